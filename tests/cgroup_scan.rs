//! Scan and classify each fake tree under `testdata/cgroup/` the way the agent does, and assert
//! the classification table an operator would see, the scanned values, and the layout.

use std::fs;
use std::path::PathBuf;

use cpusetd::cgroupfs::{
    detect_layout, CgroupDriver, CgroupPath, CgroupVersion, CpuMax, CpuSettings, FileValue,
    LayoutConfig, Quota,
};
use cpusetd::classify::{CpuSource, Millicores, Notice};
use cpusetd::state::AssignmentKey;

use crate::util::*;

const POD_A: &str = "1a2b3c4d-0000-4000-8000-00000000000a";

/// Scans and classifies a fixture tree and compares `(short path, summary)` rows.
fn assert_table(tree: &str, expected: &[(&str, &str)]) {
    let layout = layout_of(&cgroup_testdata(tree));
    let (scan, classes) = scan_and_classify(&layout, &cgroup_testdata("runtime"));
    assert!(scan.complete);
    assert_eq!(scan.skipped, []);
    let actual: Vec<(String, String)> = scan
        .cgroups
        .iter()
        .zip(&classes)
        .map(|(cg, c)| (short(&cg.relative.to_string()), short(&summary(c))))
        .collect();
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(p, s)| (p.to_string(), s.to_string()))
        .collect();
    if actual != expected {
        let shown: Vec<String> = actual
            .iter()
            .map(|(p, s)| format!("(\"{p}\", \"{}\"),", s.replace('"', "\\\"")))
            .collect();
        panic!(
            "{tree}: classification table differs; actual:\n{}",
            shown.join("\n")
        );
    }
}

#[test]
fn v1_cgroupfs_table() {
    assert_table(
        "v1-cgroupfs",
        &[
            (".", "kubepods root | - | - | -"),
            ("besteffort", "QoS directory | BestEffort | - | -"),
            ("besteffort/pod<0e>", "pod | BestEffort | - | -"),
            ("besteffort/pod<0e>/<e0>", "container | BestEffort | shared(BestEffort pod) | -"),
            ("besteffort/pod<0e>/<e1>", "container | BestEffort | shared(BestEffort pod) | -"),
            ("burstable", "QoS directory | Burstable | - | -"),
            ("burstable/pod<0d>", "pod | Burstable | - | -"),
            ("burstable/pod<0d>/<d0>", "container | Burstable | shared(Burstable pod) | -"),
            ("burstable/pod<0d>/<d1>", "container | Burstable | shared(Burstable pod) | -"),
            ("not-a-pod", "unknown ('not-a-pod' is neither a QoS class directory nor a pod) | - | - | -"),
            ("not-a-pod/child", "unknown (inside the unknown cgroup 'not-a-pod') | - | - | -"),
            ("pod<0a>", "pod | Guaranteed | - | -"),
            ("pod<0a>/<a0>", "sandbox | Guaranteed | shared(pod sandbox) | -"),
            ("pod<0a>/<a1>", "container | Guaranteed | exclusive:2 | app"),
            ("pod<0a>/<a2>", "container | Guaranteed | exclusive:1 | init"),
            ("pod<0b>", "pod | Guaranteed | - | -"),
            ("pod<0b>/<b0>", "sandbox | Guaranteed | shared(pod sandbox) | -"),
            ("pod<0b>/<b1>", "container | Guaranteed | shared(cpu request 1500m is not a whole number of cpus) | -"),
            ("pod<0c>", "pod | Guaranteed | - | -"),
            ("pod<0c>/<c0>", "sandbox | Guaranteed | shared(pod sandbox) | -"),
            ("pod<0c>/<c1>", "container | Guaranteed | exclusive:1 | -"),
            ("pod<0c>/<c1>/sub", "container child cgroup | Guaranteed | - | -"),
            ("pod<0c>/<c1>/sub/leaf", "container child cgroup | Guaranteed | - | -"),
            ("pod<0f>", "pod | Guaranteed | - | -"),
            ("pod<0f>/<f0>", "sandbox | Guaranteed | shared(pod sandbox) | -"),
            ("pod<0f>/<f1>", "container | Guaranteed | shared(cpusetd.io/exclusive.app: \"false\") | app"),
        ],
    );
}

