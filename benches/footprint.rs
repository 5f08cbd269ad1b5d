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
        "{:<32} {:>10} {:>22} {:>22} {:>8}",
        "reconcile period", "RSS MiB", "CPU ms (stat ticks)", "CPU ms (schedstat)", "window s"
    );
    // The PodResources server (on by default) off, idle, and after answering `List` (every
    // pod) ten times; never this machine's kubelet.
    let rows: [(&str, &[&str], usize); 4] = [
        ("1h", &["--pod-resources-socket", "none"], 0),
        ("1h", &[], 0),
        ("1h", &[], 10),
        ("10s", &[], 0),
    ];
    for (period, extra, lists) in rows {
        let mut args = machine.agent_args();
        args.extend(["--cpu-manager-reconcile-period".into(), period.into()]);
        args.extend(["--kubelet-pod-resources-socket".into(), "none".into()]);
        args.extend(extra.iter().map(|a| a.to_string()));
        let agent = Agent::start(&args);
        // Let the first pass's writes come back as events and settle.
        agent.wait_quiet(Duration::from_secs(2), Duration::from_secs(300));
        let listed = list_pod_resources(&agent.state_dir().join("pod-resources.sock"), lists);
        let period = match (extra.is_empty(), lists) {
            (false, _) => format!("{period}, no PodResources"),
            (true, 0) => period.to_string(),
            (true, n) => format!("{period}, {n} List ({listed} pods)"),
        };
        let (before, before_ns) = (agent.cpu_time(), agent.cpu_time_ns());
        std::thread::sleep(idle);
        let used = agent.cpu_time() - before;
        let used_ns = agent.cpu_time_ns() - before_ns;
        println!(
            "{:<32} {:>10.1} {:>22.0} {:>22.3} {:>8}",
            period,
            agent.rss_kib() as f64 / 1024.0,
            used.as_secs_f64() * 1e3,
            used_ns as f64 / 1e6,
            idle.as_secs()
        );
    }
    println!("targets: RSS <= 16 MiB, CPU < 10 ms over 60 s idle");
}

/// Asks `List` on the PodResources socket `n` times (a new connection each, as a reader polling
/// does); how many pods the last answer listed.
fn list_pod_resources(socket: &std::path::Path, n: usize) -> usize {
    use cpusetd::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
    use cpusetd::podresources::v1::ListPodResourcesRequest;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut pods = 0;
    for _ in 0..n {
        let socket = socket.to_path_buf();
        pods = runtime.block_on(async move {
            let channel = tonic::transport::Endpoint::from_static("http://[::]:0")
                .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                    let socket = socket.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(socket).await?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                    }
                }))
                .await
                .unwrap();
            let mut client = PodResourcesListerClient::new(channel);
            let answer = client.list(ListPodResourcesRequest {}).await.unwrap();
            answer.into_inner().pod_resources.len()
        });
    }
    pods
}
