//! A fake node with the real agent running on it, for the reliability tests (crash, faults,
//! hostile input, confinement): a cgroup v1 tree made by `kubesim` (on a tmpfs when root, as
//! production's cgroupfs is not a disk), a fake sysfs, the agent binary started with the
//! fake-kernel rules, and `cpusetd status --json` to see what it did. Everything is torn down
//! on drop, even on panic.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::kubesim::FakeNode;
use cpusetd::topology::{write_fake_sysfs, RegularShape, Topology};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

/// How long the agent may take to settle after a change.
pub const SETTLE: Duration = Duration::from_secs(20);

/// Whether this process runs as root.
pub fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// 1 socket × 4 cores × 2 threads: cpus n and n+4 share a core.
pub fn small_topology() -> Topology {
    Topology::regular(RegularShape {
        sockets: 1,
        numa_nodes_per_socket: 1,
        uncore_caches_per_numa_node: 1,
        cores_per_uncore_cache: 4,
        threads_per_core: 2,
    })
    .unwrap()
}

/// A fake node and (when started) the agent on it.
pub struct Node {
    // Field order: the agent is stopped (Drop) before the tree goes.
    pub agent: Option<Child>,
    pub node: FakeNode,
    pub dir: PathBuf,
    pub state_dir: PathBuf,
    pub metrics: PathBuf,
    pub log: PathBuf,
    pub refusals: PathBuf,
    sysfs: PathBuf,
    proc_root: PathBuf,
    /// Extra environment for the agent (`CPUSETD_FAULTS`, …).
    pub env: Vec<(String, String)>,
    /// Extra flags for `run`.
    pub flags: Vec<String>,
    tmpfs: bool,
    _tmp: tempfile::TempDir,
}

