//! What the tests of the real agent binary read and check on a [`TestNode`] (the node and the
//! [`AgentProcess`] started on it are in `agent_process`, shared with the benchmarks):
//! `cpusetd status --json` as typed rows, polled until a condition holds
//! ([`TestNode::wait_status`]), the metrics file, a container's files, CPU hotplug and PCI
//! devices in the node's sysfs, and what the fake kernel refused.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::cpuset::CpuSet;
use cpusetd::kubesim::{new_pod_uid, ContainerSpec, PodSpec, Qos};

use crate::agent_process::cpusetd_command;
pub use crate::agent_process::{poll_until, AgentProcess, TestNode, DEADLINE, MACHINE};
use crate::util::{copy_tree, testdata};

/// A Guaranteed pod with one container of `milli` millicores, named like the pod.
pub fn guaranteed(name: &str, milli: u64) -> PodSpec {
    pod(
        name,
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed(name, milli)],
    )
}

/// A BestEffort pod with one container, named like the pod.
pub fn best_effort(name: &str) -> PodSpec {
    pod(
        name,
        Qos::BestEffort,
        vec![ContainerSpec::best_effort(name)],
    )
}

pub fn cpus(text: &str) -> CpuSet {
    CpuSet::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

/// `cpusetd status --json` as the tests read it.
#[derive(Debug, Clone, Deserialize)]
pub struct Status {
    pub policy: String,
    pub shared_pool: String,
    pub exclusive_cpus: String,
    pub exclusive_cpu_count: usize,
    pub last_reconcile_unix_ms: Option<u64>,
    pub containers: Vec<Row>,
    pub differing: usize,
}

/// One container (or sandbox) row of `status --json`.
#[derive(Debug, Clone, Deserialize)]
pub struct Row {
    pub path: String,
    pub kind: String,
    pub pod_uid: Option<String>,
    pub pod_name: Option<String>,
    pub namespace: Option<String>,
    pub container: Option<String>,
    pub container_id: Option<String>,
    pub current: Option<String>,
    pub desired: Option<String>,
    pub exclusive: bool,
    pub note: String,
    #[serde(default)]
    pub isolation: Vec<String>,
    #[serde(default)]
    pub devices: Vec<DeviceRow>,
}

/// One device of a row of `status --json`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct DeviceRow {
    pub device: String,
    pub pci: Vec<String>,
    pub numa: Vec<u32>,
}

impl Status {
    /// The row of the container with this id.
    pub fn by_id(&self, id: &str) -> Option<&Row> {
        self.containers
            .iter()
            .find(|r| r.container_id.as_deref() == Some(id))
    }

    /// Whether the container with this id has `expected` as both its desired and actual set.
    pub fn has(&self, id: &str, expected: &str) -> bool {
        let expected = Some(cpus(expected).to_string());
        self.by_id(id)
            .is_some_and(|r| r.current == expected && r.desired == expected)
    }

    /// Every row has what the agent wants.
    pub fn converged(&self) -> bool {
        self.differing == 0
    }

    /// Rows whose current set differs from the desired one, leaving out those whose cpuset
    /// cannot be read at all (a FIFO planted in its place: nothing the agent can repair), which
    /// [`Status::differing`] counts.
    pub fn differing_readable(&self) -> usize {
        self.containers
            .iter()
            .filter(|r| r.current.is_some() && r.desired.is_some() && r.current != r.desired)
            .count()
    }
}

impl TestNode {
    /// A node whose sysfs is a copy of the fixture, so a test can take cpus offline
    /// ([`TestNode::set_cpu_online`]).
    pub fn with_writable_sysfs(version: CgroupVersion) -> TestNode {
        let mut node = TestNode::new(version);
        let copy = node.base.join("sys");
        copy_tree(&node.sysfs, &copy);
        node.sysfs = copy;
        node
    }

    /// CPU hotplug as the kernel does it: sysfs' `online` list and the cpu's own `online` file,
    /// and the cgroup tree. On v1 the kernel takes an offline cpu out of every cpuset (and puts
    /// it back only into the root's); on v2 only the effective sets change (the fake tree has
    /// the root's, which is what the agent reads). Done under the fake kernel's lock, as the
    /// kernel does it under `cgroup_mutex`.
    pub fn set_cpu_online(&self, cpu: u32, online: bool) {
        let cpu_dir = self.sysfs.join("devices/system/cpu");
        let list = cpu_dir.join("online");
        let mut now = cpus(fs::read_to_string(&list).unwrap().trim());
        if online {
            now.insert(cpu);
        } else {
            now.remove(cpu);
        }
        fs::write(
            cpu_dir.join(format!("cpu{cpu}/online")),
            format!("{}\n", u8::from(online)),
        )
        .unwrap();
        let root = match self.fake.version() {
            CgroupVersion::V1 => self.fake.cgroup_root().join("cpuset"),
            CgroupVersion::V2 => self.fake.cgroup_root().to_path_buf(),
        };
        let _lock = nix::fcntl::Flock::lock(
            fs::File::open(&root).unwrap(),
            nix::fcntl::FlockArg::LockExclusive,
        )
        .unwrap();
        match self.fake.version() {
            CgroupVersion::V1 => {
                for file in ["cpuset.cpus", "cpuset.effective_cpus"] {
                    fs::write(root.join(file), format!("{now}\n")).unwrap();
                }
                if !online {
                    remove_cpu_below(&root, cpu);
                }
            }
            CgroupVersion::V2 => {
                fs::write(root.join("cpuset.cpus.effective"), format!("{now}\n")).unwrap();
            }
        }
        fs::write(&list, format!("{now}\n")).unwrap();
    }

