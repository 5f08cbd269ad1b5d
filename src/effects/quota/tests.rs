use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use super::*;
use crate::checkpoint::host::load_host_record;
use crate::classify::Isolation;
use crate::cpuset::CpuSet;
use crate::effects::tests::Known;
use crate::effects::{build as build_all, Assigned, EffectState};
use crate::topology::{RegularShape, Topology};

const POD: &str = "kubepods/podu";
const APP: &str = "kubepods/podu/app";
const SIDE: &str = "kubepods/podu/side";

fn path(text: &str) -> CgroupPath {
    CgroupPath::new(text).unwrap()
}

fn topology() -> Topology {
    Topology::regular(RegularShape {
        sockets: 1,
        numa_nodes_per_socket: 1,
        uncore_caches_per_numa_node: 1,
        cores_per_uncore_cache: 4,
        threads_per_core: 1,
    })
    .unwrap()
}

/// A v1 `cpu` hierarchy with the pod and its two containers, each quota as given.
fn tree(root: &Path, quotas: &[(&str, &str)]) {
    for (cgroup, quota) in quotas {
        let dir = root.join(cgroup);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("cpu.cfs_quota_us"), format!("{quota}\n")).unwrap();
        fs::write(dir.join("cpu.cfs_period_us"), "100000\n").unwrap();
    }
}

/// The quota of `cgroup` as the file says.
fn quota(root: &Path, cgroup: &str) -> String {
    fs::read_to_string(root.join(cgroup).join("cpu.cfs_quota_us"))
        .unwrap()
        .trim()
        .to_string()
}

/// What the agent read of the tree (its model): each cgroup's quota from its file.
fn known(root: &Path) -> Known {
    let mut cgroups = BTreeMap::new();
    for cgroup in [POD, APP, SIDE] {
        let text = quota(root, cgroup);
        cgroups.insert(
            path(cgroup),
            CpuSettings::V1 {
                shares: FileValue::Value(1024),
                cfs_quota: FileValue::Value(parse_cfs_quota(&text).unwrap()),
                cfs_period_us: FileValue::Value(100_000),
            },
        );
    }
    Known(cgroups)
}

fn env<'a>(root: &Path, journal: Option<HostJournal>) -> Env<'a> {
    let fs = CgroupFs::open(root).unwrap();
    Env {
        proc_root: Path::new("/nonexistent/proc"),
        sysfs_root: Path::new("/nonexistent/sys"),
        cpuset: Some((fs.clone(), CgroupVersion::V1, path("kubepods"))),
        cpu: Some(fs),
        isolate_host: None,
        journal,
        effect_done: None,
    }
}

/// The quota effect of the list, built with what was recorded.
fn effect(env: &Env<'_>, recorded: &Recorded<'_>) -> Box<dyn Effect> {
    build_all(env, recorded)
        .into_iter()
        .find(|e| e.name() == NAME)
        .expect("the quota effect is in the list")
}

fn update(effect: &mut dyn Effect, pinned: &[(&CgroupPath, &Isolation)], keep: bool, root: &Path) {
    let (topology, cpus, known) = (topology(), CpuSet::parse("2").unwrap(), known(root));
    let wanted = Wanted {
        containers: pinned
            .iter()
            .map(|(path, isolation)| Assigned {
                isolation,
                path,
                cpus: &cpus,
            })
            .collect(),
        topology: &topology,
        keep_cfs_quota: keep,
        cgroups: Some(&known),
    };
    effect.update(&wanted, false, &mut Metrics::default());
}

