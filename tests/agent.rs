//! The agent binary, `cpusetd run`, on fake nodes (kubesim on tmpfs or a temporary directory,
//! 16 CPUs in 8 HT cores `{n, n+8}`, CPU 0 reserved) with the fake kernel refusing what cgroup
//! v1 refuses: pods of every class arrive and leave, containers restart, someone else writes a
//! cpuset, a limit is resized, the agent restarts, its checkpoint is corrupt, it is signalled, a
//! second one is started, the tree is flooded, `status` and `reset`. Every test ends with no
//! write the kernel would refuse and no failed write in the metrics. Waiting always polls with a
//! deadline.

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::kubesim::{new_container_id, ContainerSpec, PodSpec, Qos};

use crate::agent_util::{
    best_effort, cpus, guaranteed, pin_latency, pod, poll_until, AgentProcess, Status, TestNode,
    DEADLINE,
};
use crate::util::{stderr, stdout};

/// Every `cpuset.cpus` under the kubepods cgroup, by directory.
fn every_cpuset(node: &TestNode) -> Vec<(String, String)> {
    let root = node.fake.file("kubepods", "cpuset.cpus");
    let top = root.parent().unwrap().to_path_buf();
    let mut found = Vec::new();
    let mut dirs = vec![top.clone()];
    while let Some(dir) = dirs.pop() {
        if let Ok(text) = fs::read_to_string(dir.join("cpuset.cpus")) {
            let rel = dir.strip_prefix(&top).unwrap().display().to_string();
            found.push((rel, text.trim().to_string()));
        }
        for entry in fs::read_dir(&dir).unwrap().flatten() {
            if entry.file_type().unwrap().is_dir() {
                dirs.push(entry.path());
            }
        }
    }
    found
}

fn every_class_arrives_and_leaves(version: CgroupVersion) {
    let node = TestNode::new(version);
    let mut agent = node.start_agent(&[]);

    let be_pod = best_effort("be");
    let burstable = pod(
        "burst",
        Qos::Burstable,
        vec![ContainerSpec::burstable("burst", 250, Some(2000))],
    );
    let db = pod(
        "db",
        Qos::Guaranteed,
        vec![
            ContainerSpec::guaranteed("db", 2000),
            ContainerSpec::guaranteed("sidecar", 500),
        ],
    );
    let fractional = guaranteed("fractional", 1500);
    let be = node.fake.start_pod(&be_pod).unwrap();
    let bu = node.fake.start_pod(&burstable).unwrap();
    let g = node.fake.start_pod(&db).unwrap();
    let f = node.fake.start_pod(&fractional).unwrap();

    // The 2-CPU container gets a whole core; every other container the rest.
    let status = node.wait_cpus(&g[0], "1,9");
    let shared = "0,2-8,10-15";
    assert_eq!(status.shared_pool, shared);
    assert_eq!(status.exclusive_cpus, "1,9");
    assert_eq!(status.policy, "static");
    let sidecar = status.by_id(&g[1]).unwrap();
    assert_eq!(sidecar.container.as_deref(), Some("sidecar"));
    assert!(sidecar.note.contains("not a whole number"), "{sidecar:?}");
    let sandboxes = status.containers.iter().filter(|r| r.kind == "sandbox");
    assert_eq!(sandboxes.count(), 4);
    assert!(status.by_id(&g[0]).unwrap().exclusive);
    for id in [&be[0], &bu[0], &g[1], &f[0]] {
        assert!(status.has(id, shared), "{id}: {status:#?}");
        assert!(!status.by_id(id).unwrap().exclusive, "{id}");
    }
    assert_eq!(node.cpus_of(&db, &g[0]), "1,9");
    assert_eq!(node.cpus_of(&db, &g[1]), shared);
    assert_eq!(node.cpus_of(&fractional, &f[0]), shared);
    match version {
        CgroupVersion::V1 => assert_eq!(node.read(&db, "", "cpuset.cpus"), "0-15"),
        // v2: the pod follows its parent (kubepods), as kubelet leaves it.
        CgroupVersion::V2 => {
            assert_eq!(node.read(&db, "", "cpuset.cpus"), "");
            assert_eq!(node.read(&db, "", "cpuset.cpus.effective"), "0-15");
        }
    }

    // The pod is deleted: its CPUs return to the shared pool.
    node.fake.remove_pod(&db).unwrap();
    let status = node.wait_status("db's cpus back in the shared pool", |s| {
        s.exclusive_cpu_count == 0 && s.has(&be[0], "0-15") && s.converged()
    });
    assert_eq!(status.shared_pool, "0-15");
    for (p, id) in [
        (&be_pod, &be[0]),
        (&burstable, &bu[0]),
        (&fractional, &f[0]),
    ] {
        assert_eq!(node.cpus_of(p, id), "0-15");
    }
    for p in [&be_pod, &burstable, &fractional] {
        node.fake.remove_pod(p).unwrap();
    }
    node.wait_status("every pod gone", |s| s.containers.is_empty());
    assert!(agent.stop().success());
    node.assert_clean();
}

#[test]
fn agent_pods_of_every_class_arrive_and_leave_v1() {
    every_class_arrives_and_leaves(CgroupVersion::V1);
}

#[test]
fn agent_pods_of_every_class_arrive_and_leave_v2() {
    every_class_arrives_and_leaves(CgroupVersion::V2);
}

/// Makes a cgroup directory appear the way the kernel makes one, all its files at once, but
/// right after its parent, before anyone wrote the parent's values.
fn appear(node: &TestNode, rel: &str, files: &[(&str, &str)]) {
    let target = node.fake.file(rel, files[0].0);
    let target = target.parent().unwrap();
    let staging = node.base.join(format!("staging-{}", new_container_id("s")));
    fs::create_dir(&staging).unwrap();
    for (name, value) in files {
        fs::write(staging.join(name), format!("{value}\n")).unwrap();
    }
    fs::rename(&staging, target).unwrap();
}

#[test]
fn agent_race_of_a_directory_created_right_after_its_parent() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);

    // Pod, sandbox and container back to back, for several pods at once.
    let pods: Vec<PodSpec> = (0..6).map(|i| guaranteed(&format!("g{i}"), 2000)).collect();
    let ids: Vec<String> = pods
        .iter()
        .map(|p| node.fake.start_pod(p).unwrap().remove(0))
        .collect();
    let status = node.wait_status("every racing pod pinned", |s| {
        s.converged()
            && ids
                .iter()
                .all(|id| s.by_id(id).is_some_and(|r| r.exclusive))
    });
    let mut taken = cpus("");
    for id in &ids {
        let held = cpus(status.by_id(id).unwrap().current.as_deref().unwrap());
        assert_eq!(held.len(), 2, "{id}");
        assert!(
            held.is_disjoint(&taken) && !held.contains(0),
            "{held} after {taken}"
        );
        let core = held.first().unwrap();
        assert_eq!(held, cpus(&format!("{core},{}", core + 8)), "a whole core");
        taken = taken.union(&held);
    }

    // Closer still: the pod directory and its container's directory appear with nothing in
    // between, then the runtime writes the container's settings and copies the cpusets down.
    let racer = guaranteed("racer", 1000);
    let pod_dir = node.fake.pod_dir(&racer);
    let id = new_container_id("racer");
    let container = format!("{pod_dir}/{id}");
    let empty_cpuset = [
        ("cpuset.cpus", ""),
        ("cpuset.mems", ""),
        ("cpuset.effective_cpus", ""),
        ("cpuset.effective_mems", ""),
        ("cgroup.procs", ""),
    ];
    let default_cpu = [
        ("cpu.shares", "1024"),
        ("cpu.cfs_quota_us", "-1"),
        ("cpu.cfs_period_us", "100000"),
        ("cgroup.procs", ""),
    ];
    appear(&node, &pod_dir, &empty_cpuset);
    appear(&node, &container, &empty_cpuset);
    appear(&node, &pod_dir, &default_cpu);
    appear(&node, &container, &default_cpu);
    fs::write(node.fake.file(&container, "cpu.cfs_quota_us"), "100000\n").unwrap();
    for rel in [&pod_dir, &container] {
        let parent = rel.rsplit_once('/').unwrap().0;
        for file in ["cpuset.mems", "cpuset.cpus"] {
            let inherited = fs::read_to_string(node.fake.file(parent, file)).unwrap();
            let own = node.fake.file(rel, file);
            if fs::read_to_string(&own).unwrap().trim().is_empty() {
                fs::write(&own, inherited).unwrap();
            }
        }
    }
    let status = node.wait_status("the racing container pinned", |s| {
        s.converged() && s.by_id(&id).is_some_and(|r| r.exclusive)
    });
    let held = cpus(status.by_id(&id).unwrap().current.as_deref().unwrap());
    assert_eq!(held.len(), 1);
    assert!(held.is_disjoint(&taken) && !held.contains(0));
    assert_eq!(node.read(&racer, &id, "cpuset.cpus"), held.to_string());
    assert!(agent.stop().success());
    node.assert_clean();
}

