//! Figure 2, pinned before start with real runc: `runc create` then `runc start` back to back,
//! 200 times, for a Guaranteed 1-CPU container (shares 1024, quota 100000/100000) whose command
//! first prints its `Cpus_allowed_list`, while `cpusetd run` (this build) watches the
//! subtree. Counts how many saw their final (exclusive) set at their first instruction, and
//! times the steps: `runc create`, `runc start`, and when the agent's pin landed relative to
//! `runc create` returning.
//!
//! Needs root, the cgroup v1 cpuset and cpu hierarchies, runc and a static busybox; skips
//! with the reason otherwise. `cargo bench --bench runc_start`; `RUNS` (default 200).

mod common;

#[allow(dead_code, unused_imports)]
#[path = "../tests/runc.rs"]
mod runc;

use std::fs::{self, File};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use runc::{pod_uid, CpuResources, Runc};

fn main() {
    if let Some(reason) = runc::runc_skip_reason() {
        println!("runc create/start: skipped: {reason}");
        return;
    }
    let runs = env_usize("RUNS", 200);
    let mut harness = Runc::new();
    let tree = harness.tree().name().to_string();
    let kubepods = harness.tree().kubepods();
    // The kubepods cgroup exists before the agent starts, as kubelet makes it.
    for controller in ["cpuset", "cpu"] {
        fs::create_dir_all(harness.tree().dir(controller, "")).unwrap();
    }
    let mount = runc::controller_mount("cpuset").unwrap();
    for dir in [mount.join(&tree), mount.join(&kubepods)] {
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let value = fs::read_to_string(mount.join(file)).unwrap();
            fs::write(dir.join(file), value.trim()).unwrap();
        }
    }
    let configs = format!("{}/{{id}}/config.json", harness.scratch().display());
    let agent = Agent::start(&[
        "--cgroup-root".into(),
        CGROUP_ROOT.into(),
        "--kubepods-path".into(),
        kubepods.clone(),
        "--runtime-config-path".into(),
        configs,
        "--reserved-cpus".into(),
        "0".into(),
    ]);

    let mut saw_final = 0;
    let mut create = Vec::new();
    let mut start = Vec::new();
    let mut pinned_at_create = 0;
    let mut late = Vec::new();
    let mut waiter = FileWaiter::default();
    for run in 0..runs {
        let pod = format!("pod{}", pod_uid());
        let (id, bundle) = harness.bundle(
            &pod,
            CpuResources::guaranteed(1),
            &["grep", "Cpus_allowed_list", "/proc/self/status"],
        );
        let out = bundle.join("stdout");
        let t0 = Instant::now();
        let status = harness
            .runc()
            .args(["create", "--bundle"])
            .arg(&bundle)
            .arg(&id)
            .stdin(Stdio::null())
            .stdout(File::create(&out).unwrap())
            .stderr(File::create(bundle.join("runc.log")).unwrap())
            .status()
            .unwrap();
        assert!(
            status.success(),
            "runc create: {}",
            fs::read_to_string(bundle.join("runc.log")).unwrap_or_default()
        );
        let created = Instant::now();
        let cpus = harness
            .tree()
            .dir("cpuset", &format!("{pod}/{id}"))
            .join("cpuset.cpus");
        if has_cpus(1)(fs::read_to_string(&cpus).unwrap_or_default().trim()) {
            pinned_at_create += 1;
        }
        let status = harness.runc().args(["start", &id]).status().unwrap();
        assert!(status.success(), "runc start {id}");
        let started = Instant::now();
        create.push(created - t0);
        start.push(started - created);

        // The final set: the agent's pin (one cpu).
        waiter.wait(&cpus, Duration::from_secs(5), has_cpus(1));
        let final_set = fs::read_to_string(&cpus)
            .unwrap_or_default()
            .trim()
            .to_string();
        // The container's output: its Cpus_allowed_list at its first instruction.
        let deadline = Instant::now() + Duration::from_secs(5);
        let seen = loop {
            let text = fs::read_to_string(&out).unwrap_or_default();
            if let Some(v) = text
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            {
                break v.trim().to_string();
            }
            assert!(Instant::now() < deadline, "run {run}: no output from {id}");
            std::thread::sleep(Duration::from_millis(1));
        };
        if seen == final_set {
            saw_final += 1;
        } else {
            late.push((seen, final_set));
        }
        harness.delete_by_id(&id);
        let _ = fs::remove_dir(harness.tree().dir("cpuset", &pod));
        let _ = fs::remove_dir(harness.tree().dir("cpu", &pod));
    }
    let ms = |d: &mut Vec<Duration>| {
        let (m, p) = median_p99(d);
        format!("median {:.1} ms, p99 {:.1} ms", m / 1e3, p / 1e3)
    };
    println!("runc create + runc start back to back, {runs} Guaranteed 1-cpu containers");
    println!("saw their final cpuset at their first instruction: {saw_final} of {runs} ({:.1} %, target >= 99.5 %)", saw_final as f64 * 100.0 / runs as f64);
    println!("runc create:                   {}", ms(&mut create));
    println!("runc start:                    {}", ms(&mut start));
    println!("already pinned when runc create returned: {pinned_at_create} of {runs}");
    if let Some(p99) = agent.metric("cpusetd_event_to_pin_seconds{quantile=\"0.99\"}") {
        println!("agent's own event -> pin p99:  {:.2} ms", p99 * 1e3);
    }
    for (seen, final_set) in late.iter().take(5) {
        println!("  late: saw {seen}, final {final_set}");
    }
    drop(agent);
}
