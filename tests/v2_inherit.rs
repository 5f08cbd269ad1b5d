//! cgroup v2 inheritance (issues 24 (b), 25 item 4): a cgroup whose `cpuset.cpus` is empty
//! follows its parent's effective set, so the agent sets the shared pool on the QoS parents
//! and on the non-exclusive members of Guaranteed pods only, and a pod event costs a few writes
//! instead of one per shared container. The agent binary on a fake v2 node whose fake kernel
//! keeps `cpuset.cpus.effective` as the real one does.

use std::fs;

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::kubesim::{ContainerSpec, PodSpec, Qos};

use crate::agent_util::{cpus, guaranteed, pod, poll_until, TestNode, DEADLINE};

/// The large-node mix of the benches: Burstable pods of three app containers (four cgroups
/// with the sandbox).
fn burstable(n: usize) -> PodSpec {
    pod(
        &format!("b{n}"),
        Qos::Burstable,
        vec![
            ContainerSpec::burstable("app", 250, Some(2000)),
            ContainerSpec::burstable("sidecar", 100, None),
            ContainerSpec::burstable("log", 50, Some(200)),
        ],
    )
}

/// The agent's `cpusetd_cgroup_writes_total` once it has stayed the same for a while (the
/// held-back shared rewrites have fallen due).
fn settled_writes(node: &TestNode) -> f64 {
    let mut last = -1.0;
    let mut stable = 0;
    poll_until(DEADLINE, || {
        let now = node.metric("cpusetd_cgroup_writes_total");
        stable = if now == last { stable + 1 } else { 0 };
        last = now;
        std::thread::sleep(std::time::Duration::from_millis(50));
        (stable >= 10).then_some(now)
    })
    .expect("the writes settle")
}

/// A file of a pod's container (or of the pod with `id` empty), trimmed.
fn read(node: &TestNode, p: &PodSpec, id: &str, file: &str) -> String {
    node.read(p, id, file)
}

/// Waits until `gid` runs on cpu 8 and no other container does; how long since `started`
/// (`None` past the deadline). What each runs on is what the fake kernel says is in force.
fn until_exclusive(
    node: &TestNode,
    pods: &[PodSpec],
    ids: &[Vec<String>],
    g: &PodSpec,
    gid: &str,
    started: std::time::Instant,
) -> Option<std::time::Duration> {
    let others_off = || {
        pods.iter()
            .zip(ids)
            .all(|(p, ids)| ids.iter().all(|id| !cpus(&node.cpus_of(p, id)).contains(8)))
    };
    poll_until(DEADLINE, || {
        (node.cpus_of(g, gid) == "8" && others_off()).then(|| started.elapsed())
    })
}