#[test]
fn agent_container_restart_keeps_its_cpus() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let db = pod(
        "db",
        Qos::Guaranteed,
        vec![
            ContainerSpec::guaranteed("db", 2000),
            ContainerSpec::guaranteed("log", 1000),
        ],
    );
    let ids = node.fake.start_pod(&db).unwrap();
    node.wait_cpus(&ids[0], "1,9");
    let status = node.wait_cpus(&ids[1], "8");

    // The db container exits; the next one (same name, new id) gets the same CPUs.
    node.fake.remove_container(&db, &ids[0]).unwrap();
    // Meanwhile another pod asks for CPUs: the restarting container's are not given away.
    let other = guaranteed("other", 2000);
    let other_id = node.fake.start_pod(&other).unwrap().remove(0);
    node.wait_cpus(&other_id, "2,10");
    let again = node.fake.add_container(&db, &db.containers[0]).unwrap();
    assert_ne!(again, ids[0]);
    let after = node.wait_cpus(&again, "1,9");
    assert_eq!(
        after.by_id(&again).unwrap().container.as_deref(),
        Some("db")
    );
    assert!(after.has(&ids[1], "8"));
    assert_eq!(status.shared_pool, "0,2-7,10-15");
    assert_eq!(after.shared_pool, "0,3-7,11-15");
    assert!(
        agent.log_lines("allocated cpus=1,9").len() == 1,
        "{}",
        agent.log()
    );
    assert!(agent.stop().success());
    node.assert_clean();
}

#[test]
fn agent_repairs_a_foreign_write_at_once() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&["--cpu-manager-reconcile-period", "1h"]);
    let p = guaranteed("g", 1000);
    let id = node.fake.start_pod(&p).unwrap().remove(0);
    node.wait_cpus(&id, "8");

    // Someone widens the container (its pod holds every cpu: the sandbox is shared).
    let started = Instant::now();
    assert_eq!(node.read(&p, "", "cpuset.cpus"), "0-15");
    node.write(&p, &id, "cpuset.cpus", "0-15");
    let repaired = poll_until(DEADLINE, || (node.cpus_of(&p, &id) == "8").then_some(()));
    let took = started.elapsed();
    assert!(
        repaired.is_some(),
        "not repaired: {}",
        node.cpus_of(&p, &id)
    );
    println!("foreign write repaired in {took:?}");
    // Without a reconcile tick (the period is an hour): the watcher saw it.
    assert!(took < Duration::from_secs(2), "{took:?}");
    node.wait_cpus(&id, "8");
    let repairs = poll_until(DEADLINE, || {
        Some(node.metric("cpusetd_drift_repairs_total")).filter(|n| *n >= 1.0)
    });
    assert!(repairs.is_some(), "{:?}", node.metrics());
    assert!(agent.stop().success());
    node.assert_clean();
}

/// What kubelet's in-place resize has the runtime write: the container's and the pod's shares
/// and quota.
pub(crate) fn resize(node: &TestNode, p: &PodSpec, id: &str, milli: u64) {
    let shares = (milli * 1024 / 1000).to_string();
    let quota = (milli * 100).to_string();
    match node.fake.version() {
        CgroupVersion::V1 => {
            node.write(p, "", "cpu.shares", &shares);
            node.write(p, "", "cpu.cfs_quota_us", &quota);
            node.write(p, id, "cpu.shares", &shares);
            node.write(p, id, "cpu.cfs_quota_us", &quota);
        }
        CgroupVersion::V2 => {
            let weight = cpusetd::kubesim::weight(milli * 1024 / 1000).to_string();
            let max = format!("{quota} 100000");
            for cg in ["", id] {
                node.write(p, cg, "cpu.weight", &weight);
                node.write(p, cg, "cpu.max", &max);
            }
        }
    }
}

fn cpu_limit_resize(version: CgroupVersion) {
    let node = TestNode::new(version);
    let mut agent = node.start_agent(&[]);
    let p = guaranteed("g", 1000);
    let id = node.fake.start_pod(&p).unwrap().remove(0);
    node.wait_cpus(&id, "8");

    resize(&node, &p, &id, 2000);
    let status = node.wait_status("resized to 2 cpus", |s| {
        s.converged()
            && s.by_id(&id).is_some_and(|r| {
                r.exclusive && r.current.as_deref().map(cpus).map(|c| c.len()) == Some(2)
            })
    });
    // It keeps the cpu it was given (8, beside the reserved 0) and gets one more near it
    // (issue 23, item 24: a resize adds to the original set).
    let held = status.by_id(&id).unwrap().current.clone().unwrap();
    assert_eq!(held, "1,8");
    let lifted = match version {
        CgroupVersion::V1 => ("cpu.cfs_quota_us", "-1"),
        CgroupVersion::V2 => ("cpu.max", "max 100000"),
    };
    assert!(
        poll_until(DEADLINE, || (node.read(&p, &id, lifted.0) == lifted.1)
            .then_some(()))
        .is_some(),
        "quota of the resized container not lifted: {}",
        node.read(&p, &id, lifted.0)
    );

    // `reset` puts back the quota the resize set, not the one the container started with.
    assert!(agent.stop().success());
    let out = node.cpusetd("reset", &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let quota = |q: &str| match version {
        CgroupVersion::V1 => q.to_string(),
        CgroupVersion::V2 => format!("{q} 100000"),
    };
    assert_eq!(node.read(&p, &id, lifted.0), quota("200000"));
    // A restarted agent sees the resized container for what it is now.
    let mut agent = node.start_agent(&[]);
    node.wait_cpus(&id, "1,9");

    resize(&node, &p, &id, 1500);
    let status = node.wait_status("resized to 1.5 cpus: shared", |s| {
        s.converged() && s.by_id(&id).is_some_and(|r| !r.exclusive) && s.exclusive_cpu_count == 0
    });
    assert!(status.has(&id, "0-15"), "{status:#?}");
    assert!(agent.stop().success());
    // The quota is kubelet's again: reset leaves it.
    let out = node.cpusetd("reset", &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(node.read(&p, &id, lifted.0), quota("150000"));
    node.assert_clean();
}

#[test]
fn agent_cpu_limit_resize_v1() {
    cpu_limit_resize(CgroupVersion::V1);
}

#[test]
fn agent_cpu_limit_resize_v2() {
    cpu_limit_resize(CgroupVersion::V2);
}

/// Issue 23, item 24: an in-place resize keeps the cpus the container was given first: 4 → 6
/// adds two, 6 → 4 (after a restart of the agent, from its checkpoint) gives back exactly those
/// two, and 6 → 2 keeps a whole core of the original on its NUMA node (node 0 = 0-3,8-11).
#[test]
fn agent_resizes_give_back_what_they_added_across_a_restart() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let a = guaranteed("a", 4000);
    let id = node.fake.start_pod(&a).unwrap().remove(0);
    node.wait_cpus(&id, "1-2,9-10");
    let b = guaranteed("b", 2000);
    let b_id = node.fake.start_pod(&b).unwrap().remove(0);
    node.wait_cpus(&b_id, "3,11");

    resize(&node, &a, &id, 6000);
    node.wait_cpus(&id, "1-2,4,8-10");
    agent.wait_for_log("resized in place from cpus=1-2,9-10 to cpus=1-2,4,8-10 (added 4,8)");
    assert!(agent.stop().success());

    let mut agent = node.start_agent(&[]);
    node.wait_cpus(&id, "1-2,4,8-10");
    resize(&node, &a, &id, 4000);
    node.wait_cpus(&id, "1-2,9-10");
    resize(&node, &a, &id, 6000);
    node.wait_cpus(&id, "1-2,4,8-10");
    resize(&node, &a, &id, 2000);
    let status = node.wait_cpus(&id, "1,9");
    assert_eq!(
        status.by_id(&b_id).unwrap().current.as_deref(),
        Some("3,11")
    );
    assert!(agent.stop().success());
    node.assert_clean();
}

/// A Guaranteed 2-CPU pod with a sidecar and a BestEffort pod, pinned; returns the ids.
fn pinned_pods(node: &TestNode) -> (PodSpec, Vec<String>, PodSpec, String) {
    let db = pod(
        "db",
        Qos::Guaranteed,
        vec![
            ContainerSpec::guaranteed("db", 2000),
            ContainerSpec::guaranteed("sidecar", 500),
        ],
    );
    let ids = node.fake.start_pod(&db).unwrap();
    let be = best_effort("be");
    let be_id = node.fake.start_pod(&be).unwrap().remove(0);
    node.wait_cpus(&ids[0], "1,9");
    node.wait_cpus(&be_id, "0,2-8,10-15");
    (db, ids, be, be_id)
}

fn sets(status: &Status) -> Vec<(String, Option<String>, bool)> {
    let mut rows: Vec<_> = status
        .containers
        .iter()
        .map(|r| (r.path.clone(), r.current.clone(), r.exclusive))
        .collect();
    rows.sort();
    rows
}

#[test]
fn agent_restart_adopts_its_pins() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut first = node.start_agent(&[]);
    let (_db, ids, _be, _be_id) = pinned_pods(&node);
    let before = node.wait_cpus(&ids[0], "1,9");
    assert!(first.stop().success());

    let mut second = node.start_agent(&[]);
    let after = node.wait_cpus(&ids[0], "1,9");
    assert_eq!(sets(&after), sets(&before));
    assert_eq!(after.shared_pool, before.shared_pool);
    assert!(
        second.log_lines("allocated cpus=").is_empty(),
        "{}",
        second.log()
    );
    assert_eq!(node.metric("cpusetd_pinning_requests_total"), 0.0);
    assert!(
        second
            .log()
            .contains("first pass: 3 containers, 1 exclusive, 0 writes"),
        "{}",
        second.log()
    );
    assert!(second.stop().success());
    node.assert_clean();
}

