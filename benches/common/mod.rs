//! What the agent benchmarks share: the agent binary run as an operator runs it (`cpusetd run`,
//! release build) and fake nodes on tmpfs, both from the tests' harness (tests/agent_process.rs,
//! included below: one way to make a node and start the agent), a controller built as `run`
//! builds it for the in-process figures, a real cgroup v1 subtree that is always removed,
//! waiting for a file to hold a value (inotify, no busy polling), percentiles and the skip rules
//! for the real-kernel parts.
//!
//! Each benchmark includes this module and uses part of it.
#![allow(dead_code)]

// The tests' harness, compiled into each bench (a bench is a crate of its own and cannot use the
// test binary's modules).
#[path = "../../tests/agent_process.rs"]
mod agent_process;
pub use agent_process::{AgentProcess, TestNode};

use std::fs;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use inotify::{Inotify, WatchMask};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;

use cpusetd::cpuset::CpuSet;
use cpusetd::kubesim::{ContainerSpec, FakeNode, PodSpec, Qos};

/// The 256-CPU machine (2 sockets × 64 cores × 2 threads) of the fixtures.
pub const TOPOLOGY_256: &str = "2s-64c-ht";
/// Where the real cgroup v1 controllers are mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Median and 99th percentile (nearest rank), in microseconds.
pub fn median_p99(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort_unstable();
    let at = |q: f64| {
        let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
        samples[rank - 1].as_secs_f64() * 1e6
    };
    (at(0.5), at(0.99))
}

/// An environment variable as a number, or the default.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The reserved CPUs of the fake nodes' agents and controllers.
pub const RESERVED: [&str; 2] = ["--reserved-cpu-count", "2"];

/// A fake cgroup v1 node on tmpfs with the CPUs of a fixture topology (`sysfs/<topology>`),
/// whose agents run without the fake kernel's rules: the figures measure the agent alone.
pub fn fake_machine(topology: &str) -> TestNode {
    TestNode::builder()
        .fixture(&format!("sysfs/{topology}"))
        .fake_kernel(false)
        .build()
}

impl TestNode {
    /// The flags that point `cpusetd run` at this node ([`RESERVED`]); the state dir and the
    /// metrics file are each agent's own ([`Agent::start`]).
    pub fn agent_args(&self) -> Vec<String> {
        let mut args = self.node_args();
        args.extend(RESERVED.map(String::from));
        args
    }
}

/// A pod with a sandbox and the given containers.
pub fn pod(qos: Qos, containers: Vec<ContainerSpec>) -> PodSpec {
    let uid = cpusetd::kubesim::new_pod_uid();
    PodSpec {
        name: format!("bench-{}", &uid[uid.len() - 6..]),
        uid,
        qos,
        containers,
    }
}

/// The mix of the large-node figures: `pods` pods with three app containers each (four
/// containers with the sandbox); one pod in `guaranteed_every` is Guaranteed with one
/// 1-CPU exclusive container and two fractional ones, the rest Burstable.
pub fn large_node_pods(pods: usize, guaranteed_every: usize) -> Vec<PodSpec> {
    (0..pods)
        .map(|n| {
            if guaranteed_every > 0 && n % guaranteed_every == 0 {
                pod(
                    Qos::Guaranteed,
                    vec![
                        ContainerSpec::guaranteed("app", 1000),
                        ContainerSpec::guaranteed("sidecar", 500),
                        ContainerSpec::guaranteed("log", 100),
                    ],
                )
            } else {
                pod(
                    Qos::Burstable,
                    vec![
                        ContainerSpec::burstable("app", 250, Some(2000)),
                        ContainerSpec::burstable("sidecar", 100, None),
                        ContainerSpec::burstable("log", 50, Some(200)),
                    ],
                )
            }
        })
        .collect()
}

/// `cpusetd run` (this build's binary) with a fresh state dir and metrics file, stopped when
/// dropped (an [`AgentProcess`]).
pub struct Agent {
    process: AgentProcess,
    pub metrics: PathBuf,
    _state: tempfile::TempDir,
}

