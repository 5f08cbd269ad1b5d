use std::fs;
use std::path::Path;

use super::*;
use crate::checkpoint::host::{load_host_record, HostJournal, HOST_FILE};

/// `host.json` exactly as the agent wrote it before the effects had one map (version 1).
const VERSION_1_RECORD: &str = r#"{
  "version": 1,
  "sched": {
    "isolated": "",
    "flags": {},
    "host": {}
  },
  "irq": {
    "banned": "",
    "default_affinity": "ff",
    "irqs": {
      "24": "0-7"
    }
  },
  "power": {
    "latency": {
      "3": "0"
    }
  }
}
"#;

/// A node where an agent of before kept interrupts and the resume latency off cpu 3: IRQ 24
/// and the default mask without it, cpu 3 at `n/a`.
fn changed_node(root: &Path) {
    let irq = root.join("proc/irq");
    fs::create_dir_all(irq.join("24")).unwrap();
    fs::write(irq.join("default_smp_affinity"), "f7\n").unwrap();
    fs::write(irq.join("24/smp_affinity_list"), "0-2,4-7\n").unwrap();
    let cpu = root.join("sys/devices/system/cpu/cpu3/power");
    fs::create_dir_all(&cpu).unwrap();
    fs::write(cpu.join("pm_qos_resume_latency_us"), "n/a\n").unwrap();
}

/// The cgroups as a test knows them: their CPU settings by path; a container's pod is its
/// parent when that is a `pod…` directory.
#[derive(Debug, Default)]
pub(super) struct Known(pub(super) std::collections::BTreeMap<CgroupPath, CpuSettings>);

impl Cgroups for Known {
    fn cpu(&self, path: &CgroupPath) -> Option<&CpuSettings> {
        self.0.get(path)
    }

    fn pod_of(&self, container: &CgroupPath) -> Option<CgroupPath> {
        let parent = container.parent()?;
        let name = parent.to_string();
        let last = name.rsplit('/').next()?;
        last.starts_with("pod").then_some(parent)
    }
}

fn env<'a>(proc_root: &'a Path, sysfs: &'a Path) -> Env<'a> {
    Env {
        proc_root,
        sysfs_root: sysfs,
        cpuset: None,
        cpu: None,
        isolate_host: None,
        journal: None,
        effect_done: None,
    }
}

/// Issue 24: after an upgrade, the originals today's code recorded in `host.json` (a member
/// per effect) are restored through the one list, each file back to what it was.
#[test]
fn the_originals_of_a_version_1_host_record_are_restored_through_the_list() {
    let dir = tempfile::tempdir().unwrap();
    let (proc_root, sysfs) = (dir.path().join("proc"), dir.path().join("sys"));
    changed_node(dir.path());
    let state = dir.path().join("state");
    fs::create_dir_all(&state).unwrap();
    fs::write(state.join(HOST_FILE), VERSION_1_RECORD).unwrap();
    let record = load_host_record(&state).unwrap().unwrap();
    let recorded = Recorded {
        checkpoint: None,
        host: Some(&record.effects),
    };
    let mut effects = build(&env(&proc_root, &sysfs), &recorded);
    let names: Vec<&str> = effects.iter().map(|e| e.name()).collect();
    assert_eq!(names, ["irq", "power"], "no cpuset hierarchy: no sched");
    for effect in &mut effects {
        let restored = effect.restore();
        assert!(restored.errors.is_empty(), "{restored:?}");
    }
    let read = |path: &str| fs::read_to_string(dir.path().join(path)).unwrap();
    assert_eq!(read("proc/irq/default_smp_affinity").trim(), "ff");
    assert_eq!(read("proc/irq/24/smp_affinity_list").trim(), "0-7");
    let latency = "sys/devices/system/cpu/cpu3/power/pm_qos_resume_latency_us";
    assert_eq!(read(latency).trim(), "0");
}