#[test]
fn agent_starts_from_the_live_tree_when_its_checkpoint_is_corrupt() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut first = node.start_agent(&[]);
    let (_db, ids, _be, _be_id) = pinned_pods(&node);
    let before = node.wait_cpus(&ids[0], "1,9");
    assert!(first.stop().success());

    fs::write(node.checkpoint(), b"{\"version\": 1, garbage").unwrap();
    let mut second = node.start_agent(&[]);
    let log = second.log();
    assert!(log.contains("is unusable"), "{log}");
    assert!(log.contains("starting from the live tree"), "{log}");
    assert!(log.contains("adopted cpus=1,9"), "{log}");
    let quarantined: Vec<String> = fs::read_dir(node.state_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("state.json.corrupt-") && !n.ends_with(".reason"))
        .collect();
    assert_eq!(quarantined.len(), 1, "{quarantined:?}");
    let kept = fs::read(node.state_dir().join(&quarantined[0])).unwrap();
    assert_eq!(kept, b"{\"version\": 1, garbage");
    let after = node.wait_cpus(&ids[0], "1,9");
    assert_eq!(sets(&after), sets(&before));
    assert!(second.stop().success());
    node.assert_clean();
}

#[test]
fn agent_stops_on_sigterm_with_a_fresh_checkpoint() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let (_db, ids, _be, _be_id) = pinned_pods(&node);
    fs::remove_file(node.checkpoint()).unwrap();

    agent.signal(Signal::SIGTERM);
    let status = agent
        .wait_exit(DEADLINE)
        .expect("stopped within the deadline");
    assert_eq!(status.code(), Some(0), "{}", agent.log());
    assert!(agent
        .log()
        .contains("SIGTERM: writing the checkpoint and stopping"));
    let checkpoint = match cpusetd::checkpoint::load(&node.state_dir()) {
        cpusetd::checkpoint::LoadOutcome::Loaded(cp) => cp,
        other => panic!("no usable checkpoint after SIGTERM: {other:?}"),
    };
    assert_eq!(checkpoint.assignments.exclusive_cpus().to_string(), "1,9");
    assert_eq!(checkpoint.shared_pool.to_string(), "0,2-8,10-15");
    // The container's quota and its pod's (kubelet's DisableCPUQuotaWithExclusiveCPUs), in
    // the quota effect's saved state.
    let lifted = checkpoint.effects["quota"].as_array().unwrap();
    assert_eq!(lifted.len(), 2, "{lifted:?}");
    let cgroup = |q: &serde_json::Value| q["cgroup"].as_str().unwrap().to_string();
    assert!(lifted.iter().any(|q| cgroup(q).ends_with(&ids[0])));
    assert!(lifted.iter().any(|q| cgroup(q).ends_with(&_db.uid)));
    // `status` reads it: the pins are there.
    let status = node.status().expect("status after stop");
    assert!(status.has(&ids[0], "1,9"));
    node.assert_clean();
}

#[test]
fn agent_refuses_a_second_agent_on_the_same_state_dir() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let mut second = node.spawn_agent(&[]);
    let status = second.wait_exit(DEADLINE).expect("the second agent exits");
    assert!(!status.success());
    let log = second.log();
    assert!(
        log.contains(&format!("another cpusetd (pid {}) holds", agent.pid())),
        "{log}"
    );
    // The first one is unharmed.
    let p = guaranteed("g", 1000);
    let id = node.fake.start_pod(&p).unwrap().remove(0);
    node.wait_cpus(&id, "8");
    assert!(agent.stop().success());
    node.assert_clean();
}

#[test]
fn agent_reconciles_on_sighup() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&["--cpu-manager-reconcile-period", "1h"]);
    let last = |s: &Status| s.last_reconcile_unix_ms;
    let before =
        last(&node.wait_status("a first reconcile", |s| s.last_reconcile_unix_ms.is_some()));
    agent.signal(Signal::SIGHUP);
    agent.wait_for_log("SIGHUP: reconciling now");
    node.wait_status("a reconcile after SIGHUP", |s| last(s) > before);
    assert!(agent.stop().success());
    node.assert_clean();
}

