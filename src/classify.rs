//! Classification: what a cgroup under the kubepods root is (the root, a QoS directory, a pod, a
//! container, a pod sandbox, a cgroup a container made itself, or unknown), which pod and QoS
//! class it belongs to, its CPU request and limit, and whether it gets exclusive CPUs.
//!
//! Pure: it takes a cgroup's path relative to the kubepods root, its scanned CPU settings and
//! the runtime's view of the container (when its OCI `config.json` was found) and returns a
//! value. The path table is DESIGN.md §3 for both kubelet cgroup drivers. CPU request and limit
//! come from the most exact source: the OCI config's `linux.resources.cpu` (what kubelet sent),
//! then v1 `cpu.shares` + `cpu.cfs_quota_us`/`cpu.cfs_period_us`, then v2 `cpu.weight` +
//! `cpu.max`. kubelet's conversions are inverted exactly where they can be: shares =
//! milli × 1024 / 1000 (at least 2) is strictly increasing, so shares give the request exactly;
//! quota = milli × period / 1000 gives the limit exactly for periods of at least 1 ms. v2's
//! weight is lossy (runc before 1.3.2 maps shares to weight linearly, later runc and crun ≥ 1.23
//! by a quadratic in log2(shares); both are accepted): it yields a range of requests, and when
//! that range cannot settle whether the request is a whole number of CPUs, a Guaranteed
//! container's exact `cpu.max` limit settles it (limit = request in a Guaranteed pod) when it is
//! consistent with the weight; otherwise the container stays shared and a notice says why.
//! The config keeps the values a container was created with: after an in-place resize the
//! cgroup is the truth, and the agent's controller (which sees the cgroup change after it once
//! matched the config, [`config_matches_cgroup`]) classifies without the config's CPU values.
//!
//! A container gets N exclusive CPUs when its pod is Guaranteed, it is not a sandbox, and its
//! request is a whole N ≥ 1 CPUs — kubelet's static policy rule — unless its pod's CPU is set
//! at pod level (KEP-2837), which only the whole pod shows ([`pod_level_pods`], applied by
//! [`classify_scan`] and the agent's passes). Annotations can only narrow
//! this: `cpusetd.io/exclusive: "false"` (pod) or `cpusetd.io/exclusive.<container-name>:
//! "false"` keeps a container shared. Sandboxes are known from the runtime's container-type
//! annotation; without a runtime config, a container of a Guaranteed pod with kubelet's minimum
//! shares (2, v2 weight 1) and no CPU limit is taken to be the pause container — that guess
//! only affects the label, since such a container never has a whole CPU. Malformed names
//! classify as unknown with a reason; nothing here panics on input.

use std::collections::BTreeMap;
use std::fmt;

use crate::cgroupfs::{
    CgroupDriver, CgroupPath, CpuSettings, FileValue, Quota, Scan, ScannedCgroup,
};
use crate::devices::ContainerDevice;
use crate::logging::excerpt;
use crate::runtime::{keys, OciCpu, RuntimeInfo};
use crate::state::AssignmentKey;
use crate::topology::CoreType;

/// Pod annotation that keeps every container of the pod shared when `"false"`.
pub const EXCLUSIVE_ANNOTATION: &str = "cpusetd.io/exclusive";
/// Prefix of the per-container opt-out: `cpusetd.io/exclusive.<container-name>: "false"`.
pub const EXCLUSIVE_CONTAINER_ANNOTATION_PREFIX: &str = "cpusetd.io/exclusive.";

/// Pod annotation asking for the pod's exclusive CPUs from the kernel's isolated CPUs
/// (`isolcpus=`, sysfs `isolated`) under `--respect-isolcpus`: `"require"` (the only value with
/// an effect) means from there or not at all: a request the isolated pool cannot hold rejects
/// the pod (`IsolatedCPUsError`) rather than pinning it elsewhere.
pub const ISOLATED_CPUS_ANNOTATION: &str = "cpusetd.io/isolated-cpus";
/// The value of [`ISOLATED_CPUS_ANNOTATION`] that asks for the isolated pool.
pub const ISOLATED_CPUS_REQUIRE: &str = "require";
/// Pod annotation asking best fit for exclusive CPUs on one core type of a hybrid part:
/// `"performance"` (what best fit does anyway) or `"efficient"`. Other values are noted and
/// ignored; kubelet's placement does not look at it.
pub const CORE_TYPE_ANNOTATION: &str = "cpusetd.io/core-type";

/// Reads `cpusetd.io/core-type`; an odd value is noted and the default kept.
fn core_type(runtime: Option<&RuntimeInfo>, notices: &mut Vec<Notice>) -> CoreType {
    let Some(value) = runtime.and_then(|r| r.annotation(CORE_TYPE_ANNOTATION)) else {
        return CoreType::default();
    };
    CoreType::parse(value).unwrap_or_else(|| {
        notices.push(Notice::UnknownCoreType {
            value: value.to_string(),
        });
        CoreType::default()
    })
}

/// CRI-O's high-performance pod annotations (the same names and values on every runtime):
/// `"disable"` turns the isolation on for the pod's containers that hold exclusive CPUs;
/// `"true"` is CRI-O's older spelling, still accepted (with a notice); `"enable"`/`"false"`
/// leave it off.
pub const CPU_LOAD_BALANCING_ANNOTATION: &str = "cpu-load-balancing.crio.io";
pub const CPU_QUOTA_ANNOTATION: &str = "cpu-quota.crio.io";
pub const IRQ_LOAD_BALANCING_ANNOTATION: &str = "irq-load-balancing.crio.io";
/// CRI-O's `cpu-c-states.crio.io`: `"enable"`, `"disable"` or `"max_latency:<µs>"`, written to
/// each exclusive CPU's `power/pm_qos_resume_latency_us` ([`CState::sysfs_value`]).
pub const CPU_C_STATES_ANNOTATION: &str = "cpu-c-states.crio.io";
/// CRI-O's `cpu-freq-governor.crio.io`: a cpufreq governor name for each exclusive CPU.
pub const CPU_FREQ_GOVERNOR_ANNOTATION: &str = "cpu-freq-governor.crio.io";

/// What `cpu-c-states.crio.io` asks, as CRI-O reads it (`convertAnnotationToLatency`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CState {
    /// `"enable"`: every idle state allowed (the kernel's "no constraint", written `0`).
    Enable,
    /// `"disable"`: no idle state but polling (a latency limit of zero, written `n/a`).
    Disable,
    /// `"max_latency:<n>"`, n > 0: idle states that wake within n µs.
    MaxLatency(u32),
}

impl CState {
    /// CRI-O's reading of the value; `None` for anything else (CRI-O fails the container).
    pub fn parse(value: &str) -> Option<CState> {
        match value {
            "enable" => Some(CState::Enable),
            "disable" => Some(CState::Disable),
            _ => {
                let n: u32 = value.strip_prefix("max_latency:")?.parse().ok()?;
                // The kernel takes an s32.
                (n > 0 && n <= i32::MAX as u32).then_some(CState::MaxLatency(n))
            }
        }
    }

    /// What is written to `pm_qos_resume_latency_us` (and what the kernel prints back): `0`
    /// is the kernel's "no constraint", `n/a` a limit of zero.
    pub fn sysfs_value(&self) -> String {
        match self {
            CState::Enable => "0".to_string(),
            CState::Disable => "n/a".to_string(),
            CState::MaxLatency(n) => n.to_string(),
        }
    }
}

/// A cpufreq governor name, as the kernel allows it (at most 15 bytes of `[a-z0-9_]`:
/// `CPUFREQ_NAME_LEN` is 16 with the NUL), kept inline so [`Isolation`] stays `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Governor {
    len: u8,
    name: [u8; 15],
}

impl Governor {
    pub fn parse(value: &str) -> Option<Governor> {
        let bytes = value.as_bytes();
        let ok = !bytes.is_empty()
            && bytes.len() <= 15
            && bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_');
        if !ok {
            return None;
        }
        let mut name = [0u8; 15];
        name[..bytes.len()].copy_from_slice(bytes);
        Some(Governor {
            len: bytes.len() as u8,
            name,
        })
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII is ever stored.
        std::str::from_utf8(&self.name[..self.len as usize]).unwrap_or("")
    }
}

impl fmt::Debug for Governor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl fmt::Display for Governor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
/// CRI-O's per-container request for the shared pool besides its exclusive CPUs:
/// `cpu-shared.crio.io/<container-name>: "enable"` on the pod (CRI-O reads only `"enable"`).
pub const CPU_SHARED_ANNOTATION_PREFIX: &str = "cpu-shared.crio.io/";
/// cpusetd's pod annotation asking for a projection file per container (`"enable"`).
pub const PROJECTION_ANNOTATION: &str = "cpusetd.io/projection";

/// Every annotation key classification reads by its full name (the runtime's and kubelet's
/// identity keys and CRI-O's high-performance annotations); [`ANNOTATION_PREFIXES`] covers the
/// rest. The runtime lookup keeps exactly these ([`reads_annotation`]): a key read here but
/// missing from this list would be trimmed away and never seen
/// (`every_annotation_key_classification_reads_is_kept` proves the list complete).
pub(crate) const ANNOTATION_KEYS: [&str; 15] = [
    CPU_LOAD_BALANCING_ANNOTATION,
    CPU_C_STATES_ANNOTATION,
    CPU_FREQ_GOVERNOR_ANNOTATION,
    CPU_QUOTA_ANNOTATION,
    IRQ_LOAD_BALANCING_ANNOTATION,
    keys::CRI_CONTAINER_TYPE,
    keys::CRI_CONTAINER_NAME,
    keys::CRI_SANDBOX_UID,
    keys::CRI_SANDBOX_NAME,
    keys::CRI_SANDBOX_NAMESPACE,
    keys::CRIO_CONTAINER_TYPE,
    keys::KUBE_CONTAINER_NAME,
    keys::KUBE_POD_UID,
    keys::KUBE_POD_NAME,
    keys::KUBE_POD_NAMESPACE,
];

/// The prefixes of the annotation keys classification reads by a name it builds: cpusetd's own
/// (`cpusetd.io/exclusive.<container>` and the rest) and [`CPU_SHARED_ANNOTATION_PREFIX`].
pub(crate) const ANNOTATION_PREFIXES: [&str; 2] = ["cpusetd.io/", CPU_SHARED_ANNOTATION_PREFIX];

/// Whether classification may read `key`: what the runtime lookup keeps of a config.
pub(crate) fn reads_annotation(key: &str) -> bool {
    ANNOTATION_PREFIXES
        .iter()
        .any(|prefix| key.starts_with(prefix))
        || ANNOTATION_KEYS.contains(&key)
}

/// What the pod's high-performance annotations ask for its exclusive containers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Isolation {
    /// `cpu-quota.crio.io`: no CFS quota, even with `--keep-cfs-quota`.
    pub no_cpu_quota: bool,
    /// `cpu-load-balancing.crio.io`: the scheduler does not balance onto its CPUs.
    pub no_load_balancing: bool,
    /// `irq-load-balancing.crio.io`: device interrupts stay off its CPUs.
    pub no_irqs: bool,
    /// `irq-load-balancing.crio.io: "housekeeping"` (with `no_irqs`): interrupts stay on the
    /// first core of its CPUs (the first CPU and its SMT siblings), off the rest.
    pub irq_housekeeping: bool,
    /// `cpu-c-states.crio.io`: the idle-state limit of its CPUs.
    pub c_states: Option<CState>,
    /// `cpu-freq-governor.crio.io`: the cpufreq governor of its CPUs.
    pub governor: Option<Governor>,
}

impl Isolation {
    pub fn any(&self) -> bool {
        self.no_cpu_quota
            || self.no_load_balancing
            || self.no_irqs
            || self.c_states.is_some()
            || self.governor.is_some()
    }
}

/// Reads `cpu-c-states.crio.io` and `cpu-freq-governor.crio.io`; odd values are noted and
/// ignored (CRI-O would fail the container; cpusetd pins it and leaves its CPUs alone).
fn power(runtime: &RuntimeInfo, isolation: &mut Isolation, notices: &mut Vec<Notice>) {
    if let Some(value) = runtime.annotation(CPU_C_STATES_ANNOTATION) {
        isolation.c_states = CState::parse(value);
        if isolation.c_states.is_none() {
            notices.push(Notice::BadAnnotationValue {
                key: CPU_C_STATES_ANNOTATION.to_string(),
                value: value.to_string(),
                expected: "\"enable\", \"disable\" or \"max_latency:<microseconds above 0>\"",
            });
        }
    }
    if let Some(value) = runtime.annotation(CPU_FREQ_GOVERNOR_ANNOTATION) {
        isolation.governor = Governor::parse(value);
        if isolation.governor.is_none() {
            notices.push(Notice::BadAnnotationValue {
                key: CPU_FREQ_GOVERNOR_ANNOTATION.to_string(),
                value: value.to_string(),
                expected: "a cpufreq governor name (up to 15 of a-z, 0-9 and _)",
            });
        }
    }
}

/// Reads the three annotations as CRI-O reads them; odd values are noted and ignored.
fn isolation(runtime: Option<&RuntimeInfo>, notices: &mut Vec<Notice>) -> Isolation {
    let Some(runtime) = runtime else {
        return Isolation::default();
    };
    let mut wanted = |key: &str| match runtime.annotation(key) {
        None | Some("enable" | "false") => false,
        Some("disable") => true,
        Some("true") => {
            notices.push(Notice::DeprecatedAnnotationValue {
                key: key.to_string(),
            });
            true
        }
        Some(value) => {
            notices.push(Notice::UnknownAnnotationValue {
                key: key.to_string(),
                value: value.to_string(),
            });
            false
        }
    };
    let housekeeping = runtime.annotation(IRQ_LOAD_BALANCING_ANNOTATION) == Some("housekeeping");
    let mut isolation = Isolation {
        no_cpu_quota: wanted(CPU_QUOTA_ANNOTATION),
        no_load_balancing: wanted(CPU_LOAD_BALANCING_ANNOTATION),
        no_irqs: housekeeping || wanted(IRQ_LOAD_BALANCING_ANNOTATION),
        irq_housekeeping: housekeeping,
        ..Isolation::default()
    };
    power(runtime, &mut isolation, notices);
    isolation
}

