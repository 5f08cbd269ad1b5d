//! CRI-O's high-performance annotations on any runtime (`cpu-quota.crio.io`,
//! `irq-load-balancing.crio.io`, `cpu-load-balancing.crio.io`), read from the pod's annotations
//! in the runtime's config, for containers holding exclusive CPUs.

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::kubesim::{ContainerSpec, Qos};

use crate::agent_util::{pod, TestNode};

#[test]
fn cpu_quota_annotation_lifts_the_quota_even_with_keep_cfs_quota() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&["--keep-cfs-quota"]);
    let fast = pod(
        "fast",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 1000)],
    );
    let plain = pod(
        "plain",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 1000)],
    );
    let odd = pod(
        "odd",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 1000)],
    );
    node.fake
        .annotate_pod(&fast.uid, &[("cpu-quota.crio.io", "disable")]);
    node.fake
        .annotate_pod(&odd.uid, &[("cpu-quota.crio.io", "yes please")]);
    let fast_id = node.fake.start_pod(&fast).unwrap().remove(0);
    let plain_id = node.fake.start_pod(&plain).unwrap().remove(0);
    let odd_id = node.fake.start_pod(&odd).unwrap().remove(0);
    node.wait_status("pinned", |s| s.exclusive_cpu_count == 3 && s.converged());
    let quota = |p, id| node.read(p, id, "cpu.cfs_quota_us");
    let lifted = crate::agent_util::poll_until(crate::agent_util::DEADLINE, || {
        (quota(&fast, &fast_id) == "-1" && quota(&fast, "") == "-1").then_some(())
    });
    assert!(
        lifted.is_some(),
        "{} {}",
        quota(&fast, &fast_id),
        quota(&fast, "")
    );
    // --keep-cfs-quota holds for the others; a value that means nothing is said once.
    assert_eq!(quota(&plain, &plain_id), "100000");
    assert_eq!(quota(&odd, &odd_id), "100000");
    assert_eq!(
        agent
            .log_lines("annotation cpu-quota.crio.io: \"yes please\" ignored")
            .len(),
        1,
        "{}",
        agent.log()
    );
    assert!(agent.stop().success());
    node.assert_clean();
}
