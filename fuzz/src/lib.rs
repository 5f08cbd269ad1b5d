//! The properties the fuzz targets check, one function per target, each taking the raw input and
//! panicking when a property fails. `fuzz_targets/*.rs` hand libFuzzer's input to them; the main
//! test suite includes this file (`tests/fuzz_replay.rs`) and replays the committed corpus and
//! every regression input through the same functions, so CI needs no fuzzing toolchain.
//!
//! Structured inputs (cgroup trees, settings, annotations) are decoded from the bytes with
//! `arbitrary::Unstructured`, so a replayed file means exactly what it meant to the fuzzer.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use arbitrary::{Result, Unstructured};
use cpusetd::allocator::{PolicyOptions, ReservedCpus, StaticPolicy};
use cpusetd::cgroupfs::{
    CgroupDriver, CgroupPath, CgroupVersion, CpuMax, CpuSettings, FileValue, InterfaceFile, Quota,
    Scan, ScannedCgroup, ValueError,
};
use cpusetd::checkpoint::{kubelet_state, Checkpoint};
use cpusetd::classify::{
    classify_scan, parse_path, CgroupKind, CgroupNaming, Classification, Exclusivity, QosClass,
    EXCLUSIVE_ANNOTATION, EXCLUSIVE_CONTAINER_ANNOTATION_PREFIX,
};
use cpusetd::cpuset::{CpuSet, MAX_CPU_ID};
use cpusetd::devices::MAX_DEVICES;
use cpusetd::irq::{format_mask, parse_mask};
use cpusetd::irqbalance::{parse_setup, parse_start_time};
use cpusetd::planner::{plan, NestingChecker, Plan, PlanConfig, SetNode, WriteStep};
use cpusetd::runtime::{keys, parse_config, OciCpu, RuntimeInfo};
use cpusetd::state::Assignments;
use cpusetd::topology::{RegularShape, Topology};

/// CPU lists: whatever parses prints in a canonical form that parses back to the same set, and
/// sets built from ids survive printing and parsing.
pub fn cpu_list(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(set) = CpuSet::parse(&text) {
        let shown = set.to_string();
        let again = CpuSet::parse(&shown)
            .unwrap_or_else(|e| panic!("{text:?} parsed, but its form {shown:?} does not: {e}"));
        assert_eq!(again, set, "{text:?} → {shown:?}");
        assert_eq!(
            again.to_string(),
            shown,
            "the printed form is not canonical"
        );
        assert_eq!(set.iter().count(), set.len());
        assert!(set.last().is_none_or(|id| id <= MAX_CPU_ID));
        assert!(!shown.contains(char::is_whitespace), "{shown:?}");
    }
    // The same bytes as a list of ids.
    let ids: BTreeSet<u32> = data
        .chunks(2)
        .map(|pair| u32::from(pair[0]) << 8 | u32::from(*pair.get(1).unwrap_or(&0)))
        .map(|id| id % (MAX_CPU_ID + 1))
        .collect();
    let set: CpuSet = ids.iter().copied().collect();
    assert_eq!(set.len(), ids.len());
    let parsed = CpuSet::parse(&set.to_string()).expect("a printed set parses");
    assert_eq!(parsed, set);
    assert_eq!(parsed.iter().collect::<BTreeSet<u32>>(), ids);
}

/// Classification of arbitrary paths, settings and runtime configs: never panics, agrees with
/// the path parser, and never gives exclusive CPUs beyond kubelet's rule (a Guaranteed, non
/// sandbox container with a whole number of CPUs) or against an opt-out annotation.
pub fn classify(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let _ = classify_case(&mut u);
}

