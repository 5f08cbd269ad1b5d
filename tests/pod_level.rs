//! Pod-level resources (KEP-2837, issue 25 item 5): a Guaranteed pod whose CPU is set in
//! `spec.resources` and whose containers set none. kubelet 1.34–1.36's static policy gives such
//! containers no exclusive CPUs (they run in the shared pool); the agent does the same and
//! `status` says why. On a fake cgroup v2 node with the real agent binary, laid out as kubelet
//! and runc leave it: the pod cgroup holds the pod-level values, and each container the pod's
//! limit as its `cpu.max` and, its missing request defaulting to that limit, the same shares
//! (`cpu.weight`) — each container alone looks like a container-level Guaranteed one; only the
//! pod shows that its containers add up to more than it. The runtime config says so too
//! (`testdata/runtime/pod-level-resources-containerd.json` is the same shape as a runtime
//! writes it).

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::kubesim::{weight, ContainerSpec, Qos};

use crate::agent_util::{guaranteed, pod, TestNode};
use crate::util::{stderr, stdout};

#[test]
fn pod_level_cpu_leaves_its_containers_in_the_shared_pool() {
    let node = TestNode::new(CgroupVersion::V2);
    let mut agent = node.start_agent(&[]);
    let db = guaranteed("db", 2000);
    let db_id = node.fake.start_pod(&db).unwrap().remove(0);
    let batch = pod(
        "batch",
        Qos::Guaranteed,
        vec![
            ContainerSpec::best_effort("worker"),
            ContainerSpec::best_effort("helper"),
        ],
    );
    let ids = node
        .fake
        .start_pod_with_pod_level_cpu(&batch, 2000)
        .unwrap();
    let status = node.wait_status("db pinned, batch seen", |s| {
        s.converged()
            && s.by_id(&db_id).is_some_and(|r| r.exclusive)
            && ids.iter().all(|id| s.by_id(id).is_some())
    });
    // The cgroups as kubelet and runc leave them (and as the agent leaves them: it lifted no
    // quota of the pod, or put back any it lifted while it saw only its first container).
    assert_eq!(node.read(&batch, "", "cpu.max"), "200000 100000");
    assert_eq!(
        node.read(&batch, "", "cpu.weight"),
        weight(2048).to_string()
    );
    for id in &ids {
        assert_eq!(
            node.read(&batch, id, "cpu.weight"),
            weight(2048).to_string()
        );
        assert_eq!(node.read(&batch, id, "cpu.max"), "200000 100000");
    }
    let shared = status.shared_pool.clone();
    for id in &ids {
        let row = status.by_id(id).unwrap();
        assert!(!row.exclusive, "{row:?}");
        assert_eq!(row.kind, "container", "{row:?}");
        assert_eq!(row.current.as_deref(), Some(shared.as_str()), "{row:?}");
        assert_eq!(
            row.note,
            "shared: pod-level resources (spec.resources, cpu limit 2000m): kubelet's static \
             policy gives its containers no exclusive cpus",
            "{row:?}"
        );
        assert_eq!(node.cpus_of(&batch, id), shared);
    }
    // The table an operator reads names the reason on each container's row.
    let out = node.cpusetd("status", &[]);
    let table = stdout(&out);
    assert!(out.status.success(), "{table}{}", stderr(&out));
    let noted = table
        .lines()
        .filter(|l| l.contains("shared: pod-level resources (spec.resources, cpu limit 2000m)"))
        .count();
    assert_eq!(noted, 2, "{table}");
    // The log says it once, of the pod, whatever the passes since.
    let web = guaranteed("web", 1000);
    let web_id = node.fake.start_pod(&web).unwrap().remove(0);
    node.wait_status("web pinned later", |s| {
        s.converged() && s.by_id(&web_id).is_some_and(|r| r.exclusive)
    });
    let said =
        agent.log_lines("pod-level resources (spec.resources, cpu limit 2000m): its containers");
    assert_eq!(said.len(), 1, "{}", agent.log());
    assert!(
        said[0].contains("cpusetd keeps pods with pod-level resources in the shared pool"),
        "{}",
        said[0]
    );
    assert!(agent.stop().success(), "{}", agent.log());
}

/// Containers come one at a time. The first alone looks like a container-level Guaranteed
/// container of 2 CPUs (kubelet's values for it are exactly those): the agent pins it, as
/// DECISIONS says it must. When the second comes, the pod's containers add up to twice its
/// cgroup: both are shared with the reason, the first's cpus go back to the pool and the CFS
/// quotas lifted for it (its own and the pod's) are put back as kubelet set them.
#[test]
fn a_pod_level_pod_is_found_when_its_second_container_comes() {
    let node = TestNode::new(CgroupVersion::V2);
    let mut agent = node.start_agent(&[]);
    let batch = pod(
        "batch",
        Qos::Guaranteed,
        vec![ContainerSpec::best_effort("worker")],
    );
    let first = node
        .fake
        .start_pod_with_pod_level_cpu(&batch, 2000)
        .unwrap()
        .remove(0);
    node.wait_status("the first container pinned", |s| {
        s.converged() && s.by_id(&first).is_some_and(|r| r.exclusive)
    });
    assert_eq!(node.read(&batch, &first, "cpu.max"), "max 100000", "lifted");
    assert_eq!(node.read(&batch, "", "cpu.max"), "max 100000", "lifted");
    // The second sets no CPU either: kubelet gives it the pod's limit and its shares.
    let helper = ContainerSpec::guaranteed("helper", 2000);
    let second = node.fake.add_container(&batch, &helper).unwrap();
    // The quotas are put back by a pass of their own after the release: wait for them too.
    let status = node.wait_status("both shared, their quotas back", |s| {
        s.converged()
            && [&first, &second]
                .iter()
                .all(|id| s.by_id(id).is_some_and(|r| !r.exclusive))
            && node.read(&batch, "", "cpu.max") == "200000 100000"
            && node.read(&batch, &first, "cpu.max") == "200000 100000"
    });
    for id in [&first, &second] {
        let row = status.by_id(id).unwrap();
        assert!(
            row.note
                .starts_with("shared: pod-level resources (spec.resources"),
            "{row:?}"
        );
        assert_eq!(node.cpus_of(&batch, id), status.shared_pool);
    }
    assert_eq!(status.exclusive_cpu_count, 0, "{status:?}");
    assert_eq!(node.read(&batch, "", "cpu.max"), "200000 100000");
    assert_eq!(node.read(&batch, &first, "cpu.max"), "200000 100000");
    let said =
        agent.log_lines("pod-level resources (spec.resources, cpu limit 2000m): its containers");
    assert_eq!(said.len(), 1, "{}", agent.log());
    assert!(agent.stop().success(), "{}", agent.log());
}