#[test]
fn agent_configuration_errors_exit_78() {
    let node = TestNode::new(CgroupVersion::V1);
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cpusetd"))
            .arg("run")
            .args(node.tree_args())
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let cases: [(&[&str], &str); 6] = [
        (&[], "needs reserved cpus"),
        (
            &[
                "--reserved-cpus",
                "0",
                "--cpu-manager-reconcile-period",
                "10x",
            ],
            "cpu-manager-reconcile-period",
        ),
        (
            &[
                "--reserved-cpus",
                "0",
                "--cpu-manager-reconcile-period",
                "0s",
            ],
            "cpu-manager-reconcile-period",
        ),
        (&["--reserved-cpus", "16"], "--reserved-cpus"),
        // Past every bound (issue 17, item 10): an error, not a panic (exit 101).
        (
            &[
                "--reserved-cpus",
                "0",
                "--cpu-manager-reconcile-period",
                "18446744073709551616s",
            ],
            "cpu-manager-reconcile-period",
        ),
        // A configuration error is reported at once even while kubepods is missing.
        (&["--kubepods-path", "nowhere"], "needs reserved cpus"),
    ];
    for (args, message) in cases {
        let (code, stderr) = run(args);
        assert_eq!(code, Some(78), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
    assert!(!node.checkpoint().exists());
}

/// After a reboot the agent starts before kubelet has made the kubepods cgroup (issue 17,
/// item 8): it waits (saying so), starts once kubepods appears and pins; SIGTERM while waiting
/// is a clean stop.
#[test]
fn agent_waits_for_a_kubepods_cgroup_kubelet_has_not_made_yet() {
    let node = TestNode::new(CgroupVersion::V1);
    let root = node.fake.cgroup_root().to_path_buf();
    let controllers: Vec<PathBuf> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("kubepods").is_dir())
        .collect();
    assert!(controllers.len() >= 2, "{controllers:?}");
    let hide = |from: &str, to: &str| {
        // The cpu hierarchy first, the cpuset one last: the agent wakes on the latter.
        for dir in controllers.iter().rev() {
            fs::rename(dir.join(from), dir.join(to)).unwrap();
        }
    };
    hide("kubepods", "kubepods-later");

    // SIGTERM while waiting: exit 0.
    let mut agent = node.spawn_agent(&[]);
    agent.wait_for_log("does not exist yet: waiting for kubelet");
    assert!(agent.stop().success(), "{}", agent.log());

    let mut agent = node.spawn_agent(&[]);
    agent.wait_for_log("does not exist yet: waiting for kubelet");
    assert!(
        agent.wait_exit(Duration::from_millis(300)).is_none(),
        "it exited"
    );
    hide("kubepods-later", "kubepods");
    agent.wait_for_log("first pass:");
    // Pinned as usual (pinned_pods waits for the exclusive and the shared sets).
    let (db, ids, _be, _be_id) = pinned_pods(&node);
    assert_eq!(node.cpus_of(&db, &ids[0]), "1,9");
    assert!(agent.stop().success());
}

/// A `NOTIFY_SOCKET` whose receiver never reads (issue 17, item 13): the agent neither stalls
/// nor ignores SIGTERM; it keeps pinning and stops at once.
#[test]
fn agent_never_blocks_on_a_notify_socket_nobody_drains() {
    let node = TestNode::new(CgroupVersion::V1);
    let socket = node.base.join("notify.sock");
    let _receiver = std::os::unix::net::UnixDatagram::bind(&socket).unwrap();
    let mut command = node.agent_command(&[]);
    command
        .env("NOTIFY_SOCKET", &socket)
        // A ping every 10 ms: the receiver's queue (ten datagrams) is full at once.
        .env("WATCHDOG_USEC", "20000");
    let log = node.base.join("agent-notify.log");
    let mut agent = AgentProcess::spawn(command, &log, node.refusals());
    agent.wait_for_log("first pass:");
    // The queue fills within a few pings; the agent then goes on without systemd.
    agent.wait_for_log("sd_notify: the receiver's queue is full");
    let (db, ids, _be, _be_id) = pinned_pods(&node);
    assert_eq!(node.cpus_of(&db, &ids[0]), "1,9");
    let exited = agent.stop_within(Duration::from_secs(5));
    let text = agent.log();
    assert!(exited.is_ok_and(|s| s.success()), "{exited:?}: {text}");
}

/// A container whose runtime config names another pod (issue 17, item 3): the cgroup path's
/// pod wins, so the two containers never share an exclusive cpu, nothing flaps, and the
/// disagreement is logged once.
#[test]
fn agent_trusts_the_cgroup_path_over_a_runtime_config_naming_another_pod() {
    let node = TestNode::new(CgroupVersion::V1);
    let victim = pod(
        "victim",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 1000)],
    );
    let forger = pod(
        "forger",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 1000)],
    );
    let victim_id = node.fake.start_pod(&victim).unwrap().remove(0);
    let forger_id = node.fake.start_pod(&forger).unwrap().remove(0);
    // The forger's config says it belongs to the victim's pod (same container name).
    let config_path = node
        .base
        .join("runtime")
        .join(&forger_id)
        .join("config.json");
    let config = fs::read_to_string(&config_path).unwrap();
    let forged = config.replace(&forger.uid, &victim.uid);
    assert_ne!(config, forged);
    fs::write(&config_path, forged).unwrap();

    let mut agent = node.start_agent(&[]);
    let status = node.wait_status("both placed", |s| {
        s.by_id(&victim_id).is_some() && s.by_id(&forger_id).is_some() && s.converged()
    });
    let (a, b) = (
        cpus(&node.cpus_of(&victim, &victim_id)),
        cpus(&node.cpus_of(&forger, &forger_id)),
    );
    assert!(
        a.is_disjoint(&b),
        "victim {a} and forger {b} share cpus: {status:?}"
    );
    assert_eq!(status.exclusive_cpu_count, 2, "{status:?}");
    // No flapping: a few reconcile periods later nothing was allocated again.
    let allocations = || agent.log_lines("allocated cpus=").len();
    let before = allocations();
    let ticks = |n: &TestNode| {
        n.metric("cpusetd_quiet_reconciles_total")
            + n.metric("cpusetd_reconciles_without_pass_total")
    };
    let start = ticks(&node);
    assert!(
        poll_until(DEADLINE, || (ticks(&node) >= start + 2.0).then_some(())).is_some(),
        "no reconcile ticks"
    );
    assert_eq!(allocations(), before, "{}", agent.log());
    assert_eq!(agent.log_lines("differs from").len(), 1, "{}", agent.log());
    assert!(agent.stop().success());
}

/// Names from runtime configs are printed, never obeyed (issue 17, item 24): a newline or an
/// escape sequence in a container name forges no `status` row and no log line; `--json` keeps
/// the name exactly.
#[test]
fn agent_hostile_names_forge_no_row_and_no_log_line() {
    let node = TestNode::new(CgroupVersion::V1);
    let hostile = "app\nforged-pod  forged  Guaranteed  1  5  5  exclusive\u{1b}[2J";
    let db = pod(
        "db",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed(hostile, 1000)],
    );
    let mut agent = node.start_agent(&[]);
    let id = node.fake.start_pod(&db).unwrap().remove(0);
    let status = node.wait_status("pinned", |s| s.has(&id, "1") || s.converged());
    let row = status.by_id(&id).unwrap();
    assert_eq!(
        row.container.as_deref(),
        Some(hostile),
        "--json keeps the name exactly"
    );
    let table = node.cpusetd("status", &[]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success(), "{text}");
    assert!(!text.contains('\u{1b}'), "{text:?}");
    assert!(
        !text.lines().any(|l| l.starts_with("forged-pod")),
        "a forged row:\n{text}"
    );
    assert!(text.contains("app\\u{a}forged-pod"), "{text}");
    let log = agent.log();
    assert!(!log.contains('\u{1b}'), "{log:?}");
    assert!(!log.lines().any(|l| l.starts_with("forged-pod")), "{log}");
    assert!(agent.stop().success());
}