fn classify_case(u: &mut Unstructured<'_>) -> Result<()> {
    let systemd: bool = u.arbitrary()?;
    let (driver, kubepods) = if systemd {
        (CgroupDriver::Systemd, "kubepods.slice")
    } else {
        (CgroupDriver::Cgroupfs, "kubepods")
    };
    let naming = CgroupNaming::new(driver, &CgroupPath::new(kubepods).unwrap());
    let uid = pod_uid(u.int_in_range(0..=255)?);
    let id = container_id(u.int_in_range(0..=255)?);
    let depth = u.int_in_range(0..=5)?;
    let mut relative = CgroupPath::root();
    for level in 0..depth {
        let name = path_component(u, systemd, level, &uid, &id)?;
        match relative.join(OsStr::from_bytes(&name)) {
            Ok(joined) => relative = joined,
            Err(_) => return Ok(()),
        }
    }
    let settings = if u.arbitrary()? {
        CpuSettings::V1 {
            shares: file_value(u, |u| u.arbitrary())?,
            cfs_quota: file_value(u, |u| {
                Ok(if u.arbitrary()? {
                    Quota::Unlimited
                } else {
                    Quota::Micros(u.arbitrary()?)
                })
            })?,
            cfs_period_us: file_value(u, |u| u.arbitrary())?,
        }
    } else {
        CpuSettings::V2 {
            max: file_value(u, |u| {
                Ok(CpuMax {
                    quota: if u.arbitrary()? {
                        Quota::Unlimited
                    } else {
                        Quota::Micros(u.arbitrary()?)
                    },
                    period_us: u.arbitrary()?,
                })
            })?,
            weight: file_value(u, |u| u.arbitrary())?,
        }
    };
    let runtime = if u.arbitrary()? {
        Some(runtime_info(u, &uid)?)
    } else {
        None
    };

    let path = parse_path(&naming, &relative);
    let class = cpusetd::classify::classify(&naming, &relative, &settings, runtime.as_ref());
    let _ = (class.to_string_all(), class.assignment_key());
    match (&path.kind, &class.kind) {
        (CgroupKind::Container, CgroupKind::Sandbox) => {}
        (a, b) => assert_eq!(a, b, "classify and parse_path disagree on {relative}"),
    }
    assert_eq!(path.qos, class.qos);
    assert_eq!(path.container_id, class.container_id);
    if let Exclusivity::Exclusive { cpus } = class.exclusivity {
        assert!(cpus >= 1);
        assert_eq!(class.kind, CgroupKind::Container);
        assert_eq!(class.qos, Some(QosClass::Guaranteed), "{relative}");
        assert!(class.resources.is_some());
        if let Some(info) = &runtime {
            let mut keys = vec![EXCLUSIVE_ANNOTATION.to_string()];
            if let Some(name) = info.container_name() {
                keys.push(format!("{EXCLUSIVE_CONTAINER_ANNOTATION_PREFIX}{name}"));
            }
            for key in keys {
                let value = info.annotation(&key).map(str::trim);
                assert!(
                    !value.is_some_and(|v| v.eq_ignore_ascii_case("false")),
                    "{key}=false did not keep {relative} shared"
                );
            }
            assert_ne!(info.is_sandbox(), Some(true));
        }
    }
    Ok(())
}

/// Displays every part of a classification (the strings an operator reads).
trait ShowAll {
    fn to_string_all(&self) -> String;
}

impl ShowAll for Classification {
    fn to_string_all(&self) -> String {
        let mut out = format!("{} {:?}", self.kind, self.exclusivity);
        if let Exclusivity::Shared { reason } = &self.exclusivity {
            out.push_str(&reason.to_string());
        }
        for notice in &self.notices {
            out.push_str(&notice.to_string());
        }
        out
    }
}

/// A pod UID (UUID form), distinct per `n`.
fn pod_uid(n: u8) -> String {
    format!("1a2b3c4d-0000-4000-8000-0000000000{n:02x}")
}