/// An annotation CRI-O reads as on only when `"enable"`: `"disable"` (or none) is off, any
/// other value is noted and ignored.
fn enabled(runtime: Option<&RuntimeInfo>, key: &str, notices: &mut Vec<Notice>) -> bool {
    match runtime.and_then(|r| r.annotation(key)) {
        None | Some("disable") => false,
        Some("enable") => true,
        Some(value) => {
            notices.push(Notice::NotEnableOrDisable {
                key: key.to_string(),
                value: value.to_string(),
            });
            false
        }
    }
}

/// The kernel's CFS period when a runtime config names a quota without one.
const DEFAULT_PERIOD_US: u64 = 100_000;
/// kubelet's minimum `cpu.shares` (`MinShares`) and maximum (`MaxShares`).
const MIN_SHARES: u64 = 2;
const MAX_SHARES: u64 = 262_144;
/// kubelet's minimum CFS quota (`MinQuotaPeriod`, 1 ms).
const MIN_QUOTA_US: u64 = 1_000;
/// The largest request considered when inverting `cpu.weight`: the millicores at MaxShares.
const MAX_SHARES_MILLI: u64 = MAX_SHARES * 1000 / 1024;
/// Length of a container id in a cgroup name.
const CONTAINER_ID_LEN: usize = 64;

/// Kubernetes QoS class, from the cgroup path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl fmt::Display for QosClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        })
    }
}

/// Why a cgroup under the kubepods root is not one kubelet or the runtime would have made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnknownReason {
    /// A name that is not UTF-8. Names in reasons are escaped like cgroup paths.
    NotUtf8 { name: String },
    /// Directly under the kubepods root but neither a QoS directory nor a Guaranteed pod.
    NotQosOrPod { name: String },
    /// Under a QoS directory but not a pod of that class.
    NotAPod { name: String },
    /// Named like a pod but the UID is not a UUID or a 32-digit hex hash.
    BadPodUid { name: String },
    /// Under a pod but not named like a container of the driver's runtimes.
    NotAContainer { name: String },
    /// A runtime's helper cgroup (CRI-O's conmon), not a container.
    RuntimeHelper { name: String },
    /// Somewhere below an unknown cgroup.
    BelowUnknown { ancestor: String },
}

impl fmt::Display for UnknownReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnknownReason::NotUtf8 { name } => write!(f, "name '{name}' is not UTF-8"),
            UnknownReason::NotQosOrPod { name } => {
                write!(f, "'{name}' is neither a QoS class directory nor a pod")
            }
            UnknownReason::NotAPod { name } => write!(f, "'{name}' is not a pod of its QoS class"),
            UnknownReason::BadPodUid { name } => {
                write!(f, "'{name}' does not hold a valid pod UID")
            }
            UnknownReason::NotAContainer { name } => {
                write!(f, "'{name}' is not a container cgroup")
            }
            UnknownReason::RuntimeHelper { name } => {
                write!(f, "'{name}' is a runtime helper cgroup, not a container")
            }
            UnknownReason::BelowUnknown { ancestor } => {
                write!(f, "inside the unknown cgroup '{ancestor}'")
            }
        }
    }
}

/// What a cgroup is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupKind {
    /// The kubepods root itself.
    KubepodsRoot,
    /// `burstable` / `besteffort` (or their systemd slices).
    QosDir,
    Pod,
    /// An application (or init) container.
    Container,
    /// A pod sandbox (pause) container.
    Sandbox,
    /// A cgroup a container created below its own.
    ContainerChild,
    Unknown {
        reason: UnknownReason,
    },
}

impl fmt::Display for CgroupKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CgroupKind::KubepodsRoot => f.write_str("kubepods root"),
            CgroupKind::QosDir => f.write_str("QoS directory"),
            CgroupKind::Pod => f.write_str("pod"),
            CgroupKind::Container => f.write_str("container"),
            CgroupKind::Sandbox => f.write_str("sandbox"),
            CgroupKind::ContainerChild => f.write_str("container child cgroup"),
            CgroupKind::Unknown { reason } => write!(f, "unknown ({reason})"),
        }
    }
}

/// An amount of CPU in millicores: exact, or a range where the source is lossy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Millicores {
    Exact(u64),
    /// Somewhere in `min..=max`.
    Between {
        min: u64,
        max: u64,
    },
}

impl Millicores {
    fn new(min: u64, max: u64) -> Millicores {
        if min == max {
            Millicores::Exact(min)
        } else {
            Millicores::Between { min, max }
        }
    }
}

impl fmt::Display for Millicores {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Millicores::Exact(m) => write!(f, "{m}m"),
            Millicores::Between { min, max } if *max == u64::MAX => write!(f, "≥{min}m"),
            Millicores::Between { min, max } => write!(f, "{min}m..{max}m"),
        }
    }
}

/// Where a container's CPU request and limit were read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuSource {
    /// The runtime's OCI config (`linux.resources.cpu`).
    OciConfig,
    /// cgroup v1 `cpu.shares`, `cpu.cfs_quota_us`, `cpu.cfs_period_us`.
    CgroupV1,
    /// cgroup v2 `cpu.weight`, `cpu.max`.
    CgroupV2,
}

impl fmt::Display for CpuSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CpuSource::OciConfig => "runtime config",
            CpuSource::CgroupV1 => "cgroup v1",
            CpuSource::CgroupV2 => "cgroup v2",
        })
    }
}

/// A container's CPU request and limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuResources {
    pub source: CpuSource,
    pub request: Millicores,
    /// `None`: no limit.
    pub limit: Option<Millicores>,
}

/// Why a container or sandbox does not get exclusive CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedReason {
    Sandbox,
    NotGuaranteed {
        qos: QosClass,
    },
    /// No readable CPU settings and no runtime config.
    CpuSettingsUnavailable,
    /// The request is not a whole number of CPUs.
    NotWholeCpus {
        request: Millicores,
    },
    /// The source (v2 `cpu.weight`, or shares at kubelet's maximum) cannot settle whether the
    /// request is whole; with a weight, a [`Notice::LossyWeight`] says so.
    Undecidable {
        request: Millicores,
    },
    /// Narrowed by an annotation.
    OptedOut {
        annotation: String,
    },
    /// The pod's CPU is set at pod level (`spec.resources`, KEP-2837) and the container sets
    /// none: kubelet 1.34–1.36's static policy hands out exclusive CPUs by container requests
    /// only (and skips every container of such a pod), so it runs in the shared pool. `limit`
    /// is the pod-level limit kubelet applies to the container's cgroup.
    PodLevelResources {
        limit: Option<Millicores>,
    },
}

impl fmt::Display for SharedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SharedReason::Sandbox => f.write_str("pod sandbox"),
            SharedReason::NotGuaranteed { qos } => write!(f, "{qos} pod"),
            SharedReason::CpuSettingsUnavailable => f.write_str("cpu settings unavailable"),
            SharedReason::NotWholeCpus { request } => {
                write!(f, "cpu request {request} is not a whole number of cpus")
            }
            SharedReason::Undecidable { request } => {
                write!(f, "cpu request {request} may or may not be whole cpus")
            }
            SharedReason::OptedOut { annotation } => write!(f, "{annotation}: \"false\""),
            SharedReason::PodLevelResources { limit } => {
                pod_level_prefix(f, *limit)?;
                f.write_str(": kubelet's static policy gives its containers no exclusive cpus")
            }
        }
    }
}

/// `pod-level resources (spec.resources, cpu limit …)`, as the NOTE and the log begin.
fn pod_level_prefix(f: &mut fmt::Formatter<'_>, limit: Option<Millicores>) -> fmt::Result {
    f.write_str("pod-level resources (spec.resources")?;
    if let Some(limit) = limit {
        write!(f, ", cpu limit {limit}")?;
    }
    f.write_str(")")
}

/// What a container is entitled to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exclusivity {
    /// Not a container or sandbox.
    NotApplicable,
    Exclusive {
        cpus: u32,
    },
    Shared {
        reason: SharedReason,
    },
}

/// Something the caller should log once for this cgroup; the classification stands regardless.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The weight could not decide whole CPUs: the container stays shared.
    LossyWeight { weight: u64, request: Millicores },
    /// The runtime's pod UID differs from the one in the cgroup path (the runtime's is used).
    PodUidMismatch { path: String, runtime: String },
    /// The runtime config's shares are not what the cgroup holds (resized?); the config wins.
    RuntimeConfigDisagrees { detail: String },
    /// A Guaranteed container's limit differs from its request.
    LimitDiffersFromRequest {
        request: Millicores,
        limit: Millicores,
    },
    /// An opt-out annotation with a value other than "true" or "false".
    IgnoredAnnotation { key: String, value: String },
    /// A high-performance annotation spelt `"true"` (CRI-O's deprecated value).
    DeprecatedAnnotationValue { key: String },
    /// A high-performance annotation with a value that means nothing.
    UnknownAnnotationValue { key: String, value: String },
    /// A high-performance annotation whose value is not one it takes (`expected` says which).
    BadAnnotationValue {
        key: String,
        value: String,
        expected: &'static str,
    },
    /// `cpusetd.io/isolated-cpus` with a value other than "require".
    IgnoredIsolatedCpusValue { value: String },
    /// `cpusetd.io/core-type` with a value other than "performance" or "efficient".
    UnknownCoreType { value: String },
    /// An `"enable"`/`"disable"` annotation (`cpu-shared.crio.io/…`, `cpusetd.io/projection`)
    /// with another value.
    NotEnableOrDisable { key: String, value: String },
    /// A pod whose CPU is set at pod level ([`pod_level_pods`]): said once of the pod cgroup.
    PodLevelPod { limit: Option<Millicores> },
}

/// What cpusetd does with pods whose CPU is set at pod level, said alike wherever it comes up
/// (a pod found by [`pod_level_pods`], kubelet's v3 `podEntries` not adopted).
pub const POD_LEVEL_POLICY: &str = "cpusetd keeps pods with pod-level resources in the shared \
     pool, as kubelet 1.34-1.36 does without its pod-level resource managers";

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Notice::LossyWeight { weight, request } => write!(
                f,
                "cpu.weight {weight} means a request of {request}, which may or may not be whole cpus: kept shared (a runtime config or cpu.max would settle it)"
            ),
            Notice::PodUidMismatch { path, runtime } => write!(
                f,
                "pod uid {} from the runtime config differs from {path} in the cgroup path; using the cgroup path's",
                excerpt(runtime)
            ),
            Notice::RuntimeConfigDisagrees { detail } => {
                write!(f, "runtime config and cgroup disagree ({detail}); using the runtime config")
            }
            Notice::LimitDiffersFromRequest { request, limit } => write!(
                f,
                "guaranteed container has cpu limit {limit} but request {request}"
            ),
            Notice::IgnoredAnnotation { key, value } => {
                ignored(f, key, value, ": only \"false\" has an effect")
            }
            Notice::DeprecatedAnnotationValue { key } => write!(
                f,
                "annotation {}: \"true\" is CRI-O's deprecated spelling of \"disable\" (honoured)",
                excerpt(key)
            ),
            Notice::BadAnnotationValue {
                key,
                value,
                expected,
            } => ignored(
                f,
                key,
                value,
                format_args!(" (its cpus are left as they are): it takes {expected}"),
            ),
            Notice::UnknownAnnotationValue { key, value } => ignored(
                f,
                key,
                value,
                ": \"disable\" turns it on, \"enable\" leaves it off",
            ),
            Notice::IgnoredIsolatedCpusValue { value } => ignored(
                f,
                ISOLATED_CPUS_ANNOTATION,
                value,
                format_args!(": only \"{ISOLATED_CPUS_REQUIRE}\" has an effect (exclusive cpus come from the other cpus)"),
            ),
            Notice::UnknownCoreType { value } => ignored(
                f,
                CORE_TYPE_ANNOTATION,
                value,
                ": \"performance\" or \"efficient\" (placing on performance cores first)",
            ),
            other => other.fmt_more(f),
        }
    }
}

impl Notice {
    /// The text of the notices [`fmt::Display`] leaves to this (its 60 lines are full).
    fn fmt_more(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Notice::NotEnableOrDisable { key, value } => ignored(
                f,
                key,
                value,
                ": \"enable\" turns it on, \"disable\" leaves it off",
            ),
            Notice::PodLevelPod { limit } => {
                pod_level_prefix(f, *limit)?;
                write!(
                    f,
                    ": its containers get no exclusive cpus: {POD_LEVEL_POLICY}"
                )
            }
            // Said by `fmt` itself.
            other => write!(f, "{other:?}"),
        }
    }
}

/// `annotation <key>: <value> ignored<why>`: an annotation value that has no effect.
fn ignored(
    f: &mut fmt::Formatter<'_>,
    key: &str,
    value: &str,
    why: impl fmt::Display,
) -> fmt::Result {
    write!(
        f,
        "annotation {}: {:?} ignored{why}",
        excerpt(key),
        excerpt(value)
    )
}

