//! cpusetd's own placement on the machines of issue 28, as the agent runs it: the
//! `cpusetd.io/core-type` pod annotation on a hybrid part under `--placement best-fit`.

use cpusetd::cgroupfs::CgroupVersion;

use crate::agent_process::TestNode;
use crate::agent_util::{cpus, guaranteed};

/// hybrid-pe: P-cores 0-15 (two threads each), E-cores 16-23; cpu 0 reserved. Best fit gives
/// an unannotated pod performance cores, a pod annotated `cpusetd.io/core-type: efficient`
/// efficient cores, and a pod with an odd value performance cores, with one log line.
#[test]
fn core_type_annotation_chooses_the_cores_under_best_fit() {
    let node = TestNode::builder()
        .version(CgroupVersion::V1)
        .fixture("sysfs/hybrid-pe")
        .build();
    let mut agent = node.start_agent(&["--placement", "best-fit"]);
    let fast = guaranteed("fast", 2000);
    let lean = guaranteed("lean", 2000);
    let odd = guaranteed("odd", 1000);
    node.fake
        .annotate_pod(&lean.uid, &[("cpusetd.io/core-type", "efficient")]);
    node.fake
        .annotate_pod(&odd.uid, &[("cpusetd.io/core-type", "little")]);
    let fast_id = node.fake.start_pod(&fast).unwrap().remove(0);
    let lean_id = node.fake.start_pod(&lean).unwrap().remove(0);
    let odd_id = node.fake.start_pod(&odd).unwrap().remove(0);
    let status = node.wait_status("pinned", |s| s.exclusive_cpu_count == 5 && s.converged());
    let held = |id: &str| cpus(status.by_id(id).unwrap().current.as_deref().unwrap());
    let (performance, efficient) = (cpus("0-15"), cpus("16-23"));
    assert!(held(&fast_id).is_subset(&performance), "{}", held(&fast_id));
    assert_eq!(held(&lean_id), cpus("16-17"));
    assert!(held(&odd_id).is_subset(&performance), "{}", held(&odd_id));
    assert!(held(&fast_id).is_disjoint(&efficient));
    assert_eq!(
        agent
            .log_lines("annotation cpusetd.io/core-type: \"little\" ignored")
            .len(),
        1,
        "{}",
        agent.log()
    );
    assert!(agent.stop().success());
    node.assert_clean();
}
