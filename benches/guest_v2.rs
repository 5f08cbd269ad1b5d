//! Issue 25 item 6: the pin figures on a real cgroup v2 hierarchy, measured inside the Linux
//! 6.12 guest that `scripts/vm-e2e.sh bench-v2` boots (`scripts/bench.sh guest-v2` runs it and
//! prints the table). `cpusetd run` (this build, `/bin/cpusetd` in the guest: `CPUSETD_BIN`)
//! watches a node of `BACKGROUND_PODS` (default 110) Burstable pods, each a sandbox and three
//! containers, made the way a runtime makes them on v2 (`FakeNode::on_kernel_v2`: the parent
//! hands `+cpuset +cpu` down, `mkdir`, then `cpu.weight` and `cpu.max`). Per sample, with the
//! agent quiet before it:
//!
//! * **floor**: `mkdir` of a cgroup (outside `kubepods`) plus one `write` of its `cpuset.cpus`,
//!   timed the same way in the same guest: what one pin costs the kernel at the least;
//! * **event → pin**: a Guaranteed pod with one 1-CPU container appears (timestamp right after
//!   the runtime's last write) until its `cpuset.cpus` reads one CPU (inotify);
//! * **event → exclusive**: from the same appearance until no other container's
//!   `cpuset.cpus.effective` (the kernel's own answer) holds the pinned CPU: every container's
//!   and ancestor's `cpuset.cpus` is watched (inotify); after a write lands, the containers
//!   below it are re-read; the time is the wake-up of the pass that finds none left;
//! * **drift repair**: one foreign `write` of the whole machine into the pinned container's
//!   `cpuset.cpus` until it reads the pin again (inotify).
//!
//! Then the pod goes and the floor cgroup is removed (untimed). Every wait is on inotify and
//! `poll`, never a spin. Medians and p99 (nearest rank) in µs, and each as a ratio to the floor's
//! median and p99: under an emulated or loaded guest the ratios are the figures to trust.
//!
//! It refuses to run where `CGROUP_V2_ROOT` (default `/sys/fs/cgroup`) is not a cgroup v2 mount
//! with the cpuset controller, or already holds `kubepods` (a real node): it makes and removes
//! `kubepods` and `cpusetd-floor` there. `SAMPLES` (default 100) and `BACKGROUND_PODS` change
//! the run.

mod common;

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use cpusetd::cpuset::CpuSet;
use cpusetd::kubesim::{ContainerSpec, FakeNode, PodSpec, Qos};
use inotify::{Inotify, WatchDescriptor, WatchMask};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// Per wait (an emulated guest is slow: a pin takes milliseconds there).
const LIMIT: Duration = Duration::from_secs(30);
/// How long the agent must stay without a pass and without CPU to count as quiet.
const QUIET: Duration = Duration::from_millis(300);
/// The floor's cgroup, beside `kubepods`.
const FLOOR_DIR: &str = "cpusetd-floor";

fn main() {
    let root =
        PathBuf::from(std::env::var("CGROUP_V2_ROOT").unwrap_or_else(|_| "/sys/fs/cgroup".into()));
    if let Some(why) = skip_reason(&root) {
        println!("guest_v2: skipped: {why}");
        return;
    }
    let samples = env_usize("SAMPLES", 100);
    let background = env_usize("BACKGROUND_PODS", 110);
    let runtime = tempfile::Builder::new()
        .prefix("cpusetd-guest-v2-runtime-")
        .tempdir()
        .expect("runtime config dir");
    let node = FakeNode::on_kernel_v2(&root, runtime.path()).expect("kubepods on cgroup v2");
    let figures = measure(&root, &node, samples, background);
    node.remove_all().expect("remove kubepods");
    let _ = fs::remove_dir(root.join(FLOOR_DIR));
    figures.print(&root, samples, background);
}

/// Why this cannot run at `root`, if it cannot.
fn skip_reason(root: &Path) -> Option<String> {
    let controllers = match fs::read_to_string(root.join("cgroup.controllers")) {
        Ok(text) => text,
        Err(_) => {
            return Some(format!(
                "{} is not a cgroup v2 mount (run it in the guest: scripts/bench.sh guest-v2)",
                root.display()
            ))
        }
    };
    if !controllers.split_whitespace().any(|c| c == "cpuset") {
        return Some(format!(
            "no cpuset controller at {} (cgroup.controllers: {})",
            root.display(),
            controllers.trim()
        ));
    }
    if root.join("kubepods").exists() || root.join(FLOOR_DIR).exists() {
        return Some(format!(
            "{} already holds kubepods or {FLOOR_DIR}: not a scratch hierarchy (a real node?); \
             run it in the guest: scripts/bench.sh guest-v2",
            root.display()
        ));
    }
    None
}

/// The samples of each row, in order: floor, event → pin, event → exclusive, drift repair.
#[derive(Default)]
struct Figures {
    rows: [Vec<Duration>; 4],
    missed: [usize; 4],
    cgroups: usize,
}

const ROWS: [&str; 4] = [
    "floor: mkdir + one cpuset.cpus write",
    "event -> pin",
    "event -> exclusive",
    "drift repair",
];