#[test]
fn v1_systemd_table() {
    assert_table(
        "v1-systemd",
        &[
            (".", "kubepods root | - | - | -"),
            ("kubepods-besteffort.slice", "QoS directory | BestEffort | - | -"),
            ("kubepods-besteffort.slice/kubepods-besteffort-pod<0e>.slice", "pod | BestEffort | - | -"),
            ("kubepods-besteffort.slice/kubepods-besteffort-pod<0e>.slice/crio-<e0>.scope", "container | BestEffort | shared(BestEffort pod) | -"),
            ("kubepods-besteffort.slice/kubepods-besteffort-pod<0e>.slice/crio-<e1>.scope", "container | BestEffort | shared(BestEffort pod) | -"),
            ("kubepods-burstable.slice", "QoS directory | Burstable | - | -"),
            ("kubepods-burstable.slice/kubepods-burstable-pod<0d>.slice", "pod | Burstable | - | -"),
            ("kubepods-burstable.slice/kubepods-burstable-pod<0d>.slice/crio-<d0>.scope", "container | Burstable | shared(Burstable pod) | -"),
            ("kubepods-burstable.slice/kubepods-burstable-pod<0d>.slice/crio-<d1>.scope", "container | Burstable | shared(Burstable pod) | -"),
            ("kubepods-pod<0a>.slice", "pod | Guaranteed | - | -"),
            ("kubepods-pod<0a>.slice/crio-<a0>.scope", "sandbox | Guaranteed | shared(pod sandbox) | POD"),
            ("kubepods-pod<0a>.slice/crio-<a1>.scope", "container | Guaranteed | exclusive:2 | app"),
            ("kubepods-pod<0a>.slice/crio-<a2>.scope", "container | Guaranteed | exclusive:1 | init"),
            ("kubepods-pod<0a>.slice/crio-conmon-<a1>.scope", "unknown ('crio-conmon-<a1>.scope' is a runtime helper cgroup, not a container) | - | - | -"),
            ("kubepods-pod<0b>.slice", "pod | Guaranteed | - | -"),
            ("kubepods-pod<0b>.slice/crio-<b0>.scope", "sandbox | Guaranteed | shared(pod sandbox) | -"),
            ("kubepods-pod<0b>.slice/crio-<b1>.scope", "container | Guaranteed | shared(cpu request 1500m is not a whole number of cpus) | -"),
            ("kubepods-pod<0c>.slice", "pod | Guaranteed | - | -"),
            ("kubepods-pod<0c>.slice/crio-<c0>.scope", "sandbox | Guaranteed | shared(pod sandbox) | -"),
            ("kubepods-pod<0c>.slice/crio-<c1>.scope", "container | Guaranteed | exclusive:1 | -"),
            ("kubepods-pod<0c>.slice/crio-<c1>.scope/sub", "container child cgroup | Guaranteed | - | -"),
            ("kubepods-pod<0c>.slice/crio-<c1>.scope/sub/leaf", "container child cgroup | Guaranteed | - | -"),
            ("kubepods-pod<0f>.slice", "pod | Guaranteed | - | -"),
            ("kubepods-pod<0f>.slice/crio-<f0>.scope", "sandbox | Guaranteed | shared(pod sandbox) | POD"),
            ("kubepods-pod<0f>.slice/crio-<f1>.scope", "container | Guaranteed | shared(cpusetd.io/exclusive: \"false\") | app"),
            ("kubepods-podnot_a_uid.slice", "unknown ('kubepods-podnot_a_uid.slice' does not hold a valid pod UID) | - | - | -"),
        ],
    );
}