/// Everything classification says about one cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classification {
    pub kind: CgroupKind,
    /// For QoS directories, pods, containers, sandboxes and their children.
    pub qos: Option<QosClass>,
    /// With `-` separators, as the API server shows it.
    pub pod_uid: Option<String>,
    pub container_id: Option<String>,
    /// From the runtime config.
    pub container_name: Option<String>,
    /// The pod's name and namespace, from the runtime config (shown by `status`; never used
    /// for placement: the cgroup path's UID is the pod's identity).
    pub pod_name: Option<String>,
    pub pod_namespace: Option<String>,
    /// The pod's high-performance annotations (in force only while it holds exclusive CPUs).
    pub isolation: Isolation,
    /// The pod asks for its exclusive CPUs from the isolated pool
    /// ([`ISOLATED_CPUS_ANNOTATION`]: `"require"`).
    pub isolated_cpus: bool,
    /// The core type best fit places its exclusive CPUs on first (`cpusetd.io/core-type`).
    pub core_type: CoreType,
    /// `cpu-shared.crio.io/<its name>: "enable"`: its exclusive CPUs plus the shared pool.
    pub cpu_shared: bool,
    /// `cpusetd.io/projection: "enable"` on its pod: a projection file is kept for it.
    pub projection: bool,
    /// For containers and sandboxes with readable CPU settings.
    pub resources: Option<CpuResources>,
    pub exclusivity: Exclusivity,
    pub notices: Vec<Notice>,
    /// The devices the runtime config gives a container, with their NUMA nodes when located
    /// (a topology hint for its exclusive CPUs).
    pub devices: Vec<ContainerDevice>,
}

impl Classification {
    fn of_kind(kind: CgroupKind) -> Classification {
        Classification {
            kind,
            qos: None,
            pod_uid: None,
            container_id: None,
            container_name: None,
            pod_name: None,
            pod_namespace: None,
            isolation: Isolation::default(),
            isolated_cpus: false,
            core_type: CoreType::default(),
            cpu_shared: false,
            projection: false,
            resources: None,
            exclusivity: Exclusivity::NotApplicable,
            notices: Vec::new(),
            devices: Vec::new(),
        }
    }

    /// The number of exclusive CPUs (0 when shared or not a container).
    pub fn exclusive_cpus(&self) -> u32 {
        match self.exclusivity {
            Exclusivity::Exclusive { cpus } => cpus,
            _ => 0,
        }
    }

    /// The key under which an exclusive assignment of this container is kept: (pod UID,
    /// container name) when the name is known, so a restarted container gets its CPUs back;
    /// else (pod UID, container id).
    pub fn assignment_key(&self) -> Option<AssignmentKey> {
        if !matches!(self.kind, CgroupKind::Container | CgroupKind::Sandbox) {
            return None;
        }
        let pod_uid = self.pod_uid.clone()?;
        match (&self.container_name, &self.container_id) {
            (Some(container), _) => Some(AssignmentKey::Named {
                pod_uid,
                container: container.clone(),
            }),
            (None, Some(id)) => Some(AssignmentKey::Id {
                pod_uid,
                container_id: id.clone(),
            }),
            (None, None) => None,
        }
    }
}

/// How the kubelet names cgroups below a given kubepods root: the driver, and for systemd the
/// slice prefix the root's name implies (`kubepods.slice` → `kubepods-`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupNaming {
    driver: CgroupDriver,
    /// systemd only: the kubepods slice name without `.slice`.
    slice_prefix: String,
}

impl CgroupNaming {
    pub fn new(driver: CgroupDriver, kubepods: &CgroupPath) -> CgroupNaming {
        let name = kubepods
            .name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let slice_prefix = name.strip_suffix(".slice").unwrap_or(&name).to_string();
        CgroupNaming {
            driver,
            slice_prefix,
        }
    }

    pub fn driver(&self) -> CgroupDriver {
        self.driver
    }
}

/// What a cgroup's path alone says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathInfo {
    /// `Container` for containers and sandboxes alike: the path cannot tell them apart.
    pub kind: CgroupKind,
    pub qos: Option<QosClass>,
    pub pod_uid: Option<String>,
    pub container_id: Option<String>,
}

impl PathInfo {
    fn new(kind: CgroupKind) -> PathInfo {
        PathInfo {
            kind,
            qos: None,
            pod_uid: None,
            container_id: None,
        }
    }

    fn unknown(reason: UnknownReason) -> PathInfo {
        PathInfo::new(CgroupKind::Unknown { reason })
    }
}

/// A directory name for messages: invalid UTF-8 and control characters escaped, like a cgroup
/// path is shown, so a reason stays on one line.
fn shown(name: &std::ffi::OsStr) -> String {
    CgroupPath::root()
        .join(name)
        .map(|p| p.to_string())
        .unwrap_or_else(|_| name.to_string_lossy().escape_debug().to_string())
}

/// Parses a cgroup path relative to the kubepods root.
pub fn parse_path(naming: &CgroupNaming, relative: &CgroupPath) -> PathInfo {
    let mut info = PathInfo::new(CgroupKind::KubepodsRoot);
    for component in relative.components() {
        info = match (component.to_str(), &info.kind) {
            (Some(name), _) => step(naming, info, name, component),
            // Containers may name their own children anything; only the levels kubelet and the
            // runtime name must be UTF-8.
            (None, CgroupKind::Container | CgroupKind::ContainerChild) => PathInfo {
                kind: CgroupKind::ContainerChild,
                ..info
            },
            (None, CgroupKind::Unknown { .. }) => step(naming, info, "", component),
            (None, _) => PathInfo::unknown(UnknownReason::NotUtf8 {
                name: shown(component),
            }),
        };
    }
    info
}

/// Classifies the next path level given what its parent was.
fn step(naming: &CgroupNaming, parent: PathInfo, name: &str, raw: &std::ffi::OsStr) -> PathInfo {
    let shown_name = || shown(raw);
    match parent.kind {
        CgroupKind::KubepodsRoot => {
            if let Some(qos) = qos_dir(naming, name) {
                return PathInfo {
                    qos: Some(qos),
                    ..PathInfo::new(CgroupKind::QosDir)
                };
            }
            match pod_dir(naming, name, QosClass::Guaranteed) {
                Some(Ok(uid)) => PathInfo {
                    qos: Some(QosClass::Guaranteed),
                    pod_uid: Some(uid),
                    ..PathInfo::new(CgroupKind::Pod)
                },
                Some(Err(())) => PathInfo::unknown(UnknownReason::BadPodUid { name: shown_name() }),
                None => PathInfo::unknown(UnknownReason::NotQosOrPod { name: shown_name() }),
            }
        }
        CgroupKind::QosDir => {
            let qos = parent.qos.unwrap_or(QosClass::Burstable);
            match pod_dir(naming, name, qos) {
                Some(Ok(uid)) => PathInfo {
                    qos: Some(qos),
                    pod_uid: Some(uid),
                    ..PathInfo::new(CgroupKind::Pod)
                },
                Some(Err(())) => PathInfo::unknown(UnknownReason::BadPodUid { name: shown_name() }),
                None => PathInfo::unknown(UnknownReason::NotAPod { name: shown_name() }),
            }
        }
        CgroupKind::Pod => match container_dir(naming, name) {
            ContainerName::Id(id) => PathInfo {
                kind: CgroupKind::Container,
                container_id: Some(id),
                ..parent
            },
            ContainerName::Helper => {
                PathInfo::unknown(UnknownReason::RuntimeHelper { name: shown_name() })
            }
            ContainerName::NotAContainer => {
                PathInfo::unknown(UnknownReason::NotAContainer { name: shown_name() })
            }
        },
        CgroupKind::Container | CgroupKind::Sandbox | CgroupKind::ContainerChild => PathInfo {
            kind: CgroupKind::ContainerChild,
            ..parent
        },
        CgroupKind::Unknown { reason } => {
            let ancestor = match reason {
                UnknownReason::BelowUnknown { ancestor } => ancestor,
                other => other_name(&other),
            };
            PathInfo::unknown(UnknownReason::BelowUnknown { ancestor })
        }
    }
}

/// The offending name of an unknown cgroup, for its descendants' reason.
fn other_name(reason: &UnknownReason) -> String {
    match reason {
        UnknownReason::NotUtf8 { name }
        | UnknownReason::NotQosOrPod { name }
        | UnknownReason::NotAPod { name }
        | UnknownReason::BadPodUid { name }
        | UnknownReason::NotAContainer { name }
        | UnknownReason::RuntimeHelper { name } => name.clone(),
        UnknownReason::BelowUnknown { ancestor } => ancestor.clone(),
    }
}

fn qos_word(qos: QosClass) -> &'static str {
    match qos {
        QosClass::Guaranteed => "guaranteed",
        QosClass::Burstable => "burstable",
        QosClass::BestEffort => "besteffort",
    }
}

/// The QoS class of a QoS directory name.
fn qos_dir(naming: &CgroupNaming, name: &str) -> Option<QosClass> {
    [QosClass::Burstable, QosClass::BestEffort]
        .into_iter()
        .find(|&qos| match naming.driver {
            CgroupDriver::Cgroupfs => name == qos_word(qos),
            CgroupDriver::Systemd => {
                name == format!("{}-{}.slice", naming.slice_prefix, qos_word(qos))
            }
        })
}

/// `None` when `name` is not a pod directory of the class at all; `Some(Err)` when it is named
/// like one but its UID is malformed; else the UID with `-` separators.
fn pod_dir(naming: &CgroupNaming, name: &str, qos: QosClass) -> Option<Result<String, ()>> {
    let uid = match naming.driver {
        CgroupDriver::Cgroupfs => name.strip_prefix("pod")?.to_string(),
        CgroupDriver::Systemd => {
            let prefix = match qos {
                QosClass::Guaranteed => format!("{}-pod", naming.slice_prefix),
                _ => format!("{}-{}-pod", naming.slice_prefix, qos_word(qos)),
            };
            let escaped = name.strip_prefix(&prefix)?.strip_suffix(".slice")?;
            // A dash here would be a further slice level, not part of the UID.
            if escaped.contains('-') {
                return Some(Err(()));
            }
            escaped.replace('_', "-")
        }
    };
    Some(if valid_pod_uid(&uid) {
        Ok(uid)
    } else {
        Err(())
    })
}

/// A UUID (`8-4-4-4-12` lowercase hex) as the API server assigns, or 32 lowercase hex digits as
/// kubelet assigns to static pods.
fn valid_pod_uid(uid: &str) -> bool {
    let hex = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if uid.len() == 32 {
        return hex(uid);
    }
    let groups: Vec<&str> = uid.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && hex(g))
}

enum ContainerName {
    Id(String),
    Helper,
    NotAContainer,
}

/// The container id of a container directory name.
fn container_dir(naming: &CgroupNaming, name: &str) -> ContainerName {
    let id = match naming.driver {
        CgroupDriver::Cgroupfs => {
            if name.starts_with("crio-conmon-") {
                return ContainerName::Helper;
            }
            name.strip_prefix("crio-").unwrap_or(name)
        }
        CgroupDriver::Systemd => {
            let Some(stem) = name.strip_suffix(".scope") else {
                return ContainerName::NotAContainer;
            };
            if stem.starts_with("crio-conmon-") {
                return ContainerName::Helper;
            }
            let id = ["cri-containerd-", "crio-", "docker-"]
                .iter()
                .find_map(|prefix| stem.strip_prefix(prefix));
            match id {
                Some(id) => id,
                None => return ContainerName::NotAContainer,
            }
        }
    };
    let valid = id.len() == CONTAINER_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if valid {
        ContainerName::Id(id.to_string())
    } else {
        ContainerName::NotAContainer
    }
}

