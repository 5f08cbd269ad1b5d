//! Figure 7, footprint: resident memory of `cpusetd run` (this build) watching 10,000
//! container cgroups (2,500 pods, 256-CPU topology, tmpfs), and the CPU time (user + system,
//! from /proc/<pid>/stat) it uses over 60 s with nothing happening. Measured twice: with the
//! reconcile tick out of the window (`--cpu-manager-reconcile-period 1h`: what the agent itself
//! costs at rest) and with kubelet's default 10 s tick (six full reconciles in the window).
//!
//! `cargo bench --bench footprint`; `PODS` (default 2500), `IDLE_SECS` (default 60).

mod common;

use std::time::Duration;

use common::*;

fn main() {
    let pods = env_usize("PODS", 2500);
    let idle = Duration::from_secs(env_usize("IDLE_SECS", 60) as u64);
    let machine = fake_machine(TOPOLOGY_256);
    for pod in large_node_pods(pods, 25) {
        machine.fake.start_pod(&pod).unwrap();
    }
    println!(
        "footprint of cpusetd run with {} container cgroups ({pods} pods) watched",
        pods * 4
    );
    println!(
        "{:<20} {:>10} {:>22} {:>22} {:>8}",
        "reconcile period", "RSS MiB", "CPU ms (stat ticks)", "CPU ms (schedstat)", "window s"
    );
    for period in ["1h", "10s"] {
        let mut args = machine.agent_args();
        args.extend(["--cpu-manager-reconcile-period".into(), period.into()]);
        let agent = Agent::start(&args);
        // Let the first pass's writes come back as events and settle.
        agent.wait_quiet(Duration::from_secs(2), Duration::from_secs(300));
        let (before, before_ns) = (agent.cpu_time(), agent.cpu_time_ns());
        std::thread::sleep(idle);
        let used = agent.cpu_time() - before;
        let used_ns = agent.cpu_time_ns() - before_ns;
        println!(
            "{:<20} {:>10.1} {:>22.0} {:>22.3} {:>8}",
            period,
            agent.rss_kib() as f64 / 1024.0,
            used.as_secs_f64() * 1e3,
            used_ns as f64 / 1e6,
            idle.as_secs()
        );
    }
    println!("targets: RSS <= 16 MiB, CPU < 10 ms over 60 s idle");
}
