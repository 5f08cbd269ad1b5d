//! The one harness that starts the agent, shared by the integration tests (a module of
//! tests/tests.rs) and the benchmarks (benches/common includes this same file with `#[path]`:
//! cargo builds each bench as a crate of its own, which cannot link the test binary's modules).
//! It uses only std, nix, tempfile and cpusetd's library, so it compiles in both.
//!
//! - [`TestNode`]: a fake node made with `cpusetd::kubesim` (on a private tmpfs when root, else
//!   in a temporary directory on /dev/shm or the default place) with a fixture's topology or a
//!   generated one ([`TestNode::builder`]), its state dir, metrics file and the fake kernel's
//!   refusal log, and the `run`, `status` and `reset` command lines that point at it.
//! - [`AgentProcess`]: one `cpusetd run` of this build, its log in a file. Waiting is always
//!   polling against a deadline and fails at once if the agent exits. Dropping it stops it
//!   (SIGTERM, SIGKILL after [`DEADLINE`]) and, when a test is failing, prints its log and the
//!   fake kernel's refusals.

use std::cell::Cell;
use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::cpuset::CpuSet;
use cpusetd::kubesim::FakeNode;
use cpusetd::topology::{write_fake_sysfs, Topology};

/// The machine a fake node has unless the builder says otherwise: 16 CPUs, cores `{n, n+8}`,
/// NUMA nodes 0-1.
pub const MACHINE: &str = "sysfs/2s-8c-ht-2numa";
/// How long anything the agent does may take before a test gives up.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// How often a condition is re-checked.
const POLL: Duration = Duration::from_millis(20);

/// `testdata/<rel>` in the source tree.
pub fn testdata(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(rel)
}

/// This build's `cpusetd` binary.
pub fn cpusetd_command() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cpusetd"))
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

/// The lines of `text` (a log) containing `needle`.
pub fn lines_with(text: &str, needle: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.contains(needle))
        .map(String::from)
        .collect()
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
        // No fixed size: a benchmark's node holds 10,000 containers' files.
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=50%,mode=0755", "cpusetd-test"])
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

/// Where a node's topology comes from.
#[derive(Debug)]
enum Machine {
    /// A sysfs fixture under testdata (`sysfs/<name>`), used in place.
    Fixture(String),
    /// A topology written as a fake sysfs into the node's directory.
    Generated(Box<Topology>),
}

/// How to make a [`TestNode`]: cgroup v1, the [`MACHINE`] fixture and the fake kernel's rules
/// unless told otherwise.
#[derive(Debug)]
pub struct TestNodeBuilder {
    version: CgroupVersion,
    machine: Machine,
    fake_kernel: bool,
}

impl TestNodeBuilder {
    pub fn version(mut self, version: CgroupVersion) -> Self {
        self.version = version;
        self
    }

    /// The topology of a sysfs fixture (`sysfs/<name>` under testdata).
    #[allow(dead_code)] // the benchmarks' (benches/common)
    pub fn fixture(mut self, rel: &str) -> Self {
        self.machine = Machine::Fixture(rel.to_string());
        self
    }

    /// A generated topology, written as the node's sysfs.
    pub fn topology(mut self, topology: Topology) -> Self {
        self.machine = Machine::Generated(Box::new(topology));
        self
    }

    /// Whether the agents started on the node apply the fake kernel's rules (v1 nesting,
    /// refusals logged): on for tests, off for benchmarks, which measure the agent alone.
    #[allow(dead_code)] // the benchmarks' (benches/common)
    pub fn fake_kernel(mut self, on: bool) -> Self {
        self.fake_kernel = on;
        self
    }