/// kubelet's `MilliCPUToShares`.
pub fn milli_to_shares(milli: u64) -> u64 {
    (milli.saturating_mul(1024) / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// The requests kubelet would have turned into `shares`.
pub fn shares_to_milli(shares: u64) -> Millicores {
    if shares <= MIN_SHARES {
        return Millicores::Between { min: 0, max: 2 };
    }
    if shares >= MAX_SHARES {
        return Millicores::Between {
            min: MAX_SHARES_MILLI,
            max: u64::MAX,
        };
    }
    let candidate = (shares * 1000).div_ceil(1024);
    if milli_to_shares(candidate) == shares {
        Millicores::Exact(candidate)
    } else {
        // Not a value kubelet writes: the request lies between its neighbours.
        Millicores::Between {
            min: shares * 1000 / 1024,
            max: candidate,
        }
    }
}

/// The limits kubelet would have turned into `quota` per `period` (`MilliCPUToQuota`).
pub fn quota_to_milli(quota_us: u64, period_us: u64) -> Millicores {
    let period_us = period_us.max(1);
    let lowest = (quota_us.saturating_mul(1000)).div_ceil(period_us);
    let highest = ((quota_us + 1).saturating_mul(1000)).div_ceil(period_us) - 1;
    if quota_us <= MIN_QUOTA_US {
        // Every limit up to the minimum quota is written as the minimum.
        return Millicores::new(1, highest.max(1));
    }
    if lowest <= highest {
        Millicores::new(lowest, highest)
    } else {
        Millicores::Between {
            min: highest,
            max: lowest,
        }
    }
}

/// runc before 1.3.2: `1 + ((shares - 2) * 9999) / 262142`.
pub fn weight_linear(shares: u64) -> u64 {
    if shares == 0 {
        return 0;
    }
    1 + (shares.saturating_sub(2) * 9999) / 262_142
}

/// runc ≥ 1.3.2, crun ≥ 1.23: `ceil(10^((l² + 125 l) / 612 − 7/34))`, `l = log2(shares)`.
pub fn weight_quadratic(shares: u64) -> u64 {
    if shares == 0 {
        return 0;
    }
    if shares <= 2 {
        return 1;
    }
    if shares >= MAX_SHARES {
        return 10_000;
    }
    let l = (shares as f64).log2();
    let exponent = (l * l + 125.0 * l) / 612.0 - 7.0 / 34.0;
    10f64.powf(exponent).ceil() as u64
}

/// Whether a request of `milli` could have produced `weight` through either conversion.
fn weight_matches(weight: u64, milli: u64) -> bool {
    let shares = milli_to_shares(milli);
    weight_linear(shares) == weight || weight_quadratic(shares) == weight
}

/// The range of requests a conversion maps to `weight` (both conversions are monotonic).
fn weight_range(weight: u64, convert: fn(u64) -> u64) -> Option<(u64, u64)> {
    let at = |milli: u64| convert(milli_to_shares(milli));
    // First milli with at(milli) >= weight.
    let (mut lo, mut hi) = (0u64, MAX_SHARES_MILLI + 1);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if at(mid) >= weight {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let first = lo;
    if first > MAX_SHARES_MILLI || at(first) != weight {
        return None;
    }
    // First milli with at(milli) > weight.
    let (mut lo, mut hi) = (first, MAX_SHARES_MILLI + 1);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if at(mid) > weight {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let last = if lo > MAX_SHARES_MILLI {
        u64::MAX
    } else {
        lo - 1
    };
    Some((first, last))
}

/// The requests a v2 `cpu.weight` may stand for, under either conversion.
pub fn weight_to_milli(weight: u64) -> Option<Millicores> {
    let ranges = [
        weight_range(weight, weight_linear),
        weight_range(weight, weight_quadratic),
    ];
    let min = ranges.iter().flatten().map(|r| r.0).min()?;
    let max = ranges.iter().flatten().map(|r| r.1).max()?;
    Some(Millicores::new(min, max))
}

/// Whether a request is a whole number of CPUs.
enum WholeCpus {
    Yes(u32),
    No,
    Unknown,
}

fn whole_cpus(request: Millicores, weight: Option<u64>) -> WholeCpus {
    match request {
        Millicores::Exact(m) if m >= 1000 && m % 1000 == 0 => {
            WholeCpus::Yes(u32::try_from(m / 1000).unwrap_or(u32::MAX))
        }
        Millicores::Exact(_) => WholeCpus::No,
        Millicores::Between { min, max } => {
            let first = min.div_ceil(1000).max(1);
            // Requests beyond MaxShares all look alike; one past it is enough to ask about.
            let last = (max / 1000).min(MAX_SHARES_MILLI / 1000 + 1);
            let mut wholes = (first..=last).map(|n| n * 1000);
            let possible = match weight {
                Some(w) => wholes.any(|m| weight_matches(w, m)),
                None => wholes.next().is_some(),
            };
            if possible {
                WholeCpus::Unknown
            } else {
                WholeCpus::No
            }
        }
    }
}

/// The parsed value of a scanned file; missing, unreadable and invalid values are all `None`.
fn value<T: Copy>(v: &FileValue<T>) -> Option<T> {
    v.value().copied()
}

/// Whether a container's cgroup holds the CPU request its runtime config names (v1
/// `cpu.shares`; v2 `cpu.weight` by either of runc's conversions): `Some(false)` while the
/// cgroup still has the kernel's defaults, and after an in-place resize (kubelet has the
/// runtime write the cgroup; its config.json keeps the values the container was created with);
/// `None` when either side is not known.
pub fn config_matches_cgroup(settings: &CpuSettings, config: &OciCpu) -> Option<bool> {
    let shares = config.shares?;
    match settings {
        CpuSettings::V1 {
            shares: on_disk, ..
        } => Some(value(on_disk)? == shares),
        CpuSettings::V2 { weight, .. } => {
            let w = value(weight)?;
            Some(w == weight_linear(shares) || w == weight_quadratic(shares))
        }
    }
}

/// The kernel's `cpu.shares` of a new v1 cgroup.
pub const KERNEL_DEFAULT_SHARES: u64 = 1024;
/// The kernel's `cpu.weight` of a new v2 cgroup.
pub const KERNEL_DEFAULT_WEIGHT: u64 = 100;

/// Whether the cgroup's CPU request is still what the kernel gives a new cgroup: one the
/// runtime has made but not written yet (or written the same value).
pub fn holds_kernel_default(settings: &CpuSettings) -> bool {
    match settings {
        CpuSettings::V1 { shares, .. } => value(shares) == Some(KERNEL_DEFAULT_SHARES),
        CpuSettings::V2 { weight, .. } => value(weight) == Some(KERNEL_DEFAULT_WEIGHT),
    }
}

fn value_text<T: Copy + fmt::Display>(v: &FileValue<T>) -> String {
    v.value().map_or_else(|| "?".to_string(), |v| v.to_string())
}

/// CPU request and limit from the most exact source, with the v2 weight when that was used.
fn cpu_resources(
    settings: &CpuSettings,
    runtime: Option<&RuntimeInfo>,
    notices: &mut Vec<Notice>,
) -> Option<(CpuResources, Option<u64>)> {
    let cpu = runtime.map(|r| r.cpu).unwrap_or_default();
    match cpu.shares {
        Some(shares) => Some((resources_from_config(settings, cpu, shares, notices), None)),
        None => resources_from_cgroup(settings),
    }
}

/// CPU request and limit from the OCI config (`cpu.shares` present), noting a cgroup that
/// disagrees with it.
fn resources_from_config(
    settings: &CpuSettings,
    cpu: OciCpu,
    shares: u64,
    notices: &mut Vec<Notice>,
) -> CpuResources {
    let limit = match cpu.quota {
        Some(q) if q > 0 => Some(quota_to_milli(
            q as u64,
            cpu.period.filter(|p| *p > 0).unwrap_or(DEFAULT_PERIOD_US),
        )),
        _ => None,
    };
    // A cgroup that still holds the kernel's default is being set up (runc makes it, then
    // writes the config's value): settling, not disagreeing.
    if config_matches_cgroup(settings, &cpu) == Some(false) && !holds_kernel_default(settings) {
        let on_disk = match settings {
            CpuSettings::V1 { shares, .. } => format!("cpu.shares {}", value_text(shares)),
            CpuSettings::V2 { weight, .. } => format!("cpu.weight {}", value_text(weight)),
        };
        notices.push(Notice::RuntimeConfigDisagrees {
            detail: format!("{on_disk}, config shares {shares}"),
        });
    }
    CpuResources {
        source: CpuSource::OciConfig,
        request: shares_to_milli(shares),
        limit,
    }
}

/// CPU request and limit from the cgroup's own files, with the v2 weight when that was used.
fn resources_from_cgroup(settings: &CpuSettings) -> Option<(CpuResources, Option<u64>)> {
    match settings {
        CpuSettings::V1 {
            shares,
            cfs_quota,
            cfs_period_us,
        } => {
            let shares = value(shares)?;
            let limit = match (value(cfs_quota), value(cfs_period_us)) {
                (Some(Quota::Micros(q)), Some(p)) => Some(quota_to_milli(q, p)),
                (Some(Quota::Micros(q)), None) => Some(quota_to_milli(q, DEFAULT_PERIOD_US)),
                _ => None,
            };
            Some((
                CpuResources {
                    source: CpuSource::CgroupV1,
                    request: shares_to_milli(shares),
                    limit,
                },
                None,
            ))
        }
        CpuSettings::V2 { max, weight } => {
            let weight = value(weight)?;
            let request = weight_to_milli(weight)?;
            let limit = match value(max) {
                Some(max) => match max.quota {
                    Quota::Micros(q) => Some(quota_to_milli(q, max.period_us)),
                    Quota::Unlimited => None,
                },
                None => None,
            };
            Some((
                CpuResources {
                    source: CpuSource::CgroupV2,
                    request,
                    limit,
                },
                Some(weight),
            ))
        }
    }
}

/// The lowest and highest request a value stands for.
fn bounds(m: Millicores) -> (u64, u64) {
    match m {
        Millicores::Exact(m) => (m, m),
        Millicores::Between { min, max } => (min, max),
    }
}

/// Whether a container of a Guaranteed pod shows on its own that the pod's CPU is set at pod
/// level (`spec.resources`, KEP-2837; cgroup v2 only, kubelet refuses such pods on v1). A
/// Guaranteed pod without pod-level resources gives each container a request equal to its
/// limit, at least 1m; so, with `request` already settled by the limit where the weight allows:
/// * a request of 0 (kubelet's minimum shares 2, weight 1) and either no limit or a limit no
///   such request can equal (kubelet puts the pod-level limit on a container that sets none;
///   one that sets no request at all gets the shares of that limit and looks like any
///   Guaranteed container: only its pod tells, [`pod_level_pods`]): pod-level resources;
/// * the runtime config (written once, at creation: no resize in between) with a request its
///   limit cannot equal: pod-level resources too (a container request under a pod-level limit).
fn pod_level_resources(
    settings: &CpuSettings,
    resources: &CpuResources,
    request: Millicores,
) -> bool {
    if !matches!(settings, CpuSettings::V2 { .. }) {
        return false;
    }
    let (min, max) = bounds(request);
    match resources.limit {
        None => min == 0,
        Some(limit) => {
            let (low, high) = bounds(limit);
            let disjoint = low > max || high < min;
            disjoint && (min == 0 || resources.source == CpuSource::OciConfig)
        }
    }
}

/// Without a runtime config: the pause container of a Guaranteed pod has kubelet's minimum
/// shares (2; v2 weight 1) and no CPU limit, while every application container there has a
/// limit (equal to its request).
fn looks_like_pause(qos: QosClass, resources: Option<(CpuResources, Option<u64>)>) -> bool {
    let Some((resources, weight)) = resources else {
        return false;
    };
    if qos != QosClass::Guaranteed || resources.limit.is_some() {
        return false;
    }
    match weight {
        Some(weight) => weight == 1,
        None => resources.request == Millicores::Between { min: 0, max: 2 },
    }
}

/// Whether the pod asks for the isolated pool ([`ISOLATED_CPUS_ANNOTATION`]); notes values
/// that mean nothing.
fn wants_isolated_cpus(runtime: Option<&RuntimeInfo>, notices: &mut Vec<Notice>) -> bool {
    let Some(value) = runtime.and_then(|r| r.annotation(ISOLATED_CPUS_ANNOTATION)) else {
        return false;
    };
    let value = value.trim();
    if value.eq_ignore_ascii_case(ISOLATED_CPUS_REQUIRE) {
        return true;
    }
    notices.push(Notice::IgnoredIsolatedCpusValue {
        value: value.to_string(),
    });
    false
}

/// The opt-out annotation that applies, if any; notes values that mean nothing.
fn opted_out(
    runtime: Option<&RuntimeInfo>,
    container_name: Option<&str>,
    notices: &mut Vec<Notice>,
) -> Option<String> {
    let runtime = runtime?;
    let mut keys = vec![EXCLUSIVE_ANNOTATION.to_string()];
    if let Some(name) = container_name {
        keys.push(format!("{EXCLUSIVE_CONTAINER_ANNOTATION_PREFIX}{name}"));
    }
    let mut found = None;
    for key in keys {
        let Some(value) = runtime.annotation(&key) else {
            continue;
        };
        let value = value.trim();
        if value.eq_ignore_ascii_case("false") {
            found.get_or_insert(key);
        } else if !value.eq_ignore_ascii_case("true") {
            notices.push(Notice::IgnoredAnnotation {
                key,
                value: value.to_string(),
            });
        }
    }
    found
}

/// Whether a Guaranteed container gets exclusive CPUs, and how many: kubelet's rule (a whole
/// request of at least one CPU) unless its pod's CPU is set at pod level. A lossy v2 weight
/// settled by an exact limit is written back to `settled`.
fn guaranteed_decision(
    settings: &CpuSettings,
    resources: CpuResources,
    weight: Option<u64>,
    settled: &mut Option<CpuResources>,
    notices: &mut Vec<Notice>,
) -> Result<u32, SharedReason> {
    let mut request = resources.request;
    // A Guaranteed container's limit equals its request: an exact limit consistent with the
    // lossy weight settles the request.
    if let (Some(w), Some(Millicores::Exact(limit))) = (weight, resources.limit) {
        if weight_matches(w, limit) {
            request = Millicores::Exact(limit);
            *settled = Some(CpuResources {
                request,
                ..resources
            });
        }
    }
    if pod_level_resources(settings, &resources, request) {
        return Err(SharedReason::PodLevelResources {
            limit: resources.limit,
        });
    }
    if let (Millicores::Exact(r), Some(Millicores::Exact(l))) = (request, resources.limit) {
        if r != l {
            notices.push(Notice::LimitDiffersFromRequest {
                request,
                limit: Millicores::Exact(l),
            });
        }
    }
    match whole_cpus(request, weight) {
        WholeCpus::Yes(cpus) => Ok(cpus),
        WholeCpus::No => Err(SharedReason::NotWholeCpus { request }),
        WholeCpus::Unknown => {
            if let Some(weight) = weight {
                notices.push(Notice::LossyWeight { weight, request });
            }
            Err(SharedReason::Undecidable { request })
        }
    }
}

/// Classifies one cgroup from its path relative to the kubepods root, its CPU settings and,
/// for containers, the runtime's view when known.
pub fn classify(
    naming: &CgroupNaming,
    relative: &CgroupPath,
    settings: &CpuSettings,
    runtime: Option<&RuntimeInfo>,
) -> Classification {
    let path = parse_path(naming, relative);
    let mut classification = Classification {
        qos: path.qos,
        pod_uid: path.pod_uid.clone(),
        container_id: path.container_id.clone(),
        ..Classification::of_kind(path.kind.clone())
    };
    if path.kind != CgroupKind::Container {
        return classification;
    }
    let qos = path.qos.unwrap_or(QosClass::BestEffort);
    classification.devices = runtime.map(|r| r.devices.clone()).unwrap_or_default();
    read_identity(&mut classification, path.pod_uid.as_deref(), runtime);
    let resources = cpu_resources(settings, runtime, &mut classification.notices);
    classification.resources = resources.map(|(r, _)| r);

    let sandbox = match runtime.and_then(|r| r.is_sandbox()) {
        Some(sandbox) => sandbox,
        None => looks_like_pause(qos, resources),
    };
    if sandbox {
        classification.kind = CgroupKind::Sandbox;
        classification.exclusivity = Exclusivity::Shared {
            reason: SharedReason::Sandbox,
        };
        return classification;
    }
    read_requests(&mut classification, runtime);

    let decision = match resources {
        _ if qos != QosClass::Guaranteed => Err(SharedReason::NotGuaranteed { qos }),
        None => Err(SharedReason::CpuSettingsUnavailable),
        Some((resources, weight)) => guaranteed_decision(
            settings,
            resources,
            weight,
            &mut classification.resources,
            &mut classification.notices,
        ),
    };
    let container_name = classification.container_name.clone();
    let notices = &mut classification.notices;
    classification.exclusivity = exclusivity(decision, runtime, container_name.as_deref(), notices);
    classification
}

/// The container's and pod's names from the runtime, noting a pod UID that differs from the
/// cgroup path's (`from_path`).
fn read_identity(
    classification: &mut Classification,
    from_path: Option<&str>,
    runtime: Option<&RuntimeInfo>,
) {
    if let (Some(from_path), Some(from_runtime)) = (from_path, runtime.and_then(|r| r.pod_uid())) {
        if from_path != from_runtime {
            // The cgroup path wins: kubelet made it, and the pod's cpus are the union of its
            // directory's containers. A runtime config naming another pod must not put this
            // container under that pod's key (two containers on one exclusive cpu).
            classification.notices.push(Notice::PodUidMismatch {
                path: from_path.to_string(),
                runtime: from_runtime.to_string(),
            });
        }
    }
    classification.container_name = runtime.and_then(|r| r.container_name()).map(str::to_string);
    classification.pod_name = runtime.and_then(|r| r.pod_name()).map(str::to_string);
    classification.pod_namespace = runtime.and_then(|r| r.pod_namespace()).map(str::to_string);
}

/// What the pod's annotations ask for an application container besides exclusivity:
/// isolation, the isolated pool, a core type, a projection, the shared pool too.
fn read_requests(classification: &mut Classification, runtime: Option<&RuntimeInfo>) {
    let notices = &mut classification.notices;
    classification.isolation = isolation(runtime, notices);
    classification.isolated_cpus = wants_isolated_cpus(runtime, notices);
    classification.core_type = core_type(runtime, notices);
    classification.projection = enabled(runtime, PROJECTION_ANNOTATION, notices);
    if let Some(name) = &classification.container_name {
        let key = format!("{CPU_SHARED_ANNOTATION_PREFIX}{name}");
        classification.cpu_shared = enabled(runtime, &key, notices);
    }
}

/// Exclusive when the rule gives whole CPUs and no annotation opts out; opt-out values are
/// checked (and odd ones noted) either way.
fn exclusivity(
    decision: Result<u32, SharedReason>,
    runtime: Option<&RuntimeInfo>,
    container_name: Option<&str>,
    notices: &mut Vec<Notice>,
) -> Exclusivity {
    match decision {
        Ok(cpus) => match opted_out(runtime, container_name, notices) {
            Some(annotation) => Exclusivity::Shared {
                reason: SharedReason::OptedOut { annotation },
            },
            None => Exclusivity::Exclusive { cpus },
        },
        Err(reason) => {
            // Still note meaningless opt-out values.
            opted_out(runtime, container_name, notices);
            Exclusivity::Shared { reason }
        }
    }
}

/// Classifies every cgroup of a scan, in the scan's order, looking containers up with
/// `runtime` (by container id).
pub fn classify_scan(
    naming: &CgroupNaming,
    scan: &Scan,
    mut runtime: impl FnMut(&str) -> Option<RuntimeInfo>,
) -> Vec<Classification> {
    let mut classes: Vec<Classification> = scan
        .cgroups
        .iter()
        .map(|cgroup| classify_scan_one(naming, cgroup, &mut runtime))
        .collect();
    let pods = pod_level_pods(scan.cgroups.iter().zip(&classes));
    for class in &mut classes {
        if let Some(changed) = in_pod_level_pod(class, &pods) {
            *class = changed;
        }
    }
    classes
}

/// Classifies one scanned cgroup; `runtime` is called only for containers.
pub fn classify_scan_one(
    naming: &CgroupNaming,
    cgroup: &ScannedCgroup,
    mut runtime: impl FnMut(&str) -> Option<RuntimeInfo>,
) -> Classification {
    let path = parse_path(naming, &cgroup.relative);
    let info = match (&path.kind, &path.container_id) {
        (CgroupKind::Container, Some(id)) => runtime(id),
        _ => None,
    };
    classify(naming, &cgroup.relative, &cgroup.cpu, info.as_ref())
}

/// A Guaranteed pod whose CPU is set at pod level (`spec.resources`, KEP-2837), found from the
/// whole pod by [`pod_level_pods`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLevelPod {
    /// The pod cgroup (scan path), whose model entry says it once.
    pub pod: CgroupPath,
    /// The pod-level limit (the pod cgroup's `cpu.max`, or a container's where the pod's was
    /// lifted).
    pub limit: Option<Millicores>,
}

/// What one pod's cgroups add up to, for [`pod_level_pods`].
#[derive(Debug, Default)]
struct PodTotals {
    pod: Option<(CgroupPath, CpuResources)>,
    /// A container of the pod is pod-level on its own ([`pod_level_resources`]).
    own: Option<Option<Millicores>>,
    /// By container name: the lowest request and limit it may have (`None`: no limit).
    members: BTreeMap<String, (u64, Option<u64>)>,
    limit: Option<Millicores>,
}

impl PodTotals {
    /// Counts a container by its name (a restarted container's new cgroup may come before its
    /// old one goes: one name counts once, at its largest). One without a name (no runtime
    /// config), or read from a cgroup that still holds the kernel's default, counts for
    /// nothing.
    fn add_container(&mut self, cgroup: &ScannedCgroup, class: &Classification) {
        if let Exclusivity::Shared {
            reason: SharedReason::PodLevelResources { limit },
        } = &class.exclusivity
        {
            self.own = Some(*limit);
        }
        let (Some(resources), Some(name)) = (class.resources, class.container_name.as_ref()) else {
            return;
        };
        if resources.source != CpuSource::OciConfig && holds_kernel_default(&cgroup.cpu) {
            return;
        }
        self.limit = self.limit.or(resources.limit);
        let now = (
            bounds(resources.request).0,
            resources.limit.map(|l| bounds(l).0),
        );
        let member = self.members.entry(name.clone()).or_insert(now);
        member.0 = member.0.max(now.0);
        member.1 = match (member.1, now.1) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
    }

    /// kubelet sets a Guaranteed pod's cgroup from the sum of its containers' requests and
    /// limits (plus any overhead), so no container-level pod has containers that add up to
    /// more than it. A pod-level pod does: kubelet gives each container that sets no CPU the
    /// pod-level limit as its limit and (its request defaulting to its limit) as its shares.
    fn pod_level(&self) -> Option<PodLevelPod> {
        let (path, pod) = self.pod.as_ref()?;
        let requests: u64 = self.members.values().map(|m| m.0).sum();
        let limits: Option<u64> = self.members.values().map(|m| m.1).sum();
        let over_requests = requests > bounds(pod.request).1;
        let over_limits = match (limits, pod.limit) {
            (Some(sum), Some(limit)) => sum > bounds(limit).1,
            _ => false,
        };
        let limit = pod.limit.or(self.limit);
        match self.own {
            Some(own) => Some(PodLevelPod {
                pod: path.clone(),
                limit: limit.or(own),
            }),
            None if over_requests || over_limits => Some(PodLevelPod {
                pod: path.clone(),
                limit,
            }),
            None => None,
        }
    }
}

/// The pods whose CPU is set at pod level, by pod UID, from the whole pod: kubelet 1.34–1.36's
/// static policy skips every container of such a pod (`IsPodLevelResourcesSet`), whatever a
/// container asks. cgroup v2 only (kubelet refuses such pods on v1). A pod is one when a
/// container of it is one on its own ([`pod_level_resources`]), or when its containers'
/// requests or limits (what classification read: the runtime config's where found) add up to
/// more than its pod cgroup's (`cpu.weight`, `cpu.max`). Containers count by name (known from
/// the runtime config): one without, or whose settings are not known yet, counts for nothing.
/// A pod with one container that sets no CPU is not found: its
/// cgroups and runtime config are those of a container-level pod (DECISIONS, "Pod-level
/// resources").
pub fn pod_level_pods<'a>(
    cgroups: impl IntoIterator<Item = (&'a ScannedCgroup, &'a Classification)>,
) -> BTreeMap<String, PodLevelPod> {
    let mut pods: BTreeMap<String, PodTotals> = BTreeMap::new();
    for (cgroup, class) in cgroups {
        if class.qos != Some(QosClass::Guaranteed) || !matches!(cgroup.cpu, CpuSettings::V2 { .. })
        {
            continue;
        }
        let Some(uid) = class.pod_uid.as_ref() else {
            continue;
        };
        match class.kind {
            CgroupKind::Pod if !holds_kernel_default(&cgroup.cpu) => {
                if let Some((resources, _)) = resources_from_cgroup(&cgroup.cpu) {
                    pods.entry(uid.clone()).or_default().pod =
                        Some((cgroup.path.clone(), resources));
                }
            }
            CgroupKind::Container => pods
                .entry(uid.clone())
                .or_default()
                .add_container(cgroup, class),
            _ => {}
        }
    }
    pods.into_iter()
        .filter_map(|(uid, totals)| totals.pod_level().map(|pod| (uid, pod)))
        .collect()
}

/// `class` as it stands in a pod found by [`pod_level_pods`]: a container of such a pod that is
/// not already shared for that reason gets [`SharedReason::PodLevelResources`]; `None` when
/// nothing changes (not such a container, or already so).
pub fn in_pod_level_pod(
    class: &Classification,
    pods: &BTreeMap<String, PodLevelPod>,
) -> Option<Classification> {
    if class.kind != CgroupKind::Container {
        return None;
    }
    let pod = pods.get(class.pod_uid.as_ref()?)?;
    if matches!(
        class.exclusivity,
        Exclusivity::Shared {
            reason: SharedReason::PodLevelResources { .. }
        }
    ) {
        return None;
    }
    Some(Classification {
        exclusivity: Exclusivity::Shared {
            reason: SharedReason::PodLevelResources { limit: pod.limit },
        },
        ..class.clone()
    })
}

#[allow(clippy::too_many_lines)]
#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    use super::*;
    use crate::cgroupfs::{CpuMax, ValueError};
    use crate::runtime::OciCpu;

    const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
    const UID_: &str = "0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0";
    const ID: &str = "4c0ffee4c0ffee4c0ffee4c0ffee4c0ffee4c0ffee4c0ffee4c0ffee4c0ffee0";

    fn cgroupfs() -> CgroupNaming {
        CgroupNaming::new(
            CgroupDriver::Cgroupfs,
            &CgroupPath::new("kubepods").unwrap(),
        )
    }

    fn systemd() -> CgroupNaming {
        CgroupNaming::new(
            CgroupDriver::Systemd,
            &CgroupPath::new("kubepods.slice").unwrap(),
        )
    }

    fn path(text: &str) -> CgroupPath {
        CgroupPath::new(text).unwrap()
    }

    fn v1(shares: u64, quota: Option<u64>) -> CpuSettings {
        CpuSettings::V1 {
            shares: FileValue::Value(shares),
            cfs_quota: FileValue::Value(quota.map_or(Quota::Unlimited, Quota::Micros)),
            cfs_period_us: FileValue::Value(100_000),
        }
    }

    fn v2(weight: u64, quota: Option<u64>) -> CpuSettings {
        CpuSettings::V2 {
            max: FileValue::Value(CpuMax {
                quota: quota.map_or(Quota::Unlimited, Quota::Micros),
                period_us: 100_000,
            }),
            weight: FileValue::Value(weight),
        }
    }

    fn runtime(pairs: &[(&str, &str)], cpu: OciCpu) -> RuntimeInfo {
        RuntimeInfo {
            annotations: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
            cpu,
            ..RuntimeInfo::default()
        }
    }

    fn kind_of(naming: &CgroupNaming, text: &str) -> CgroupKind {
        parse_path(naming, &path(text)).kind
    }

    #[test]
    fn cgroupfs_paths() {
        let n = cgroupfs();
        assert_eq!(kind_of(&n, ""), CgroupKind::KubepodsRoot);
        for (text, qos) in [
            ("burstable", QosClass::Burstable),
            ("besteffort", QosClass::BestEffort),
        ] {
            let info = parse_path(&n, &path(text));
            assert_eq!((info.kind, info.qos), (CgroupKind::QosDir, Some(qos)));
        }
        let pod = parse_path(&n, &path(&format!("pod{UID}")));
        assert_eq!(pod.kind, CgroupKind::Pod);
        assert_eq!(pod.qos, Some(QosClass::Guaranteed));
        assert_eq!(pod.pod_uid.as_deref(), Some(UID));
        let pod = parse_path(&n, &path(&format!("besteffort/pod{UID}")));
        assert_eq!(pod.qos, Some(QosClass::BestEffort));

        let container = parse_path(&n, &path(&format!("burstable/pod{UID}/{ID}")));
        assert_eq!(container.kind, CgroupKind::Container);
        assert_eq!(container.qos, Some(QosClass::Burstable));
        assert_eq!(container.pod_uid.as_deref(), Some(UID));
        assert_eq!(container.container_id.as_deref(), Some(ID));
        let crio = parse_path(&n, &path(&format!("pod{UID}/crio-{ID}")));
        assert_eq!(crio.container_id.as_deref(), Some(ID));

        let child = parse_path(&n, &path(&format!("pod{UID}/{ID}/sub/deeper")));
        assert_eq!(child.kind, CgroupKind::ContainerChild);
        assert_eq!(child.container_id.as_deref(), Some(ID));
        assert_eq!(child.qos, Some(QosClass::Guaranteed));

        // A static pod's UID is an md5 hash without dashes.
        let static_pod = parse_path(&n, &path("burstable/pod6d5f0a1b2c3d4e5f6a7b8c9d0e1f2a3b"));
        assert_eq!(static_pod.kind, CgroupKind::Pod);
    }

    #[test]
    fn systemd_paths() {
        let n = systemd();
        let info = parse_path(&n, &path("kubepods-burstable.slice"));
        assert_eq!(info.qos, Some(QosClass::Burstable));
        let pod = parse_path(&n, &path(&format!("kubepods-pod{UID_}.slice")));
        assert_eq!(pod.kind, CgroupKind::Pod);
        assert_eq!(pod.qos, Some(QosClass::Guaranteed));
        assert_eq!(pod.pod_uid.as_deref(), Some(UID), "normalised with '-'");
        let pod = parse_path(
            &n,
            &path(&format!(
                "kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"
            )),
        );
        assert_eq!(pod.qos, Some(QosClass::BestEffort));
        for scope in [
            format!("cri-containerd-{ID}.scope"),
            format!("crio-{ID}.scope"),
            format!("docker-{ID}.scope"),
        ] {
            let info = parse_path(&n, &path(&format!("kubepods-pod{UID_}.slice/{scope}")));
            assert_eq!(info.kind, CgroupKind::Container, "{scope}");
            assert_eq!(info.container_id.as_deref(), Some(ID));
        }
        let conmon = kind_of(
            &n,
            &format!("kubepods-pod{UID_}.slice/crio-conmon-{ID}.scope"),
        );
        assert!(
            matches!(
                conmon,
                CgroupKind::Unknown {
                    reason: UnknownReason::RuntimeHelper { .. }
                }
            ),
            "{conmon:?}"
        );
        // crun's "container" sub-cgroup is a child of the container.
        let child = kind_of(
            &n,
            &format!("kubepods-pod{UID_}.slice/crio-{ID}.scope/container"),
        );
        assert_eq!(child, CgroupKind::ContainerChild);
        // A burstable pod slice directly under the root is not a Guaranteed pod.
        let misplaced = kind_of(&n, &format!("kubepods-burstable-pod{UID_}.slice"));
        assert!(
            matches!(misplaced, CgroupKind::Unknown { .. }),
            "{misplaced:?}"
        );
    }

    #[test]
    fn systemd_prefix_follows_a_custom_kubepods_slice() {
        let n = CgroupNaming::new(
            CgroupDriver::Systemd,
            &path("kubelet.slice/kubelet-kubepods.slice"),
        );
        let pod = parse_path(
            &n,
            &path(&format!(
                "kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{UID_}.slice"
            )),
        );
        assert_eq!(pod.kind, CgroupKind::Pod);
        assert_eq!(pod.qos, Some(QosClass::Burstable));
    }

    #[test]
    fn malformed_names_are_unknown_with_a_reason() {
        let n = cgroupfs();
        let long = "p".repeat(255);
        let cases: Vec<(String, &str)> = vec![
            (
                "not-a-pod".into(),
                "neither a QoS class directory nor a pod",
            ),
            ("pod with space".into(), "does not hold a valid pod UID"),
            (
                "pod\nnewline".into(),
                "'pod\\nnewline' does not hold a valid pod UID",
            ),
            ("podé-ü".into(), "does not hold a valid pod UID"),
            (
                format!("pod{}", UID.to_uppercase()),
                "does not hold a valid pod UID",
            ),
            (format!("pod{UID_}"), "does not hold a valid pod UID"),
            (long.clone(), "neither a QoS class"),
            ("burstable/x".into(), "is not a pod of its QoS class"),
            (
                format!("pod{UID}/{}", ID.to_uppercase()),
                "is not a container cgroup",
            ),
            (
                format!("pod{UID}/{}", &ID[..63]),
                "is not a container cgroup",
            ),
            (
                format!("pod{UID}/cri-containerd-{ID}.scope"),
                "is not a container cgroup",
            ),
            (
                "not-a-pod/child/grandchild".into(),
                "inside the unknown cgroup 'not-a-pod'",
            ),
        ];
        for (text, why) in cases {
            match kind_of(&n, &text) {
                CgroupKind::Unknown { reason } => {
                    assert!(reason.to_string().contains(why), "{text:?}: {reason}");
                    assert!(!reason.to_string().contains('\n'));
                }
                other => panic!("{text:?} classified as {other:?}"),
            }
        }
        let bytes = CgroupPath::root()
            .join(OsStr::from_bytes(b"pod\xff"))
            .unwrap();
        let info = parse_path(&n, &bytes);
        assert!(
            matches!(&info.kind, CgroupKind::Unknown { reason: UnknownReason::NotUtf8 { name } } if name == "pod\\xff"),
            "{info:?}"
        );
        // Below a container, any name is the container's own business.
        let child = path(&format!("pod{UID}/{ID}"))
            .join(OsStr::from_bytes(b"\xff\n"))
            .unwrap();
        assert_eq!(parse_path(&n, &child).kind, CgroupKind::ContainerChild);
    }

    #[test]
    fn shares_invert_exactly() {
        for milli in 3..256_000u64 {
            let shares = milli_to_shares(milli);
            assert_eq!(
                shares_to_milli(shares),
                Millicores::Exact(milli),
                "{milli}m"
            );
        }
        assert_eq!(milli_to_shares(0), 2);
        assert_eq!(shares_to_milli(2), Millicores::Between { min: 0, max: 2 });
        assert!(matches!(shares_to_milli(42), Millicores::Between { .. }));
        assert_eq!(
            shares_to_milli(262_144),
            Millicores::Between {
                min: 256_000,
                max: u64::MAX
            }
        );
    }

    #[test]
    fn quota_inverts_exactly_for_common_periods() {
        for period in [100_000u64, 50_000, 10_000, 1_000_000] {
            for milli in (11..=64_000u64).step_by(7) {
                let quota = milli * period / 1000;
                if quota <= MIN_QUOTA_US {
                    continue;
                }
                assert_eq!(
                    quota_to_milli(quota, period),
                    Millicores::Exact(milli),
                    "{milli}m period {period}"
                );
            }
        }
        assert_eq!(
            quota_to_milli(1000, 100_000),
            Millicores::Between { min: 1, max: 10 }
        );
    }

    #[test]
    fn weight_conversions_match_the_runtimes() {
        assert_eq!(weight_linear(2), 1);
        assert_eq!(weight_linear(1024), 39);
        assert_eq!(weight_linear(2048), 79);
        assert_eq!(weight_linear(262_144), 10_000);
        assert_eq!(weight_quadratic(2), 1);
        assert_eq!(weight_quadratic(1024), 100);
        assert_eq!(weight_quadratic(1536), 138);
        assert_eq!(weight_quadratic(2048), 174);
        assert_eq!(weight_quadratic(262_144), 10_000);
        // Every weight of a whole-CPU request maps back to a range holding that request.
        for cpus in 1..=64u64 {
            for convert in [weight_linear, weight_quadratic] {
                let weight = convert(milli_to_shares(cpus * 1000));
                let (min, max) = match weight_to_milli(weight).unwrap() {
                    Millicores::Exact(m) => (m, m),
                    Millicores::Between { min, max } => (min, max),
                };
                assert!(min <= cpus * 1000 && cpus * 1000 <= max, "{cpus} cpus");
            }
        }
    }

    fn exclusivity(
        naming: &CgroupNaming,
        text: &str,
        cpu: &CpuSettings,
        rt: Option<&RuntimeInfo>,
    ) -> Classification {
        classify(naming, &path(text), cpu, rt)
    }

    #[test]
    fn guaranteed_whole_cpus_are_exclusive_on_v1() {
        let n = cgroupfs();
        let c = exclusivity(
            &n,
            &format!("pod{UID}/{ID}"),
            &v1(2048, Some(200_000)),
            None,
        );
        assert_eq!(c.kind, CgroupKind::Container);
        assert_eq!(c.exclusivity, Exclusivity::Exclusive { cpus: 2 });
        assert_eq!(
            c.resources,
            Some(CpuResources {
                source: CpuSource::CgroupV1,
                request: Millicores::Exact(2000),
                limit: Some(Millicores::Exact(2000)),
            })
        );
        // After the agent lifted the quota, shares still say 2 CPUs.
        let c = exclusivity(&n, &format!("pod{UID}/{ID}"), &v1(2048, None), None);
        assert_eq!(c.exclusive_cpus(), 2);
        assert!(c.notices.is_empty(), "{:?}", c.notices);
    }

    #[test]
    fn fractional_burstable_and_besteffort_are_shared() {
        let n = cgroupfs();
        let c = exclusivity(
            &n,
            &format!("pod{UID}/{ID}"),
            &v1(1536, Some(150_000)),
            None,
        );
        assert_eq!(
            c.exclusivity,
            Exclusivity::Shared {
                reason: SharedReason::NotWholeCpus {
                    request: Millicores::Exact(1500)
                }
            }
        );
        let c = exclusivity(
            &n,
            &format!("burstable/pod{UID}/{ID}"),
            &v1(2048, Some(400_000)),
            None,
        );
        assert_eq!(
            c.exclusivity,
            Exclusivity::Shared {
                reason: SharedReason::NotGuaranteed {
                    qos: QosClass::Burstable
                }
            }
        );
        let c = exclusivity(&n, &format!("besteffort/pod{UID}/{ID}"), &v1(2, None), None);
        assert_eq!(
            c.kind,
            CgroupKind::Container,
            "no sandbox guess outside Guaranteed"
        );
        assert_eq!(c.exclusive_cpus(), 0);
    }

    #[test]
    fn sandboxes_are_shared() {
        let n = cgroupfs();
        // Heuristic: minimum shares and no limit in a Guaranteed pod.
        let c = exclusivity(&n, &format!("pod{UID}/{ID}"), &v1(2, None), None);
        assert_eq!(c.kind, CgroupKind::Sandbox);
        assert_eq!(
            c.exclusivity,
            Exclusivity::Shared {
                reason: SharedReason::Sandbox
            }
        );
        let c = exclusivity(&n, &format!("pod{UID}/{ID}"), &v2(1, None), None);
        assert_eq!(c.kind, CgroupKind::Sandbox);
        // The runtime's word wins, even for a sandbox with pod-level resources.
        let rt = runtime(
            &[("io.kubernetes.cri.container-type", "sandbox")],
            OciCpu {
                shares: Some(4096),
                quota: Some(400_000),
                period: Some(100_000),
            },
        );
        let c = exclusivity(
            &n,
            &format!("pod{UID}/{ID}"),
            &v1(4096, Some(400_000)),
            Some(&rt),
        );
        assert_eq!(c.kind, CgroupKind::Sandbox);
        assert_eq!(c.exclusive_cpus(), 0);
        let rt = runtime(
            &[("io.kubernetes.cri-o.ContainerType", "sandbox")],
            OciCpu::default(),
        );
        let c = exclusivity(&n, &format!("pod{UID}/{ID}"), &v1(1024, None), Some(&rt));
        assert_eq!(c.kind, CgroupKind::Sandbox);
    }

    #[test]
    fn runtime_config_is_the_first_source() {
        let n = cgroupfs();
        let rt = runtime(
            &[
                ("io.kubernetes.cri.container-type", "container"),
                ("io.kubernetes.cri.container-name", "app"),
                ("io.kubernetes.cri.sandbox-uid", UID),
            ],
            OciCpu {
                shares: Some(3072),
                quota: Some(300_000),
                period: Some(100_000),
            },
        );
        // v2 weight alone could not decide; the config's shares can.
        let c = exclusivity(
            &n,
            &format!("pod{UID}/{ID}"),
            &v2(weight_linear(3072), None),
            Some(&rt),
        );
        assert_eq!(c.exclusivity, Exclusivity::Exclusive { cpus: 3 });
        assert_eq!(c.container_name.as_deref(), Some("app"));
        assert_eq!(c.resources.unwrap().source, CpuSource::OciConfig);
        assert_eq!(
            c.assignment_key(),
            Some(AssignmentKey::Named {
                pod_uid: UID.into(),
                container: "app".into()
            })
        );
        // A cgroup still on the kernel's default is settling (issue 23, item 22): the config
        // wins and nothing is noticed; a value that is neither is noticed.
        let c = exclusivity(&n, &format!("pod{UID}/{ID}"), &v1(1024, None), Some(&rt));
        assert_eq!(c.exclusive_cpus(), 3);
        assert!(c.notices.is_empty(), "{:?}", c.notices);
        let c = exclusivity(&n, &format!("pod{UID}/{ID}"), &v2(100, None), Some(&rt));
        assert!(c.notices.is_empty(), "{:?}", c.notices);
        let c = exclusivity(&n, &format!("pod{UID}/{ID}"), &v1(1536, None), Some(&rt));
        assert_eq!(c.exclusive_cpus(), 3);
        assert!(matches!(
            c.notices.as_slice(),
            [Notice::RuntimeConfigDisagrees { .. }]
        ));
    }

    #[test]
    fn config_matches_cgroup_once_the_runtime_wrote_it() {
        let config = |shares| OciCpu {
            shares: Some(shares),
            quota: Some(200_000),
            period: Some(100_000),
        };
        // The kernel's defaults before the runtime writes, then the config's values.
        assert_eq!(
            config_matches_cgroup(&v1(1024, None), &config(2048)),
            Some(false)
        );
        assert_eq!(
            config_matches_cgroup(&v1(2048, None), &config(2048)),
            Some(true)
        );
        assert_eq!(
            config_matches_cgroup(&v2(100, None), &config(2048)),
            Some(false)
        );
        for convert in [weight_linear, weight_quadratic] {
            let settings = v2(convert(2048), Some(200_000));
            assert_eq!(config_matches_cgroup(&settings, &config(2048)), Some(true));
        }
        // Unknown either side.
        let unreadable = CpuSettings::V1 {
            shares: FileValue::Missing,
            cfs_quota: FileValue::Missing,
            cfs_period_us: FileValue::Missing,
        };
        assert_eq!(config_matches_cgroup(&unreadable, &config(2048)), None);
        assert_eq!(
            config_matches_cgroup(&v1(1024, None), &OciCpu::default()),
            None
        );
    }

    #[test]
    fn v2_weight_decides_with_an_exact_limit_only() {
        let n = systemd();
        let container = format!("kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope");
        for convert in [weight_linear, weight_quadratic] {
            let weight = convert(2048);
            let c = exclusivity(&n, &container, &v2(weight, Some(200_000)), None);
            assert_eq!(
                c.exclusivity,
                Exclusivity::Exclusive { cpus: 2 },
                "weight {weight}"
            );
            assert_eq!(c.resources.unwrap().request, Millicores::Exact(2000));

            let c = exclusivity(&n, &container, &v2(weight, None), None);
            assert!(
                matches!(
                    c.exclusivity,
                    Exclusivity::Shared {
                        reason: SharedReason::Undecidable { .. }
                    }
                ),
                "{c:?}"
            );
            assert!(matches!(c.notices.as_slice(), [Notice::LossyWeight { .. }]));

            // 1.5 CPUs: no whole request is consistent with the weight.
            let weight = convert(1536);
            let c = exclusivity(&n, &container, &v2(weight, None), None);
            assert!(
                matches!(
                    c.exclusivity,
                    Exclusivity::Shared {
                        reason: SharedReason::NotWholeCpus { .. }
                    }
                ),
                "{c:?}"
            );
            assert!(c.notices.is_empty());
        }
        // A limit inconsistent with the weight settles nothing.
        let c = exclusivity(
            &n,
            &container,
            &v2(weight_linear(1536), Some(200_000)),
            None,
        );
        assert_eq!(c.exclusive_cpus(), 0);
    }

    /// Issue 25 item 5: a pod whose CPU is set in `spec.resources` (KEP-2837) and whose
    /// containers set none. kubelet puts the pod-level limit on each such container
    /// (`getCPULimit`) and, its missing request defaulting to that limit, the same shares
    /// (`calculateLinuxResources`): alone, such a container is a container-level Guaranteed
    /// one. Its static policy (1.34–1.36) gives no container of such a pod exclusive CPUs; the
    /// pod shows it ([`pod_level_pods`]).
    #[test]
    fn pod_level_resources_keep_containers_shared_as_kubelet_does() {
        let n = systemd();
        let uid_ = "5a1e7c3d_2b4f_4e6a_9c8d_0f1e2d3c4b5a";
        let container = format!("kubepods-pod{uid_}.slice/cri-containerd-{ID}.scope");
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/runtime/pod-level-resources-containerd.json");
        let rt = crate::runtime::load_config(&fixture).unwrap().unwrap();
        assert_eq!(
            rt.cpu.shares,
            Some(2048),
            "kubelet's shares of the pod's limit"
        );
        // What runc wrote from that config: the weight of 2048 shares, the pod's limit.
        let cgroup = v2(weight_quadratic(2048), Some(200_000));
        let pod_level = Exclusivity::Shared {
            reason: SharedReason::PodLevelResources {
                limit: Some(Millicores::Exact(2000)),
            },
        };
        for rt in [Some(&rt), None] {
            // Alone it cannot tell: a container-level container of 2 CPUs.
            let c = exclusivity(&n, &container, &cgroup, rt);
            assert_eq!(c.kind, CgroupKind::Container, "{c:?}");
            assert_eq!(c.exclusive_cpus(), 2, "runtime config {}", rt.is_some());
        }
        let c = exclusivity(
            &n,
            &container,
            &v2(weight_quadratic(2), Some(200_000)),
            None,
        );
        let Exclusivity::Shared { reason } = &c.exclusivity else {
            panic!("{c:?}")
        };
        assert_eq!(
            reason.to_string(),
            "pod-level resources (spec.resources, cpu limit 2000m): kubelet's static policy \
             gives its containers no exclusive cpus"
        );
        // Its pause container: minimum shares and no limit, a sandbox as ever.
        let c = exclusivity(&n, &container, &v2(1, None), None);
        assert_eq!(c.kind, CgroupKind::Sandbox);
        // A container that sets a request of 1 CPU under the pod's limit of 2: kubelet skips
        // it too. The config (written at creation) shows request and limit apart.
        let own = runtime(
            &[("io.kubernetes.cri.container-type", "container")],
            OciCpu {
                shares: Some(1024),
                quota: Some(200_000),
                period: Some(100_000),
            },
        );
        let settings = v2(weight_quadratic(1024), Some(200_000));
        let c = exclusivity(&n, &container, &settings, Some(&own));
        assert_eq!(c.exclusivity, pod_level);
        // With no request and no limit either (kubelet's CFS quota off): still pod-level.
        let unlimited = runtime(
            &[("io.kubernetes.cri.container-type", "container")],
            OciCpu {
                shares: Some(2),
                quota: None,
                period: Some(100_000),
            },
        );
        let c = exclusivity(&n, &container, &v2(1, None), Some(&unlimited));
        assert_eq!(
            c.exclusivity,
            Exclusivity::Shared {
                reason: SharedReason::PodLevelResources { limit: None }
            }
        );
    }

    /// What pod-level resources must not catch: container-level Guaranteed pods (a tiny
    /// request with its minimum quota, whole CPUs with the CFS quota off or lifted) and cgroup
    /// v1, where kubelet refuses pod-level resources.
    #[test]
    fn container_level_guaranteed_pods_are_not_pod_level() {
        let n = systemd();
        let container = format!("kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope");
        let config = |shares, quota| {
            runtime(
                &[("io.kubernetes.cri.container-type", "container")],
                OciCpu {
                    shares: Some(shares),
                    quota,
                    period: Some(100_000),
                },
            )
        };
        // 1m request = limit: shares 2, the minimum quota (1 ms): the ranges meet.
        let tiny = config(2, Some(1_000));
        let c = exclusivity(&n, &container, &v2(1, Some(1_000)), Some(&tiny));
        assert!(
            matches!(
                c.exclusivity,
                Exclusivity::Shared {
                    reason: SharedReason::NotWholeCpus { .. }
                }
            ),
            "{c:?}"
        );
        // Two whole CPUs with no quota: exclusive, from the config or the settled cgroup.
        let whole = config(2048, None);
        let c = exclusivity(
            &n,
            &container,
            &v2(weight_quadratic(2048), None),
            Some(&whole),
        );
        assert_eq!(c.exclusive_cpus(), 2);
        let c = exclusivity(
            &n,
            &container,
            &v2(weight_quadratic(2048), Some(200_000)),
            None,
        );
        assert_eq!(c.exclusive_cpus(), 2);
        // cgroup v1: minimum shares under a 2-CPU quota is no pod-level pod there.
        let v1_container = format!("pod{UID}/{ID}");
        let c = exclusivity(&cgroupfs(), &v1_container, &v1(2, Some(200_000)), None);
        assert!(
            matches!(
                c.exclusivity,
                Exclusivity::Shared {
                    reason: SharedReason::NotWholeCpus { .. }
                }
            ),
            "{c:?}"
        );
    }

    fn scanned(relative: &str, cpu: CpuSettings) -> ScannedCgroup {
        ScannedCgroup {
            path: path(&format!("kubepods.slice/{relative}")),
            relative: path(relative),
            cpus: FileValue::Missing,
            mems: FileValue::Missing,
            effective_cpus: FileValue::Missing,
            cpu,
        }
    }

    fn scan_of(version: crate::cgroupfs::CgroupVersion, cgroups: Vec<ScannedCgroup>) -> Scan {
        Scan {
            version,
            kubepods: path("kubepods.slice"),
            cgroups,
            inherits: false,
            skipped: Vec::new(),
            complete: true,
            truncated: false,
            gone_pods: std::collections::BTreeSet::new(),
        }
    }

    fn id(n: u64) -> String {
        format!("{n:064x}")
    }

    fn config(name: &str, shares: u64, quota: Option<i64>) -> RuntimeInfo {
        runtime(
            &[
                ("io.kubernetes.cri.container-type", "container"),
                ("io.kubernetes.cri.container-name", name),
            ],
            OciCpu {
                shares: Some(shares),
                quota,
                period: Some(100_000),
            },
        )
    }

    /// A pod of `containers` (id, cgroup settings, runtime config) under a pod cgroup of
    /// `pod` settings (systemd driver, Guaranteed), classified as a whole.
    fn classify_pod(
        uid_: &str,
        pod: CpuSettings,
        containers: &[(String, CpuSettings, Option<RuntimeInfo>)],
    ) -> Vec<Classification> {
        let slice = format!("kubepods-pod{uid_}.slice");
        let mut cgroups = vec![scanned(&slice, pod)];
        for (id, cpu, _) in containers {
            cgroups.push(scanned(
                &format!("{slice}/cri-containerd-{id}.scope"),
                cpu.clone(),
            ));
        }
        let version = match cgroups[0].cpu {
            CpuSettings::V1 { .. } => crate::cgroupfs::CgroupVersion::V1,
            CpuSettings::V2 { .. } => crate::cgroupfs::CgroupVersion::V2,
        };
        let scan = scan_of(version, cgroups);
        let configs: BTreeMap<&str, Option<&RuntimeInfo>> = containers
            .iter()
            .map(|(id, _, rt)| (id.as_str(), rt.as_ref()))
            .collect();
        let mut classes = classify_scan(&systemd(), &scan, |id| configs[id].cloned());
        classes.remove(0);
        classes
    }

    /// The task's case on a real node: a pod with `spec.resources` cpu 2 and two containers
    /// that set none. Each container, laid out by kubelet and runc, is a 2-CPU one on its own
    /// (the fixture config.json, shares 2048 and quota 200000); together they are twice the
    /// pod cgroup. Both stay shared, with the reason; an ordinary Guaranteed pod beside it is
    /// pinned. Containers count by the name their runtime config gives (without configs the
    /// pod is not found), and with the pod's quota lifted the requests still tell. A pod-level
    /// pod of one such container is not found.
    #[test]
    fn pod_level_pod_is_found_from_the_whole_pod() {
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/runtime/pod-level-resources-containerd.json");
        let rt = crate::runtime::load_config(&fixture).unwrap().unwrap();
        let mut helper = rt.clone();
        helper
            .annotations
            .insert(keys::CRI_CONTAINER_NAME.into(), "helper".into());
        let batch = "5a1e7c3d_2b4f_4e6a_9c8d_0f1e2d3c4b5a";
        let pod_cgroup = v2(weight_linear(2048), Some(200_000));
        let member = v2(weight_linear(2048), Some(200_000));
        let pod_level = Exclusivity::Shared {
            reason: SharedReason::PodLevelResources {
                limit: Some(Millicores::Exact(2000)),
            },
        };
        let containers = [
            (id(1), member.clone(), Some(rt.clone())),
            (id(2), member.clone(), Some(helper.clone())),
        ];
        let classes = classify_pod(batch, pod_cgroup.clone(), &containers);
        for c in &classes {
            assert_eq!(c.exclusivity, pod_level, "{c:?}");
            assert_eq!(c.kind, CgroupKind::Container);
        }
        let db = classify_pod(UID_, pod_cgroup.clone(), &[(id(3), member.clone(), None)]);
        assert_eq!(db[0].exclusive_cpus(), 2, "{:?}", db[0]);
        // One such container alone is a container-level pod's (documented).
        let alone = classify_pod(batch, pod_cgroup.clone(), &containers[..1]);
        assert_eq!(alone[0].exclusive_cpus(), 2);
        // Without runtime configs, no names: not found.
        let unnamed = [(id(1), member.clone(), None), (id(2), member.clone(), None)];
        let classes = classify_pod(batch, pod_cgroup.clone(), &unnamed);
        assert!(
            classes.iter().all(|c| c.exclusive_cpus() == 2),
            "{classes:?}"
        );
        // The pod's and a member's quota lifted (as for exclusive containers): the configs'
        // requests, 4 CPUs under a pod of 2, still tell.
        let lifted = v2(weight_linear(2048), None);
        let containers = [
            (id(1), lifted.clone(), Some(rt.clone())),
            (id(2), member.clone(), Some(helper)),
        ];
        let classes = classify_pod(batch, lifted.clone(), &containers);
        assert!(
            classes.iter().all(|c| c.exclusive_cpus() == 0),
            "{classes:?}"
        );
        assert!(matches!(
            classes[0].exclusivity,
            Exclusivity::Shared {
                reason: SharedReason::PodLevelResources { limit: Some(_) }
            }
        ));
        // What the agent logs of the pod, once.
        let notice = Notice::PodLevelPod {
            limit: Some(Millicores::Exact(2000)),
        };
        assert_eq!(
            notice.to_string(),
            format!(
                "pod-level resources (spec.resources, cpu limit 2000m): its containers get no \
                 exclusive cpus: {POD_LEVEL_POLICY}"
            )
        );
    }

    /// kubelet skips every container of a pod-level pod, whatever it asks: one container that
    /// shows the pod-level limit (a request under it) takes its whole-CPU sibling with it, even
    /// with the pod's quota lifted.
    #[test]
    fn one_pod_level_container_keeps_its_siblings_shared() {
        let under = (
            id(1),
            v2(weight_linear(1024), Some(300_000)),
            Some(config("under", 1024, Some(300_000))),
        );
        let whole = (
            id(2),
            v2(weight_linear(2048), Some(200_000)),
            Some(config("whole", 2048, Some(200_000))),
        );
        let pod = v2(weight_linear(3072), None);
        let classes = classify_pod(UID_, pod.clone(), &[under.clone(), whole.clone()]);
        for c in &classes {
            assert_eq!(
                c.exclusivity,
                Exclusivity::Shared {
                    reason: SharedReason::PodLevelResources {
                        limit: Some(Millicores::Exact(3000))
                    }
                },
                "{c:?}"
            );
        }
        // Without the pod-level one, the whole-CPU container is pinned.
        let classes = classify_pod(UID_, v2(weight_linear(2048), Some(200_000)), &[whole]);
        assert_eq!(classes[0].exclusive_cpus(), 2);
    }

    /// Container-level Guaranteed pods never add up past their pod cgroup: a 1m container at
    /// kubelet's minimum quota beside a 2-CPU one, a pod with overhead, one container still
    /// waiting for its settings, and cgroup v1 (where kubelet refuses pod-level resources).
    #[test]
    fn container_level_pods_never_add_up_past_their_pod() {
        let tiny = (
            id(1),
            v2(1, Some(1_000)),
            Some(config("tiny", 2, Some(1_000))),
        );
        let whole = (
            id(2),
            v2(weight_linear(2048), Some(200_000)),
            Some(config("whole", 2048, Some(200_000))),
        );
        // kubelet's pod cgroup: the sum, 2001m (shares 2049, quota 200100).
        let pod = v2(weight_linear(milli_to_shares(2001)), Some(200_100));
        let classes = classify_pod(UID_, pod, &[tiny.clone(), whole.clone()]);
        assert_eq!(classes[1].exclusive_cpus(), 2, "{:?}", classes[1]);
        assert!(matches!(
            classes[0].exclusivity,
            Exclusivity::Shared {
                reason: SharedReason::NotWholeCpus { .. }
            }
        ));
        // With 250m of overhead on the pod cgroup.
        let overhead = v2(weight_linear(milli_to_shares(2251)), Some(225_100));
        let classes = classify_pod(UID_, overhead, &[tiny, whole.clone()]);
        assert_eq!(classes[1].exclusive_cpus(), 2);
        // A second member still at the kernel's defaults, its config without CPU values:
        // counts for nothing.
        let mut no_cpu = config("waiting", 0, None);
        no_cpu.cpu = OciCpu::default();
        let waiting = (id(3), v2(100, None), Some(no_cpu));
        let pod = v2(weight_linear(2048), Some(200_000));
        let classes = classify_pod(UID_, pod.clone(), &[whole.clone(), waiting]);
        assert_eq!(classes[0].exclusive_cpus(), 2, "{classes:?}");
        // A restart: the new cgroup of "whole" before its old one goes. One name, once.
        let again = (id(6), whole.1.clone(), whole.2.clone());
        let classes = classify_pod(UID_, pod, &[whole, again]);
        assert!(
            classes.iter().all(|c| c.exclusive_cpus() == 2),
            "{classes:?}"
        );
        // cgroup v1: two 2-CPU containers under a pod cgroup of 2 are not read as pod-level.
        let v1_member = (id(4), v1(2048, Some(200_000)), None);
        let v1_other = (id(5), v1(2048, Some(200_000)), None);
        let classes = classify_pod(UID_, v1(2048, Some(200_000)), &[v1_member, v1_other]);
        assert!(
            classes.iter().all(|c| c.exclusive_cpus() == 2),
            "{classes:?}"
        );
    }

    #[test]
    fn annotations_only_narrow() {
        let n = cgroupfs();
        let cpu = OciCpu {
            shares: Some(2048),
            quota: Some(200_000),
            period: Some(100_000),
        };
        let named = |extra: &[(&str, &str)]| {
            let mut pairs = vec![("io.kubernetes.container.name", "app")];
            pairs.extend_from_slice(extra);
            runtime(&pairs, cpu)
        };
        let pod_off = named(&[("cpusetd.io/exclusive", "false")]);
        let c = exclusivity(
            &n,
            &format!("pod{UID}/{ID}"),
            &v1(2048, Some(200_000)),
            Some(&pod_off),
        );
        assert_eq!(
            c.exclusivity,
            Exclusivity::Shared {
                reason: SharedReason::OptedOut {
                    annotation: "cpusetd.io/exclusive".into()
                }
            }
        );
        let ctr_off = named(&[("cpusetd.io/exclusive.app", "false")]);
        let c = exclusivity(
            &n,
            &format!("pod{UID}/{ID}"),
            &v1(2048, Some(200_000)),
            Some(&ctr_off),
        );
        assert_eq!(c.exclusive_cpus(), 0);
        let other_off = named(&[("cpusetd.io/exclusive.sidecar", "false")]);
        let c = exclusivity(
            &n,
            &format!("pod{UID}/{ID}"),
            &v1(2048, Some(200_000)),
            Some(&other_off),
        );
        assert_eq!(c.exclusive_cpus(), 2);
        // "true" cannot widen a Burstable container; garbage is noticed.
        let widen = named(&[
            ("cpusetd.io/exclusive", "true"),
            ("cpusetd.io/exclusive.app", "yes"),
        ]);
        let c = exclusivity(
            &n,
            &format!("burstable/pod{UID}/{ID}"),
            &v1(2048, Some(200_000)),
            Some(&widen),
        );
        assert_eq!(c.exclusive_cpus(), 0);
        assert!(matches!(
            c.notices.as_slice(),
            [Notice::IgnoredAnnotation { key, .. }] if key == "cpusetd.io/exclusive.app"
        ));
    }

    /// Every key classification asks a runtime config for is one the runtime lookup keeps
    /// ([`reads_annotation`], what `RuntimeInfo::trimmed` keeps): a key read but not kept would
    /// be trimmed from every cached config and silently never seen. And every listed key is
    /// read, so the list holds nothing stale.
    #[test]
    fn every_annotation_key_classification_reads_is_kept() {
        let cpu = OciCpu {
            shares: Some(2048),
            quota: Some(200_000),
            period: Some(100_000),
        };
        crate::runtime::asked::take();
        // A container without annotations asks for every key and falls back through each
        // alternative; a named one also asks for its per-container keys.
        for pairs in [&[][..], &[(keys::CRI_CONTAINER_NAME, "app")][..]] {
            for settings in [v1(2048, Some(200_000)), v2(79, Some(200_000))] {
                let info = runtime(pairs, cpu);
                let relative = path(&format!("pod{UID}/{ID}"));
                classify(&cgroupfs(), &relative, &settings, Some(&info));
            }
        }
        let asked = crate::runtime::asked::take();
        let every: Vec<(String, String)> =
            asked.iter().map(|key| (key.clone(), "x".into())).collect();
        let kept = RuntimeInfo {
            annotations: every.into_iter().collect(),
            ..RuntimeInfo::default()
        }
        .trimmed();
        for key in &asked {
            assert_eq!(
                kept.annotation(key),
                Some("x"),
                "classification reads {key:?} but the runtime lookup drops it: add it to ANNOTATION_KEYS"
            );
        }
        for key in ANNOTATION_KEYS {
            assert!(asked.contains(key), "{key:?} is kept but never read");
        }
        assert!(asked.contains("cpusetd.io/exclusive.app"), "{asked:?}");
        assert!(asked.contains("cpu-shared.crio.io/app"), "{asked:?}");
    }

    #[test]
    fn high_performance_annotations_read_as_cri_o_reads_them() {
        let n = cgroupfs();
        let cpu = OciCpu {
            shares: Some(1024),
            quota: Some(100_000),
            period: Some(100_000),
        };
        let classify_with = |pairs: &[(&str, &str)]| {
            let info = runtime(pairs, cpu);
            exclusivity(
                &n,
                &format!("pod{UID}/{ID}"),
                &v1(1024, Some(100_000)),
                Some(&info),
            )
        };
        let c = classify_with(&[
            ("cpu-quota.crio.io", "disable"),
            ("irq-load-balancing.crio.io", "true"),
            ("cpu-load-balancing.crio.io", "enable"),
        ]);
        assert_eq!(
            c.isolation,
            Isolation {
                no_cpu_quota: true,
                no_load_balancing: false,
                no_irqs: true,
                ..Isolation::default()
            }
        );
        assert_eq!(c.exclusive_cpus(), 1, "isolation never changes exclusivity");
        assert!(matches!(
            c.notices.as_slice(),
            [Notice::DeprecatedAnnotationValue { key }] if key == "irq-load-balancing.crio.io"
        ));
        let c = classify_with(&[("cpu-load-balancing.crio.io", " Disable ")]);
        assert!(
            !c.isolation.any(),
            "values are exact, as CRI-O compares them"
        );
        assert!(matches!(
            c.notices.as_slice(),
            [Notice::UnknownAnnotationValue { key, .. }] if key == "cpu-load-balancing.crio.io"
        ));
        assert_eq!(classify_with(&[]).isolation, Isolation::default());
        // CRI-O's other values: housekeeping, c-states and the governor.
        let c = classify_with(&[
            ("irq-load-balancing.crio.io", "housekeeping"),
            ("cpu-c-states.crio.io", "max_latency:10"),
            ("cpu-freq-governor.crio.io", "performance"),
        ]);
        assert!(c.isolation.no_irqs && c.isolation.irq_housekeeping);
        assert_eq!(c.isolation.c_states, Some(CState::MaxLatency(10)));
        assert_eq!(c.isolation.governor.unwrap().as_str(), "performance");
        assert!(c.notices.is_empty(), "{:?}", c.notices);
        for (value, written) in [("enable", "0"), ("disable", "n/a"), ("max_latency:7", "7")] {
            assert_eq!(CState::parse(value).unwrap().sysfs_value(), written);
        }
        for odd in [
            "max_latency:0",
            "max_latency:-3",
            "max_latency:",
            "Disable",
            "off",
        ] {
            let c = classify_with(&[("cpu-c-states.crio.io", odd)]);
            assert_eq!(c.isolation.c_states, None, "{odd}");
            assert!(matches!(
                c.notices.as_slice(),
                [Notice::BadAnnotationValue { key, .. }] if key == "cpu-c-states.crio.io"
            ));
        }
        for odd in ["", "Performance", "../../x", "a_very_long_governor_name"] {
            let c = classify_with(&[("cpu-freq-governor.crio.io", odd)]);
            assert_eq!(c.isolation.governor, None, "{odd}");
            assert_eq!(c.notices.len(), 1);
            assert!(c.notices[0].to_string().contains("cpufreq governor"));
        }
    }

    #[test]
    fn cpu_shared_and_projection_are_read_per_container_as_cri_o_reads_them() {
        let n = cgroupfs();
        let cpu = OciCpu {
            shares: Some(1024),
            quota: Some(100_000),
            period: Some(100_000),
        };
        let classify_with = |pairs: &[(&str, &str)]| {
            let mut pairs = pairs.to_vec();
            pairs.push(("io.kubernetes.cri.container-name", "app"));
            let info = runtime(&pairs, cpu);
            exclusivity(
                &n,
                &format!("pod{UID}/{ID}"),
                &v1(1024, Some(100_000)),
                Some(&info),
            )
        };
        let c = classify_with(&[
            ("cpu-shared.crio.io/app", "enable"),
            ("cpusetd.io/projection", "enable"),
        ]);
        assert!(c.cpu_shared && c.projection, "{c:?}");
        assert_eq!(
            c.exclusive_cpus(),
            1,
            "cpu-shared never changes exclusivity"
        );
        assert!(c.notices.is_empty(), "{:?}", c.notices);
        let other = classify_with(&[("cpu-shared.crio.io/sidecar", "enable")]);
        assert!(!other.cpu_shared, "another container's key");
        let off = classify_with(&[
            ("cpu-shared.crio.io/app", "disable"),
            ("cpusetd.io/projection", "disable"),
        ]);
        assert!(!off.cpu_shared && !off.projection && off.notices.is_empty());
        let odd = classify_with(&[("cpu-shared.crio.io/app", "true")]);
        assert!(!odd.cpu_shared, "values are exact, as CRI-O compares them");
        assert!(matches!(
            odd.notices.as_slice(),
            [Notice::NotEnableOrDisable { key, .. }] if key == "cpu-shared.crio.io/app"
        ));
        assert!(odd.notices[0].to_string().contains("\"true\" ignored"));
    }

    #[test]
    fn unusable_settings_keep_a_container_shared() {
        let n = cgroupfs();
        let garbage = CpuSettings::V2 {
            max: FileValue::Invalid {
                text: "garbage".into(),
                error: Box::new(ValueError::NotANumber {
                    text: "garbage".into(),
                }),
            },
            weight: FileValue::Missing,
        };
        let c = exclusivity(&n, &format!("pod{UID}/{ID}"), &garbage, None);
        assert_eq!(
            c.exclusivity,
            Exclusivity::Shared {
                reason: SharedReason::CpuSettingsUnavailable
            }
        );
        let negative = CpuSettings::V1 {
            shares: FileValue::Invalid {
                text: "-5".into(),
                error: Box::new(ValueError::NotANumber { text: "-5".into() }),
            },
            cfs_quota: FileValue::Value(Quota::Micros(200_000)),
            cfs_period_us: FileValue::Value(100_000),
        };
        let c = exclusivity(&n, &format!("pod{UID}/{ID}"), &negative, None);
        assert_eq!(c.exclusive_cpus(), 0);
        assert_eq!(c.resources, None);
    }

    #[test]
    fn pod_uid_from_the_cgroup_path_wins_and_mismatch_is_noticed() {
        let n = cgroupfs();
        let other = "11111111-2222-3333-4444-555555555555";
        let rt = runtime(&[("io.kubernetes.pod.uid", other)], OciCpu::default());
        let c = exclusivity(
            &n,
            &format!("pod{UID}/{ID}"),
            &v1(1024, Some(100_000)),
            Some(&rt),
        );
        assert_eq!(c.pod_uid.as_deref(), Some(UID));
        assert!(c
            .notices
            .iter()
            .any(|n| matches!(n, Notice::PodUidMismatch { .. })));
        assert!(
            matches!(c.assignment_key(), Some(AssignmentKey::Id { pod_uid, container_id }) if container_id == ID && pod_uid == UID)
        );
    }

    #[test]
    fn non_containers_carry_their_place() {
        let n = cgroupfs();
        let c = exclusivity(&n, &format!("burstable/pod{UID}"), &v1(1024, None), None);
        assert_eq!(c.kind, CgroupKind::Pod);
        assert_eq!(c.exclusivity, Exclusivity::NotApplicable);
        assert_eq!(c.assignment_key(), None);
        let c = exclusivity(&n, "", &v1(1024, None), None);
        assert_eq!(c.kind, CgroupKind::KubepodsRoot);
        assert_eq!(c.qos, None);
    }
}