impl Agent {
    /// Starts the agent with `args` plus a fresh state dir and metrics file, and waits until
    /// its first pass is done (the metrics file appears). `CPUSETD_BIN` names another binary
    /// (the vm-e2e guest's `/bin/cpusetd`).
    pub fn start(args: &[String]) -> Agent {
        let state = tempfile::Builder::new()
            .prefix("cpusetd-bench-state-")
            .tempdir()
            .unwrap();
        let metrics = state.path().join("metrics.prom");
        let mut command = match std::env::var_os("CPUSETD_BIN") {
            Some(bin) => Command::new(bin),
            None => agent_process::cpusetd_command(),
        };
        command
            .arg("run")
            .args(args)
            .arg("--state-dir")
            .arg(state.path())
            .arg("--metrics-file")
            .arg(&metrics);
        let mut process = AgentProcess::spawn(command, &state.path().join("agent.log"), None);
        let ready = || metrics.exists();
        process.wait_until("its first metrics file", Duration::from_secs(120), ready);
        Agent {
            process,
            metrics,
            _state: state,
        }
    }

    pub fn pid(&self) -> i32 {
        self.process.pid()
    }

    /// Its state directory (where its PodResources socket is, unless told otherwise).
    #[allow(dead_code)] // footprint's
    pub fn state_dir(&self) -> &Path {
        self._state.path()
    }

    /// The agent's log lines that contain `needle`.
    #[allow(dead_code)] // drift's
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        self.process.log_lines(needle)
    }

    /// One sample of the metrics file: the value of `name` (with its labels, if any).
    pub fn metric(&self, name: &str) -> Option<f64> {
        let text = fs::read_to_string(&self.metrics).ok()?;
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    /// Waits until the agent has neither run a pass nor used CPU for `quiet`.
    pub fn wait_quiet(&self, quiet: Duration, limit: Duration) {
        let deadline = Instant::now() + limit;
        let probe = || (self.metric("cpusetd_passes_total"), self.cpu_time());
        let mut last = probe();
        let mut since = Instant::now();
        while Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
            let now = probe();
            if now != last {
                last = now;
                since = Instant::now();
            } else if since.elapsed() >= quiet {
                return;
            }
        }
        panic!("cpusetd run did not go quiet within {limit:?}");
    }

    /// `VmRSS` in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap()
    }

    /// User + system CPU time used so far (all threads).
    pub fn cpu_time(&self) -> Duration {
        let stat = fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        let rest = stat.rsplit_once(')').unwrap().1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // Fields 14 and 15 of stat(5); `rest` starts at field 3.
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        // USER_HZ, the unit of these fields (100 on every mainstream Linux).
        let hz: u64 = Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100);
        Duration::from_micros(ticks * 1_000_000 / hz)
    }

    /// Time on CPU of all the agent's threads, in nanoseconds (`/proc/<pid>/task/*/schedstat`),
    /// finer than the clock ticks of `stat`.
    pub fn cpu_time_ns(&self) -> u64 {
        let tasks = format!("/proc/{}/task", self.pid());
        fs::read_dir(tasks)
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|t| fs::read_to_string(t.path().join("schedstat")).ok())
                    .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                    .sum()
            })
            .unwrap_or(0)
    }

    pub fn signal(&self, signal: Signal) {
        self.process.signal(signal);
    }
}

/// Waits for files to hold a value, woken by inotify (`IN_MODIFY`) instead of polling.
pub struct FileWaiter {
    inotify: Inotify,
}

impl Default for FileWaiter {
    fn default() -> Self {
        FileWaiter {
            inotify: Inotify::init().expect("inotify"),
        }
    }
}

impl FileWaiter {
    /// Waits until `done(contents of path)`; returns when it saw that, or `None` after
    /// `limit`. The watch is added before the first read, so no write is missed.
    pub fn wait(
        &mut self,
        path: &Path,
        limit: Duration,
        mut done: impl FnMut(&str) -> bool,
    ) -> Option<Instant> {
        let wd = self
            .inotify
            .watches()
            .add(path, WatchMask::MODIFY)
            .unwrap_or_else(|e| panic!("watch {}: {e}", path.display()));
        let deadline = Instant::now() + limit;
        let mut buffer = [0u8; 4096];
        let result = loop {
            let text = fs::read_to_string(path).unwrap_or_default();
            if done(text.trim()) {
                break Some(Instant::now());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break None;
            }
            let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN)];
            let _ = poll(&mut fds, PollTimeout::from(ms));
            // Drain; the file is re-read above.
            while let Ok(mut events) = self.inotify.read_events(&mut buffer) {
                if events.next().is_none() {
                    break;
                }
            }
        };
        let _ = self.inotify.watches().remove(wd);
        result
    }
}

/// A cpuset value with exactly `n` CPUs.
pub fn has_cpus(n: usize) -> impl FnMut(&str) -> bool {
    move |text| CpuSet::parse(text).is_ok_and(|s| s.len() == n)
}

