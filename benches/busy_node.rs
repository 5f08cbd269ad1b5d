//! Issue 24's shapes of the pin figures, with `cpusetd run` (this build) on a fake tmpfs tree
//! (256-CPU topology, 2 CPUs reserved) holding a background of other pods (each a sandbox and
//! three Burstable containers). Every container is made the way a runtime makes it (the
//! simulator: the directory appears with its files, then the runtime's writes; `src/kubesim.rs`)
//! and every wait is on inotify, never a spin.
//!
//! * **Busy node**: back-to-back Guaranteed pods with one 1-CPU container, one started every
//!   `PERIOD_MS` (default 50 ms); each is removed `HOLD_MS` (default 20 ms) after its pin, and
//!   the rest of the period is the pause in which the shared pool's held-back rewrites fall due
//!   (the gap between arrivals is longer than the agent's coalescing window). Event → pin p50 /
//!   p99, and the agent's CPU (time on CPU of all its threads, `/proc/<pid>/task/*/schedstat`)
//!   and cgroup writes (its `cpusetd_cgroup_writes_total`) per pod over the run; and, per pin,
//!   how many writes to the other containers' `cpuset.cpus` (v2: and their ancestors') landed
//!   between the pod's cgroup appearing (the bench watches `kubepods` for it) and its pin
//!   (`behind`: whether a pin waits behind the shared pool's batch; also printed, counted from
//!   the bench's start of the pod, when the agent could not know of it yet).
//! * **Quiet node, event → exclusive**: one pod at a time, the agent quiet before each. From the
//!   container's appearance until no container of the background pods holds the new pin's CPU
//!   any more (on v1 a container's own `cpuset.cpus`; on v2 its effective set, worked out from
//!   the `cpuset.cpus` of the container and its ancestors as the kernel does: an empty or
//!   disjoint set follows the parent). Also event → pin, and per pod start + release (the
//!   pod's removal and the agent quiet again) the agent's CPU and writes. The bench keeps the
//!   watched sets parsed and re-reads a file once per change, so its own reads stay few.
//!
//! The fake v2 tree's `cpuset.cpus.effective` files are not kept up to date (no kernel): the
//! bench works the effective sets out itself; an agent that reads them sees the whole machine.
//!
//! `cargo bench --bench busy_node` (or `scripts/bench.sh busy`); knobs: `BACKGROUND_PODS`
//! (default `110,500`), `VERSIONS` (cgroup versions of the fake tree, default `v1,v2`),
//! `BUSY_SAMPLES` (default 200), `QUIET_SAMPLES` (default 30), `PERIOD_MS`, `HOLD_MS`.

mod common;

use std::collections::HashMap;
use std::fs;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::cpuset::CpuSet;
use cpusetd::kubesim::{ContainerSpec, Qos};
use inotify::{Inotify, WatchDescriptor, WatchMask};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

const LIMIT: Duration = Duration::from_secs(10);
/// How long the agent must stay without a pass and without CPU to count as quiet.
const QUIET: Duration = Duration::from_millis(300);

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn env_ms(name: &str, default: usize) -> Duration {
    Duration::from_millis(env_usize(name, default) as u64)
}

/// A fake node of `version` with `background` other pods, and the agent watching it, quiet.
fn node_with_agent(version: CgroupVersion, background: usize) -> (TestNode, Agent) {
    let machine = TestNode::builder()
        .fixture(&format!("sysfs/{TOPOLOGY_256}"))
        .version(version)
        .fake_kernel(false)
        .build();
    for pod in large_node_pods(background, 0) {
        machine.fake.start_pod(&pod).unwrap();
    }
    let agent = Agent::start(&machine.agent_args());
    agent.wait_quiet(QUIET, Duration::from_secs(120));
    (machine, agent)
}