#[test]
fn v2_systemd_table() {
    assert_table(
        "v2-systemd",
        &[
            (".", "kubepods root | - | - | -"),
            ("kubepods-besteffort.slice", "QoS directory | BestEffort | - | -"),
            ("kubepods-besteffort.slice/kubepods-besteffort-pod<0e>.slice", "pod | BestEffort | - | -"),
            ("kubepods-besteffort.slice/kubepods-besteffort-pod<0e>.slice/cri-containerd-<e0>.scope", "container | BestEffort | shared(BestEffort pod) | -"),
            ("kubepods-besteffort.slice/kubepods-besteffort-pod<0e>.slice/cri-containerd-<e1>.scope", "container | BestEffort | shared(BestEffort pod) | -"),
            ("kubepods-burstable.slice", "QoS directory | Burstable | - | -"),
            ("kubepods-burstable.slice/kubepods-burstable-pod<0d>.slice", "pod | Burstable | - | -"),
            ("kubepods-burstable.slice/kubepods-burstable-pod<0d>.slice/cri-containerd-<d0>.scope", "container | Burstable | shared(Burstable pod) | -"),
            ("kubepods-burstable.slice/kubepods-burstable-pod<0d>.slice/cri-containerd-<d1>.scope", "container | Burstable | shared(Burstable pod) | -"),
            ("kubepods-pod<0a>.slice", "pod | Guaranteed | - | -"),
            ("kubepods-pod<0a>.slice/cri-containerd-<a0>.scope", "sandbox | Guaranteed | shared(pod sandbox) | -"),
            ("kubepods-pod<0a>.slice/cri-containerd-<a1>.scope", "container | Guaranteed | exclusive:2 | -"),
            ("kubepods-pod<0a>.slice/cri-containerd-<a2>.scope", "container | Guaranteed | exclusive:1 | -"),
            ("kubepods-pod<0b>.slice", "pod | Guaranteed | - | -"),
            ("kubepods-pod<0b>.slice/cri-containerd-<b0>.scope", "sandbox | Guaranteed | shared(pod sandbox) | -"),
            ("kubepods-pod<0b>.slice/cri-containerd-<b1>.scope", "container | Guaranteed | shared(cpu request 1500m is not a whole number of cpus) | -"),
            ("kubepods-pod<0c>.slice", "pod | Guaranteed | - | -"),
            ("kubepods-pod<0c>.slice/cri-containerd-<c0>.scope", "sandbox | Guaranteed | shared(pod sandbox) | -"),
            ("kubepods-pod<0c>.slice/cri-containerd-<c1>.scope", "container | Guaranteed | exclusive:1 | app"),
            ("kubepods-pod<0c>.slice/cri-containerd-<c1>.scope/sub", "container child cgroup | Guaranteed | - | -"),
            ("kubepods-pod<0c>.slice/cri-containerd-<c1>.scope/sub/leaf", "container child cgroup | Guaranteed | - | -"),
            ("kubepods-pod<10>.slice", "pod | Guaranteed | - | -"),
            ("kubepods-pod<10>.slice/cri-containerd-<70>.scope", "sandbox | Guaranteed | shared(pod sandbox) | -"),
            ("kubepods-pod<10>.slice/cri-containerd-<71>.scope", "container | Guaranteed | shared(cpu request 3997m..7759m may or may not be whole cpus) | -"),
            ("kubepods-podnot_a_uid.slice", "unknown ('kubepods-podnot_a_uid.slice' does not hold a valid pod UID) | - | - | -"),
        ],
    );
}

#[test]
fn v2_cgroupfs_table() {
    assert_table(
        "v2-cgroupfs",
        &[
            (".", "kubepods root | - | - | -"),
            ("besteffort", "QoS directory | BestEffort | - | -"),
            ("besteffort/pod<0e>", "pod | BestEffort | - | -"),
            ("besteffort/pod<0e>/<e0>", "container | BestEffort | shared(BestEffort pod) | -"),
            ("besteffort/pod<0e>/<e1>", "container | BestEffort | shared(BestEffort pod) | -"),
            ("burstable", "QoS directory | Burstable | - | -"),
            ("burstable/pod<0d>", "pod | Burstable | - | -"),
            ("burstable/pod<0d>/<d0>", "container | Burstable | shared(Burstable pod) | -"),
            ("burstable/pod<0d>/<d1>", "container | Burstable | shared(Burstable pod) | -"),
            ("debug-shell", "unknown ('debug-shell' is neither a QoS class directory nor a pod) | - | - | -"),
            ("pod<0a>", "pod | Guaranteed | - | -"),
            ("pod<0a>/<a0>", "sandbox | Guaranteed | shared(pod sandbox) | -"),
            ("pod<0a>/<a1>", "container | Guaranteed | exclusive:2 | -"),
            ("pod<0b>", "pod | Guaranteed | - | -"),
            ("pod<0b>/<b0>", "sandbox | Guaranteed | shared(pod sandbox) | -"),
            ("pod<0b>/<b1>", "container | Guaranteed | shared(cpu request 1500m is not a whole number of cpus) | -"),
            ("pod<0c>", "pod | Guaranteed | - | -"),
            ("pod<0c>/<c0>", "sandbox | Guaranteed | shared(pod sandbox) | -"),
            ("pod<0c>/<c1>", "container | Guaranteed | exclusive:1 | -"),
            ("pod<0c>/<c1>/sub", "container child cgroup | Guaranteed | - | -"),
            ("pod<0c>/<c1>/sub/leaf", "container child cgroup | Guaranteed | - | -"),
        ],
    );
}