    pub fn build(self) -> TestNode {
        let shm = Path::new("/dev/shm");
        let mut builder = tempfile::Builder::new();
        builder.prefix("cpusetd-agent-");
        let dir = if shm.is_dir() {
            builder.tempdir_in(shm)
        } else {
            builder.tempdir()
        }
        .unwrap();
        let base = dir.path().join("node");
        fs::create_dir(&base).unwrap();
        let tmpfs = if is_root() { Tmpfs::mount(&base) } else { None };
        let (sysfs, cpus, mems) = match self.machine {
            Machine::Fixture(rel) => {
                let sysfs = testdata(&rel);
                let online = fs::read_to_string(sysfs.join("devices/system/cpu/online")).unwrap();
                let cpus = CpuSet::parse(online.trim()).unwrap();
                (sysfs, cpus, CpuSet::parse("0-1").unwrap())
            }
            Machine::Generated(topology) => {
                let sysfs = base.join("sys");
                write_fake_sysfs(&topology, &sysfs, &sysfs.join("proc")).unwrap();
                let mems = topology.memory_nodes().clone();
                (sysfs, topology.all_cpus().clone(), mems)
            }
        };
        fs::create_dir(base.join("cgroup")).unwrap();
        let fake = FakeNode::create(
            &base.join("cgroup"),
            self.version,
            cpus,
            mems,
            &base.join("runtime"),
        )
        .unwrap();
        fs::create_dir(base.join("state")).unwrap();
        TestNode {
            agent: None,
            env: Vec::new(),
            flags: Vec::new(),
            fake,
            base,
            sysfs,
            fake_kernel: self.fake_kernel,
            started: Cell::new(0),
            _tmpfs: tmpfs,
            _dir: dir,
        }
    }
}

/// A fake node with its state dir, metrics file and the fake kernel's refusal log, and the one
/// agent a test may leave to the node to start, restart and kill (`TestNode::start`, in the
/// tests' `harness`).
#[derive(Debug)]
pub struct TestNode {
    /// The agent `TestNode::start` started, its log appended across restarts; killed (SIGKILL)
    /// when the node goes, before the tree does.
    pub agent: Option<AgentProcess>,
    /// Extra environment for that agent (`CPUSETD_FAULTS`, …).
    pub env: Vec<(String, String)>,
    /// Extra flags for its `run`.
    pub flags: Vec<String>,
    pub fake: FakeNode,
    pub base: PathBuf,
    /// The `--sysfs-root` (its `proc` directory is the `--proc-root`): the fixture itself, a
    /// generated one, or a copy a test may change.
    pub sysfs: PathBuf,
    fake_kernel: bool,
    started: Cell<usize>,
    // Dropped after every agent (tests declare agents after the node), tmpfs before the dir.
    _tmpfs: Option<Tmpfs>,
    _dir: tempfile::TempDir,
}

impl TestNode {
    pub fn builder() -> TestNodeBuilder {
        TestNodeBuilder {
            version: CgroupVersion::V1,
            machine: Machine::Fixture(MACHINE.to_string()),
            fake_kernel: true,
        }
    }

    /// A node with the [`MACHINE`] topology and the fake kernel's rules.
    pub fn new(version: CgroupVersion) -> TestNode {
        TestNode::builder().version(version).build()
    }

    pub fn state_dir(&self) -> PathBuf {
        self.base.join("state")
    }

    pub fn checkpoint(&self) -> PathBuf {
        self.state_dir().join("state.json")
    }

    /// The metrics file, alone in its directory (what the confinement test allows the agent).
    pub fn metrics_file(&self) -> PathBuf {
        self.base.join("metrics/cpusetd.prom")
    }

    pub fn refusal_log(&self) -> PathBuf {
        self.base.join("refused.log")
    }