/// Starts a Guaranteed pod with one 1-CPU container; returns it, when its container had
/// appeared with its settings, and the path of its `cpuset.cpus`.
fn start_pinned_pod(machine: &TestNode) -> (cpusetd::kubesim::PodSpec, Instant, PathBuf) {
    let pod = pod(
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 1000)],
    );
    let ids = machine.fake.start_pod(&pod).expect("start pod");
    let appeared = Instant::now();
    let rel = format!("{}/{}", machine.fake.pod_dir(&pod), ids[0]);
    (pod, appeared, machine.fake.file(&rel, "cpuset.cpus"))
}

/// What the agent did over a stretch: CPU (ns) and cgroup writes.
#[derive(Debug, Clone, Copy)]
struct Work {
    cpu_ns: u64,
    writes: f64,
}

impl Work {
    fn now(agent: &Agent) -> Work {
        Work {
            cpu_ns: agent.cpu_time_ns(),
            writes: agent.metric("cpusetd_cgroup_writes_total").unwrap_or(0.0),
        }
    }

    fn since(self, earlier: Work) -> Work {
        Work {
            cpu_ns: self.cpu_ns.saturating_sub(earlier.cpu_ns),
            writes: self.writes - earlier.writes,
        }
    }
}

/// The busy node's run: per pin, event -> pin and how many writes to the other containers'
/// `cpuset.cpus` (and, on v2, their ancestors') landed between the appearance and the pin.
struct BusyRun {
    /// Event -> pin, the writes landed after the pod's cgroup appeared, and all the writes
    /// since the bench began to start the pod (some before the agent could know of it).
    samples: Vec<(Duration, usize, usize)>,
    missed: usize,
    work: Work,
}

fn busy(machine: &TestNode, agent: &Agent, n: usize) -> BusyRun {
    let (period, hold) = (env_ms("PERIOD_MS", 50), env_ms("HOLD_MS", 20));
    let mut others = Others::of(machine);
    let mut waiter = FileWaiter::default();
    let mut run = BusyRun {
        samples: Vec::with_capacity(n),
        missed: 0,
        work: Work::now(agent),
    };
    let mut next = Instant::now();
    for _ in 0..n {
        thread::sleep(next.saturating_duration_since(Instant::now()));
        next = Instant::now() + period;
        others.changes();
        let (pod, appeared, cpus) = start_pinned_pod(machine);
        match waiter.wait(&cpus, LIMIT, has_cpus(1)) {
            Some(pinned) => {
                let all = others.changes().0;
                run.samples.push((pinned - appeared, others.after_pod, all));
            }
            None => run.missed += 1,
        }
        thread::sleep(hold);
        machine.fake.remove_pod(&pod).expect("remove pod");
    }
    agent.wait_quiet(QUIET, Duration::from_secs(60));
    run.work = Work::now(agent).since(run.work);
    run
}

/// The `cpuset.cpus` files of every container under `kubepods` (64-hex directory names) and,
/// on v2, of their ancestors up to `kubepods`, watched for changes and kept parsed (each file
/// re-read once per change, so the bench's own reads stay few): tells when none of the
/// containers' effective sets holds a CPU any more.
struct Others {
    inotify: Inotify,
    /// Each watched file and its last value.
    files: Vec<(PathBuf, CpuSet)>,
    file_of: HashMap<WatchDescriptor, usize>,
    /// Per file, the containers it bears on.
    dependents: Vec<Vec<usize>>,
    /// Per container, its file and its ancestors' (kubepods first), as indices into `files`.
    chains: Vec<Vec<usize>>,
    /// The watch of the kubepods directory, for a Guaranteed pod's cgroup appearing.
    pods: WatchDescriptor,
    /// Of the writes the last [`Others::changes`] counted, those after a pod's cgroup
    /// appeared (all of them when none did).
    after_pod: usize,
}

impl Others {
    /// The containers of the node's pods as they are now.
    fn of(machine: &TestNode) -> Others {
        let kubepods = machine.fake.file("kubepods", "cpuset.cpus");
        Others::new(kubepods.parent().unwrap(), machine.fake.version())
    }