    /// Gives the node's sysfs a PCI function on a NUMA node (`numa` as the kernel writes it,
    /// `-1` for none): `devices/pci<domain>:<bus>/<addr>/numa_node`, with the
    /// `bus/pci/devices/<addr>` symlink the kernel makes, and, with `iommu_group`, its entry
    /// in `kernel/iommu_groups/<group>/devices`. The first change copies the machine's fixture
    /// under the node's directory (the fixture itself stays as generated). Before the agent
    /// starts: a device never moves while containers run.
    pub fn add_pci_device(&mut self, address: &str, numa: &str, iommu_group: Option<u32>) {
        if self.sysfs == testdata(MACHINE) {
            let copy = self.base.join("sys");
            copy_tree(&self.sysfs, &copy);
            self.sysfs = copy;
        }
        let bridge = format!("pci{}", &address[..7]);
        let device = self.sysfs.join("devices").join(&bridge).join(address);
        fs::create_dir_all(&device).unwrap();
        fs::write(device.join("numa_node"), format!("{numa}\n")).unwrap();
        let bus = self.sysfs.join("bus/pci/devices");
        fs::create_dir_all(&bus).unwrap();
        std::os::unix::fs::symlink(
            format!("../../../devices/{bridge}/{address}"),
            bus.join(address),
        )
        .unwrap();
        if let Some(group) = iommu_group {
            let members = self
                .sysfs
                .join(format!("kernel/iommu_groups/{group}/devices"));
            fs::create_dir_all(&members).unwrap();
            std::os::unix::fs::symlink(
                format!("../../../../devices/{bridge}/{address}"),
                members.join(address),
            )
            .unwrap();
        }
    }

    /// `cpusetd status --json`, or `None` while it fails (no checkpoint yet).
    pub fn status(&self) -> Option<Status> {
        status_of(&self.tree_args())
    }

    /// Polls `status --json` until `condition` holds; panics after [`DEADLINE`] with the last
    /// status seen.
    pub fn wait_status(&self, what: &str, condition: impl FnMut(&Status) -> bool) -> Status {
        wait_status_of(&self.tree_args(), what, condition)
    }

    /// Waits until the container `id` has `expected` both desired and actual, and the whole
    /// tree has converged.
    pub fn wait_cpus(&self, id: &str, expected: &str) -> Status {
        self.wait_status(&format!("container {id} on {expected}"), |s| {
            s.has(id, expected) && s.converged()
        })
    }

    /// The metrics file as `name{labels}` → value.
    pub fn metrics(&self) -> BTreeMap<String, f64> {
        parse_metrics(&fs::read_to_string(self.metrics_file()).unwrap_or_default())
    }

    pub fn metric(&self, name: &str) -> f64 {
        self.metrics().get(name).copied().unwrap_or(0.0)
    }

    /// A container's `cpuset.cpus` as the file says; on cgroup v2, where it is empty (the
    /// container follows its parent), its `cpuset.cpus.effective` (the fake kernel keeps it as
    /// the kernel does).
    pub fn cpus_of(&self, pod: &PodSpec, id: &str) -> String {
        let own = self.fake.container_cpus(pod, id).unwrap();
        if own.is_empty() && self.fake.version() == CgroupVersion::V2 {
            return self.read(pod, id, "cpuset.cpus.effective");
        }
        own
    }

    /// A file of a container (or of the pod with `id` empty), with the trailing newline trimmed.
    pub fn read(&self, pod: &PodSpec, id: &str, file: &str) -> String {
        let path = self.path(pod, id, file);
        fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .trim()
            .to_string()
    }

    /// Writes a value into a container's (or pod's) file, as someone else would.
    pub fn write(&self, pod: &PodSpec, id: &str, file: &str, value: &str) {
        let path = self.path(pod, id, file);
        fs::write(&path, format!("{value}\n"))
            .unwrap_or_else(|e| panic!("{value:?} > {}: {e}", path.display()))
    }

    fn path(&self, pod: &PodSpec, id: &str, file: &str) -> PathBuf {
        let rel = if id.is_empty() {
            self.fake.pod_dir(pod)
        } else {
            format!("{}/{id}", self.fake.pod_dir(pod))
        };
        self.fake.file(&rel, file)
    }

