//! Figure 1, event → pin latency: from a Guaranteed 1-CPU container's cgroup appearing with
//! its CPU settings (timestamp taken right after the kubelet simulator's rename and writes)
//! until its `cpuset.cpus` reads back as its one exclusive CPU, with `cpusetd run` (this
//! build) watching. One container at a time, each pod removed after its sample; on a tmpfs
//! fake tree (256-CPU topology, with a background of other pods) and on the real cgroup v1
//! hierarchy (a unique subtree, removed at the end).
//!
//! `cargo bench --bench event_to_pin`; `SAMPLES` (default 1000), `BACKGROUND_PODS`
//! (default 110, kubelet's default max-pods, and 500; comma-separated) and `IN_PROCESS_PODS`
//! (the controller-only rows, and the time of a full pass; default 110 and 2500) change the run.

mod common;

use std::time::{Duration, Instant};

use common::*;
use cpusetd::kubesim::{ContainerSpec, FakeNode, Qos};

const LIMIT: Duration = Duration::from_secs(10);

/// Full passes timed per in-process tree.
const FULL_PASSES: usize = 200;

/// Samples `n` containers; `settled` is called after each pod removal.
fn sample(node: &FakeNode, n: usize, mut settled: impl FnMut()) -> (Vec<Duration>, usize) {
    let mut waiter = FileWaiter::default();
    let mut samples = Vec::with_capacity(n);
    let mut missed = 0;
    for _ in 0..n {
        let pod = pod(
            Qos::Guaranteed,
            vec![ContainerSpec::guaranteed("app", 1000)],
        );
        let ids = node.start_pod(&pod).expect("start pod");
        let appeared = Instant::now();
        let rel = format!("{}/{}", node.pod_dir(&pod), ids[0]);
        match waiter.wait(&node.file(&rel, "cpuset.cpus"), LIMIT, has_cpus(1)) {
            Some(pinned) => samples.push(pinned - appeared),
            None => missed += 1,
        }
        node.remove_pod(&pod).expect("remove pod");
        settled();
    }
    (samples, missed)
}

fn report(what: &str, samples: &mut [Duration], missed: usize, agent: &Agent) {
    let (median, p99) = median_p99(samples);
    let agent_p99 = agent
        .metric("cpusetd_event_to_pin_seconds{quantile=\"0.99\"}")
        .map_or("-".into(), |s| format!("{:.0}", s * 1e6));
    let writes = agent.metric("cpusetd_cgroup_writes_total").unwrap_or(0.0);
    let passes = agent.metric("cpusetd_passes_total").unwrap_or(0.0);
    let incremental = agent
        .metric("cpusetd_incremental_passes_total")
        .unwrap_or(0.0);
    println!(
        "{what:<44} {:>6} {:>10.0} {:>10.0} {:>8} {:>16} {:>14.0}   ({incremental} of {passes} passes incremental)",
        samples.len(),
        median,
        p99,
        missed,
        agent_p99,
        writes / (samples.len() + missed) as f64
    );
}

fn main() {
    let n = env_usize("SAMPLES", 1000);
    let backgrounds: Vec<usize> = std::env::var("BACKGROUND_PODS")
        .unwrap_or_else(|_| "110,500".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    println!("event -> pin latency, one Guaranteed 1-cpu container at a time (µs)");
    println!(
        "{:<44} {:>6} {:>10} {:>10} {:>8} {:>16} {:>14}",
        "tree", "n", "median", "p99", "missed", "agent's own p99", "writes/sample"
    );
    for background in backgrounds {
        let machine = fake_machine(TOPOLOGY_256);
        for pod in large_node_pods(background, 0) {
            machine.fake.start_pod(&pod).unwrap();
        }
        let agent = Agent::start(&machine.agent_args());
        let (mut samples, missed) = sample(&machine.fake, n, || {});
        report(
            &format!("tmpfs, 256 cpus, {background} other pods"),
            &mut samples,
            missed,
            &agent,
        );
    }

    // The agent's own work per container, without inotify or scheduling: the controller
    // handles the pod's `Created` event and runs its pass, in process, with the agent's write
    // schedule (pins first; the shared pool's rewrites held back while pods keep arriving).
    let in_process: Vec<usize> = std::env::var("IN_PROCESS_PODS")
        .unwrap_or_else(|_| "110,2500".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    for background in in_process {
        let machine = fake_machine(TOPOLOGY_256);
        for pod in large_node_pods(background, 0) {
            machine.fake.start_pod(&pod).unwrap();
        }
        let mut controller = controller_of(&machine);
        controller.watch_arrivals(cpusetd::watcher::Arrivals::channel().1);
        controller.full_scan().unwrap();
        controller.pass(Instant::now());
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let pod = pod(
                Qos::Guaranteed,
                vec![ContainerSpec::guaranteed("app", 1000)],
            );
            machine.fake.start_pod(&pod).unwrap();
            let dir = cpusetd::cgroupfs::CgroupPath::new(&machine.fake.pod_dir(&pod)).unwrap();
            let started = Instant::now();
            controller
                .apply_event(
                    cpusetd::watcher::TreeEvent::Created {
                        cgroup: dir.clone(),
                    },
                    started,
                )
                .unwrap();
            controller.pass(started);
            samples.push(started.elapsed());
            machine.fake.remove_pod(&pod).unwrap();
            controller
                .apply_event(
                    cpusetd::watcher::TreeEvent::Removed { cgroup: dir },
                    Instant::now(),
                )
                .unwrap();
            controller.pass(Instant::now());
        }
        let (median, p99) = median_p99(&mut samples);
        println!(
            "{:<44} {:>6} {:>10.0} {:>10.0}   (Created event + pass, in process; {} incremental)",
            format!("tmpfs, {background} other pods, controller only"),
            n,
            median,
            p99,
            controller.metrics.incremental_passes
        );
        // What a pin may wait for: a full pass (the shared pool's rewrites after incremental
        // passes), whose planning an arrival does not interrupt. Nothing changed: all planning.
        let mut full = Vec::new();
        for _ in 0..FULL_PASSES {
            let started = Instant::now();
            let outcome = controller.pass(started);
            full.push(started.elapsed());
            assert_eq!(outcome.writes, 0, "a converged tree");
        }
        let (median, p99) = median_p99(&mut full);
        println!(
            "{:<44} {:>6} {:>10.0} {:>10.0}   (a full pass of the converged tree, in process)",
            format!("tmpfs, {background} other pods, full pass"),
            FULL_PASSES,
            median,
            p99,
        );
    }

    if let Some(reason) = kernel_skip_reason() {
        println!("real cgroup v1: skipped: {reason}");
        return;
    }
    let machine = KernelMachine::new();
    let agent = Agent::start(&machine.agent_args());
    // One exclusive cpu on a 2-cpu machine: wait for each release (the burstable cgroup gets
    // the whole pool back) before the next container.
    let burstable = machine.cpuset_dir("kubepods/burstable/cpuset.cpus");
    let whole = std::fs::read_to_string(&burstable).unwrap();
    let mut waiter = FileWaiter::default();
    let (mut samples, missed) = sample(&machine.fake, n, || {
        waiter.wait(&burstable, LIMIT, |t| t == whole.trim());
    });
    report("real cgroup v1, this machine", &mut samples, missed, &agent);
    drop(agent);
    drop(machine);
}