    fn new(kubepods: &Path, version: CgroupVersion) -> Others {
        let mut containers = Vec::new();
        containers_below(kubepods, &mut containers);
        let inotify = Inotify::init().expect("inotify");
        let pods = inotify
            .watches()
            .add(
                kubepods,
                WatchMask::CREATE | WatchMask::MOVED_TO | WatchMask::ONLYDIR,
            )
            .expect("watch kubepods");
        let mut others = Others {
            inotify,
            files: Vec::new(),
            file_of: HashMap::new(),
            dependents: Vec::new(),
            chains: Vec::new(),
            pods,
            after_pod: 0,
        };
        for (index, dir) in containers.iter().enumerate() {
            let mut dirs: Vec<&Path> = match version {
                CgroupVersion::V1 => vec![dir.as_path()],
                CgroupVersion::V2 => dir
                    .ancestors()
                    .take_while(|d| d.starts_with(kubepods))
                    .collect(),
            };
            dirs.reverse();
            let chain = dirs
                .iter()
                .map(|d| others.watch(&d.join("cpuset.cpus"), index))
                .collect();
            others.chains.push(chain);
        }
        others
    }

    /// Watches `file` (once) for `container`; its index.
    fn watch(&mut self, file: &Path, container: usize) -> usize {
        let wd = self
            .inotify
            .watches()
            .add(file, WatchMask::MODIFY)
            .unwrap_or_else(|e| panic!("watch {}: {e}", file.display()));
        let next = self.files.len();
        let index = *self.file_of.entry(wd).or_insert(next);
        if index == next {
            self.files.push((file.to_path_buf(), read_set(file)));
            self.dependents.push(Vec::new());
        }
        self.dependents[index].push(container);
        index
    }

    /// The container's effective CPUs as the kernel works them out from the chain.
    fn effective(&self, container: usize) -> CpuSet {
        let mut effective: Option<CpuSet> = None;
        for &file in &self.chains[container] {
            let own = &self.files[file].1;
            let narrowed = match &effective {
                Some(parent) => own.intersection(parent),
                None => own.clone(),
            };
            if !narrowed.is_empty() {
                effective = Some(narrowed);
            }
        }
        effective.unwrap_or_default()
    }

    /// The changes seen since the last look: how many, and the files they touched (not read).
    fn changes(&mut self) -> (usize, Vec<usize>) {
        let mut buffer = [0u8; 16384];
        let (mut count, mut changed) = (0, Vec::new());
        let mut pod_at = None;
        loop {
            let Ok(events) = self.inotify.read_events(&mut buffer) else {
                break;
            };
            let mut read = 0;
            for event in events {
                read += 1;
                if event.wd == self.pods {
                    let pod = event
                        .name
                        .is_some_and(|n| n.to_string_lossy().starts_with("pod"));
                    if pod && pod_at.is_none() {
                        pod_at = Some(count);
                    }
                    continue;
                }
                count += 1;
                if event.mask.contains(inotify::EventMask::Q_OVERFLOW) {
                    changed.extend(0..self.files.len());
                }
                changed.extend(self.file_of.get(&event.wd));
            }
            if read == 0 {
                break;
            }
        }
        self.after_pod = count - pod_at.unwrap_or(0);
        changed.sort_unstable();
        changed.dedup();
        (count, changed)
    }

    /// Takes the changes, re-reading each changed file once: the containers they bear on.
    fn drain(&mut self) -> Vec<usize> {
        let mut touched = Vec::new();
        for file in self.changes().1 {
            self.files[file].1 = read_set(&self.files[file].0);
            touched.extend(&self.dependents[file]);
        }
        touched
    }