/// A 64-hex container id, distinct per `n`.
fn container_id(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

/// One component of a path below the kubepods root: mostly what kubelet and the runtimes name
/// at that level, sometimes near misses, sometimes arbitrary bytes.
fn path_component(
    u: &mut Unstructured<'_>,
    systemd: bool,
    level: usize,
    uid: &str,
    id: &str,
) -> Result<Vec<u8>> {
    let kind: u8 = u.int_in_range(0..=9)?;
    let qos = *u.choose(&["burstable", "besteffort"])?;
    let name = match (kind, systemd) {
        (0..=2, _) if level == 0 && kind == 0 => {
            if systemd {
                format!("kubepods-{qos}.slice")
            } else {
                qos.to_string()
            }
        }
        (0..=3, false) if level <= 1 => format!("pod{uid}"),
        (0..=3, true) if level <= 1 => {
            let escaped = uid.replace('-', "_");
            if level == 0 {
                format!("kubepods-pod{escaped}.slice")
            } else {
                format!("kubepods-{qos}-pod{escaped}.slice")
            }
        }
        (0..=5, false) => {
            if u.arbitrary()? {
                format!("crio-{id}")
            } else {
                id.to_string()
            }
        }
        (0..=5, true) => {
            let prefix = *u.choose(&["cri-containerd-", "crio-", "docker-", "crio-conmon-"])?;
            format!("{prefix}{id}.scope")
        }
        (6, _) => {
            // A near miss: one byte of a plausible name changed.
            let mut name = format!("pod{uid}").into_bytes();
            let at = u.choose_index(name.len())?;
            name[at] = u.arbitrary()?;
            return Ok(name);
        }
        _ => {
            let len = u.int_in_range(0..=300)?;
            return u.bytes(len.min(u.len())).map(<[u8]>::to_vec);
        }
    };
    Ok(name.into_bytes())
}

/// A scanned file value: missing, a value, invalid text, or unreadable.
fn file_value<T>(
    u: &mut Unstructured<'_>,
    value: impl FnOnce(&mut Unstructured<'_>) -> Result<T>,
) -> Result<FileValue<T>> {
    Ok(match u.int_in_range(0..=5)? {
        0 => FileValue::Missing,
        1 => FileValue::Invalid {
            text: u.arbitrary()?,
            error: Box::new(ValueError::NotANumber {
                text: String::new(),
            }),
        },
        2 => FileValue::Unreadable {
            error: u.arbitrary()?,
        },
        _ => FileValue::Value(value(u)?),
    })
}

/// A runtime view with annotations drawn from the keys that matter and arbitrary values.
fn runtime_info(u: &mut Unstructured<'_>, uid: &str) -> Result<RuntimeInfo> {
    let mut info = RuntimeInfo::default();
    let names = ["app", "db", "", "sidecar"];
    let n = u.int_in_range(0..=8)?;
    for _ in 0..n {
        let key = match u.int_in_range(0..=8)? {
            0 => keys::CRI_CONTAINER_TYPE.to_string(),
            1 => keys::CRIO_CONTAINER_TYPE.to_string(),
            2 => keys::CRI_CONTAINER_NAME.to_string(),
            3 => keys::CRI_SANDBOX_UID.to_string(),
            4 => EXCLUSIVE_ANNOTATION.to_string(),
            5 => format!(
                "{EXCLUSIVE_CONTAINER_ANNOTATION_PREFIX}{}",
                u.choose(&names)?
            ),
            6 => keys::KUBE_CONTAINER_NAME.to_string(),
            _ => u.arbitrary()?,
        };
        let value = match u.int_in_range(0..=9)? {
            0 => "true".to_string(),
            1 => " FALSE ".to_string(),
            2 => "false".to_string(),
            3 => keys::SANDBOX.to_string(),
            4 => keys::CONTAINER.to_string(),
            5 => uid.to_string(),
            6 | 7 => u.choose(&names)?.to_string(),
            _ => u.arbitrary()?,
        };
        let target = match u.int_in_range(0..=2)? {
            0 => &mut info.annotations,
            1 => &mut info.crio_annotations,
            _ => &mut info.crio_labels,
        };
        target.insert(key, value);
    }
    info.cpu = OciCpu {
        shares: u.arbitrary()?,
        quota: u.arbitrary()?,
        period: u.arbitrary()?,
    };
    Ok(info)
}

/// OCI `config.json` parsing: never panics, keeps exactly the string-valued annotations and at
/// most `MAX_DEVICES` distinct devices, and accepts every JSON object (wrong-typed members are
/// dropped, not fatal).
pub fn runtime_config(data: &[u8]) {
    let parsed = parse_config(data);
    let document: Option<serde_json::Value> = serde_json::from_slice(data).ok();
    let Some(serde_json::Value::Object(object)) = document else {
        return;
    };
    let info = match parsed {
        Ok(info) => info,
        Err(e) => panic!("a JSON object was refused: {e}"),
    };
    let expected: BTreeMap<String, String> = match object.get("annotations") {
        Some(serde_json::Value::Object(map)) => map
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect(),
        _ => BTreeMap::new(),
    };
    assert_eq!(info.annotations, expected);
    let _ = (info.container_name(), info.pod_uid(), info.is_sandbox());
    // Devices: bounded, each once, none located by parsing alone.
    assert!(info.devices.len() <= MAX_DEVICES, "{}", info.devices.len());
    for (i, device) in info.devices.iter().enumerate() {
        assert!(device.numa.is_empty());
        assert!(!info.devices[..i].iter().any(|d| d.id == device.id));
    }
}

/// Checkpoints: whatever loads saves and loads back to the same value, with overlap-free
/// assignments; kubelet's `cpu_manager_state` parses or is refused without a panic.
pub fn checkpoint(data: &[u8]) {
    if let Ok(checkpoint) = Checkpoint::from_json(data) {
        let bytes = checkpoint
            .to_json()
            .expect("a loaded checkpoint serialises");
        let again = Checkpoint::from_json(&bytes)
            .unwrap_or_else(|e| panic!("a saved checkpoint does not load: {e}"));
        assert_eq!(again, checkpoint);
        assert_overlap_free(&checkpoint.assignments);
        let _ = checkpoint.cpus_outside(&CpuSet::range(0, 7));
    }
    if let Ok(state) = kubelet_state::parse(data) {
        let adopted = state.assignments(|_| true);
        assert_overlap_free(&adopted.assignments);
        let kept = adopted.assignments.len() + adopted.refused.len();
        assert_eq!(kept, state.entries.len());
    }
}

fn assert_overlap_free(assignments: &Assignments) {
    let total: usize = assignments.iter().map(|(_, a)| a.cpus.len()).sum();
    assert_eq!(
        total,
        assignments.exclusive_cpus().len(),
        "two assignments share a cpu"
    );
}

/// The planner on random trees over random topologies, in two rounds (pods come and go,
/// containers restart under the same name, quotas are lifted in between): every write of each
/// plan is one cgroup v1 accepts (child ⊆ parent after every single write, never empty), no
/// container ends up on a CPU that is neither its exclusive set nor the shared pool, the shared
/// pool is never empty, and planning again from the result writes nothing.
pub fn planner(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let _ = planner_case(&mut u);
}

/// One pod of a generated tree.
#[derive(Debug, Clone)]
struct GenPod {
    uid: String,
    qos: QosClass,
    /// 0: in both rounds; 1: only the first (deleted); 2: only the second (new).
    life: u8,
    containers: Vec<GenContainer>,
}

#[derive(Debug, Clone)]
struct GenContainer {
    id: String,
    /// The id after a restart in round two, if it restarts.
    restarted_id: Option<String>,
    name: Option<String>,
    sandbox: bool,
    request: Option<u64>,
    limit: Option<u64>,
    /// The shares file is unreadable (the settings cannot be known).
    unreadable: bool,
    opted_out: bool,
    child: bool,
}

/// A node of the generated tree, before its current values are chosen.
struct GenNode {
    relative: CgroupPath,
    parent: Option<usize>,
    cpu: CpuSettings,
    /// Choice of current value: 0 uninitialised, 1 the parent's, else a subset.
    pick: u8,
    mask: u64,
    mems_mask: u64,
    runtime: Option<(String, RuntimeInfo)>,
}

fn planner_case(u: &mut Unstructured<'_>) -> Result<()> {
    let shape = RegularShape {
        sockets: u.int_in_range(1..=2)?,
        numa_nodes_per_socket: u.int_in_range(1..=2)?,
        uncore_caches_per_numa_node: 1,
        cores_per_uncore_cache: u.int_in_range(1..=3)?,
        threads_per_core: u.int_in_range(1..=2)?,
    };
    let Ok(topology) = Topology::regular(shape) else {
        return Ok(());
    };
    let options = *u.choose(&[
        "",
        "full-pcpus-only=true",
        "distribute-cpus-across-numa=true",
        "strict-cpu-reservation=true",
        "full-pcpus-only=true,strict-cpu-reservation=true",
        "distribute-cpus-across-cores=true",
    ])?;
    let Ok(options) = PolicyOptions::parse(options) else {
        return Ok(());
    };
    let reserved = u.int_in_range(1..=2)?;
    let Ok(policy) = StaticPolicy::new(&topology, options, ReservedCpus::Count(reserved), false)
    else {
        return Ok(());
    };
    let align_memory = u.arbitrary()?;
    // Was `keep_cfs_quota` (the quota lift is no plan step now): still read, so the committed
    // corpus decodes as it did.
    let _keep_cfs_quota: bool = u.arbitrary()?;
    let config = PlanConfig {
        topology: &topology,
        policy: Some(&policy),
        align_memory,
        limits: None,
        respect_isolcpus: false,
    };

    let mut pods = Vec::new();
    for p in 0..u.int_in_range(0..=6)? {
        let qos = *u.choose(&[
            QosClass::Guaranteed,
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ])?;
        let mut containers = vec![GenContainer {
            id: container_id(p * 16),
            restarted_id: None,
            name: Some("POD".into()),
            sandbox: true,
            request: None,
            limit: None,
            unreadable: false,
            opted_out: false,
            child: false,
        }];
        for c in 1..=u.int_in_range(0..=3u8)? {
            let request = *u.choose(&[
                None,
                Some(500),
                Some(1000),
                Some(1500),
                Some(2000),
                Some(3000),
            ])?;
            let limit = match qos {
                QosClass::Guaranteed => request,
                _ => *u.choose(&[None, request, Some(4000)])?,
            };
            containers.push(GenContainer {
                id: container_id(p * 16 + c),
                restarted_id: u.ratio(1, 4)?.then(|| container_id(p * 16 + c + 8)),
                name: if u.ratio(1, 6)? {
                    None
                } else {
                    Some(u.choose(&["app", "db", "app"])?.to_string())
                },
                sandbox: false,
                request: if qos == QosClass::BestEffort {
                    None
                } else {
                    request
                },
                limit: if qos == QosClass::BestEffort {
                    None
                } else {
                    limit
                },
                unreadable: u.ratio(1, 12)?,
                opted_out: u.ratio(1, 8)?,
                child: u.ratio(1, 6)?,
            });
        }
        pods.push(GenPod {
            uid: pod_uid(p),
            qos,
            life: u.int_in_range(0..=2)?,
            containers,
        });
    }

    // Round one.
    let nodes = build_tree(u, &pods, 1)?;
    let scan = scan_of(&nodes, &topology, |_, _| None);
    let (plan1, finals1, settings1) = check_round(&scan, &nodes, &Assignments::new(), &config);

    // Round two: keep what round one wrote for the cgroups that stay.
    let written: BTreeMap<CgroupPath, (CpuSet, CpuSet, CpuSettings)> = scan
        .cgroups
        .iter()
        .zip(finals1)
        .zip(settings1)
        .map(|((c, (cpus, mems)), cpu)| (c.relative.clone(), (cpus, mems, cpu)))
        .collect();
    let nodes = build_tree(u, &pods, 2)?;
    let scan = scan_of(&nodes, &topology, |relative, _| {
        written.get(relative).cloned()
    });
    check_round(&scan, &nodes, &plan1.assignments, &config);
    Ok(())
}

/// The cgroups of one round: kubepods, the QoS directories, and the pods alive in the round.
fn build_tree(u: &mut Unstructured<'_>, pods: &[GenPod], round: u8) -> Result<Vec<GenNode>> {
    let mut nodes: Vec<GenNode> = Vec::new();
    let mut add = |u: &mut Unstructured<'_>,
                   relative: &str,
                   parent: Option<usize>,
                   cpu: CpuSettings,
                   runtime: Option<(String, RuntimeInfo)>|
     -> Result<usize> {
        nodes.push(GenNode {
            relative: CgroupPath::new(relative).unwrap(),
            parent,
            cpu,
            pick: u.int_in_range(0..=4)?,
            mask: u.arbitrary()?,
            mems_mask: u.arbitrary()?,
            runtime,
        });
        Ok(nodes.len() - 1)
    };
    let settings = |request: Option<u64>, limit: Option<u64>, unreadable: bool| CpuSettings::V1 {
        shares: if unreadable {
            FileValue::Unreadable {
                error: "permission denied".into(),
            }
        } else {
            FileValue::Value(cpusetd::classify::milli_to_shares(request.unwrap_or(0)))
        },
        cfs_quota: FileValue::Value(match limit {
            Some(l) => Quota::Micros(l * 100),
            None => Quota::Unlimited,
        }),
        cfs_period_us: FileValue::Value(100_000),
    };
    let root = add(u, "", None, settings(None, None, false), None)?;
    let burstable = add(
        u,
        "burstable",
        Some(root),
        settings(None, None, false),
        None,
    )?;
    let besteffort = add(
        u,
        "besteffort",
        Some(root),
        settings(None, None, false),
        None,
    )?;
    for pod in pods {
        let alive = match pod.life {
            1 => round == 1,
            2 => round == 2,
            _ => true,
        };
        if !alive {
            continue;
        }
        let (dir, parent) = match pod.qos {
            QosClass::Guaranteed => (format!("pod{}", pod.uid), root),
            QosClass::Burstable => (format!("burstable/pod{}", pod.uid), burstable),
            QosClass::BestEffort => (format!("besteffort/pod{}", pod.uid), besteffort),
        };
        let pod_index = add(u, &dir, Some(parent), settings(None, None, false), None)?;
        for c in &pod.containers {
            let id = match (&c.restarted_id, round) {
                (Some(id), 2) => id,
                _ => &c.id,
            };
            let mut info = RuntimeInfo::default();
            let annotations = &mut info.annotations;
            annotations.insert(
                keys::CRI_CONTAINER_TYPE.into(),
                if c.sandbox {
                    keys::SANDBOX
                } else {
                    keys::CONTAINER
                }
                .into(),
            );
            annotations.insert(keys::CRI_SANDBOX_UID.into(), pod.uid.clone());
            if let Some(name) = &c.name {
                annotations.insert(keys::CRI_CONTAINER_NAME.into(), name.clone());
            }
            if c.opted_out {
                annotations.insert(EXCLUSIVE_ANNOTATION.into(), "false".into());
            }
            // Annotations can only narrow: asking for more changes nothing.
            annotations.insert(
                format!(
                    "{EXCLUSIVE_CONTAINER_ANNOTATION_PREFIX}{}",
                    c.name.as_deref().unwrap_or("")
                ),
                "true".into(),
            );
            info.cpu = OciCpu {
                shares: Some(cpusetd::classify::milli_to_shares(c.request.unwrap_or(0))),
                quota: c.limit.map(|l| (l * 100) as i64),
                period: Some(100_000),
            };
            let runtime = (!c.unreadable || c.name.is_some()).then(|| (id.clone(), info));
            let container = add(
                u,
                &format!("{dir}/{id}"),
                Some(pod_index),
                settings(c.request, c.limit, c.unreadable),
                runtime,
            )?;
            if c.child {
                add(
                    u,
                    &format!("{dir}/{id}/sub"),
                    Some(container),
                    settings(None, None, false),
                    None,
                )?;
            }
        }
    }
    Ok(nodes)
}

/// A v1 scan of the generated nodes. Current values come from `known` (what an earlier round
/// left) or are chosen: uninitialised, the parent's (runc copies it), or a subset of it.
fn scan_of(
    nodes: &[GenNode],
    topology: &Topology,
    known: impl Fn(&CgroupPath, usize) -> Option<(CpuSet, CpuSet, CpuSettings)>,
) -> Scan {
    let all = topology.all_cpus().clone();
    let all_mems = topology.memory_nodes().clone();
    let mut cgroups: Vec<ScannedCgroup> = Vec::new();
    let subset = |mask: u64, within: &CpuSet| -> CpuSet {
        let picked: CpuSet = within
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << (i % 64)) != 0)
            .map(|(_, id)| id)
            .collect();
        if picked.is_empty() {
            within.clone()
        } else {
            picked
        }
    };
    for (i, node) in nodes.iter().enumerate() {
        let parent = node.parent.map(|p| {
            (
                cgroups[p].cpus.value().cloned().unwrap_or_default(),
                cgroups[p].mems.value().cloned().unwrap_or_default(),
            )
        });
        let (cpus, mems, cpu) = match (known(&node.relative, i), &parent) {
            (Some((cpus, mems, cpu)), _) => (cpus, mems, cpu),
            (None, None) => (all.clone(), all_mems.clone(), node.cpu.clone()),
            (None, Some((pc, pm))) => {
                if pc.is_empty() || node.pick == 0 {
                    (CpuSet::new(), CpuSet::new(), node.cpu.clone())
                } else if node.pick == 1 {
                    (pc.clone(), pm.clone(), node.cpu.clone())
                } else {
                    (
                        subset(node.mask, pc),
                        subset(node.mems_mask, pm),
                        node.cpu.clone(),
                    )
                }
            }
        };
        // A value must nest in the parent's (the kernel guarantees it).
        let (cpus, mems) = match &parent {
            Some((pc, pm)) if !cpus.is_subset(pc) || !mems.is_subset(pm) || pc.is_empty() => {
                (CpuSet::new(), CpuSet::new())
            }
            _ => (cpus, mems),
        };
        cgroups.push(ScannedCgroup {
            path: CgroupPath::new("kubepods").unwrap().concat(&node.relative),
            relative: node.relative.clone(),
            effective_cpus: FileValue::Value(cpus.clone()),
            cpus: FileValue::Value(cpus),
            mems: FileValue::Value(mems),
            cpu,
        });
    }
    Scan {
        inherits: false,
        version: CgroupVersion::V1,
        kubepods: CgroupPath::new("kubepods").unwrap(),
        cgroups,
        skipped: Vec::new(),
        complete: true,
        truncated: false,
        gone_pods: Default::default(),
    }
}