/// Why the real cgroup v1 parts cannot run here, if they cannot.
pub fn kernel_skip_reason() -> Option<String> {
    if fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid()) != 0 {
        return Some("not running as root".into());
    }
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mounts = cpusetd::cgroupfs::parse_mountinfo(&mountinfo);
    let v1 = |controller: &str| {
        mounts.iter().any(|m| {
            m.mount_point == Path::new(CGROUP_ROOT).join(controller)
                && m.fs_type == "cgroup"
                && m.super_options.iter().any(|o| o == controller)
        })
    };
    if !v1("cpuset") || !v1("cpu") {
        return Some(format!(
            "no cgroup v1 cpuset and cpu mounts at {CGROUP_ROOT}/cpuset and {CGROUP_ROOT}/cpu"
        ));
    }
    let online = fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    if CpuSet::parse(online.trim()).map_or(0, |s| s.len()) < 2 {
        return Some("fewer than 2 online cpus".into());
    }
    None
}

/// A node on the real cgroup v1 hierarchy, in a unique subtree (`cpusetd-bench-<pid>`) of the
/// cpuset and cpu mounts, removed on drop (also after a panic). Stop the agent first.
pub struct KernelMachine {
    pub name: String,
    pub fake: FakeNode,
    pub runtime: tempfile::TempDir,
}

impl KernelMachine {
    pub fn new() -> KernelMachine {
        remove_stale_subtrees();
        let name = format!("cpusetd-bench-{}", std::process::id());
        let runtime = tempfile::Builder::new()
            .prefix("cpusetd-bench-runtime-")
            .tempdir()
            .unwrap();
        let root = Path::new(CGROUP_ROOT);
        let fake = FakeNode::on_kernel(
            &root.join("cpuset").join(&name),
            &root.join("cpu").join(&name),
            runtime.path(),
        )
        .expect("a cgroup v1 subtree for the benchmark");
        KernelMachine {
            name,
            fake,
            runtime,
        }
    }

    /// The flags that point `cpusetd run` at this subtree (CPU 0 reserved).
    pub fn agent_args(&self) -> Vec<String> {
        vec![
            "--cgroup-root".into(),
            CGROUP_ROOT.into(),
            "--kubepods-path".into(),
            format!("{}/kubepods", self.name),
            "--runtime-config-path".into(),
            self.fake.runtime_template(),
            "--reserved-cpus".into(),
            "0".into(),
        ]
    }

    /// A cgroup directory below the subtree's kubepods, in the cpuset hierarchy.
    pub fn cpuset_dir(&self, rel: &str) -> PathBuf {
        Path::new(CGROUP_ROOT)
            .join("cpuset")
            .join(&self.name)
            .join(rel)
    }
}

/// Removes `cpusetd-bench-<pid>` subtrees left by a benchmark that was killed (no unwinding,
/// so no drop) and whose process is gone.
fn remove_stale_subtrees() {
    for controller in ["cpuset", "cpu"] {
        let mount = Path::new(CGROUP_ROOT).join(controller);
        let Ok(entries) = fs::read_dir(&mount) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = name.strip_prefix("cpusetd-bench-") else {
                continue;
            };
            if Path::new("/proc").join(pid).exists() {
                continue;
            }
            let mut dirs = Vec::new();
            collect_dirs(&entry.path(), &mut dirs);
            for dir in dirs.iter().rev() {
                let _ = fs::remove_dir(dir);
            }
        }
    }
}

/// A directory and the directories below it, parents first.
fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&entry.path(), out);
            }
        }
    }
}

impl Drop for KernelMachine {
    fn drop(&mut self) {
        if let Err(e) = self.fake.remove_all() {
            eprintln!("cleanup: cannot remove the {} subtree: {e}", self.name);
        }
    }
}

/// A scanner over a fake machine's kubepods tree.
pub fn scanner_of(machine: &TestNode) -> cpusetd::cgroupfs::Scanner {
    use cpusetd::cgroupfs::{detect_layout, Hierarchy, LayoutConfig, Scanner};
    let layout = detect_layout(&LayoutConfig {
        proc_root: PathBuf::from("/nonexistent-proc"),
        cgroup_root: Some(machine.fake.cgroup_root().to_path_buf()),
        driver: None,
        kubepods: None,
    })
    .unwrap();
    Scanner::new(Hierarchy::open(&layout).unwrap(), layout.kubepods)
}

/// A controller over a fake machine, built the way `cpusetd run` builds it (static policy,
/// [`RESERVED`]), for in-process measurements.
pub fn controller_of(machine: &TestNode) -> cpusetd::agent::Controller {
    machine.controller(&RESERVED)
}