    /// Waits until no container's effective set holds `cpu`; returns when it saw that.
    fn wait_exclusive(&mut self, cpu: u32, limit: Duration) -> Option<Instant> {
        let deadline = Instant::now() + limit;
        self.drain();
        let mut holding: Vec<bool> = (0..self.chains.len())
            .map(|i| self.effective(i).contains(cpu))
            .collect();
        let mut left = holding.iter().filter(|h| **h).count();
        while left > 0 {
            let wait = deadline.saturating_duration_since(Instant::now());
            if wait.is_zero() {
                return None;
            }
            let ms = u16::try_from(wait.as_millis().max(1)).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN)];
            let _ = poll(&mut fds, PollTimeout::from(ms));
            for index in self.drain() {
                if holding[index] && !self.effective(index).contains(cpu) {
                    holding[index] = false;
                    left -= 1;
                }
            }
        }
        Some(Instant::now())
    }
}

/// A `cpuset.cpus` file's set (empty when unreadable or empty).
fn read_set(path: &Path) -> CpuSet {
    let text = fs::read_to_string(path).unwrap_or_default();
    CpuSet::parse(text.trim()).unwrap_or_default()
}

/// Container cgroup directories (64-hex names) below `dir`.
fn containers_below(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap().flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
            out.push(entry.path());
        } else {
            containers_below(&entry.path(), out);
        }
    }
}

/// Per quiet sample: event → pin, event → exclusive, and the agent's work for the pod's start
/// and release.
struct QuietSamples {
    pin: Vec<Duration>,
    exclusive: Vec<Duration>,
    work: Vec<Work>,
    missed: usize,
}

fn quiet(machine: &TestNode, agent: &Agent, n: usize) -> QuietSamples {
    let mut others = Others::of(machine);
    let mut waiter = FileWaiter::default();
    let mut out = QuietSamples {
        pin: Vec::new(),
        exclusive: Vec::new(),
        work: Vec::new(),
        missed: 0,
    };
    for _ in 0..n {
        let before = Work::now(agent);
        let (pod, appeared, cpus) = start_pinned_pod(machine);
        let pinned = waiter.wait(&cpus, LIMIT, has_cpus(1));
        let cpu = fs::read_to_string(&cpus).ok().and_then(|t| {
            let set = CpuSet::parse(t.trim()).ok()?;
            set.iter().next()
        });
        match (pinned, cpu) {
            (Some(pinned), Some(cpu)) if cpus_len(&cpus) == 1 => {
                out.pin.push(pinned - appeared);
                match others.wait_exclusive(cpu, LIMIT) {
                    Some(exclusive) => out.exclusive.push(exclusive - appeared),
                    None => out.missed += 1,
                }
            }
            _ => out.missed += 1,
        }
        machine.fake.remove_pod(&pod).expect("remove pod");
        agent.wait_quiet(QUIET, Duration::from_secs(60));
        out.work.push(Work::now(agent).since(before));
    }
    out
}

fn cpus_len(path: &Path) -> usize {
    read_set(path).len()
}

fn ms(micros: f64) -> String {
    format!("{:.2}", micros / 1000.0)
}

