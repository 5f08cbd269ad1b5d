//! The reliability tests' (crash, faults, hostile input, confinement) use of the one
//! [`TestNode`]: cgroup v1 with a small generated topology ([`TestNode::small`]), the agent
//! started on it by the node itself ([`TestNode::start`]) with the fake-kernel rules and a fast
//! reconcile tick, restarted and killed at will, its log kept across restarts, and
//! `cpusetd status --json` read as the typed [`Status`] until the agent has settled.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

use cpusetd::topology::{RegularShape, Topology};

use crate::agent_process::{cpusetd_command, lines_with, AgentProcess, TestNode};
use crate::agent_util::{running_status_of, Status};

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

impl TestNode {
    /// A v1 node with the small topology; on a tmpfs when root.
    pub fn small() -> TestNode {
        TestNode::builder().topology(small_topology()).build()
    }

    /// The flags `run` and `status` share: the tree, the state dir, CPU 0 reserved.
    pub fn tree_flags(&self) -> Vec<String> {
        let mut args = self.tree_args();
        args.extend(["--reserved-cpus".into(), "0".into()]);
        args
    }

    /// The log of the agent [`Self::start`] starts, appended to by every start.
    pub fn agent_log(&self) -> PathBuf {
        self.base.join("agent.log")
    }

    /// The started agent's command: a 150 ms reconcile period, `self.flags` and `self.env`.
    fn started_command(&self) -> Command {
        let mut extra = vec!["--cpu-manager-reconcile-period", "150ms"];
        extra.extend(self.flags.iter().map(String::as_str));
        let mut command = self.agent_command(&extra);
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    /// The whole `run` command line after the binary.
    pub fn run_args(&self) -> Vec<String> {
        let command = self.started_command();
        let args = command.get_args().map(|a| a.to_string_lossy().into_owned());
        args.collect()
    }

    /// Starts the node's agent (with the fake-kernel rules); does not wait for it.
    pub fn start(&mut self) {
        self.spawn_started(self.started_command());
    }

    /// `wrapper` (e.g. `strace … --`) followed by the agent's command line.
    pub fn start_under(&mut self, wrapper: &[String]) {
        let agent = self.started_command();
        let mut command = Command::new(&wrapper[0]);
        command
            .args(&wrapper[1..])
            .arg(agent.get_program())
            .args(agent.get_args());
        command.envs(agent.get_envs().filter_map(|(k, v)| Some((k, v?))));
        self.spawn_started(command);
    }

    fn spawn_started(&mut self, command: Command) {
        assert!(self.agent.is_none(), "the agent runs already");
        let agent = AgentProcess::spawn_appending(command, &self.agent_log(), self.refusals());
        self.agent = Some(agent);
    }

    /// `kill -9` the node's agent and reap.
    pub fn kill9(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            agent.kill9();
        }
    }

    /// SIGTERM the node's agent and wait (5 s at most, then SIGKILL); the exit status.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut agent = self.agent.take()?;
        Some(
            agent
                .stop_within(Duration::from_secs(5))
                .unwrap_or_else(|s| s),
        )
    }

    /// Panics with the log if the node's agent has exited.
    pub fn assert_running(&mut self) {
        if let Some(agent) = self.agent.as_mut() {
            agent.assert_running();
        }
    }

    /// The node's agent's log, every start.
    pub fn log_text(&self) -> String {
        fs::read_to_string(self.agent_log()).unwrap_or_default()
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
        fs::read_to_string(self.metrics_file()).unwrap_or_default()
    }

    /// The host path of a cgroup file (relative path as kubesim names it).
    pub fn file(&self, rel: &str, file: &str) -> PathBuf {
        self.fake.file(rel, file)
    }
}

impl TestNode {
    /// Waits until the checkpoint says a pass ended at or after `since_unix_ms` and `status`
    /// (exiting 0: an agent runs on the state dir) shows no differing readable row ([`Status::differing_readable`])
    /// and `done` holds; returns that status. Panics with the agent's log at the deadline.
    pub fn settled(&mut self, since_unix_ms: u64, done: impl Fn(&Status) -> bool) -> Status {
        let deadline = Instant::now() + SETTLE;
        let mut last;
        loop {
            self.assert_running();
            match running_status_of(&self.tree_flags()) {
                Ok(status)
                    if status.differing_readable() == 0
                        && status
                            .last_reconcile_unix_ms
                            .is_some_and(|t| t >= since_unix_ms)
                        && done(&status) =>
                {
                    return status
                }
                Ok(status) => last = format!("{status:#?}"),
                Err(e) => last = e,
            }
            if Instant::now() > deadline {
                self.not_settled(&last);
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Panics saying the agent did not settle: the last status, the log and what a fresh
    /// one-shot plan of the same tree would write, for the diagnosis.
    fn not_settled(&self, last: &str) -> ! {
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
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    cpusetd::checkpoint::unix_ms_now()
}

pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