/// What each effect saves is what the checkpoint's map keeps, under its name; the host
/// record's originals win over the checkpoint's (it is never older), the checkpoint's report
/// of what is in force is kept.
#[test]
fn the_host_records_originals_win_and_the_checkpoints_report_stays() {
    let dir = tempfile::tempdir().unwrap();
    let (proc_root, sysfs) = (dir.path().join("proc"), dir.path().join("sys"));
    let checkpoint: EffectState = [(
        "irq".to_string(),
        serde_json::json!({"banned": "3", "in_force": "3", "irqs": {"24": "0-3"}}),
    )]
    .into();
    let host: EffectState = [(
        "irq".to_string(),
        serde_json::json!({"banned": "", "irqs": {"24": "0-7"}}),
    )]
    .into();
    let recorded = Recorded {
        checkpoint: Some(&checkpoint),
        host: Some(&host),
    };
    let effects = build(&env(&proc_root, &sysfs), &recorded);
    let saved = saved(&effects);
    assert_eq!(saved.len(), 1, "{saved:?}");
    assert_eq!(saved["irq"]["irqs"]["24"], "0-7");
    assert_eq!(in_force(&effects).irq, CpuSet::parse("3").unwrap());
}

/// An effect records its originals in `host.json` before it writes (the journal under its
/// name), and takes them out once restored.
#[test]
fn an_effect_records_its_originals_before_writing_and_drops_them_when_restored() {
    let dir = tempfile::tempdir().unwrap();
    let (proc_root, sysfs) = (dir.path().join("proc"), dir.path().join("sys"));
    changed_node(dir.path());
    fs::write(proc_root.join("irq/24/smp_affinity_list"), "0-7\n").unwrap();
    let state = dir.path().join("state");
    let mut env = env(&proc_root, &sysfs);
    env.journal = Some(HostJournal::new(&state, None));
    let mut effects = build(&env, &Recorded::default());
    let topology = Topology::regular(crate::topology::RegularShape {
        sockets: 1,
        numa_nodes_per_socket: 1,
        uncore_caches_per_numa_node: 1,
        cores_per_uncore_cache: 8,
        threads_per_core: 1,
    })
    .unwrap();
    let (isolation, path, cpus) = (
        Isolation {
            no_irqs: true,
            ..Default::default()
        },
        CgroupPath::new("kubepods/pod1/c1").unwrap(),
        CpuSet::parse("3").unwrap(),
    );
    let wanted = Wanted {
        containers: vec![Assigned {
            isolation: &isolation,
            path: &path,
            cpus: &cpus,
        }],
        topology: &topology,
        keep_cfs_quota: false,
        cgroups: None,
    };
    let mut metrics = Metrics::default();
    for effect in &mut effects {
        effect.update(&wanted, false, &mut metrics);
    }
    let record = load_host_record(&state).unwrap().unwrap();
    assert_eq!(record.effects["irq"]["irqs"]["24"], "0-7", "{record:?}");
    assert_eq!(metrics.irq_isolated_cpus, 1);
    let none = Wanted {
        containers: Vec::new(),
        topology: &topology,
        keep_cfs_quota: false,
        cgroups: None,
    };
    for effect in &mut effects {
        effect.update(&none, false, &mut metrics);
    }
    let record = load_host_record(&state).unwrap().unwrap();
    assert!(!record.effects.contains_key("irq"), "{record:?}");
}

#[test]
fn the_effects_are_asked_for_the_isolated_containers_that_hold_exclusive_cpus() {
    use crate::state::{AssignmentKey, Assignments, ExclusiveAssignment};
    let topology = Topology::regular(crate::topology::RegularShape {
        sockets: 1,
        numa_nodes_per_socket: 1,
        uncore_caches_per_numa_node: 1,
        cores_per_uncore_cache: 4,
        threads_per_core: 1,
    })
    .unwrap();
    let key = |c: &str| AssignmentKey::Named {
        pod_uid: "u".to_string(),
        container: c.to_string(),
    };
    let isolation = Isolation {
        no_irqs: true,
        ..Isolation::default()
    };
    let path = CgroupPath::new("kubepods/podu/c").unwrap();
    let isolated = HashMap::from([
        (key("pinned"), (isolation, path.clone())),
        (key("shared"), (isolation, path.clone())),
    ]);
    let mut assignments = Assignments::default();
    let held = ExclusiveAssignment {
        cpus: CpuSet::parse("2-3").unwrap(),
        container_id: None,
        adopted: None,
        wanted: None,
    };
    assignments.insert(key("pinned"), held).unwrap();
    let known = Known::default();
    let wanted = Wanted::of(&isolated, &assignments, &topology, false, &known);
    assert_eq!(wanted.containers.len(), 1);
    let only = wanted.containers[0];
    assert_eq!(
        (only.path, only.cpus),
        (&path, &CpuSet::parse("2-3").unwrap())
    );
    assert!(only.isolation.no_irqs);
}