/// A container holding exclusive cpus and its pod run without a quota; each original is in
/// `host.json` (written ahead) and in what the checkpoint saves; the sidecar keeps its own.
/// When the pin goes, the originals go back and leave the records.
#[test]
fn lifts_a_pinned_containers_and_its_pods_quota_and_puts_them_back_on_release() {
    let dir = tempfile::tempdir().unwrap();
    let (root, state) = (dir.path().join("cpu"), dir.path().join("state"));
    tree(&root, &[(POD, "250000"), (APP, "200000"), (SIDE, "50000")]);
    let env = env(&root, Some(HostJournal::new(&state, None)));
    let mut quota_lift = effect(&env, &Recorded::default());
    let (app, none) = (path(APP), Isolation::default());
    update(quota_lift.as_mut(), &[(&app, &none)], false, &root);
    assert_eq!(
        [quota(&root, POD), quota(&root, APP), quota(&root, SIDE)],
        ["-1", "-1", "50000"]
    );
    let record = load_host_record(&state).unwrap().unwrap();
    let expected = serde_json::json!([
        {"cgroup": POD, "original": "250000"},
        {"cgroup": APP, "original": "200000"},
    ]);
    assert_eq!(record.effects[NAME], expected);
    assert_eq!(quota_lift.saved(), expected);
    let mut in_force = InForce::default();
    quota_lift.in_force(&mut in_force);
    assert_eq!(in_force.quota, [path(POD), path(APP)].into());
    // Asked again with the tree as written: nothing changes.
    update(quota_lift.as_mut(), &[(&app, &none)], false, &root);
    assert_eq!(quota_lift.saved(), expected);

    update(quota_lift.as_mut(), &[], false, &root);
    assert_eq!(
        [quota(&root, POD), quota(&root, APP), quota(&root, SIDE)],
        ["250000", "200000", "50000"]
    );
    assert!(quota_lift.saved().is_null());
    let record = load_host_record(&state).unwrap().unwrap();
    assert!(!record.effects.contains_key(NAME), "{record:?}");
}

/// The model may not have seen the lift yet (its echo still queued): the file says it is in
/// force, so nothing is recorded again; a quota set again after the lift (an in-place resize)
/// is lifted again with its new value as the original; one set again once the pin is gone is
/// someone else's and stays.
#[test]
fn a_quota_set_again_is_lifted_with_its_new_original_or_left_to_its_owner() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cpu");
    tree(&root, &[(POD, "250000"), (APP, "200000"), (SIDE, "50000")]);
    let env = env(&root, None);
    let mut quota_lift = effect(&env, &Recorded::default());
    let (app, none) = (path(APP), Isolation::default());
    let stale = known(&root);
    update(quota_lift.as_mut(), &[(&app, &none)], false, &root);
    let (topology, cpus) = (topology(), CpuSet::parse("2").unwrap());
    let wanted = Wanted {
        containers: vec![Assigned {
            isolation: &none,
            path: &app,
            cpus: &cpus,
        }],
        topology: &topology,
        keep_cfs_quota: false,
        cgroups: Some(&stale),
    };
    quota_lift.update(&wanted, false, &mut Metrics::default());
    assert_eq!(quota(&root, APP), "-1");
    assert_eq!(quota_lift.saved()[1]["original"], "200000");

    fs::write(root.join(APP).join("cpu.cfs_quota_us"), "300000\n").unwrap();
    update(quota_lift.as_mut(), &[(&app, &none)], false, &root);
    assert_eq!(quota(&root, APP), "-1");
    assert_eq!(quota_lift.saved()[1]["original"], "300000");

    fs::write(root.join(APP).join("cpu.cfs_quota_us"), "150000\n").unwrap();
    update(quota_lift.as_mut(), &[], false, &root);
    assert_eq!(quota(&root, APP), "150000");
    assert_eq!(quota(&root, POD), "250000");
    assert!(quota_lift.saved().is_null());
}