impl Figures {
    fn record(&mut self, row: usize, sample: Option<Duration>) {
        match sample {
            Some(d) => self.rows[row].push(d),
            None => self.missed[row] += 1,
        }
    }

    fn print(mut self, root: &Path, samples: usize, background: usize) {
        let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let load = fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!(
            "real cgroup v2 at {}: Linux {}, {} cpus, {background} other pods ({} cgroups under kubepods), {samples} samples; loadavg after: {}",
            root.display(),
            release.trim(),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            self.cgroups,
            load.trim()
        );
        println!(
            "{:<38} {:>5} {:>7} {:>11} {:>11} {:>14} {:>11}",
            "figure", "n", "missed", "median µs", "p99 µs", "median÷floor", "p99÷floor"
        );
        let (floor_median, floor_p99) = median_p99(&mut self.rows[0].clone());
        for (row, name) in ROWS.iter().enumerate() {
            let samples = &mut self.rows[row];
            if samples.is_empty() {
                println!("{name:<38} {:>5} {:>7}", 0, self.missed[row]);
                continue;
            }
            let (median, p99) = median_p99(samples);
            println!(
                "{name:<38} {:>5} {:>7} {median:>11.0} {p99:>11.0} {:>14.1} {:>11.1}",
                samples.len(),
                self.missed[row],
                median / floor_median,
                p99 / floor_p99
            );
        }
    }
}

fn measure(root: &Path, node: &FakeNode, samples: usize, background: usize) -> Figures {
    let started = Instant::now();
    for pod in large_node_pods(background, 0) {
        node.start_pod(&pod).expect("start a background pod");
    }
    eprintln!(
        "guest_v2: {background} pods started in {:?}",
        started.elapsed()
    );
    let kubepods = root.join("kubepods");
    let floor = Floor::new(root);
    let args: Vec<String> = [
        "--cgroup-root",
        &root.display().to_string(),
        "--kubepods-path",
        "kubepods",
        "--reserved-cpus",
        "0",
        "--runtime-config-path",
        &node.runtime_template(),
    ]
    .map(String::from)
    .to_vec();
    let agent = Agent::start(&args);
    agent.wait_quiet(QUIET, Duration::from_secs(300));
    eprintln!("guest_v2: the agent is quiet after {:?}", started.elapsed());
    let mut others = Others::new(&kubepods);
    let mut figures = Figures {
        cgroups: others.dirs.len(),
        ..Figures::default()
    };
    let mut waiter = FileWaiter::default();
    for n in 0..samples {
        if n % 10 == 0 {
            eprintln!(
                "guest_v2: sample {n} of {samples} after {:?}",
                started.elapsed()
            );
        }
        figures.record(0, floor.sample());
        others.remember();
        one_pod(node, &mut others, &mut waiter, &mut figures);
        agent.wait_quiet(QUIET, Duration::from_secs(300));
    }
    figures
}

/// One Guaranteed pod: event → pin, event → exclusive, drift repair; then it goes.
fn one_pod(node: &FakeNode, others: &mut Others, waiter: &mut FileWaiter, figures: &mut Figures) {
    let pod = pod(
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 1000)],
    );
    let ids = node.start_pod(&pod).expect("start the Guaranteed pod");
    let appeared = Instant::now();
    let file = node.file(&format!("{}/{}", node.pod_dir(&pod), ids[0]), "cpuset.cpus");
    let pinned = waiter.wait(&file, LIMIT, has_cpus(1));
    figures.record(1, pinned.map(|t| t - appeared));
    let Some(pin) = pinned.and_then(|_| read_set(&file)) else {
        figures.missed[2] += 1;
        figures.missed[3] += 1;
        return remove(node, &pod);
    };
    let exclusive = others.wait_off(&pin, LIMIT);
    figures.record(2, exclusive.map(|t| t - appeared));
    figures.record(3, drift(node, &file, &pin, waiter));
    remove(node, &pod);
}

fn remove(node: &FakeNode, pod: &PodSpec) {
    node.remove_pod(pod).expect("remove the Guaranteed pod");
}

/// A foreign write of every CPU into the pinned container's `cpuset.cpus` (one `write`, as a
/// careless tool does), until the file reads the pin again.
fn drift(node: &FakeNode, file: &Path, pin: &CpuSet, waiter: &mut FileWaiter) -> Option<Duration> {
    let all = fs::read_to_string(node.cgroup_root().join("cpuset.cpus.effective")).ok()?;
    let mut handle = fs::OpenOptions::new().write(true).open(file).ok()?;
    let written = Instant::now();
    handle.write_all(all.trim().as_bytes()).ok()?;
    drop(handle);
    let repaired = waiter.wait(file, LIMIT, |text| {
        CpuSet::parse(text).is_ok_and(|set| &set == pin)
    })?;
    Some(repaired - written)
}

fn read_set(file: &Path) -> Option<CpuSet> {
    CpuSet::parse(fs::read_to_string(file).ok()?.trim()).ok()
}