/// Plans `scan`, checks the plan, and returns it with every cgroup's values after its writes.
fn check_round(
    scan: &Scan,
    nodes: &[GenNode],
    previous: &Assignments,
    config: &PlanConfig<'_>,
) -> (Plan, Vec<(CpuSet, CpuSet)>, Vec<CpuSettings>) {
    let naming = CgroupNaming::new(CgroupDriver::Cgroupfs, &scan.kubepods);
    let runtime: BTreeMap<&str, &RuntimeInfo> = nodes
        .iter()
        .filter_map(|n| n.runtime.as_ref().map(|(id, info)| (id.as_str(), info)))
        .collect();
    let lookup = |id: &str| runtime.get(id).map(|info| (*info).clone());
    let classes = classify_scan(&naming, scan, lookup);
    let planned = plan(scan, &classes, previous, config);
    let finals = replay(scan, &planned);

    let pools = planned.pools.as_ref().expect("static policy");
    let policy = config.policy.expect("static policy");
    assert!(
        !pools.shared.is_empty(),
        "the shared pool is empty: cpus {}, reserved {}, options {}, pools {pools:?}, assignments {:?}",
        config.topology.all_cpus(),
        policy.reserved(),
        policy.options(),
        planned.assignments
    );
    assert_overlap_free(&planned.assignments);
    let exclusive = planned.assignments.exclusive_cpus();
    assert!(exclusive.is_subset(&pools.pod_cpus));
    assert!(exclusive.is_disjoint(&pools.shared));

    for (i, (cgroup, class)) in scan.cgroups.iter().zip(&classes).enumerate() {
        let own = class
            .assignment_key()
            .and_then(|k| planned.assignments.get(&k))
            .map(|a| a.cpus.clone());
        let now = &finals[i].0;
        match class.kind {
            CgroupKind::Container | CgroupKind::Sandbox => {
                if let Some(own) = &own {
                    assert_eq!(class.qos, Some(QosClass::Guaranteed), "{}", cgroup.relative);
                    assert_eq!(now, own, "{} is not on its exclusive cpus", cgroup.relative);
                } else {
                    assert!(
                        now.is_subset(&pools.shared),
                        "{} (shared) sits on {now}, outside the shared pool {}",
                        cgroup.relative,
                        pools.shared
                    );
                }
            }
            CgroupKind::ContainerChild => {
                let parent = planned.parents[i].expect("a child has a parent");
                assert!(now.is_subset(&finals[parent].0));
            }
            _ => {}
        }
    }

    // Planning again from what the writes left changes nothing.
    let mut after = scan.clone();
    let mut settings = Vec::new();
    for (i, cgroup) in after.cgroups.iter_mut().enumerate() {
        cgroup.cpus = FileValue::Value(finals[i].0.clone());
        cgroup.mems = FileValue::Value(finals[i].1.clone());
        if planned
            .writes
            .iter()
            .any(|w| w.path == cgroup.path && w.step == WriteStep::LiftQuota)
        {
            if let CpuSettings::V1 { cfs_quota, .. } = &mut cgroup.cpu {
                *cfs_quota = FileValue::Value(Quota::Unlimited);
            }
        }
        settings.push(cgroup.cpu.clone());
    }
    let classes = classify_scan(&naming, &after, lookup);
    let again = plan(&after, &classes, &planned.assignments, config);
    let rewrites: Vec<_> = again
        .writes
        .iter()
        .filter(|w| w.step != WriteStep::LiftQuota)
        .collect();
    assert_eq!(
        again.assignments, planned.assignments,
        "a second plan changes the assignments: {:?}\nfirst: {:?}",
        again.events, planned.events
    );
    assert!(
        rewrites.is_empty(),
        "a second plan still writes {rewrites:?}"
    );
    (planned, finals, settings)
}