    /// The flags that point any command at this node: the tree, the runtime configs, the
    /// topology.
    pub fn node_args(&self) -> Vec<String> {
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
        ]
    }

    /// The flags `run`, `status` and `reset` share: [`Self::node_args`] and the state dir.
    pub fn tree_args(&self) -> Vec<String> {
        let mut args = self.node_args();
        args.extend(["--state-dir".into(), self.state_dir().display().to_string()]);
        args
    }

    /// `cpusetd run` on this node: [`Self::tree_args`], CPU 0 reserved, the metrics file, a
    /// 1 s reconcile period and no kubelet checkpoint or PodResources socket, each unless `extra` names the flag
    /// (`--reserved-cpu-count` replaces `--reserved-cpus`), then `extra`; with the fake
    /// kernel's rules when the node has them.
    pub fn agent_command(&self, extra: &[&str]) -> Command {
        let mut defaults = self.tree_args();
        let metrics = self.metrics_file();
        fs::create_dir_all(metrics.parent().unwrap()).unwrap();
        let metrics = metrics.display().to_string();
        defaults.extend(
            [
                "--reserved-cpus",
                "0",
                "--metrics-file",
                &metrics,
                "--cpu-manager-reconcile-period",
                "1s",
                // Never this machine's kubelet checkpoint, nor its PodResources socket.
                "--kubelet-state",
                "none",
                "--kubelet-pod-resources-socket",
                "none",
            ]
            .map(String::from),
        );
        let named = |flag: &str| {
            extra.contains(&flag)
                || (flag == "--reserved-cpus" && extra.contains(&"--reserved-cpu-count"))
        };
        let mut args = vec!["run".to_string()];
        for pair in defaults.chunks(2).filter(|pair| !named(&pair[0])) {
            args.extend_from_slice(pair);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut command = cpusetd_command();
        command.args(&args);
        if self.fake_kernel {
            command
                .env("CPUSETD_FAKE_KERNEL_RULES", "1")
                .env("CPUSETD_FAKE_KERNEL_LOG", self.refusal_log());
        }
        command
    }

    /// The fake kernel's refusal log, when the node's agents have the fake kernel's rules.
    pub fn refusals(&self) -> Option<PathBuf> {
        self.fake_kernel.then(|| self.refusal_log())
    }

    /// [`Self::agent_command`] started, its log in a file of its own; does not wait for it.
    pub fn spawn_agent(&self, extra: &[&str]) -> AgentProcess {
        let n = self.started.get() + 1;
        self.started.set(n);
        let log = self.base.join(format!("agent-{n}.log"));
        AgentProcess::spawn(self.agent_command(extra), &log, self.refusals())
    }

    /// Starts the agent and waits until its first pass is done.
    pub fn start_agent(&self, extra: &[&str]) -> AgentProcess {
        let mut agent = self.spawn_agent(extra);
        agent.wait_for_log("first pass:");
        agent
    }

    /// Runs a `cpusetd` subcommand on this node's tree (`status`, `reset`) with `extra` flags.
    pub fn cpusetd(&self, command: &str, extra: &[&str]) -> Output {
        cpusetd_command()
            .arg(command)
            .args(self.tree_args())
            .args(extra)
            .env("RUST_LOG", "warn")
            .output()
            .expect("run cpusetd")
    }

    /// The controller `cpusetd run` builds from its flags on this node (its state dir, CPU 0
    /// reserved unless `extra` reserves others), host effects, hotplug and projections on the
    /// node's sysfs and procfs, before its first scan: for driving it in process.
    pub fn controller(&self, extra: &[&str]) -> cpusetd::agent::Controller {
        let mut flags = self.tree_args();
        if !extra.contains(&"--reserved-cpu-count") && !extra.contains(&"--reserved-cpus") {
            flags.extend(["--reserved-cpus", "0"].map(String::from));
        }
        flags.extend(extra.iter().map(|s| s.to_string()));
        cpusetd::cli::controller(&flags).unwrap_or_else(|e| panic!("{flags:?}: {e:?}"))
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            agent.kill9();
        }
    }
}

/// A running `cpusetd run`. Dropping it stops it (SIGTERM, SIGKILL after [`DEADLINE`]) and,
/// when the test is failing, prints its log and the fake kernel's refusals.
#[derive(Debug)]
pub struct AgentProcess {
    child: Child,
    log: PathBuf,
    refusals: Option<PathBuf>,
    exit: Option<ExitStatus>,
}

impl AgentProcess {
    /// Starts `command` (a `cpusetd run`, maybe under a wrapper such as strace) with its stderr
    /// in a new file `log`, at `CPUSETD_AGENT_LOG`'s level (default `info`) unless the command
    /// sets `RUST_LOG`, and without systemd's variables unless the command sets them.
    /// `refusals` is the fake kernel's log, printed with the agent's on failure.
    pub fn spawn(command: Command, log: &Path, refusals: Option<PathBuf>) -> AgentProcess {
        let file = fs::File::create(log);
        AgentProcess::start(command, file, log, refusals)
    }