/// The floor's cgroups: `<root>/cpusetd-floor/<n>`, one a sample, removed untimed.
struct Floor {
    dir: PathBuf,
    cpu: String,
}

impl Floor {
    fn new(root: &Path) -> Floor {
        let dir = root.join(FLOOR_DIR);
        fs::create_dir(&dir).expect("the floor's cgroup");
        fs::write(dir.join("cgroup.subtree_control"), "+cpuset").expect("cpuset for the floor");
        let all = read_set(&root.join("cpuset.cpus.effective")).expect("the root's cpus");
        // One CPU, as a pin writes.
        let cpu = all.last().expect("a cpu").to_string();
        Floor { dir, cpu }
    }

    fn sample(&self) -> Option<Duration> {
        let cgroup = self.dir.join("sample");
        let started = Instant::now();
        fs::create_dir(&cgroup).ok()?;
        let mut handle = fs::OpenOptions::new()
            .write(true)
            .open(cgroup.join("cpuset.cpus"))
            .ok()?;
        handle.write_all(self.cpu.as_bytes()).ok()?;
        drop(handle);
        let took = started.elapsed();
        fs::remove_dir(&cgroup).ok()?;
        Some(took)
    }
}

/// Every cgroup under `kubepods` (the background's containers and their ancestors), each
/// `cpuset.cpus` watched: tells when no container's `cpuset.cpus.effective` holds a CPU.
struct Others {
    inotify: Inotify,
    /// Every cgroup directory, `kubepods` first.
    dirs: Vec<PathBuf>,
    dir_of: HashMap<WatchDescriptor, usize>,
    /// The containers (leaf cgroups), as indices into `dirs`, and their effective sets as read
    /// while the agent was quiet.
    containers: Vec<(usize, CpuSet)>,
}

impl Others {
    fn new(kubepods: &Path) -> Others {
        let mut dirs = vec![kubepods.to_path_buf()];
        let mut at = 0;
        while at < dirs.len() {
            let mut children: Vec<PathBuf> = fs::read_dir(&dirs[at])
                .map(|entries| {
                    entries
                        .flatten()
                        .map(|e| e.path())
                        .filter(|p| p.is_dir())
                        .collect()
                })
                .unwrap_or_default();
            children.sort();
            dirs.extend(children);
            at += 1;
        }
        let inotify = Inotify::init().expect("inotify");
        let mut dir_of = HashMap::new();
        for (index, dir) in dirs.iter().enumerate() {
            let wd = inotify
                .watches()
                .add(dir.join("cpuset.cpus"), WatchMask::MODIFY)
                .unwrap_or_else(|e| panic!("watch {}: {e}", dir.display()));
            dir_of.insert(wd, index);
        }
        let containers = (0..dirs.len())
            .filter(|&i| !dirs.iter().any(|d| d.parent() == Some(dirs[i].as_path())))
            .map(|i| (i, CpuSet::default()))
            .collect();
        Others {
            inotify,
            dirs,
            dir_of,
            containers,
        }
    }

    fn effective(&self, index: usize) -> CpuSet {
        read_set(&self.dirs[index].join("cpuset.cpus.effective")).unwrap_or_default()
    }

    /// Drops what the watches saw so far and reads every container's effective set (the agent
    /// is quiet: untimed).
    fn remember(&mut self) {
        self.changed(Duration::ZERO);
        for n in 0..self.containers.len() {
            self.containers[n].1 = self.effective(self.containers[n].0);
        }
    }

    /// The cgroups whose `cpuset.cpus` was written since the last call, waiting up to `limit`
    /// for the first; when it woke.
    fn changed(&mut self, limit: Duration) -> (Vec<usize>, Instant) {
        let ms = u16::try_from(limit.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, PollTimeout::from(ms));
        let woke = Instant::now();
        let mut buffer = [0u8; 16384];
        let mut written = Vec::new();
        while let Ok(events) = self.inotify.read_events(&mut buffer) {
            let before = written.len();
            written.extend(events.filter_map(|e| self.dir_of.get(&e.wd).copied()));
            if written.len() == before {
                break;
            }
        }
        (written, woke)
    }

    /// Waits until no container's effective set holds a CPU of `pin`; when the bench woke for
    /// the pass that found none left (`None` after `limit`).
    fn wait_off(&mut self, pin: &CpuSet, limit: Duration) -> Option<Instant> {
        let deadline = Instant::now() + limit;
        let mut holders: Vec<usize> = (0..self.containers.len())
            .filter(|&n| !self.containers[n].1.is_disjoint(pin))
            .collect();
        while !holders.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let (written, woke) = self.changed(left.min(Duration::from_secs(1)));
            let below = |n: &usize| {
                let dir = &self.dirs[self.containers[*n].0];
                written.is_empty() || written.iter().any(|&w| dir.starts_with(&self.dirs[w]))
            };
            holders
                .retain(|n| !below(n) || !self.effective(self.containers[*n].0).is_disjoint(pin));
            if holders.is_empty() {
                return Some(woke);
            }
        }
        Some(Instant::now())
    }
}