/// Replays the plan's cpuset writes through cgroup v1's rules; every one must be accepted.
/// Returns each cgroup's `cpuset.cpus` and `cpuset.mems` afterwards.
fn replay(scan: &Scan, planned: &Plan) -> Vec<(CpuSet, CpuSet)> {
    let node = |file: InterfaceFile| -> Vec<SetNode> {
        scan.cgroups
            .iter()
            .zip(&planned.parents)
            .map(|(c, p)| SetNode {
                parent: *p,
                current: match file {
                    InterfaceFile::CpusetCpus => c.cpus.value().cloned().unwrap_or_default(),
                    _ => c.mems.value().cloned().unwrap_or_default(),
                },
                desired: CpuSet::new(),
            })
            .collect()
    };
    let mut checkers = [
        NestingChecker::new(&node(InterfaceFile::CpusetCpus)),
        NestingChecker::new(&node(InterfaceFile::CpusetMems)),
    ];
    for write in &planned.writes {
        let checker = match write.file {
            InterfaceFile::CpusetCpus => &mut checkers[0],
            InterfaceFile::CpusetMems => &mut checkers[1],
            _ => continue,
        };
        let value = CpuSet::parse(&write.value).expect("a planned value parses");
        let node = scan.cgroups.iter().position(|c| c.path == write.path);
        if let Err(e) = checker.write(node.expect("a planned cgroup is scanned"), &value) {
            panic!(
                "the kernel would refuse {} {} = {}: {e}\nplan: {:#?}",
                write.path, write.file, write.value, planned.writes
            );
        }
    }
    (0..scan.cgroups.len())
        .map(|i| (checkers[0].value(i).clone(), checkers[1].value(i).clone()))
        .collect()
}