/// `--metrics-file` (issue 17, item 14): a directory or a file in the state directory is a
/// configuration error; a metrics directory that goes away is said once at WARN.
#[test]
fn agent_metrics_file_is_checked_and_its_failures_said() {
    let node = TestNode::new(CgroupVersion::V1);
    let state = node.state_dir();
    for (path, needle) in [
        (node.base.clone(), "is a directory"),
        (state.join("state.json"), "in the state directory"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cpusetd"))
            .arg("run")
            .args(node.tree_args())
            .args(["--reserved-cpus", "0", "--metrics-file"])
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{}: {stderr}", path.display());
        assert!(stderr.contains(needle), "{}: {stderr}", path.display());
    }
    let metrics = node.metrics_file();
    let mut agent = node.start_agent(&[]);
    assert!(poll_until(DEADLINE, || metrics.exists().then_some(())).is_some());
    // Something takes the metrics file's place that a rename cannot replace.
    fs::remove_file(&metrics).unwrap();
    fs::create_dir(&metrics).unwrap();
    fs::write(metrics.join("keep"), "").unwrap();
    for n in 0..3 {
        node.fake
            .start_pod(&best_effort(&format!("be{n}")))
            .unwrap();
    }
    agent.wait_for_log("cannot write metrics");
    node.wait_status("settled", |s| s.converged());
    assert_eq!(
        agent.log_lines("cannot write metrics").len(),
        1,
        "{}",
        agent.log()
    );
    assert!(agent.stop().success());
}

/// Issue 17, item 21: the pinning counters count containers, not passes: one SMT-misaligned
/// container is one request and one error however many pods arrive after it.
#[test]
fn agent_pinning_metrics_count_containers_not_passes() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&["--cpu-manager-policy-options", "full-pcpus-only=true"]);
    let odd = pod(
        "odd",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 1000)],
    );
    node.fake.start_pod(&odd).unwrap();
    agent.wait_for_log("SMT Alignment Error");
    for n in 0..5 {
        node.fake
            .start_pod(&best_effort(&format!("be{n}")))
            .unwrap();
    }
    let even = pod(
        "even",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 2000)],
    );
    let even_id = node.fake.start_pod(&even).unwrap().remove(0);
    node.wait_status("settled", |s| {
        s.by_id(&even_id).is_some_and(|r| r.exclusive) && s.converged()
    });
    let requests = poll_until(DEADLINE, || {
        let n = node.metric("cpusetd_pinning_requests_total");
        (n >= 2.0).then_some(n)
    });
    assert_eq!(requests, Some(2.0), "{}", agent.log());
    assert!(node.metric("cpusetd_passes_total") > 3.0);
    assert_eq!(node.metric("cpusetd_pinning_errors_total"), 1.0);

    // Issue 17, item 22: `status` (given the agent's flags) says why the container is shared.
    let flags = [
        "--reserved-cpus",
        "0",
        "--cpu-manager-policy-options",
        "full-pcpus-only=true",
    ];
    let table = node.cpusetd("status", &flags);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success(), "{text}");
    let row = text.lines().find(|l| l.contains("SMT Alignment Error"));
    assert!(row.is_some_and(|r| r.contains("shared:")), "{text}");
    // And the running agent logs what classification noticed, once: here a Guaranteed
    // container whose limit is not its request.
    let odd_limit = pod(
        "limits",
        Qos::Guaranteed,
        vec![ContainerSpec::burstable("app", 1000, Some(2000))],
    );
    node.fake.start_pod(&odd_limit).unwrap();
    agent.wait_for_log("has cpu limit");
    node.wait_status("settled", |s| s.converged());
    assert_eq!(agent.log_lines("has cpu limit").len(), 1, "{}", agent.log());
    assert!(agent.stop().success());
}

/// Issue 17, item 23: a foreign writer that keeps rewriting a pinned container's cpuset is
/// not fought silently at full speed: the fight is said once, counted, and the repairs back
/// off; once the writer stops, the pin comes back.
#[test]
fn agent_backs_off_from_a_foreign_writer_that_keeps_rewriting() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let (db, ids, _be, _be_id) = pinned_pods(&node);
    let file = node.fake.file(
        &format!("{}/{}", node.fake.pod_dir(&db), ids[0]),
        "cpuset.cpus",
    );
    let pod_file = file.parent().unwrap().parent().unwrap().join("cpuset.cpus");
    let repairs_before = node.metric("cpusetd_drift_repairs_total");
    // The fake kernel checks nesting: widen the pod first, as a real writer must.
    let started = Instant::now();
    let mut writes = 0u32;
    while started.elapsed() < Duration::from_secs(3) {
        let _ = fs::write(&pod_file, "0-15\n");
        if fs::write(&file, "0-15\n").is_ok() {
            writes += 1;
        }
    }
    assert!(writes > 200, "only {writes} foreign writes");
    agent.wait_for_log("changed by someone else more than");
    assert_eq!(
        agent.log_lines("changed by someone else more than").len(),
        1,
        "{}",
        agent.log()
    );
    let fights = poll_until(DEADLINE, || {
        let n = node.metric("cpusetd_drift_fights_total");
        (n >= 1.0).then_some(n)
    });
    assert_eq!(fights, Some(1.0));
    // The writer stopped: the pin is back within the longest backoff.
    node.wait_cpus(&ids[0], "1,9");
    let repairs = node.metric("cpusetd_drift_repairs_total") - repairs_before;
    println!("fight: {writes} foreign writes, {repairs} repairs");
    assert!(
        repairs < f64::from(writes) / 10.0 && repairs < 100.0,
        "{repairs} repairs for {writes} foreign writes"
    );
    assert!(agent.stop().success());
}

/// Issue 17, item 19: a CPU the kernel takes offline while the agent runs (the kernel drops it
/// from the root cpuset's effective cpus) is never written again: kubepods and the shared pool
/// lose it at the next reconcile, and get it back when it comes online.
#[test]
fn agent_never_writes_a_cpu_the_kernel_took_offline() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let (_db, _ids, be, be_id) = pinned_pods(&node);
    let root_effective = node.fake.cgroup_root().join("cpuset/cpuset.effective_cpus");
    let kubepods = node.fake.file("kubepods", "cpuset.cpus");
    fs::write(&root_effective, "0-14\n").unwrap();
    agent.wait_for_log("cpus 15 (offline, or held back by the parent) are not planned");
    node.wait_cpus(&be_id, "0,2-8,10-14");
    assert_eq!(fs::read_to_string(&kubepods).unwrap().trim(), "0-14");
    assert_eq!(node.cpus_of(&be, &be_id), "0,2-8,10-14");
    // Online again.
    fs::write(&root_effective, "0-15\n").unwrap();
    node.wait_cpus(&be_id, "0,2-8,10-15");
    assert_eq!(fs::read_to_string(&kubepods).unwrap().trim(), "0-15");
    assert!(agent.stop().success());
}

/// Issue 17, item 30: `--align-memory`, `--respect-isolcpus` and `strict-cpu-reservation`
/// through the running agent, asserted on the cpusets the containers end up with.
#[test]
fn agent_options_align_memory_respect_isolcpus_and_strict_reservation() {
    let isolated = cpus("2-3,10-11");
    let pods = |node: &TestNode| {
        let db = pod(
            "db",
            Qos::Guaranteed,
            vec![ContainerSpec::guaranteed("db", 4000)],
        );
        let db_id = node.fake.start_pod(&db).unwrap().remove(0);
        let be = best_effort("be");
        let be_id = node.fake.start_pod(&be).unwrap().remove(0);
        node.wait_status("settled", |s| {
            s.by_id(&db_id).is_some_and(|r| r.exclusive)
                && s.by_id(&be_id).is_some()
                && s.converged()
        });
        (db, db_id, be, be_id)
    };

    // --align-memory: the exclusive container's memory nodes are those of its cpus (NUMA 0
    // holds cores 0-3 on this machine); the shared one keeps every node.
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&["--align-memory"]);
    let (db, db_id, be, be_id) = pods(&node);
    assert_eq!(node.cpus_of(&db, &db_id), "1-2,9-10");
    assert_eq!(node.read(&db, &db_id, "cpuset.mems"), "0");
    assert_eq!(node.read(&be, &be_id, "cpuset.mems"), "0-1");
    assert!(agent.stop().success());

    // strict-cpu-reservation: no container runs on the reserved cpu 0.
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[
        "--cpu-manager-policy-options",
        "strict-cpu-reservation=true",
    ]);
    let (db, db_id, be, be_id) = pods(&node);
    assert_eq!(node.cpus_of(&db, &db_id), "1-2,9-10");
    assert_eq!(node.cpus_of(&be, &be_id), "3-8,11-15");
    assert!(agent.stop().success());

    // --respect-isolcpus with `isolcpus=2-3,10-11` on the command line: no pod gets them.
    let node = TestNode::new(CgroupVersion::V1);
    let proc = node.base.join("proc");
    fs::create_dir(&proc).unwrap();
    fs::write(proc.join("cmdline"), "ro isolcpus=2-3,10-11\n").unwrap();
    let mut agent =
        node.spawn_agent(&["--proc-root", proc.to_str().unwrap(), "--respect-isolcpus"]);
    agent.wait_for_log("first pass:");
    let (db, db_id, be, be_id) = pods(&node);
    let db_cpus = cpus(&node.cpus_of(&db, &db_id));
    let be_cpus = cpus(&node.cpus_of(&be, &be_id));
    assert_eq!(db_cpus.len(), 4);
    assert!(db_cpus.is_disjoint(&isolated), "{db_cpus}");
    assert!(be_cpus.is_disjoint(&isolated), "{be_cpus}");
    assert!(agent.stop().success());
}

