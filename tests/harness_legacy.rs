//! TRANSITIONAL (removed once every reliability test reads the typed `Status`): the old
//! untyped harness. A fake node with the real agent running on it, for the reliability tests (crash, faults,
//! hostile input, confinement): a [`TestNode`] (cgroup v1, on a tmpfs when root, as
//! production's cgroupfs is not a disk) with a small generated topology, the agent started on
//! it as an [`AgentProcess`] with the fake-kernel rules and a fast reconcile tick, its log kept
//! across restarts, and `cpusetd status --json` to see what it did. Everything is torn down
//! on drop, even on panic.

use std::fs;
use std::ops::Deref;
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

use cpusetd::topology::{RegularShape, Topology};
use serde_json::Value;

use crate::agent_process::{cpusetd_command, lines_with, AgentProcess, TestNode};

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

/// A fake node and (when started) the agent on it; the node's own API through `Deref`.
pub struct Node {
    // Field order: the agent is stopped (Drop) before the tree goes.
    pub agent: Option<AgentProcess>,
    node: TestNode,
    /// The metrics file, alone in its directory (what the confinement test allows).
    pub metrics: PathBuf,
    /// The agent's log, appended to by every start.
    pub log: PathBuf,
    /// Extra environment for the agent (`CPUSETD_FAULTS`, …).
    pub env: Vec<(String, String)>,
    /// Extra flags for `run`.
    pub flags: Vec<String>,
}

impl Deref for Node {
    type Target = TestNode;
    fn deref(&self) -> &TestNode {
        &self.node
    }
}

impl Node {
    /// A v1 node with the small topology; on a tmpfs when root.
    pub fn new() -> Node {
        let node = TestNode::builder().topology(small_topology()).build();
        Node {
            agent: None,
            metrics: node.base.join("metrics/cpusetd.prom"),
            log: node.base.join("agent.log"),
            node,
            env: Vec::new(),
            flags: Vec::new(),
        }
    }

    /// The flags `run` and `status` share: the tree, the state dir, CPU 0 reserved.
    pub fn tree_flags(&self) -> Vec<String> {
        let mut args = self.tree_args();
        args.extend(["--reserved-cpus".into(), "0".into()]);
        args
    }

    /// The agent's command: a 150 ms reconcile period, the metrics file and `self.flags`.
    fn command(&self) -> Command {
        fs::create_dir_all(self.metrics.parent().unwrap()).unwrap();
        let metrics = self.metrics.display().to_string();
        let mut extra = vec!["--cpu-manager-reconcile-period", "150ms"];
        extra.extend(["--metrics-file", &metrics]);
        extra.extend(self.flags.iter().map(String::as_str));
        let mut command = self.agent_command(&extra);
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    /// The whole `run` command line after the binary.
    pub fn run_args(&self) -> Vec<String> {
        let command = self.command();
        let args = command.get_args().map(|a| a.to_string_lossy().into_owned());
        args.collect()
    }

    /// Starts the agent (with the fake-kernel rules).
    pub fn start(&mut self) {
        self.spawn(self.command());
    }

    /// `wrapper` (e.g. `strace … --`) followed by the agent's command line.
    pub fn start_under(&mut self, wrapper: &[String]) {
        let agent = self.command();
        let mut command = Command::new(&wrapper[0]);
        command
            .args(&wrapper[1..])
            .arg(agent.get_program())
            .args(agent.get_args());
        command.envs(agent.get_envs().filter_map(|(k, v)| Some((k, v?))));
        self.spawn(command);
    }

    fn spawn(&mut self, command: Command) {
        assert!(self.agent.is_none(), "the agent runs already");
        let agent = AgentProcess::spawn_appending(command, &self.log, self.refusals());
        self.agent = Some(agent);
    }

    /// `kill -9` and reap.
    pub fn kill9(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            agent.kill9();
        }
    }

    /// SIGTERM and wait (5 s at most, then SIGKILL); the exit status.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut agent = self.agent.take()?;
        Some(
            agent
                .stop_within(Duration::from_secs(5))
                .unwrap_or_else(|s| s),
        )
    }

    /// Panics with the log if the agent has exited.
    pub fn assert_running(&mut self) {
        if let Some(agent) = self.agent.as_mut() {
            agent.assert_running();
        }
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Log lines containing `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        lines_with(&self.log_text(), needle)
    }

    /// What the fake kernel refused so far.
    pub fn refused(&self) -> Vec<String> {
        fs::read_to_string(self.refusal_log())
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
        let out = cpusetd_command()
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
                // What a fresh one-shot plan of the same tree would write, for the diagnosis.
                let plan = cpusetd_command()
                    .arg("plan")
                    .args(self.tree_flags())
                    .env("RUST_LOG", "error")
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default();
                panic!(
                    "the agent did not settle in {SETTLE:?}; last status: {last}\nlog:\n{}\nplan:\n{}",
                    tail(&self.log_text(), 40),
                    tail(&plan, 30)
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// The host path of a cgroup file (relative path as kubesim names it).
    pub fn file(&self, rel: &str, file: &str) -> PathBuf {
        self.fake.file(rel, file)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
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