/// irqbalance's protocol, whatever the daemon (or whoever holds its socket) sends: a `setup`
/// answer gives an error or the banned cpus its mask says, within the cpu ids; a
/// `/proc/<pid>/stat` line gives an error or its 22nd field. Never a panic (issue 23 item 3:
/// a mask past cpu 8191 panicked at every start).
pub fn irqbalance(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match parse_setup(&text) {
        Ok(banned) => {
            assert!(banned.last().is_none_or(|id| id <= MAX_CPU_ID));
            let mut words = text.split_whitespace();
            assert!(words.any(|w| w == "BANNED"), "{text:?} has no BANNED");
            let mask = words.next().expect("a mask after BANNED");
            assert_eq!(parse_mask(mask).as_ref(), Ok(&banned), "{text:?}");
        }
        Err(e) => assert!(!e.is_empty()),
    }
    if let Ok(started) = parse_start_time(&text) {
        let after = &text[text.rfind(')').expect("a command in parentheses") + 1..];
        let field = after
            .split_ascii_whitespace()
            .nth(19)
            .expect("a 22nd field");
        assert_eq!(field.parse::<u64>(), Ok(started), "{text:?}");
    }
}

/// `/proc/irq` files as the agent reads them, whatever they hold: a `default_smp_affinity`
/// mask parses to cpus within the ids or to an error (never a panic, however many digits),
/// and prints back, in its own shape or the shortest, to the same cpus; an `smp_affinity_list`
/// is a cpu list (an error or a set).
pub fn proc_irq(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let trimmed = text.trim();
    if let Ok(cpus) = parse_mask(trimmed) {
        assert!(cpus.last().is_none_or(|id| id <= MAX_CPU_ID));
        let shaped = format_mask(&cpus, trimmed);
        assert_eq!(
            parse_mask(&shaped).as_ref(),
            Ok(&cpus),
            "{trimmed:?} → {shaped:?}"
        );
        if !trimmed.contains(',') {
            assert!(shaped.len() >= trimmed.len(), "{trimmed:?} → {shaped:?}");
        }
        let shortest = format_mask(&cpus, "0");
        assert_eq!(parse_mask(&shortest).as_ref(), Ok(&cpus), "{shortest:?}");
    }
    if let Ok(list) = CpuSet::parse(trimmed) {
        assert!(list.last().is_none_or(|id| id <= MAX_CPU_ID));
        assert_eq!(
            parse_mask(&format_mask(&list, "00000000,00000000")),
            Ok(list)
        );
    }
}