/// Issue 17, item 29: a cgroup a container made itself (holding its container's set) is
/// narrowed with its container and widened back with it.
#[test]
fn agent_widens_a_containers_own_cgroup_back_with_it() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let be = best_effort("be");
    let be_id = node.fake.start_pod(&be).unwrap().remove(0);
    node.wait_cpus(&be_id, "0-15");
    // The container makes a sub-cgroup, as runc copies the parent's set into it.
    let container_dir = node
        .fake
        .file(
            &format!("{}/{be_id}", node.fake.pod_dir(&be)),
            "cpuset.cpus",
        )
        .parent()
        .unwrap()
        .to_path_buf();
    let sub = container_dir.join("sub");
    fs::create_dir(&sub).unwrap();
    for file in ["cpuset.mems", "cpuset.cpus"] {
        let value = fs::read_to_string(container_dir.join(file)).unwrap();
        fs::write(sub.join(file), value).unwrap();
    }
    fs::write(sub.join("cgroup.procs"), "").unwrap();
    let sub_cpus = || {
        fs::read_to_string(sub.join("cpuset.cpus"))
            .unwrap()
            .trim()
            .to_string()
    };
    // A Guaranteed pod takes cpus 1,9: the sub-cgroup is narrowed with its container.
    let db = pod(
        "db",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("db", 2000)],
    );
    node.fake.start_pod(&db).unwrap();
    node.wait_cpus(&be_id, "0,2-8,10-15");
    assert!(
        poll_until(DEADLINE, || (sub_cpus() == "0,2-8,10-15").then_some(())).is_some(),
        "{}",
        sub_cpus()
    );
    // The pod goes: the container and its sub-cgroup get every cpu back.
    node.fake.remove_pod(&db).unwrap();
    node.wait_cpus(&be_id, "0-15");
    assert!(
        poll_until(DEADLINE, || (sub_cpus() == "0-15").then_some(())).is_some(),
        "the sub-cgroup stayed at {}",
        sub_cpus()
    );
    assert!(agent.stop().success());
}

/// Issue 23, item 2: a container's own child cgroup, left empty (v1 without
/// `cgroup.clone_children`) and owned by another user, which the agent (run as the shipped
/// unit runs it: root without capabilities) cannot write. The kernel narrows a parent past an
/// empty child: the container is narrowed, and the child is named once, with the errno, and
/// counted in `cpusetd_narrowings_blocked_total`.
#[test]
fn agent_narrows_a_container_past_an_empty_child_it_cannot_write() {
    if !nix::unistd::Uid::effective().is_root() {
        println!("skipped: chown needs root");
        return;
    }
    if std::process::Command::new("setpriv")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("skipped: setpriv (util-linux) is missing");
        return;
    }
    let node = TestNode::new(CgroupVersion::V1);
    let command = node.agent_command(&[]);
    let mut without_capabilities = std::process::Command::new("setpriv");
    without_capabilities
        .args(["--bounding-set", "-all", "--inh-caps", "-all", "--"])
        .arg(command.get_program())
        .args(command.get_args());
    for (key, value) in command.get_envs() {
        if let Some(value) = value {
            without_capabilities.env(key, value);
        }
    }
    let mut agent = AgentProcess::spawn(
        without_capabilities,
        &node.base.join("agent.log"),
        node.refusals(),
    );
    agent.wait_for_log("first pass:");
    let burstable = pod(
        "web",
        Qos::Burstable,
        vec![ContainerSpec::burstable("web", 500, None)],
    );
    let id = node.fake.start_pod(&burstable).unwrap().remove(0);
    node.wait_cpus(&id, "0-15");
    let container_dir = node
        .fake
        .file(
            &format!("{}/{id}", node.fake.pod_dir(&burstable)),
            "cpuset.cpus",
        )
        .parent()
        .unwrap()
        .to_path_buf();
    let sub = container_dir.join("sub");
    fs::create_dir(&sub).unwrap();
    for file in ["cpuset.cpus", "cpuset.mems", "cgroup.procs"] {
        fs::write(sub.join(file), "\n").unwrap();
    }
    for path in [&sub, &sub.join("cpuset.cpus"), &sub.join("cpuset.mems")] {
        nix::unistd::chown(path, Some(nix::unistd::Uid::from_raw(4242)), None).unwrap();
    }
    let db = pod(
        "db",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("db", 2000)],
    );
    node.fake.start_pod(&db).unwrap();
    // Everything as the agent wants it but the child it cannot write (`status` marks it).
    node.wait_status("the container narrowed past its empty child", |s| {
        s.has(&id, "0,2-8,10-15")
            && s.containers
                .iter()
                .filter(|r| r.current != r.desired)
                .all(|r| r.path.ends_with("/sub"))
    });
    agent.wait_for_log("Permission denied");
    let said = agent.log_lines("/sub");
    assert_eq!(said.len(), 1, "{}", agent.log());
    assert!(
        said[0].contains("Permission denied") && said[0].contains("is empty"),
        "{}",
        said[0]
    );
    let blocked = poll_until(DEADLINE, || {
        let text = fs::read_to_string(node.metrics_file()).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("cpusetd_narrowings_blocked_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|v| *v >= 1.0)
    });
    assert!(blocked.is_some(), "{}", agent.log());
    assert_eq!(fs::read_to_string(sub.join("cpuset.cpus")).unwrap(), "\n");
    assert!(agent.stop().success());
}

/// Issue 17, item 18 (b): a reserved-cpu or policy-option change at a restart keeps the
/// running pins that stay valid.
#[test]
fn agent_restart_with_other_reserved_cpus_or_options_keeps_valid_pins() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let (db, ids, _be, _be_id) = pinned_pods(&node);
    assert!(agent.stop().success());
    // CPU 8 (cpu 0's sibling) reserved too, and an option: the pin on 1,9 still fits.
    let mut restarted = node.spawn_agent(&[
        "--reserved-cpus",
        "0,8",
        "--cpu-manager-policy-options",
        "full-pcpus-only=true",
    ]);
    restarted.wait_for_log("first pass:");
    node.wait_status("converged", |s| s.converged());
    assert_eq!(node.cpus_of(&db, &ids[0]), "1,9", "{}", restarted.log());
    assert!(
        restarted.log_lines("allocated cpus=").is_empty(),
        "{}",
        restarted.log()
    );
    assert!(restarted.stop().success());
}

#[test]
fn agent_status_marks_what_differs() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let (db, ids, _be, _be_id) = pinned_pods(&node);
    let table = node.cpusetd("status", &[]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success(), "{text}");
    assert!(
        text.contains("CURRENT") && text.contains("DESIRED"),
        "{text}"
    );
    assert!(!text.contains('*'), "{text}");
    assert!(agent.stop().success());

    // With the agent stopped, a foreign write stays: status shows it.
    node.write(&db, "", "cpuset.cpus", "0-15");
    node.write(&db, &ids[0], "cpuset.cpus", "0-15");
    let status = node.status().unwrap();
    assert_eq!(status.differing, 1, "{status:#?}");
    let row = status.by_id(&ids[0]).unwrap();
    assert_eq!(row.current.as_deref(), Some("0-15"));
    assert_eq!(row.desired.as_deref(), Some("1,9"));
    let table = node.cpusetd("status", &[]);
    let text = String::from_utf8_lossy(&table.stdout);
    let marked: Vec<&str> = text.lines().filter(|l| l.contains("*  ")).collect();
    assert_eq!(marked.len(), 1, "{text}");
    assert!(
        marked[0].contains("db") && marked[0].contains("0-15*") && marked[0].contains("1,9"),
        "{text}"
    );
    assert!(text.contains("1 cgroup(s) marked * differ"), "{text}");
    node.assert_clean();
}