/// The pin goes by an in-place resize: the runtime writes `cpu.shares` first and the new quota
/// after it, so the pass that releases the container may have read it still unlimited. The
/// quota the runtime wrote since is not overwritten with the original (which would put the
/// container above the pod's new quota, refused to kubelet with EINVAL on v1); it is the
/// runtime's, and forgotten. The pod, still unlimited, gets its original back.
#[test]
fn a_quota_the_runtime_set_after_the_model_was_read_is_not_overwritten_by_the_restore() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cpu");
    tree(&root, &[(POD, "250000"), (APP, "200000"), (SIDE, "50000")]);
    let env = env(&root, None);
    let mut quota_lift = effect(&env, &Recorded::default());
    let (app, none) = (path(APP), Isolation::default());
    update(quota_lift.as_mut(), &[(&app, &none)], false, &root);
    assert_eq!([quota(&root, POD), quota(&root, APP)], ["-1", "-1"]);
    // The model as the releasing pass read it: both still unlimited.
    let stale = known(&root);
    fs::write(root.join(APP).join("cpu.cfs_quota_us"), "50000\n").unwrap();
    let topology = topology();
    let wanted = Wanted {
        containers: Vec::new(),
        topology: &topology,
        keep_cfs_quota: false,
        cgroups: Some(&stale),
    };
    quota_lift.update(&wanted, false, &mut Metrics::default());
    assert_eq!(quota(&root, APP), "50000");
    assert_eq!(quota(&root, POD), "250000");
    assert!(quota_lift.saved().is_null(), "{}", quota_lift.saved());
}

/// `--keep-cfs-quota`: only the pods that say `cpu-quota.crio.io: "disable"` are lifted; what
/// an agent without the flag lifted before is put back (issue 23 item 27).
#[test]
fn keep_cfs_quota_lifts_only_what_the_annotation_asks_and_puts_back_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cpu");
    tree(&root, &[(POD, "-1"), (APP, "-1"), (SIDE, "-1")]);
    let before = serde_json::json!([
        {"cgroup": POD, "original": "250000"},
        {"cgroup": APP, "original": "200000"},
    ]);
    let checkpoint: EffectState = [(NAME.to_string(), before)].into();
    let recorded = Recorded {
        checkpoint: Some(&checkpoint),
        host: None,
    };
    let mut quota_lift = effect(&env(&root, None), &recorded);
    let (app, side) = (path(APP), path(SIDE));
    let disable = Isolation {
        no_cpu_quota: true,
        ..Isolation::default()
    };
    let none = Isolation::default();
    update(
        quota_lift.as_mut(),
        &[(&app, &none), (&side, &none)],
        true,
        &root,
    );
    assert_eq!(
        [quota(&root, POD), quota(&root, APP), quota(&root, SIDE)],
        ["250000", "200000", "-1"]
    );
    fs::write(root.join(SIDE).join("cpu.cfs_quota_us"), "50000\n").unwrap();
    update(quota_lift.as_mut(), &[(&side, &disable)], true, &root);
    assert_eq!([quota(&root, POD), quota(&root, SIDE)], ["-1", "-1"]);
    assert_eq!(
        quota_lift.saved(),
        serde_json::json!([
            {"cgroup": POD, "original": "250000"},
            {"cgroup": SIDE, "original": "50000"},
        ])
    );
}

/// `cpusetd reset` through the list: every recorded quota that is still unlimited gets its
/// original back (the host record's win over the checkpoint's); a cgroup gone is no failure.
#[test]
fn reset_puts_back_every_recorded_quota_still_lifted() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cpu");
    tree(&root, &[(POD, "-1"), (APP, "-1"), (SIDE, "70000")]);
    let checkpoint: EffectState = [(
        NAME.to_string(),
        serde_json::json!([{"cgroup": APP, "original": "1"}]),
    )]
    .into();
    let host: EffectState = [(
        NAME.to_string(),
        serde_json::json!([
            {"cgroup": POD, "original": "250000"},
            {"cgroup": APP, "original": "200000"},
            {"cgroup": SIDE, "original": "50000"},
            {"cgroup": "kubepods/podgone/app", "original": "100000"},
        ]),
    )]
    .into();
    let recorded = Recorded {
        checkpoint: Some(&checkpoint),
        host: Some(&host),
    };
    let mut quota_lift = effect(&env(&root, None), &recorded);
    let restored = quota_lift.restore();
    assert!(restored.errors.is_empty(), "{restored:?}");
    assert_eq!(restored.said, ["2 lifted CFS quota(s) restored"]);
    assert_eq!(
        [quota(&root, POD), quota(&root, APP), quota(&root, SIDE)],
        ["250000", "200000", "70000"]
    );
}