    /// No write the kernel would refuse was made, and none failed. One refusal is allowed: a
    /// narrowing refused with EBUSY because a runtime set up a child between the agent's check
    /// and its write (a race the agent re-plans at once, counted as a retry). Anything else
    /// (EACCES: a write outside the parent's set, which is what makes a runtime fail) fails.
    pub fn assert_clean(&self) {
        let refused = fs::read_to_string(self.refusal_log()).unwrap_or_default();
        let harmful: Vec<&str> = refused
            .lines()
            .filter(|l| !(l.contains(": EBUSY: ") && l.contains(": child ")))
            .collect();
        assert!(
            harmful.is_empty(),
            "writes the kernel would refuse:\n{refused}"
        );
        let errors: Vec<(String, f64)> = self
            .metrics()
            .into_iter()
            .filter(|(k, v)| k.starts_with("cpusetd_cgroup_write_errors_total") && *v > 0.0)
            .collect();
        assert!(errors.is_empty(), "failed cgroup writes: {errors:?}");
    }
}

/// v1's hotplug: `cpu` leaves the `cpuset.cpus` of every cgroup below `dir`.
fn remove_cpu_below(dir: &Path, cpu: u32) {
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if !entry.file_type().unwrap().is_dir() {
            continue;
        }
        let file = entry.path().join("cpuset.cpus");
        if let Ok(text) = fs::read_to_string(&file) {
            let mut set = cpus(text.trim());
            if set.contains(cpu) {
                set.remove(cpu);
                fs::write(&file, format!("{set}\n")).unwrap();
            }
        }
        remove_cpu_below(&entry.path(), cpu);
    }
}

/// `cpusetd status --json` with `tree_args` (a node's tree and state dir), or `None` while it
/// fails (no checkpoint yet). With no agent running (exit 3) the document is still read.
pub fn status_of(tree_args: &[String]) -> Option<Status> {
    let out = status_output(tree_args);
    if !out.status.success() && out.status.code() != Some(3) {
        return None;
    }
    Some(parse_status(&out.stdout))
}

/// `cpusetd status --json` with `tree_args` while an agent runs on the state dir (exit 0),
/// or what `status` said on stderr.
pub fn running_status_of(tree_args: &[String]) -> Result<Status, String> {
    let out = status_output(tree_args);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(parse_status(&out.stdout))
}

fn status_output(tree_args: &[String]) -> std::process::Output {
    cpusetd_command()
        .arg("status")
        .args(tree_args)
        .arg("--json")
        .env("RUST_LOG", "warn")
        // As the agents of the tests run: on v2 the plan leaves to inherit what a kernel
        // (here the fake one) makes follow its parent.
        .env("CPUSETD_FAKE_KERNEL_RULES", "1")
        .output()
        .expect("run cpusetd")
}

fn parse_status(stdout: &[u8]) -> Status {
    serde_json::from_slice(stdout)
        .unwrap_or_else(|e| panic!("status --json: {e}: {}", String::from_utf8_lossy(stdout)))
}

/// Polls [`status_of`] until `condition` holds; panics after [`DEADLINE`] with the last status
/// seen.
pub fn wait_status_of(
    tree_args: &[String],
    what: &str,
    mut condition: impl FnMut(&Status) -> bool,
) -> Status {
    let mut last = None;
    let found = poll_until(DEADLINE, || {
        let status = status_of(tree_args)?;
        if condition(&status) {
            return Some(status);
        }
        last = Some(status);
        None
    });
    found.unwrap_or_else(|| panic!("{what}: not within {DEADLINE:?}; last status:\n{last:#?}"))
}

/// Which build of cpusetd the tests run, for the figures they print.
pub fn build() -> &'static str {
    if cfg!(debug_assertions) {
        "debug build"
    } else {
        "release build"
    }
}

/// Prometheus text as `name{labels}` → value.
pub fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The agent's own event → pin summary, as printed by the latency tests.
pub fn pin_latency(metrics: &BTreeMap<String, f64>) -> String {
    let q = |q: &str| {
        metrics
            .get(&format!("cpusetd_event_to_pin_seconds{{quantile=\"{q}\"}}"))
            .map_or_else(|| "-".to_string(), |s| format!("{:.2} ms", s * 1000.0))
    };
    let count = metrics
        .get("cpusetd_event_to_pin_seconds_count")
        .copied()
        .unwrap_or(0.0);
    format!(
        "median {}, p90 {}, p99 {} over {count} containers",
        q("0.5"),
        q("0.9"),
        q("0.99")
    )
}

/// A pod spec with a fresh UID.
pub fn pod(name: &str, qos: Qos, containers: Vec<ContainerSpec>) -> PodSpec {
    PodSpec {
        uid: new_pod_uid(),
        name: name.into(),
        qos,
        containers,
    }
}