#[test]
fn agent_reset_widens_everything_and_restores_quotas() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let (db, ids, _be, _be_id) = pinned_pods(&node);
    assert_eq!(node.read(&db, &ids[0], "cpu.cfs_quota_us"), "-1");

    // Refused while the agent runs.
    let out = node.cpusetd("reset", &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("stop cpusetd before reset"), "{stderr}");
    assert!(node.checkpoint().exists());
    assert_eq!(node.cpus_of(&db, &ids[0]), "1,9");

    assert!(agent.stop().success());
    let out = node.cpusetd("reset", &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (dir, set) in every_cpuset(&node) {
        assert_eq!(set, "0-15", "{dir}");
    }
    assert_eq!(node.read(&db, &ids[0], "cpu.cfs_quota_us"), "200000");
    assert_eq!(node.read(&db, &ids[1], "cpu.cfs_quota_us"), "50000");
    assert!(!node.checkpoint().exists());
    node.assert_clean();
}

/// Polls `probe` for as long as the agent works: `None` once its threads have had no CPU time
/// for `IDLE` while `probe` still fails (it has stopped short of what `probe` waits for), or
/// after `CEILING` in all (it works on without getting there). A loaded machine slows the agent
/// down; it does not make it idle for seconds, so this holds under load where a fixed time
/// does not.
fn while_working<T>(agent: &AgentProcess, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    const IDLE: Duration = Duration::from_secs(10);
    const CEILING: Duration = Duration::from_secs(600);
    let cpu_ns = || -> u64 {
        let Ok(tasks) = fs::read_dir(format!("/proc/{}/task", agent.pid())) else {
            return 0;
        };
        tasks
            .flatten()
            .filter_map(|t| fs::read_to_string(t.path().join("schedstat")).ok())
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    };
    let started = Instant::now();
    let (mut last_cpu, mut last_progress) = (cpu_ns(), Instant::now());
    while started.elapsed() < CEILING {
        if let Some(found) = probe() {
            return Some(found);
        }
        let now_cpu = cpu_ns();
        if now_cpu != last_cpu {
            (last_cpu, last_progress) = (now_cpu, Instant::now());
        } else if last_progress.elapsed() >= IDLE {
            println!("the agent has been idle for {IDLE:?}");
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn agent_converges_after_an_inotify_queue_overflow() {
    let max_queued: usize = fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(16_384);
    if max_queued > 60_000 {
        println!(
            "skipped: fs.inotify.max_queued_events is {max_queued}, too many directories to create"
        );
        return;
    }
    let node = TestNode::new(CgroupVersion::V1);
    // No reconcile ticks: the rescan is the watcher's doing.
    let mut agent = node.start_agent(&["--cpu-manager-reconcile-period", "1h"]);
    let early = guaranteed("early", 1000);
    let early_id = node.fake.start_pod(&early).unwrap().remove(0);
    node.wait_cpus(&early_id, "8");

    // A BestEffort pod fills with container directories while the agent is stopped, so the
    // kernel's event queue must overflow.
    let crowded = best_effort("crowded");
    node.fake.start_pod(&crowded).unwrap();
    node.wait_status("the crowded pod seen", |s| {
        s.converged()
            && s.containers
                .iter()
                .any(|r| r.pod_uid.as_deref() == Some(crowded.uid.as_str()))
    });
    let pod_dir = node.fake.file(&node.fake.pod_dir(&crowded), "cpuset.cpus");
    let pod_dir = pod_dir.parent().unwrap();
    let count = (max_queued + 4_000).max(20_000);
    agent.signal(Signal::SIGSTOP);
    let started = Instant::now();
    let flood: std::io::Result<()> =
        (0..count).try_for_each(|_| fs::create_dir(pod_dir.join(new_container_id("flood"))));
    let took = started.elapsed();
    agent.signal(Signal::SIGCONT);
    flood.unwrap();
    println!("{count} directories created in {took:?}");

    // A debug build takes seconds to scan 20,000 cgroups, a loaded machine many more: each
    // wait below lasts while the agent works (see `while_working`), not a fixed time.
    let rescanning = while_working(&agent, || {
        agent
            .log()
            .contains("rescanning the whole tree")
            .then_some(())
    });
    assert!(rescanning.is_some(), "no rescan: {}", agent.log());
    let late = guaranteed("late", 2000);
    let started = Instant::now();
    let late_id = node.fake.start_pod(&late).unwrap().remove(0);
    // Files, not `status`: a debug build's `status` takes seconds to scan 20,000 cgroups.
    let pinned = while_working(&agent, || {
        (node.cpus_of(&late, &late_id) == "1,9").then_some(())
    });
    assert!(pinned.is_some(), "late: {}", node.cpus_of(&late, &late_id));
    println!(
        "a pod created after the flood pinned in {:?}",
        started.elapsed()
    );
    assert_eq!(node.cpus_of(&early, &early_id), "8");
    let rescans = while_working(&agent, || {
        Some(node.metric("cpusetd_rescans_total")).filter(|n| *n >= 1.0)
    });
    assert!(rescans.is_some(), "{:?}", node.metrics());
    // The shared pool's rewrites may follow the pin a moment later (held back while new
    // cgroups arrive): converged before the agent goes idle.
    let mut differing = Vec::new();
    let converged = while_working(&agent, || {
        let status = node.status().unwrap();
        differing = status
            .containers
            .into_iter()
            .filter(|r| r.desired.is_some() && r.current != r.desired)
            .collect();
        differing.is_empty().then_some(())
    });
    assert!(converged.is_some(), "{differing:#?}");
    assert!(agent.stop().success());
    node.assert_clean();
}

/// Event → pin latency on the fake tree (printed, not asserted): 20 rounds of 5 Guaranteed
/// 1-CPU pods and 5 BestEffort pods started back to back, each round waited for and deleted.
#[test]
fn agent_event_to_pin_latency_on_a_fake_tree() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&["--cpu-manager-reconcile-period", "1h"]);
    let rounds = 20;
    for round in 0..rounds {
        let pods: Vec<PodSpec> = (0..10)
            .map(|i| {
                if i % 2 == 0 {
                    guaranteed(&format!("g{round}-{i}"), 1000)
                } else {
                    best_effort(&format!("be{round}-{i}"))
                }
            })
            .collect();
        for p in &pods {
            node.fake.start_pod(p).unwrap();
        }
        // The agent's own count: each container is counted once, when its set is final.
        let counted = (round + 1) as f64 * 10.0;
        let pinned = poll_until(DEADLINE, || {
            Some(node.metric("cpusetd_event_to_pin_seconds_count")).filter(|n| *n >= counted)
        });
        assert!(pinned.is_some(), "round {round}: {:?}", node.metrics());
        node.wait_status(&format!("round {round} converged"), |s| {
            s.converged() && s.exclusive_cpus == "1-2,8-10"
        });
        for p in &pods {
            node.fake.remove_pod(p).unwrap();
        }
        node.wait_status(&format!("round {round} gone"), |s| {
            s.containers.is_empty() && s.exclusive_cpu_count == 0
        });
    }
    println!(
        "event-to-pin latency, fake tree ({}): {}",
        crate::agent_util::build(),
        pin_latency(&node.metrics())
    );
    assert_eq!(node.metric("cpusetd_pinning_requests_total"), 100.0);
    assert!(agent.stop().success());
    node.assert_clean();
}

/// `status` names pods the way an operator does (`namespace/pod`, the sandbox as `POD`, from
/// the runtime's annotations); `--wide` adds the UID and container id; the log names them too.
#[test]
fn status_and_log_name_pods_and_containers() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let db = guaranteed("db", 2000);
    let id = node.fake.start_pod(&db).unwrap().remove(0);
    node.wait_cpus(&id, "1,9");

    let out = node.cpusetd("status", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip_while(|l| !l.starts_with("POD"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0][..2], ["POD", "CONTAINER"], "{table}");
    assert!(
        rows.iter().any(|r| r[..2] == ["default/db", "POD"]),
        "the sandbox is POD: {table}"
    );
    assert!(
        rows.iter()
            .any(|r| r[..2] == ["default/db", "db"] && r.contains(&"exclusive")),
        "{table}"
    );
    assert!(
        !table.contains(&db.uid),
        "the UID only with --wide: {table}"
    );

    let wide = stdout(&node.cpusetd("status", &["--wide"]));
    let line = wide
        .lines()
        .find(|l| l.contains(&id))
        .unwrap_or_else(|| panic!("no row with the full container id: {wide}"));
    assert!(line.contains(&db.uid), "{line}");
    assert!(
        wide.lines()
            .any(|l| l.starts_with("POD") && l.contains("POD UID")),
        "{wide}"
    );

    // The map: the pinned core under its key, CPU 0 reserved, the legend naming the owner.
    let out = node.cpusetd("status", &["--map"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let map = stdout(&out);
    assert!(
        map.contains("socket 0 · NUMA node 0 · L3 0 · cpus 0-3,8-11"),
        "{map}"
    );
    assert!(map.contains("  [ 0R  8·] [ 1a  9a] [ 2· 10·]"), "{map}");
    assert!(map.contains("\na  default/db/db  cpus 1,9\n"), "{map}");
    assert!(!map.contains('\x1b'), "no colour into a pipe: {map}");
    let out = node.cpusetd("status", &["--map", "--json"]);
    assert_eq!(out.status.code(), Some(2), "--map and --json conflict");

    let row = node.status().unwrap();
    let row = row.by_id(&id).unwrap();
    assert_eq!(
        (row.pod_name.as_deref(), row.namespace.as_deref()),
        (Some("db"), Some("default"))
    );
    let line = format!("default/db/db (pod{}/db): allocated cpus=1,9", db.uid);
    assert_eq!(agent.log_lines(&line).len(), 1, "{}", agent.log());
    assert!(agent.stop().success());
    node.assert_clean();
}

/// `cpusetd health` (the DaemonSet's liveness probe) from the agent's own state: no agent, a
/// running one, a stale one, one killed without clearing its lock.
#[test]
fn health_says_whether_an_agent_runs_and_reconciles() {
    let node = TestNode::new(CgroupVersion::V1);
    let health = |extra: &[&str]| {
        let out = node.cpusetd("health", extra);
        (out.status.code(), stdout(&out), stderr(&out))
    };
    let (code, _, err) = health(&[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("unhealthy: no agent holds"), "{err}");

    let agent = node.start_agent(&[]);
    let (code, out, err) = health(&[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with(&format!("healthy: pid {}, last reconcile", agent.pid())),
        "{out}"
    );
    std::thread::sleep(Duration::from_millis(1100));
    let (code, _, err) = health(&["--max-age", "10ms"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("last reconciled"), "{err}");

    agent.signal(Signal::SIGKILL);
    let gone = poll_until(DEADLINE, || {
        let (code, _, err) = health(&[]);
        (code == Some(1) && err.contains("is gone")).then_some(())
    });
    assert!(gone.is_some(), "{:?}", health(&[]));
}

/// Issue 23, item 26: under `full-pcpus-only` a pod with one even and one odd container is one
/// kubelet rejects at admission (SMTAlignmentError): no container of it is pinned, the reason
/// is said once for the pod (log, `status` NOTE, `cpusetd_pods_rejected`), and a restart keeps
/// it so. Before, the even container was pinned and the odd one shared.
#[test]
fn agent_a_pod_kubelet_would_reject_gets_no_exclusive_cpus() {
    let node = TestNode::new(CgroupVersion::V1);
    let flags = ["--cpu-manager-policy-options", "full-pcpus-only=true"];
    let mut agent = node.start_agent(&flags);
    let mixed = pod(
        "mixed",
        Qos::Guaranteed,
        vec![
            ContainerSpec::guaranteed("even", 2000),
            ContainerSpec::guaranteed("odd", 1000),
        ],
    );
    let ids = node.fake.start_pod(&mixed).unwrap();
    let rejected = "cpusetd_pods_rejected{reason=\"SMTAlignmentError\"}";
    let settled = |node: &TestNode| {
        node.wait_status("the mixed pod settled, shared", |s| {
            s.converged()
                && ids.iter().all(|id| {
                    s.by_id(id)
                        .is_some_and(|r| !r.exclusive && !r.note.contains("not given yet"))
                })
        })
    };
    let status = settled(&node);
    for id in &ids {
        let row = status.by_id(id).unwrap();
        assert!(!row.exclusive, "{row:?}");
        assert!(
            row.note
                .contains("pod rejected as kubelet would reject it (SMTAlignmentError")
                && row
                    .note
                    .contains("requested 1 cpus not multiple cpus per core = 2"),
            "{row:?}"
        );
        assert_eq!(node.cpus_of(&mixed, id), "0-15");
    }
    assert!(
        poll_until(DEADLINE, || (node.metric(rejected) == 1.0).then_some(())).is_some(),
        "{:?}",
        node.metrics()
    );
    // More passes (another pod pinned beside it): the reason is said once.
    let other = guaranteed("other", 2000);
    let other_id = node.fake.start_pod(&other).unwrap().remove(0);
    node.wait_cpus(&other_id, "1,9");
    assert_eq!(agent.log_lines("pod rejected").len(), 1, "{}", agent.log());
    assert!(agent.stop().success());

    // A restarted agent keeps it so.
    let mut agent = node.start_agent(&flags);
    settled(&node);
    node.wait_cpus(&other_id, "1,9");
    assert!(
        poll_until(DEADLINE, || (node.metric(rejected) == 1.0).then_some(())).is_some(),
        "{:?}",
        node.metrics()
    );
    node.fake.remove_pod(&mixed).unwrap();
    assert!(
        poll_until(DEADLINE, || (node.metric(rejected) == 0.0).then_some(())).is_some(),
        "{:?}",
        node.metrics()
    );
    assert!(agent.stop().success());
    node.assert_clean();
}

/// Issue 23, item 25: `--respect-isolcpus` under policy `none`: the shared pool leaves the
/// isolated cpus alone, so every container's cpuset (and every pod's) excludes them; without
/// the flag `none` writes nothing.
#[test]
fn agent_policy_none_keeps_pods_off_isolated_cpus() {
    let node = TestNode::new(CgroupVersion::V1);
    let proc = node.base.join("proc");
    fs::create_dir(&proc).unwrap();
    fs::write(proc.join("cmdline"), "ro isolcpus=2-3,10-11\n").unwrap();
    let mut agent = node.spawn_agent(&[
        "--proc-root",
        proc.to_str().unwrap(),
        "--respect-isolcpus",
        "--cpu-manager-policy",
        "none",
    ]);
    agent.wait_for_log("first pass:");
    let db = guaranteed("db", 4000);
    let db_id = node.fake.start_pod(&db).unwrap().remove(0);
    let be = best_effort("be");
    let be_id = node.fake.start_pod(&be).unwrap().remove(0);
    let off_isolated = "0-1,4-9,12-15";
    let done = poll_until(DEADLINE, || {
        (node.cpus_of(&db, &db_id) == off_isolated
            && node.cpus_of(&be, &be_id) == off_isolated
            && node.read(&db, "", "cpuset.cpus") == off_isolated)
            .then_some(())
    });
    assert!(
        done.is_some(),
        "db {} be {}: {}",
        node.cpus_of(&db, &db_id),
        node.cpus_of(&be, &be_id),
        agent.log()
    );
    assert!(agent.stop().success());
    node.assert_clean();
}

/// A pod deleted while the agent was down (issue 23, item 21): its release after the restart
/// is logged with the pod's namespace/name from the checkpoint, as while the agent ran, not
/// as `pod<uid>/app` alone.
#[test]
fn agent_names_the_pods_it_releases_after_a_restart() {
    let node = TestNode::new(CgroupVersion::V1);
    let gone = pod(
        "gone-while-down",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 1000)],
    );
    let mut agent = node.start_agent(&[]);
    let id = node.fake.start_pod(&gone).unwrap().remove(0);
    node.wait_status("pinned", |s| s.has(&id, "8") && s.converged());
    assert!(agent.stop().success());
    node.fake.remove_pod(&gone).unwrap();

    let mut again = node.start_agent(&[]);
    again.wait_for_log("released cpus=");
    let released = crate::agent_process::lines_with(&again.log(), "released cpus=");
    let expected = format!(
        "default/gone-while-down/app (pod{}/app): released cpus=8",
        gone.uid
    );
    assert!(
        released.iter().any(|l| l.contains(&expected)),
        "{expected}\n{released:#?}"
    );
    assert!(again.stop().success());
}
