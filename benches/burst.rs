//! Figure 5, burst: 1,000 pods (one in ten Guaranteed with a 2-cpu exclusive container, the
//! rest Burstable; a sandbox and one app container each) created as fast as the kubelet
//! simulator can while `cpusetd run` (this build) watches, on the 256-CPU topology (tmpfs).
//! Prints the time from the first pod until every container holds its final cpuset (the last
//! change of any container's `cpuset.cpus`, once the agent has gone quiet), and writes issued
//! (`cpusetd_cgroup_writes_total`) ÷ writes necessary (what one plan from the same kubelet-made
//! tree writes, counted on a second tree with no agent).
//!
//! `cargo bench --bench burst`; `PODS` (default 1000), `RATE` (pods/s, default unlimited).

mod common;

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use common::*;
use cpusetd::kubesim::{ContainerSpec, PodSpec, Qos};

fn burst_pods(n: usize) -> Vec<PodSpec> {
    (0..n)
        .map(|i| {
            if i % 10 == 0 {
                pod(
                    Qos::Guaranteed,
                    vec![ContainerSpec::guaranteed("app", 2000)],
                )
            } else {
                pod(
                    Qos::Burstable,
                    vec![ContainerSpec::burstable("app", 250, Some(1000))],
                )
            }
        })
        .collect()
}

fn main() {
    let n = env_usize("PODS", 1000);
    let rate = std::env::var("RATE").ok().and_then(|r| r.parse().ok());

    // Writes necessary: one plan over the tree kubelet alone makes.
    let reference = fake_machine(TOPOLOGY_256);
    reference
        .fake
        .start_pods_at_rate(&burst_pods(n), None)
        .unwrap();
    let mut controller = controller_of(&reference);
    controller.full_scan().unwrap();
    let necessary = controller.pass(Instant::now()).writes;
    drop(controller);
    drop(reference);

    let machine = fake_machine(TOPOLOGY_256);
    let agent = Agent::start(&machine.agent_args());
    let before = agent.metric("cpusetd_cgroup_writes_total").unwrap_or(0.0);
    let pods = burst_pods(n);
    let wall_start = SystemTime::now();
    let start = Instant::now();
    let started = machine.fake.start_pods_at_rate(&pods, rate).unwrap();
    let created = start.elapsed();
    agent.wait_quiet(Duration::from_secs(2), Duration::from_secs(600));

    // The last change of any container's cpuset (tmpfs keeps fine-grained mtimes).
    let mut files: Vec<PathBuf> = Vec::new();
    for (pod, (ids, _)) in pods.iter().zip(&started) {
        for id in ids {
            files.push(machine.fake.file(
                &format!("{}/{id}", machine.fake.pod_dir(pod)),
                "cpuset.cpus",
            ));
        }
    }
    let last = files
        .iter()
        .filter_map(|f| fs::metadata(f).ok()?.modified().ok())
        .max()
        .unwrap();
    let all_pinned = last.duration_since(wall_start).unwrap_or_default();
    let exclusive_ok = pods
        .iter()
        .zip(&files)
        .filter(|(p, f)| {
            p.qos == Qos::Guaranteed
                && has_cpus(2)(fs::read_to_string(f).unwrap_or_default().trim())
        })
        .count();
    let issued = agent.metric("cpusetd_cgroup_writes_total").unwrap_or(0.0) - before;
    let passes = agent.metric("cpusetd_passes_total").unwrap_or(0.0);

    // Converged: a plan over the final tree writes nothing.
    // Stop the agent first: the check below must not race it.
    drop(agent);
    let mut check = controller_of(&machine);
    check.full_scan().unwrap();
    let left = check.pass(Instant::now()).writes;

    println!(
        "burst: {n} pods ({} Guaranteed 2-cpu, the rest Burstable) on 256 cpus",
        n / 10
    );
    println!(
        "pods created in             {:>10.1} ms",
        created.as_secs_f64() * 1e3
    );
    println!(
        "all pinned after            {:>10.1} ms",
        all_pinned.as_secs_f64() * 1e3
    );
    println!(
        "exclusive containers pinned {:>10} of {}",
        exclusive_ok,
        n / 10
    );
    println!("writes issued               {:>10}", issued);
    println!("writes necessary            {:>10}", necessary);
    println!(
        "issued / necessary          {:>10.2} (target 1.00)",
        issued / necessary as f64
    );
    println!("passes                      {:>10}", passes);
    println!(
        "writes left after the burst {:>10} (a second plan over the final tree)",
        left
    );
}