    /// [`Self::spawn`] with the log appended to `log` (one log across restarts).
    pub fn spawn_appending(
        command: Command,
        log: &Path,
        refusals: Option<PathBuf>,
    ) -> AgentProcess {
        let file = fs::OpenOptions::new().create(true).append(true).open(log);
        AgentProcess::start(command, file, log, refusals)
    }

    fn start(
        mut command: Command,
        file: std::io::Result<fs::File>,
        log: &Path,
        refusals: Option<PathBuf>,
    ) -> AgentProcess {
        let set = |name: &str| command.get_envs().any(|(k, v)| k == name && v.is_some());
        let (level, notify, watchdog) =
            (set("RUST_LOG"), set("NOTIFY_SOCKET"), set("WATCHDOG_USEC"));
        if !level {
            let level = std::env::var("CPUSETD_AGENT_LOG").unwrap_or_else(|_| "info".into());
            command.env("RUST_LOG", level);
        }
        if !notify {
            command.env_remove("NOTIFY_SOCKET");
        }
        if !watchdog {
            command.env_remove("WATCHDOG_USEC");
        }
        let file = file.unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start cpusetd run");
        AgentProcess {
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
        lines_with(&self.log(), needle)
    }

    /// The exit status, if the agent has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    /// Panics with the log if the agent has exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.exited() {
            panic!("the agent exited ({status}); its log:\n{}", self.log());
        }
    }

    /// Waits until `probe` holds; panics if the agent exits first or `deadline` passes.
    pub fn wait_until(&mut self, what: &str, deadline: Duration, mut probe: impl FnMut() -> bool) {
        let found = poll_until(deadline, || {
            if probe() {
                return Some(true);
            }
            self.exited().map(|_| false)
        });
        match found {
            Some(true) => {}
            Some(false) => panic!("cpusetd exited ({:?}) before {what}", self.exit),
            None => panic!("cpusetd did not get to {what} within {deadline:?}"),
        }
    }

    /// Waits until the log has a line containing `needle`; panics if the agent exits first or
    /// [`DEADLINE`] passes.
    pub fn wait_for_log(&mut self, needle: &str) {
        self.wait_for_log_within(needle, DEADLINE)
    }

    /// [`Self::wait_for_log`] with another deadline.
    pub fn wait_for_log_within(&mut self, needle: &str, deadline: Duration) {
        let log = self.log.clone();
        let logged = || {
            fs::read_to_string(&log)
                .unwrap_or_default()
                .contains(needle)
        };
        self.wait_until(&format!("logging {needle:?}"), deadline, logged)
    }

    /// Waits for the agent to exit on its own.
    pub fn wait_exit(&mut self, deadline: Duration) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = poll_until(deadline, || self.child.try_wait().ok().flatten());
        }
        self.exit
    }

    /// SIGTERM and wait; panics if it does not stop within [`DEADLINE`] (then killed).
    pub fn stop(&mut self) -> ExitStatus {
        self.stop_within(DEADLINE).unwrap_or_else(|_| {
            panic!("cpusetd did not stop within {DEADLINE:?} of SIGTERM: killed")
        })
    }

    /// SIGTERM and wait for `deadline`: its exit status, or `Err` with the status after a
    /// SIGKILL if it did not stop in time.
    pub fn stop_within(&mut self, deadline: Duration) -> Result<ExitStatus, ExitStatus> {
        if let Some(status) = self.exit {
            return Ok(status);
        }
        let _ = kill(Pid::from_raw(self.pid()), Signal::SIGTERM);
        if let Some(status) = self.wait_exit(deadline) {
            return Ok(status);
        }
        Err(self.kill9())
    }

    /// `kill -9` and reap; the exit status.
    pub fn kill9(&mut self) -> ExitStatus {
        if let Some(status) = self.exit {
            return status;
        }
        let _ = self.child.kill();
        // A raw wait status of 9: killed by SIGKILL, should the reaping itself fail.
        let status = self.child.wait().unwrap_or(ExitStatus::from_raw(9));
        self.exit = Some(status);
        status
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.stop_within(DEADLINE);
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