/// 110 Burstable pods, then one Guaranteed pod (a 1-CPU container) starts and is removed:
/// the writes that cost, and every container's effective set meanwhile.
#[test]
fn v2_pod_start_and_release_writes_where_children_do_not_inherit() {
    let node = TestNode::new(CgroupVersion::V2);
    let mut agent = node.start_agent(&[]);
    let pods: Vec<PodSpec> = (0..110).map(burstable).collect();
    let mut ids = Vec::new();
    for p in &pods {
        ids.push(node.fake.start_pod(p).unwrap());
    }
    node.wait_status("110 pods seen", |s| {
        s.containers.len() == 110 * 4 && s.converged()
    });
    let before = settled_writes(&node);

    let g = guaranteed("g", 1000);
    let started = std::time::Instant::now();
    let gid = node.fake.start_pod(&g).unwrap().remove(0);
    let pin = poll_until(DEADLINE, || {
        (node.cpus_of(&g, &gid) == "8").then(|| started.elapsed())
    });
    println!("v2, 110 pods: pinned {pin:?} after its pod started (debug build)");
    let alone = until_exclusive(&node, &pods, &ids, &g, &gid, started);
    // On the fake tree this includes the fake kernel's own work (in the agent's debug build):
    // each QoS write rewrites the effective sets of the 440 cgroups below it. The figure is
    // the writes.
    println!("v2, 110 pods: the pin exclusive {alone:?} after its pod started (debug build)");
    assert!(alone.is_some(), "the pin never became exclusive");
    node.wait_cpus(&gid, "8");
    let pinned = settled_writes(&node);
    // Every shared container runs on the shared pool, inherited or its own.
    let mut wrong = Vec::new();
    for (p, ids) in pods.iter().zip(&ids) {
        for id in ids {
            let effective = read(&node, p, id, "cpuset.cpus.effective");
            let own = read(&node, p, id, "cpuset.cpus");
            if effective != "0-7,9-15" || !own.is_empty() {
                wrong.push(format!("{id}: {own:?}, effective {effective} while pinned"));
            }
        }
    }
    // The pool is the burstable QoS cgroup's own; the pods follow it.
    let qos = |file| fs::read_to_string(node.fake.file("kubepods/burstable", file)).unwrap();
    assert_eq!(qos("cpuset.cpus").trim(), "0-7,9-15");
    assert_eq!(read(&node, &pods[0], "", "cpuset.cpus"), "");
    node.fake.remove_pod(&g).unwrap();
    node.wait_status("the pin released", |s| {
        s.exclusive_cpu_count == 0 && s.converged()
    });
    let released = settled_writes(&node);
    for (p, ids) in pods.iter().zip(&ids) {
        for id in ids {
            let effective = read(&node, p, id, "cpuset.cpus.effective");
            if effective != "0-15" {
                wrong.push(format!("{id}: {effective} after the release"));
            }
        }
    }
    let (start, release) = (pinned - before, released - pinned);
    println!(
        "v2, 110 pods: {start} writes for a pod start, {release} for its release, {} in all",
        start + release
    );
    assert!(
        wrong.is_empty(),
        "{} wrong, e.g. {:?}",
        wrong.len(),
        wrong.first()
    );
    assert!(start + release <= 20.0, "{start} + {release} writes");
    assert!(agent.stop().success());
    node.assert_clean();
}

/// A shared container that follows its QoS cgroup's set, then someone writes a set into it:
/// drift, repaired by writing the shared pool (not by emptying the file again: the agent never
/// writes an empty cpuset). `status` shows an inheriting container's effective set as current.
#[test]
fn v2_a_foreign_write_into_an_inheriting_container_is_repaired_with_the_pool() {
    let node = TestNode::new(CgroupVersion::V2);
    let mut agent = node.start_agent(&["--cpu-manager-reconcile-period", "1h"]);
    let b = burstable(0);
    let ids = node.fake.start_pod(&b).unwrap();
    let g = guaranteed("g", 1000);
    let gid = node.fake.start_pod(&g).unwrap().remove(0);
    let status = node.wait_cpus(&gid, "8");
    let shared = "0-7,9-15";
    for id in &ids {
        assert!(status.has(id, shared), "{id}: {status:#?}");
        assert_eq!(
            read(&node, &b, id, "cpuset.cpus"),
            "",
            "{id} follows its pod"
        );
    }

    let app = &ids[1];
    node.write(&b, app, "cpuset.cpus", "0-15");
    let repaired = poll_until(DEADLINE, || {
        (read(&node, &b, app, "cpuset.cpus") == shared).then_some(())
    });
    assert!(
        repaired.is_some(),
        "{}",
        read(&node, &b, app, "cpuset.cpus")
    );
    let status = node.wait_status("converged", |s| s.converged());
    assert!(status.has(app, shared), "{status:#?}");
    assert!(node.metric("cpusetd_drift_repairs_total") >= 1.0);
    // The others still follow.
    assert_eq!(read(&node, &b, &ids[2], "cpuset.cpus"), "");
    assert!(agent.stop().success());
    node.assert_clean();
}