#[test]
fn layouts_are_detected_from_an_explicit_root() {
    let cases = [
        (
            "v1-cgroupfs",
            CgroupVersion::V1,
            CgroupDriver::Cgroupfs,
            "kubepods",
        ),
        (
            "v1-systemd",
            CgroupVersion::V1,
            CgroupDriver::Systemd,
            "kubepods.slice",
        ),
        (
            "v2-systemd",
            CgroupVersion::V2,
            CgroupDriver::Systemd,
            "kubepods.slice",
        ),
        (
            "v2-cgroupfs",
            CgroupVersion::V2,
            CgroupDriver::Cgroupfs,
            "kubepods",
        ),
    ];
    for (tree, version, driver, kubepods) in cases {
        let root = cgroup_testdata(tree);
        let layout = layout_of(&root);
        assert_eq!(layout.version, version, "{tree}");
        assert_eq!(layout.driver, driver, "{tree}");
        assert_eq!(layout.kubepods.to_str(), Some(kubepods), "{tree}");
        match version {
            CgroupVersion::V1 => {
                assert_eq!(layout.cpuset_root, root.join("cpuset"));
                assert_eq!(layout.cpu_root, root.join("cpu,cpuacct"));
            }
            CgroupVersion::V2 => {
                assert_eq!(layout.cpuset_root, root);
                assert_eq!(layout.cpu_root, root);
            }
        }
    }
}

#[test]
fn layout_from_mountinfo_matches_the_explicit_one() {
    let root = cgroup_testdata("v1-systemd");
    let proc = tempfile::tempdir().unwrap();
    fs::create_dir_all(proc.path().join("self")).unwrap();
    // Mount points as the kernel escapes them; the comma needs no escape.
    let mountinfo = format!(
        "25 1 0:22 / {root} ro - tmpfs tmpfs ro,mode=755\n\
         30 25 0:27 / {root}/cpu,cpuacct rw,relatime shared:12 - cgroup cgroup rw,cpu,cpuacct\n\
         31 25 0:28 / {root}/cpuset rw,relatime shared:13 - cgroup cgroup rw,cpuset\n",
        root = root.display().to_string().replace(' ', "\\040"),
    );
    fs::write(proc.path().join("self/mountinfo"), mountinfo).unwrap();
    let detected = detect_layout(&LayoutConfig {
        proc_root: proc.path().to_path_buf(),
        cgroup_root: None,
        driver: None,
        kubepods: None,
    })
    .unwrap();
    assert_eq!(detected, layout_of(&root));
}

#[test]
fn scan_values_are_the_files_contents() {
    let layout = layout_of(&cgroup_testdata("v1-cgroupfs"));
    let scan = scanner(&layout).scan().unwrap();
    assert_eq!(scan.version, CgroupVersion::V1);
    let root = &scan.cgroups[0];
    assert!(root.relative.is_root());
    assert_eq!(root.path.to_str(), Some("kubepods"));
    assert_eq!(root.cpus.value().unwrap().to_string(), "0-7");
    assert_eq!(root.mems.value().unwrap().to_string(), "0");

    let fresh = scan
        .cgroups
        .iter()
        .find(|c| short(&c.relative.to_string()) == "pod<0b>/<b1>")
        .unwrap();
    // A v1 cpuset cgroup the runtime has not initialised yet: empty, not drift.
    assert_eq!(fresh.cpus.value().map(|s| s.is_empty()), Some(true));
    assert_eq!(fresh.cpus.configured(), None);
    assert_eq!(fresh.effective_cpus.value().unwrap().to_string(), "0-7");
    assert_eq!(
        fresh.cpu,
        CpuSettings::V1 {
            shares: FileValue::Value(1536),
            cfs_quota: FileValue::Value(Quota::Micros(150_000)),
            cfs_period_us: FileValue::Value(100_000),
        }
    );
    let leaf = scan
        .cgroups
        .iter()
        .find(|c| c.relative.to_string().ends_with("sub/leaf"))
        .unwrap();
    assert_eq!(leaf.cpus.configured().unwrap().to_string(), "1");

    let layout = layout_of(&cgroup_testdata("v2-systemd"));
    let scan = scanner(&layout).scan().unwrap();
    let lifted = scan
        .cgroups
        .iter()
        .find(|c| short(&c.relative.to_string()).ends_with("<71>.scope"))
        .unwrap();
    assert_eq!(lifted.cpus.configured().unwrap().to_string(), "4-7");
    assert!(matches!(
        lifted.cpu,
        CpuSettings::V2 {
            max: FileValue::Value(CpuMax {
                quota: Quota::Unlimited,
                period_us: 100_000
            }),
            weight: FileValue::Value(_),
        }
    ));
    let pod = scan
        .cgroups
        .iter()
        .find(|c| short(&c.relative.to_string()) == "kubepods-pod<0a>.slice")
        .unwrap();
    // v2: an empty cpuset.cpus inherits the parent's; the effective set says what it gets.
    assert_eq!(pod.cpus.configured(), None);
    assert_eq!(pod.effective_cpus.value().unwrap().to_string(), "0-7");
}