/// A record that names no cgroup below kubepods, or whose original is no quota limit, is said
/// and left out: nothing it names is written.
#[test]
fn a_record_naming_no_quota_below_kubepods_is_said_and_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cpu");
    tree(&root, &[(POD, "-1"), (APP, "-1"), ("system.slice", "-1")]);
    let host: EffectState = [(
        NAME.to_string(),
        serde_json::json!([
            {"cgroup": "system.slice", "original": "100000"},
            {"cgroup": "../etc", "original": "100000"},
            {"cgroup": APP, "original": "-1"},
            {"cgroup": POD, "original": "lots"},
            {"cgroup": SIDE, "original": "50000"},
        ]),
    )]
    .into();
    let recorded = Recorded {
        checkpoint: None,
        host: Some(&host),
    };
    let quota_lift = effect(&env(&root, None), &recorded);
    assert_eq!(
        quota_lift.saved(),
        serde_json::json!([{"cgroup": SIDE, "original": "50000"}])
    );
}

/// Removes the subtree it names from the real cgroup v1 `cpu` hierarchy, children first (an
/// empty cgroup's directory goes with `rmdir`), even when the test fails.
struct RealSubtree(std::path::PathBuf, Vec<&'static str>);

impl Drop for RealSubtree {
    fn drop(&mut self) {
        for rel in self.1.iter().rev() {
            let _ = fs::remove_dir(self.0.join(rel));
        }
        let _ = fs::remove_dir(&self.0);
    }
}

/// On the real cgroup v1 `cpu` hierarchy (as root; skipped elsewhere): the kernel accepts the
/// lifts (pod first) and the restores (containers first) of a pod whose containers' quotas add
/// up to the pod's, and of a container whose quota is the pod's whole, and the originals come
/// back exactly.
#[test]
fn the_real_v1_kernel_accepts_the_lifts_and_the_restores() {
    let mount = Path::new("/sys/fs/cgroup/cpu");
    if !nix::unistd::Uid::effective().is_root() || !mount.join("cpu.cfs_quota_us").exists() {
        println!(
            "skipped: no cgroup v1 cpu hierarchy at {} as root",
            mount.display()
        );
        return;
    }
    let top = format!("cpusetd-quota-{}", std::process::id());
    let root = mount.join(&top);
    let subtree = RealSubtree(root.clone(), vec!["kubepods", POD, APP, SIDE]);
    fs::create_dir(&root).unwrap();
    for rel in &subtree.1 {
        fs::create_dir(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    }
    for (cgroup, quota) in [(POD, "250000"), (APP, "200000"), (SIDE, "50000")] {
        fs::write(root.join(cgroup).join("cpu.cfs_quota_us"), quota).unwrap();
    }
    let fs = CgroupFs::open(&root).unwrap();
    let env = Env {
        cpuset: Some((fs.clone(), CgroupVersion::V1, path("kubepods"))),
        cpu: Some(fs),
        ..env(&root, None)
    };
    let mut quota_lift = effect(&env, &Recorded::default());
    let (app, side, none) = (path(APP), path(SIDE), Isolation::default());
    update(
        quota_lift.as_mut(),
        &[(&app, &none), (&side, &none)],
        false,
        &root,
    );
    let all = || [quota(&root, POD), quota(&root, APP), quota(&root, SIDE)];
    assert_eq!(all(), ["-1", "-1", "-1"]);
    update(quota_lift.as_mut(), &[(&side, &none)], false, &root);
    assert_eq!(all(), ["-1", "200000", "-1"]);
    let restored = quota_lift.restore();
    assert!(restored.errors.is_empty(), "{restored:?}");
    assert_eq!(all(), ["250000", "200000", "50000"]);
    drop(subtree);
    assert!(!root.exists(), "{} left behind", root.display());
}