fn median_of(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

fn report_busy(what: &str, run: BusyRun) {
    let mut all: Vec<Duration> = run.samples.iter().map(|s| s.0).collect();
    let (p50, p99) = median_p99(&mut all);
    let pods = (run.samples.len() + run.missed).max(1) as f64;
    // The pins behind which other cgroups' writes landed, and the median of each kind.
    let (mut behind, mut clear): (Vec<Duration>, Vec<Duration>) = (Vec::new(), Vec::new());
    for &(latency, writes, _) in &run.samples {
        if writes > 0 { &mut behind } else { &mut clear }.push(latency);
    }
    let most = run.samples.iter().map(|s| s.1).max().unwrap_or(0);
    let since_start = run.samples.iter().filter(|s| s.2 > 0).count();
    let most_since_start = run.samples.iter().map(|s| s.2).max().unwrap_or(0);
    let p50_of = |v: &mut Vec<Duration>| {
        if v.is_empty() {
            "-".to_string()
        } else {
            ms(median_p99(v).0)
        }
    };
    println!(
        "{what:<26} {:>5} {:>8} {:>8} {:>8} {:>10.2} {:>10.0} {:>7}/{:<5} {:>8} {:>8}",
        all.len(),
        ms(p50),
        ms(p99),
        run.missed,
        run.work.cpu_ns as f64 / 1e6 / pods,
        run.work.writes / pods,
        behind.len(),
        most,
        p50_of(&mut clear),
        p50_of(&mut behind),
    );
    println!(
        "{:<26} (counted from the bench's start of the pod, before its cgroup appeared: {since_start}/{most_since_start})",
        ""
    );
}

fn report_quiet(what: &str, mut q: QuietSamples) {
    let (pin50, pin99) = median_p99(&mut q.pin);
    let (ex50, ex99) = median_p99(&mut q.exclusive);
    let cpu = median_of(q.work.iter().map(|w| w.cpu_ns as f64 / 1e6).collect());
    let writes = median_of(q.work.iter().map(|w| w.writes).collect());
    println!(
        "{what:<26} {:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10.2} {:>10.0}",
        q.exclusive.len(),
        ms(pin50),
        ms(pin99),
        ms(ex50),
        ms(ex99),
        q.missed,
        cpu,
        writes
    );
}

fn version_of(name: &str) -> Option<CgroupVersion> {
    match name {
        "v1" => Some(CgroupVersion::V1),
        "v2" => Some(CgroupVersion::V2),
        _ => None,
    }
}

fn main() {
    let backgrounds: Vec<usize> = env_list("BACKGROUND_PODS", "110,500")
        .iter()
        .filter_map(|s| s.parse().ok())
        .collect();
    let versions: Vec<String> = env_list("VERSIONS", "v1,v2");
    let (busy_n, quiet_n) = (
        env_usize("BUSY_SAMPLES", 200),
        env_usize("QUIET_SAMPLES", 30),
    );
    println!(
        "busy node: a pod every {} ms, removed {} ms after its pin; event -> pin (ms), agent per pod",
        env_usize("PERIOD_MS", 50),
        env_usize("HOLD_MS", 20)
    );
    println!(
        "{:<26} {:>5} {:>8} {:>8} {:>8} {:>10} {:>10} {:>13} {:>8} {:>8}",
        "tree",
        "n",
        "p50",
        "p99",
        "missed",
        "cpu ms/pod",
        "writes/pod",
        "behind/max",
        "p50 clr",
        "p50 bhd"
    );
    println!(
        "(behind: pins before which writes to other containers' cpusets landed after the pod's \
         cgroup appeared / the most such writes before one pin; p50 of the pins without (clr) \
         and with (bhd) them)"
    );
    let mut quiet_rows = Vec::new();
    for name in &versions {
        let Some(version) = version_of(name) else {
            eprintln!("VERSIONS: {name:?} is not v1 or v2; skipped");
            continue;
        };
        for &background in &backgrounds {
            let what = format!("tmpfs {name}, {background} pods");
            let (machine, agent) = node_with_agent(version, background);
            report_busy(&what, busy(&machine, &agent, busy_n));
            quiet_rows.push((what, quiet(&machine, &agent, quiet_n)));
        }
    }
    println!();
    println!(
        "quiet node, one pod at a time: event -> pin and -> exclusive (ms); agent per pod start + \
         release (until it is quiet again), medians"
    );
    println!(
        "{:<26} {:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10}",
        "tree",
        "n",
        "pin p50",
        "pin p99",
        "excl p50",
        "excl p99",
        "missed",
        "cpu ms/pod",
        "writes/pod"
    );
    for (what, q) in quiet_rows {
        report_quiet(&what, q);
    }
}