#[test]
fn scan_lists_parents_before_children() {
    for tree in ["v1-cgroupfs", "v1-systemd", "v2-systemd", "v2-cgroupfs"] {
        let layout = layout_of(&cgroup_testdata(tree));
        let scan = scanner(&layout).scan().unwrap();
        for (i, cgroup) in scan.cgroups.iter().enumerate() {
            if let Some(parent) = cgroup.relative.parent() {
                let at = scan.cgroups.iter().position(|c| c.relative == parent);
                assert!(at.is_some_and(|at| at < i), "{tree}: {}", cgroup.relative);
            }
            assert_eq!(layout.kubepods.concat(&cgroup.relative), cgroup.path);
        }
    }
}

#[test]
fn resources_come_from_the_most_exact_source() {
    let layout = layout_of(&cgroup_testdata("v1-cgroupfs"));
    let (scan, classes) = scan_and_classify(&layout, &cgroup_testdata("runtime"));
    let find = |rel: &str| {
        let at = scan
            .cgroups
            .iter()
            .position(|c| short(&c.relative.to_string()) == rel)
            .unwrap();
        classes[at].clone()
    };
    let app = find("pod<0a>/<a1>");
    let resources = app.resources.unwrap();
    assert_eq!(resources.source, CpuSource::OciConfig);
    assert_eq!(resources.request, Millicores::Exact(2000));
    assert_eq!(resources.limit, Some(Millicores::Exact(2000)));
    assert_eq!(app.pod_uid.as_deref(), Some(POD_A));
    assert_eq!(
        app.assignment_key(),
        Some(AssignmentKey::Named {
            pod_uid: POD_A.into(),
            container: "app".into()
        })
    );
    let no_config = find("pod<0c>/<c1>");
    assert_eq!(no_config.resources.unwrap().source, CpuSource::CgroupV1);
    assert!(matches!(
        no_config.assignment_key(),
        Some(AssignmentKey::Id { .. })
    ));
    let burstable = find("burstable/pod<0d>/<d1>").resources.unwrap();
    assert_eq!(burstable.request, Millicores::Exact(500));
    assert_eq!(burstable.limit, Some(Millicores::Exact(1000)));

    let layout = layout_of(&cgroup_testdata("v2-systemd"));
    let (scan, classes) = scan_and_classify(&layout, &cgroup_testdata("runtime"));
    let find = |rel: &str| {
        let at = scan
            .cgroups
            .iter()
            .position(|c| short(&c.relative.to_string()).ends_with(rel))
            .unwrap();
        classes[at].clone()
    };
    // Weight settled by an exact cpu.max limit.
    let app = find("<a1>.scope");
    assert_eq!(app.resources.unwrap().source, CpuSource::CgroupV2);
    assert_eq!(app.resources.unwrap().request, Millicores::Exact(2000));
    // Quota lifted, but the runtime config still says 1 CPU.
    let lifted = find("<c1>.scope");
    assert_eq!(lifted.resources.unwrap().source, CpuSource::OciConfig);
    assert_eq!(lifted.exclusive_cpus(), 1);
    // Quota lifted and no runtime config: flagged for a log line, kept shared.
    let lossy = find("<71>.scope");
    assert!(
        matches!(lossy.notices.as_slice(), [Notice::LossyWeight { .. }]),
        "{:?}",
        lossy.notices
    );
}

#[test]
fn an_explicit_kubepods_path_scans_only_that_subtree() {
    let root = cgroup_testdata("v1-cgroupfs");
    let layout = detect_layout(&LayoutConfig {
        proc_root: PathBuf::from("/nonexistent"),
        cgroup_root: Some(root),
        driver: Some(CgroupDriver::Cgroupfs),
        kubepods: Some(CgroupPath::new("kubepods/burstable").unwrap()),
    })
    .unwrap();
    let scan = scanner(&layout).scan().unwrap();
    assert_eq!(scan.cgroups.len(), 4);
    assert_eq!(scan.cgroups[0].path.to_str(), Some("kubepods/burstable"));
}