impl Node {
    /// A v1 node with the small topology; on a tmpfs when root.
    pub fn new() -> Node {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("node");
        fs::create_dir(&dir).unwrap();
        let tmpfs = is_root()
            && Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=64m,mode=0755", "tmpfs"])
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success());
        let topo = small_topology();
        let (sysfs, proc_root) = (dir.join("sys"), dir.join("proc"));
        write_fake_sysfs(&topo, &sysfs, &proc_root).unwrap();
        let node = FakeNode::create(
            &dir.join("cgroup"),
            CgroupVersion::V1,
            topo.all_cpus().clone(),
            topo.memory_nodes().clone(),
            &dir.join("runtime"),
        )
        .unwrap();
        Node {
            agent: None,
            node,
            state_dir: dir.join("state"),
            metrics: dir.join("metrics/cpusetd.prom"),
            log: tmp.path().join("agent.log"),
            refusals: tmp.path().join("refused.log"),
            dir,
            sysfs,
            proc_root,
            env: Vec::new(),
            flags: Vec::new(),
            tmpfs,
            _tmp: tmp,
        }
    }

    /// The flags `run` and `status` share: the tree, the state dir.
    pub fn tree_flags(&self) -> Vec<String> {
        vec![
            "--cgroup-root".into(),
            self.node.cgroup_root().display().to_string(),
            "--sysfs-root".into(),
            self.sysfs.display().to_string(),
            "--proc-root".into(),
            self.proc_root.display().to_string(),
            "--runtime-config-path".into(),
            self.node.runtime_template(),
            "--reserved-cpus".into(),
            "0".into(),
            "--state-dir".into(),
            self.state_dir.display().to_string(),
        ]
    }

    /// The whole `run` command line after the binary.
    pub fn run_args(&self) -> Vec<String> {
        let mut args = vec!["run".to_string()];
        args.extend(self.tree_flags());
        args.extend([
            "--cpu-manager-reconcile-period".into(),
            "150ms".into(),
            "--metrics-file".into(),
            self.metrics.display().to_string(),
        ]);
        args.extend(self.flags.iter().cloned());
        args
    }

    /// Starts the agent (with the fake-kernel rules); its stderr is appended to `self.log`.
    pub fn start(&mut self) {
        let command = self.command(Command::new(env!("CARGO_BIN_EXE_cpusetd")));
        self.spawn(command);
    }

    /// `wrapper` (e.g. `strace … --`) followed by the agent's command line.
    pub fn start_under(&mut self, wrapper: &[String]) {
        let mut command = Command::new(&wrapper[0]);
        command
            .args(&wrapper[1..])
            .arg(env!("CARGO_BIN_EXE_cpusetd"));
        let command = self.command(command);
        self.spawn(command);
    }

    fn command(&self, mut command: Command) -> Command {
        fs::create_dir_all(self.metrics.parent().unwrap()).unwrap();
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        command
            .args(self.run_args())
            .env("RUST_LOG", "info")
            .env("CPUSETD_FAKE_KERNEL_RULES", "1")
            .env("CPUSETD_FAKE_KERNEL_LOG", &self.refusals)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        command
    }

    fn spawn(&mut self, mut command: Command) {
        assert!(self.agent.is_none(), "the agent runs already");
        self.agent = Some(command.spawn().expect("start the agent"));
    }

    /// `kill -9` and reap.
    pub fn kill9(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            let _ = agent.kill();
            let _ = agent.wait();
        }
    }

    /// SIGTERM and wait (5 s at most, then SIGKILL); the exit status.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut agent = self.agent.take()?;
        let _ = kill(Pid::from_raw(agent.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = agent.try_wait() {
                return Some(status);
            }
            thread::sleep(Duration::from_millis(5));
        }
        let _ = agent.kill();
        agent.wait().ok()
    }

    /// Panics with the log if the agent has exited.
    pub fn assert_running(&mut self) {
        if let Some(agent) = self.agent.as_mut() {
            if let Ok(Some(status)) = agent.try_wait() {
                panic!("the agent exited ({status}); its log:\n{}", self.log_text());
            }
        }
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Log lines containing `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        self.log_text()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }

    /// What the fake kernel refused so far.
    pub fn refused(&self) -> Vec<String> {
        fs::read_to_string(&self.refusals)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    pub fn metrics_text(&self) -> String {
        fs::read_to_string(&self.metrics).unwrap_or_default()
    }

    /// `cpusetd status --json`, or its error message.
    pub fn status(&self) -> Result<Value, String> {
        let out = Command::new(env!("CARGO_BIN_EXE_cpusetd"))
            .arg("status")
            .args(self.tree_flags())
            .arg("--json")
            .env("RUST_LOG", "error")
            .output()
            .unwrap();
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
    }

    /// Waits until the checkpoint says a pass ended at or after `since_unix_ms` and `status`
    /// shows no differing row and `done` holds; returns that status. Panics with the agent's
    /// log at the deadline.
    pub fn settled(&mut self, since_unix_ms: u64, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + SETTLE;
        let mut last;
        loop {
            self.assert_running();
            match self.status() {
                Ok(status)
                    if differing(&status) == 0
                        && status["last_reconcile_unix_ms"]
                            .as_u64()
                            .is_some_and(|t| t >= since_unix_ms)
                        && done(&status) =>
                {
                    return status
                }
                Ok(status) => last = status.to_string(),
                Err(e) => last = e,
            }
            if Instant::now() > deadline {
                panic!(
                    "the agent did not settle in {SETTLE:?}; last status: {last}\nlog:\n{}",
                    tail(&self.log_text(), 40)
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// The host path of a cgroup file (relative path as kubesim names it).
    pub fn file(&self, rel: &str, file: &str) -> PathBuf {
        self.node.file(rel, file)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
        if self.tmpfs {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    cpusetd::checkpoint::unix_ms_now()
}

pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Rows whose current set differs from the desired one, leaving out those whose cpuset cannot
/// be read at all (a FIFO planted in its place: nothing the agent can repair).
pub fn differing(status: &Value) -> usize {
    rows(status)
        .iter()
        .filter(|r| {
            !r["current"].is_null() && !r["desired"].is_null() && r["current"] != r["desired"]
        })
        .count()
}

/// The container rows of a status document.
pub fn rows(status: &Value) -> Vec<&Value> {
    status["containers"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}
