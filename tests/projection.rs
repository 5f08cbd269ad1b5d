//! What the workload sees and asks for (issue 27, items 1 and 4): `cpu-shared.crio.io/<name>`
//! (a container on its exclusive CPUs and the shared pool, kept current as the pool changes)
//! and the projection files (`cpusetd.io/projection`, `--project-all`).

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::kubesim::{ContainerSpec, Qos};

use crate::agent_util::{cpus, guaranteed, pod, TestNode};

fn cpu_shared_follows_the_pool(version: CgroupVersion) {
    let node = TestNode::new(version);
    let mut agent = node.start_agent(&[]);
    let fast = pod(
        "fast",
        Qos::Guaranteed,
        vec![
            ContainerSpec::guaranteed("dp", 1000),
            ContainerSpec::guaranteed("ctl", 1000),
        ],
    );
    node.fake.annotate_pod(
        &fast.uid,
        &[
            ("cpu-shared.crio.io/dp", "enable"),
            ("cpu-shared.crio.io/ctl", "maybe"),
        ],
    );
    let ids = node.fake.start_pod(&fast).unwrap();
    let (dp, ctl) = (ids[0].clone(), ids[1].clone());
    let held = |s: &crate::agent_util::Status, id: &str| {
        let row = s.by_id(id)?;
        Some(cpus(s.exclusive_cpus.as_str()).intersection(&cpus(row.current.as_deref()?)))
    };
    let status = node.wait_status("dp on its cpus and the pool", |s| {
        s.converged() && s.exclusive_cpu_count == 2 && s.by_id(&dp).is_some()
    });
    let pool = cpus(&status.shared_pool);
    let ctl_set = cpus(status.by_id(&ctl).unwrap().current.as_deref().unwrap());
    assert_eq!(ctl_set.len(), 1, "an odd value leaves ctl on its own cpu");
    let dp_own = held(&status, &dp).unwrap();
    assert_eq!(dp_own.len(), 1, "{status:?}");
    assert_eq!(
        status.by_id(&dp).unwrap().current.as_deref().map(cpus),
        Some(dp_own.union(&pool)),
        "{status:?}"
    );
    assert!(
        status.by_id(&dp).unwrap().note.contains("cpu-shared"),
        "{status:?}"
    );
    assert_eq!(
        agent
            .log_lines("annotation cpu-shared.crio.io/ctl: \"maybe\" ignored")
            .len(),
        1,
        "{}",
        agent.log()
    );

    // Another pin shrinks the pool: dp follows it and keeps its own cpu.
    let other = guaranteed("other", 2000);
    node.fake.start_pod(&other).unwrap();
    let status = node.wait_status("the pool shrank", |s| {
        s.converged() && s.exclusive_cpu_count == 4
    });
    let smaller = cpus(&status.shared_pool);
    assert!(smaller.len() + 2 == pool.len(), "{status:?}");
    assert_eq!(
        status.by_id(&dp).unwrap().current.as_deref().map(cpus),
        Some(dp_own.union(&smaller)),
        "{status:?}"
    );
    // And grows back when that pod goes.
    node.fake.remove_pod(&other).unwrap();
    let status = node.wait_status("the pool grew back", |s| {
        s.converged() && s.exclusive_cpu_count == 2
    });
    assert_eq!(cpus(&status.shared_pool), pool);
    assert_eq!(
        status.by_id(&dp).unwrap().current.as_deref().map(cpus),
        Some(dp_own.union(&pool))
    );
    assert!(agent.stop().success());
    node.assert_clean();
}

#[test]
fn cpu_shared_follows_the_pool_v1() {
    cpu_shared_follows_the_pool(CgroupVersion::V1);
}

#[test]
fn cpu_shared_follows_the_pool_v2() {
    cpu_shared_follows_the_pool(CgroupVersion::V2);
}
