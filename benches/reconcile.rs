//! Figure 4, reconcile cost over 10,000 container cgroups (2,500 pods with a sandbox and three
//! app containers each, 100 of them Guaranteed with one exclusive cpu; 256-CPU topology;
//! tmpfs), on a converged tree (no write expected), against the floor measured in the same
//! run: reading each container's `cpuset.cpus` once with `std::fs::read_to_string`. Measured
//! in-process with the agent's own code: the reconcile thread's quiet tick (every cgroup's
//! `cpuset.cpus` read once and compared with its last full scan: what a reconcile costs when
//! nothing changed), a full scan, the full reconcile (scan, merge, a pass only if needed: what
//! SIGHUP and busy ticks run) and the same with a forced pass; then through SIGHUP to `cpusetd
//! run` (`cpusetd_reconcile_duration_seconds`).
//!
//! `cargo bench --bench reconcile`; `PODS` (default 2500) and `ROUNDS` (default 9).

mod common;

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;

fn median(samples: &mut [Duration]) -> f64 {
    samples.sort_unstable();
    samples[samples.len() / 2].as_secs_f64() * 1e3
}

fn main() {
    let pods = env_usize("PODS", 2500);
    let rounds = env_usize("ROUNDS", 9);
    let machine = fake_machine(TOPOLOGY_256);
    let mut files: Vec<PathBuf> = Vec::new();
    for pod in large_node_pods(pods, 25) {
        let sandbox = machine.fake.add_pod(&pod).unwrap();
        let dir = machine.fake.pod_dir(&pod);
        files.push(
            machine
                .fake
                .file(&format!("{dir}/{sandbox}"), "cpuset.cpus"),
        );
        for c in &pod.containers {
            let id = machine.fake.add_container(&pod, c).unwrap();
            files.push(machine.fake.file(&format!("{dir}/{id}"), "cpuset.cpus"));
        }
    }

    // Converge first: pin, lift quotas, shrink the shared cgroups.
    let mut controller = controller_of(&machine);
    controller.full_scan().unwrap();
    let first = controller.pass(Instant::now());
    controller.full_scan().unwrap();
    let second = controller.pass(Instant::now());
    let (containers, exclusive) = controller.counts();
    println!(
        "reconcile over {} container cgroups ({containers} app containers, {exclusive} exclusive): converged with {} writes, then {} writes",
        files.len(),
        first.writes, second.writes
    );

    let mut scanner = scanner_of(&machine);
    let snapshot = cpusetd::cgroupfs::CpusetSnapshot::of(&scanner.scan().unwrap());
    let mut quiet = Vec::new();
    let mut floor = Vec::new();
    let mut scan_only = Vec::new();
    let mut reconcile = Vec::new();
    let mut forced = Vec::new();
    let mut writes = 0;
    let mut passes = 0;
    for _ in 0..rounds {
        let started = Instant::now();
        for file in &files {
            std::hint::black_box(fs::read_to_string(file).unwrap());
        }
        floor.push(started.elapsed());

        let started = Instant::now();
        std::hint::black_box(scanner.scan().unwrap());
        scan_only.push(started.elapsed());

        // A quiet tick of the agent's reconcile thread: each cgroup's cpuset.cpus, compared.
        let started = Instant::now();
        assert!(scanner.cpusets_unchanged(&snapshot));
        quiet.push(started.elapsed());

        // What a busy tick and SIGHUP run: scan, merge, and a pass only if needed.
        let started = Instant::now();
        if let Some(outcome) = controller.rescan().unwrap() {
            passes += 1;
            writes += outcome.writes + outcome.failed_writes;
        }
        reconcile.push(started.elapsed());

        // The same with a pass forced (what every reconcile cost before the skip).
        let started = Instant::now();
        controller.full_scan().unwrap();
        let outcome = controller.pass(Instant::now());
        forced.push(started.elapsed());
        writes += outcome.writes + outcome.failed_writes;
    }
    let floor = median(&mut floor);
    let pass = median(&mut reconcile);
    let quiet = median(&mut quiet);
    println!("{:<52} {:>10} {:>8}", "", "median ms", "x floor");
    let row = |what: &str, ms: f64| println!("{what:<52} {ms:>10.2} {:>8.2}", ms / floor);
    row("floor: read each container's cpuset.cpus once", floor);
    row(
        &format!(
            "quiet reconcile tick ({} cgroups' cpuset.cpus)",
            snapshot.len()
        ),
        quiet,
    );
    row("full scan (Scanner::scan) alone", median(&mut scan_only));
    row("no-change reconcile (scan, merge, no pass needed)", pass);
    row(
        "reconcile with a forced pass (classify, plan)",
        median(&mut forced),
    );
    println!(
        "no-change reconcile: quiet tick {:.2} x floor, full {:.2} x floor (target <= 1.5); \
         passes run {passes} of {rounds}, writes {writes} (target 0)",
        quiet / floor,
        pass / floor
    );
    drop(controller);

    let agent = Agent::start(&machine.agent_args());
    let mut via_signal = Vec::new();
    for _ in 0..rounds.min(5) {
        let before = agent.metric("cpusetd_last_reconcile_timestamp_seconds");
        agent.signal(Signal::SIGHUP);
        let deadline = Instant::now() + Duration::from_secs(30);
        while agent.metric("cpusetd_last_reconcile_timestamp_seconds") == before
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(s) = agent.metric("cpusetd_reconcile_duration_seconds") {
            via_signal.push(Duration::from_secs_f64(s));
        }
    }
    if !via_signal.is_empty() {
        println!(
            "{:<48} {:>10.2}",
            "SIGHUP to cpusetd run (reconcile_duration)",
            median(&mut via_signal)
        );
    }
    println!(
        "agent writes after its first pass: {}",
        agent.metric("cpusetd_cgroup_writes_total").unwrap_or(-1.0)
    );
}
