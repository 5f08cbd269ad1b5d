//! The harness for the tests of the real agent binary: a [`TestNode`] is a fake node made with
//! `cpusetd::kubesim` (on a private tmpfs when root, else in a temporary directory) with the
//! 2-socket, 8-core, HT, 2-NUMA topology of `testdata/sysfs/2s-8c-ht-2numa`; an [`Agent`] is
//! `cpusetd run` on it with the fake kernel's rules on, its log in a file, stopped (SIGTERM, then
//! SIGKILL after a deadline) on drop and its log printed when a test fails. Waiting is always
//! polling against a deadline: [`TestNode::wait_status`] runs `cpusetd status --json` until a
//! condition holds.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Deserialize;

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::cpuset::CpuSet;
use cpusetd::kubesim::{new_pod_uid, ContainerSpec, FakeNode, PodSpec, Qos};

use crate::util::{copy_tree, testdata};

/// The machine every fake node has: 16 CPUs, cores `{n, n+8}`, NUMA nodes 0-1.
pub const MACHINE: &str = "sysfs/2s-8c-ht-2numa";
/// How long anything the agent does may take before a test gives up.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// How often a condition is re-checked.
const POLL: Duration = Duration::from_millis(20);

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

/// Polls `probe` until it returns `Some` or `deadline` passes (then `None`).
pub fn poll_until<T>(deadline: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + deadline;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if Instant::now() >= end {
            return None;
        }
        thread::sleep(POLL);
    }
}

pub fn cpus(text: &str) -> CpuSet {
    CpuSet::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

fn is_root() -> bool {
    fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A tmpfs mounted on a directory, unmounted on drop.
#[derive(Debug)]
struct Tmpfs {
    mount_point: PathBuf,
}

impl Tmpfs {
    fn mount(on: &Path) -> Option<Tmpfs> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=256m,mode=0755", "cpusetd-test"])
            .arg(on)
            .output()
            .ok()?;
        if !out.status.success() {
            eprintln!(
                "tmpfs not mounted on {} ({}): using the temporary directory",
                on.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return None;
        }
        Some(Tmpfs {
            mount_point: on.to_path_buf(),
        })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let out = Command::new("umount").arg(&self.mount_point).output();
        if !out.is_ok_and(|o| o.status.success()) {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.mount_point)
                .status();
        }
    }
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
}

/// A fake node on tmpfs (root) or in a temporary directory, with its state dir, metrics file
/// and the fake kernel's refusal log.
#[derive(Debug)]
pub struct TestNode {
    pub fake: FakeNode,
    pub base: PathBuf,
    /// The `--sysfs-root`: the fixture itself, or a copy a test may change
    /// ([`TestNode::with_writable_sysfs`]).
    pub sysfs: PathBuf,
    started: Cell<usize>,
    // Dropped after every agent (tests declare agents after the node), tmpfs before the dir.
    _tmpfs: Option<Tmpfs>,
    _dir: tempfile::TempDir,
}

impl TestNode {
    pub fn new(version: CgroupVersion) -> TestNode {
        let dir = tempfile::Builder::new()
            .prefix("cpusetd-agent-")
            .tempdir()
            .unwrap();
        let base = dir.path().join("node");
        fs::create_dir(&base).unwrap();
        let tmpfs = if is_root() { Tmpfs::mount(&base) } else { None };
        let sysfs = testdata(MACHINE);
        let online = fs::read_to_string(sysfs.join("devices/system/cpu/online")).unwrap();
        fs::create_dir(base.join("cgroup")).unwrap();
        let fake = FakeNode::create(
            &base.join("cgroup"),
            version,
            cpus(online.trim()),
            cpus("0-1"),
            &base.join("runtime"),
        )
        .unwrap();
        fs::create_dir(base.join("state")).unwrap();
        TestNode {
            fake,
            base,
            sysfs,
            started: Cell::new(0),
            _tmpfs: tmpfs,
            _dir: dir,
        }
    }

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

    pub fn state_dir(&self) -> PathBuf {
        self.base.join("state")
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

    pub fn checkpoint(&self) -> PathBuf {
        self.state_dir().join("state.json")
    }

    pub fn metrics_file(&self) -> PathBuf {
        self.base.join("m.prom")
    }

    pub fn refusal_log(&self) -> PathBuf {
        self.base.join("refused.log")
    }

    /// The flags `run`, `status` and `reset` share: the tree, the topology, the state dir.
    pub fn tree_args(&self) -> Vec<String> {
        let sysfs = &self.sysfs;
        vec![
            "--cgroup-root".into(),
            self.fake.cgroup_root().display().to_string(),
            "--runtime-config-path".into(),
            self.fake.runtime_template(),
            "--sysfs-root".into(),
            sysfs.display().to_string(),
            "--proc-root".into(),
            sysfs.join("proc").display().to_string(),
            "--state-dir".into(),
            self.state_dir().display().to_string(),
        ]
    }

    /// `cpusetd run` with CPU 0 reserved and a 1 s reconcile period (unless `extra` names
    /// others), the metrics file, plus `extra` flags; does not wait for it.
    pub fn spawn_agent(&self, extra: &[&str]) -> Agent {
        let n = self.started.get() + 1;
        self.started.set(n);
        let log = self.base.join(format!("agent-{n}.log"));
        let mut args = vec!["run".to_string()];
        args.extend(self.tree_args());
        if !extra.contains(&"--reserved-cpus") {
            args.extend(["--reserved-cpus", "0"].map(String::from));
        }
        args.push("--metrics-file".into());
        args.push(self.metrics_file().display().to_string());
        if !extra.contains(&"--cpu-manager-reconcile-period") {
            args.extend(["--cpu-manager-reconcile-period", "1s"].map(String::from));
        }
        // Never this machine's kubelet checkpoint.
        if !extra.contains(&"--kubelet-state") {
            args.extend(["--kubelet-state", "none"].map(String::from));
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut command = Command::new(env!("CARGO_BIN_EXE_cpusetd"));
        command
            .args(&args)
            .env("CPUSETD_FAKE_KERNEL_RULES", "1")
            .env("CPUSETD_FAKE_KERNEL_LOG", self.refusal_log());
        Agent::spawn(command, &log, Some(self.refusal_log()))
    }

    /// Starts the agent and waits until its first pass is done.
    pub fn start_agent(&self, extra: &[&str]) -> Agent {
        let mut agent = self.spawn_agent(extra);
        agent.wait_for_log("first pass:");
        agent
    }

    /// Runs a `cpusetd` subcommand on this node's tree (`status`, `reset`) with `extra` flags.
    pub fn cpusetd(&self, command: &str, extra: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_cpusetd"))
            .arg(command)
            .args(self.tree_args())
            .args(extra)
            .env("RUST_LOG", "warn")
            .output()
            .expect("run cpusetd")
    }

    /// `cpusetd status --json`, or `None` while it fails (no checkpoint yet).
    pub fn status(&self) -> Option<Status> {
        let out = self.cpusetd("status", &["--json"]);
        if !out.status.success() {
            return None;
        }
        Some(serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "status --json: {e}: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        }))
    }

    /// Polls `status --json` until `condition` holds; panics after [`DEADLINE`] with the last
    /// status seen.
    pub fn wait_status(&self, what: &str, mut condition: impl FnMut(&Status) -> bool) -> Status {
        let mut last = None;
        let found = poll_until(DEADLINE, || {
            let status = self.status()?;
            if condition(&status) {
                return Some(status);
            }
            last = Some(status);
            None
        });
        found.unwrap_or_else(|| panic!("{what}: not within {DEADLINE:?}; last status:\n{last:#?}"))
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

    /// A container's `cpuset.cpus` as the file says.
    pub fn cpus_of(&self, pod: &PodSpec, id: &str) -> String {
        self.fake.container_cpus(pod, id).unwrap()
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

/// A running `cpusetd run`. Dropping it stops it (SIGTERM, SIGKILL after a deadline) and, when
/// the test is failing, prints its log and the fake kernel's refusals.
#[derive(Debug)]
pub struct Agent {
    child: Child,
    log: PathBuf,
    refusals: Option<PathBuf>,
    exit: Option<ExitStatus>,
}

impl Agent {
    /// Starts `command` (a `cpusetd run`) with info logs into `log`, without systemd's
    /// variables. `refusals` is the fake kernel's log, printed with the agent's on failure.
    pub fn spawn(mut command: Command, log: &Path, refusals: Option<PathBuf>) -> Agent {
        let child = command
            .env(
                "RUST_LOG",
                std::env::var("AGENT_LOG").unwrap_or("info".into()),
            )
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(log).unwrap())
            .spawn()
            .expect("start cpusetd run");
        Agent {
            child,
            log: log.to_path_buf(),
            refusals,
            exit: None,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.pid()), signal).unwrap();
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Lines of the log containing `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        self.log()
            .lines()
            .filter(|l| l.contains(needle))
            .map(String::from)
            .collect()
    }

    /// Waits until the log has a line containing `needle`; panics if the agent exits first or
    /// [`DEADLINE`] passes.
    pub fn wait_for_log(&mut self, needle: &str) {
        self.wait_for_log_within(needle, DEADLINE)
    }

    /// [`Self::wait_for_log`] with another deadline.
    pub fn wait_for_log_within(&mut self, needle: &str, deadline: Duration) {
        let found = poll_until(deadline, || {
            if self.log().contains(needle) {
                return Some(true);
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                self.exit = Some(status);
                return Some(false);
            }
            None
        });
        match found {
            Some(true) => {}
            Some(false) => panic!("cpusetd exited ({:?}) before logging {needle:?}", self.exit),
            None => panic!("cpusetd did not log {needle:?} within {deadline:?}"),
        }
    }

    /// Waits for the agent to exit on its own.
    pub fn wait_exit(&mut self, deadline: Duration) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = poll_until(deadline, || self.child.try_wait().ok().flatten());
        }
        self.exit
    }

    /// SIGTERM and wait; SIGKILL if it does not stop within the deadline.
    pub fn stop(&mut self) -> ExitStatus {
        if let Some(status) = self.exit {
            return status;
        }
        let _ = kill(Pid::from_raw(self.pid()), Signal::SIGTERM);
        if let Some(status) = self.wait_exit(DEADLINE) {
            return status;
        }
        let _ = self.child.kill();
        let status = self.child.wait().unwrap();
        self.exit = Some(status);
        panic!("cpusetd did not stop within {DEADLINE:?} of SIGTERM: killed");
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = kill(Pid::from_raw(self.pid()), Signal::SIGTERM);
            if self.wait_exit(DEADLINE).is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
        if thread::panicking() {
            let mut text = String::new();
            let _ = writeln!(text, "---- cpusetd run log ({}) ----", self.log.display());
            text.push_str(&self.log());
            let refused = self
                .refusals
                .as_ref()
                .and_then(|r| fs::read_to_string(r).ok())
                .unwrap_or_default();
            if !refused.is_empty() {
                let _ = writeln!(text, "---- writes the kernel would refuse ----\n{refused}");
            }
            eprintln!("{text}");
        }
    }
}
