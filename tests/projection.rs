//! What the workload sees and asks for (issue 27, items 1 and 4): `cpu-shared.crio.io/<name>`
//! (a container on its exclusive CPUs and the shared pool, kept current as the pool changes)
//! and the projection files (`cpusetd.io/projection`, `--project-all`).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use inotify::{EventMask, Inotify, WatchMask};

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::kubesim::{ContainerSpec, Qos};

use crate::agent_util::{cpus, guaranteed, pod, poll_until, wait_status_of, TestNode, DEADLINE};

fn cpu_shared_follows_the_pool(version: CgroupVersion) {
    let node = TestNode::new(version);
    let mut agent = node.start_agent(&[]);
    let fast = pod(
        "fast",
        Qos::Guaranteed,
        vec![
            ContainerSpec::guaranteed("dp", 1000),
            ContainerSpec::guaranteed("ctl", 1000),
        ],
    );
    node.fake.annotate_pod(
        &fast.uid,
        &[
            ("cpu-shared.crio.io/dp", "enable"),
            ("cpu-shared.crio.io/ctl", "maybe"),
        ],
    );
    let ids = node.fake.start_pod(&fast).unwrap();
    let (dp, ctl) = (ids[0].clone(), ids[1].clone());
    let held = |s: &crate::agent_util::Status, id: &str| {
        let row = s.by_id(id)?;
        Some(cpus(s.exclusive_cpus.as_str()).intersection(&cpus(row.current.as_deref()?)))
    };
    let status = node.wait_status("dp on its cpus and the pool", |s| {
        s.converged() && s.exclusive_cpu_count == 2 && s.by_id(&dp).is_some()
    });
    let pool = cpus(&status.shared_pool);
    let ctl_set = cpus(status.by_id(&ctl).unwrap().current.as_deref().unwrap());
    assert_eq!(ctl_set.len(), 1, "an odd value leaves ctl on its own cpu");
    let dp_own = held(&status, &dp).unwrap();
    assert_eq!(dp_own.len(), 1, "{status:?}");
    assert_eq!(
        status.by_id(&dp).unwrap().current.as_deref().map(cpus),
        Some(dp_own.union(&pool)),
        "{status:?}"
    );
    assert!(
        status.by_id(&dp).unwrap().note.contains("cpu-shared"),
        "{status:?}"
    );
    // In force as read back: in `status --json`'s isolation array and counted in the metrics;
    // not for ctl, whose value was odd.
    assert_eq!(status.by_id(&dp).unwrap().isolation, ["cpu-shared"]);
    assert!(status.by_id(&ctl).unwrap().isolation.is_empty());
    let counted = poll_until(DEADLINE, || {
        (node.metric("cpusetd_cpu_shared_containers") == 1.0).then_some(())
    });
    assert!(counted.is_some(), "{:?}", node.metrics());
    assert_eq!(
        agent
            .log_lines("annotation cpu-shared.crio.io/ctl: \"maybe\" ignored")
            .len(),
        1,
        "{}",
        agent.log()
    );

    // Another pin shrinks the pool: dp follows it and keeps its own cpu.
    let other = guaranteed("other", 2000);
    node.fake.start_pod(&other).unwrap();
    let status = node.wait_status("the pool shrank", |s| {
        s.converged() && s.exclusive_cpu_count == 4
    });
    let smaller = cpus(&status.shared_pool);
    assert!(smaller.len() + 2 == pool.len(), "{status:?}");
    assert_eq!(
        status.by_id(&dp).unwrap().current.as_deref().map(cpus),
        Some(dp_own.union(&smaller)),
        "{status:?}"
    );
    // And grows back when that pod goes.
    node.fake.remove_pod(&other).unwrap();
    let status = node.wait_status("the pool grew back", |s| {
        s.converged() && s.exclusive_cpu_count == 2
    });
    assert_eq!(cpus(&status.shared_pool), pool);
    assert_eq!(
        status.by_id(&dp).unwrap().current.as_deref().map(cpus),
        Some(dp_own.union(&pool))
    );
    // The pod goes: nothing counted.
    node.fake.remove_pod(&fast).unwrap();
    let uncounted = poll_until(DEADLINE, || {
        (node.metric("cpusetd_cpu_shared_containers") == 0.0).then_some(())
    });
    assert!(uncounted.is_some(), "{:?}", node.metrics());
    assert!(agent.stop().success());
    node.assert_clean();
}

#[test]
fn cpu_shared_follows_the_pool_v1() {
    cpu_shared_follows_the_pool(CgroupVersion::V1);
}

#[test]
fn cpu_shared_follows_the_pool_v2() {
    cpu_shared_follows_the_pool(CgroupVersion::V2);
}

/// The projection file of a container, parsed (`None` while missing).
fn projection(dir: &Path, uid: &str, container: &str) -> Option<serde_json::Value> {
    let text = fs::read_to_string(dir.join(uid).join(format!("{container}.json"))).ok()?;
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("half a file? {e}: {text}")))
}

fn wait_projection(
    dir: &Path,
    uid: &str,
    container: &str,
    what: &str,
    mut ok: impl FnMut(&serde_json::Value) -> bool,
) -> serde_json::Value {
    poll_until(DEADLINE, || {
        projection(dir, uid, container).filter(|v| ok(v))
    })
    .unwrap_or_else(|| panic!("{what}: {:?}", projection(dir, uid, container)))
}

/// Names in a directory's inotify events about `name`, as (event name, mask) pairs.
fn events_about(inotify: &mut Inotify, name: &str) -> Vec<EventMask> {
    let mut buf = [0u8; 4096];
    let mut out = Vec::new();
    while let Ok(events) = inotify.read_events(&mut buf) {
        let events: Vec<_> = events
            .filter(|e| e.name.is_some_and(|n| n == name))
            .map(|e| e.mask)
            .collect();
        if events.is_empty() {
            break;
        }
        out.extend(events);
    }
    out
}

fn projection_follows_the_pod(version: CgroupVersion) {
    let node = TestNode::new(version);
    let dir = node.base.join("projection");
    // What an earlier run left for a pod that is gone: removed at start.
    let stale = dir.join("11111111-2222-3333-4444-555555555555");
    fs::create_dir_all(&stale).unwrap();
    fs::write(stale.join("app.json"), "{}").unwrap();
    let dir_flag = dir.display().to_string();
    let mut agent = node.start_agent(&["--projection-dir", &dir_flag]);
    // (After the first pass's writes and its checkpoint, so a moment after its log line.)
    assert!(
        poll_until(DEADLINE, || (!stale.exists()).then_some(())).is_some(),
        "{}",
        agent.log()
    );

    let fast = guaranteed("fast", 1000);
    let plain = guaranteed("plain", 1000);
    node.fake.annotate_pod(
        &fast.uid,
        &[
            ("cpusetd.io/projection", "enable"),
            ("cpu-quota.crio.io", "disable"),
        ],
    );
    let id = node.fake.start_pod(&fast).unwrap().remove(0);
    node.fake.start_pod(&plain).unwrap();
    let status = node.wait_status("pinned", |s| s.converged() && s.exclusive_cpu_count == 2);
    let held = status.by_id(&id).unwrap().current.clone().unwrap();
    let doc = wait_projection(&dir, &fast.uid, "fast", "the pin", |v| {
        v["exclusive_cpus"] == held.as_str() && !v["isolation"].as_array().unwrap().is_empty()
    });
    assert_eq!(doc["version"], 1, "{doc}");
    assert_eq!(doc["pod_uid"], fast.uid.as_str());
    assert_eq!(doc["cpus"], held.as_str());
    assert_eq!(
        doc["shared_cpus"], "",
        "an exclusive container runs on no shared cpu"
    );
    let cpu: u32 = held.parse().unwrap();
    // The fixture: cpus 0-3 and 8-11 on node 0, 4-7 and 12-15 on node 1.
    assert_eq!(
        doc["exclusive_numa_nodes"],
        serde_json::json!([(cpu % 8) / 4])
    );
    assert_eq!(doc["isolation"], serde_json::json!(["cpu-quota.crio.io"]));
    let first = doc["generation"].as_u64().unwrap();
    assert!(!dir.join(&plain.uid).exists(), "plain did not ask");
    let pod_dir = dir.join(&fast.uid);
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&pod_dir), 0o755);
    assert_eq!(mode(&pod_dir.join("fast.json")), 0o644);
    let mut args = node.tree_args();
    args.extend(["--projection-dir".to_string(), dir_flag.clone()]);
    let status = wait_status_of(&args, "status notes it", |s| {
        s.by_id(&id).is_some_and(|r| r.note.contains("projected"))
    });
    assert!(status
        .by_id(&id)
        .unwrap()
        .note
        .contains("projected (generation"));

    // An in-place resize: a new file, replaced by one rename, read whole meanwhile.
    let mut inotify = Inotify::init().unwrap();
    inotify
        .watches()
        .add(&pod_dir, WatchMask::ALL_EVENTS)
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (dir, uid, stop) = (dir.clone(), fast.uid.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut reads = 0;
            while !stop.load(Ordering::Relaxed) {
                // Panics on half a file.
                projection(&dir, &uid, "fast").expect("never missing while the pod runs");
                reads += 1;
            }
            reads
        })
    };
    crate::agent::resize(&node, &fast, &id, 2000);
    let doc = wait_projection(&dir, &fast.uid, "fast", "the resize", |v| {
        v["exclusive_cpus"]
            .as_str()
            .map(cpus)
            .is_some_and(|c| c.len() == 2)
    });
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    let second = doc["generation"].as_u64().unwrap();
    assert!(second > first, "{first} → {second}");
    assert!(cpus(doc["exclusive_cpus"].as_str().unwrap()).contains(cpu));
    let events = events_about(&mut inotify, "fast.json");
    assert!(
        events.contains(&EventMask::MOVED_TO)
            && !events.iter().any(|m| m.contains(EventMask::MODIFY)),
        "{events:?}"
    );
    let names: Vec<_> = fs::read_dir(&pod_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["fast.json"], "no temporary file left");

    // The pod goes: its directory goes.
    node.fake.remove_pod(&fast).unwrap();
    assert!(
        poll_until(DEADLINE, || (!pod_dir.exists()).then_some(())).is_some(),
        "{}",
        agent.log()
    );
    assert!(agent.stop().success());
    node.assert_clean();
}

#[test]
fn projection_follows_the_pod_v1() {
    projection_follows_the_pod(CgroupVersion::V1);
}

#[test]
fn projection_follows_the_pod_v2() {
    projection_follows_the_pod(CgroupVersion::V2);
}

/// `--project-all`: every container, shared ones too; a change of the shared pool is a new
/// generation; `cpu-shared` says which cpus are whose; `reset` removes what is left.
#[test]
fn project_all_follows_the_shared_pool_and_reset_cleans_up() {
    let node = TestNode::new(CgroupVersion::V1);
    let dir = node.base.join("projection");
    let dir_flag = dir.display().to_string();
    let mut agent = node.start_agent(&["--projection-dir", &dir_flag, "--project-all"]);
    let web = pod(
        "web",
        Qos::Burstable,
        vec![ContainerSpec::burstable("web", 500, None)],
    );
    let fast = guaranteed("fast", 1000);
    node.fake
        .annotate_pod(&fast.uid, &[("cpu-shared.crio.io/fast", "enable")]);
    node.fake.start_pod(&web).unwrap();
    let status = node.wait_status("web shared", |s| s.converged() && s.containers.len() == 2);
    let pool = status.shared_pool.clone();
    let before = wait_projection(&dir, &web.uid, "web", "web", |v| v["cpus"] == pool.as_str());
    assert_eq!(before["exclusive_cpus"], "");
    assert_eq!(before["shared_cpus"], pool.as_str());
    assert_eq!(before["shared_numa_nodes"], serde_json::json!([0, 1]));

    let id = node.fake.start_pod(&fast).unwrap().remove(0);
    let status = node.wait_status("fast pinned", |s| {
        s.converged() && s.exclusive_cpu_count == 1
    });
    let smaller = status.shared_pool.clone();
    let held = status.exclusive_cpus.clone();
    let after = wait_projection(&dir, &web.uid, "web", "the pool shrank", |v| {
        v["shared_cpus"] == smaller.as_str()
    });
    assert!(after["generation"].as_u64() > before["generation"].as_u64());
    let doc = wait_projection(&dir, &fast.uid, "fast", "fast", |v| {
        v["exclusive_cpus"] == held.as_str() && v["shared_cpus"] == smaller.as_str()
    });
    assert_eq!(doc["isolation"], serde_json::json!(["cpu-shared.crio.io"]));
    assert_eq!(
        status.by_id(&id).unwrap().current.as_deref().map(cpus),
        Some(cpus(&held).union(&cpus(&smaller)))
    );
    // A kill -9 and a restart: the files stay, each keeps its generation (the same body is
    // adopted, not written again), and the next change goes on from it.
    let web_generation = after["generation"].as_u64().unwrap();
    agent.kill9();
    let mut agent = node.start_agent(&["--projection-dir", &dir_flag, "--project-all"]);
    node.fake.remove_pod(&fast).unwrap();
    let grown = wait_projection(&dir, &web.uid, "web", "the pool grew back", |v| {
        v["shared_cpus"] == pool.as_str()
    });
    assert_eq!(
        grown["generation"].as_u64(),
        Some(web_generation + 1),
        "{grown}"
    );
    assert!(
        poll_until(DEADLINE, || (!dir.join(&fast.uid).exists()).then_some(())).is_some(),
        "{}",
        agent.log()
    );
    node.fake.start_pod(&fast).unwrap();
    wait_projection(&dir, &fast.uid, "fast", "fast again", |v| {
        v["exclusive_cpus"] != ""
    });
    // Stopped, the files stay (a restart goes on from them); reset removes them.
    assert!(agent.stop().success());
    assert!(dir.join(&web.uid).exists());
    let out = node.cpusetd("reset", &["--projection-dir", &dir_flag]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("removed 2 pod projection directories"));
    assert!(!dir.join(&web.uid).exists() && !dir.join(&fast.uid).exists());
    assert!(dir.exists());
}

/// 20 rounds of 5 Guaranteed 1-CPU pods and 5 BestEffort pods started back to back, each
/// round waited for and deleted (the burst of `agent_event_to_pin_latency_on_a_fake_tree`);
/// returns the agent's metrics at the end.
fn pin_rounds(extra: &[&str]) -> std::collections::BTreeMap<String, f64> {
    let node = TestNode::new(CgroupVersion::V1);
    let dir = node.base.join("projection").display().to_string();
    let mut flags = vec![
        "--cpu-manager-reconcile-period",
        "1h",
        "--projection-dir",
        &dir,
    ];
    flags.extend_from_slice(extra);
    let mut agent = node.start_agent(&flags);
    for round in 0..20 {
        let pods: Vec<_> = (0..10)
            .map(|i| match i % 2 {
                0 => guaranteed(&format!("g{round}-{i}"), 1000),
                _ => pod(
                    &format!("be{round}-{i}"),
                    Qos::BestEffort,
                    vec![ContainerSpec::best_effort(&format!("be{round}-{i}"))],
                ),
            })
            .collect();
        for p in &pods {
            node.fake.start_pod(p).unwrap();
        }
        let counted = (round + 1) as f64 * 10.0;
        let pinned = poll_until(DEADLINE, || {
            Some(node.metric("cpusetd_event_to_pin_seconds_count")).filter(|n| *n >= counted)
        });
        assert!(pinned.is_some(), "round {round}: {:?}", node.metrics());
        node.wait_status("converged", |s| s.converged() && s.exclusive_cpu_count == 5);
        for p in &pods {
            node.fake.remove_pod(p).unwrap();
        }
        node.wait_status("gone", |s| s.containers.is_empty());
    }
    assert!(agent.stop().success());
    node.assert_clean();
    node.metrics()
}

/// What `--project-all` costs the pins (printed, not asserted: a shared 2-CPU machine): the
/// same bursts with and without it.
#[test]
fn projection_stays_off_the_path_to_the_pin() {
    let without = pin_rounds(&[]);
    let with = pin_rounds(&["--project-all"]);
    println!(
        "event-to-pin latency ({}), without projection: {}; with --project-all: {} ({} files written)",
        crate::agent_util::build(),
        crate::agent_util::pin_latency(&without),
        crate::agent_util::pin_latency(&with),
        with["cpusetd_projection_writes_total"]
    );
    assert_eq!(without["cpusetd_projection_writes_total"], 0.0);
    // (The metrics file is written before the projection files of the same pass.)
    assert!(with["cpusetd_projection_writes_total"] >= 100.0, "{with:?}");
    assert_eq!(with["cpusetd_projection_failures_total"], 0.0);
}

/// `cpu-c-states.crio.io` and `cpu-freq-governor.crio.io` in force (their files read back as
/// asked, on fake sysfs) are in the projection's `isolation` and in `status --json`'s; a
/// governor the cpus do not offer is in neither.
#[test]
fn projection_and_status_say_the_power_annotations_in_force() {
    let node = TestNode::with_writable_sysfs(CgroupVersion::V1);
    crate::power::fake_power(&node);
    let dir = node.base.join("projection");
    let dir_flag = dir.display().to_string();
    let mut agent = node.start_agent(&["--projection-dir", &dir_flag]);
    let rt = guaranteed("rt", 2000);
    node.fake.annotate_pod(
        &rt.uid,
        &[
            ("cpusetd.io/projection", "enable"),
            ("cpu-c-states.crio.io", "disable"),
            ("cpu-freq-governor.crio.io", "performance"),
        ],
    );
    let slow = guaranteed("slow", 1000);
    node.fake.annotate_pod(
        &slow.uid,
        &[
            ("cpusetd.io/projection", "enable"),
            ("cpu-freq-governor.crio.io", "ondemand"),
        ],
    );
    let rt_id = node.fake.start_pod(&rt).unwrap().remove(0);
    let slow_id = node.fake.start_pod(&slow).unwrap().remove(0);
    let both = serde_json::json!(["cpu-c-states.crio.io", "cpu-freq-governor.crio.io"]);
    let doc = wait_projection(&dir, &rt.uid, "rt", "power in force", |v| {
        v["isolation"] == both
    });
    let held = cpus(doc["exclusive_cpus"].as_str().unwrap());
    assert_eq!(held.len(), 2, "{doc}");
    for cpu in held.iter() {
        assert_eq!(
            crate::power::power_file(&node, cpu, crate::power::LATENCY),
            "n/a"
        );
        assert_eq!(
            crate::power::power_file(&node, cpu, crate::power::GOVERNOR),
            "performance"
        );
    }
    let status = node.wait_status("in force", |s| {
        s.by_id(&rt_id)
            .is_some_and(|r| r.isolation == ["cpu-c-states", "cpu-freq-governor"])
    });
    // ondemand is not offered: refused, so not in force anywhere.
    let slow_row = status.by_id(&slow_id).unwrap();
    assert!(
        slow_row.exclusive && slow_row.isolation.is_empty(),
        "{slow_row:?}"
    );
    let slow_doc = wait_projection(&dir, &slow.uid, "slow", "slow pinned", |v| {
        v["exclusive_cpus"] != ""
    });
    assert_eq!(slow_doc["isolation"], serde_json::json!([]), "{slow_doc}");
    // The table says them in the note, never as "no cpu-c-states".
    let out = node.cpusetd("status", &[]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("cpu-c-states.crio.io in force") && !table.contains("no cpu-c-states"),
        "{table}"
    );
    assert!(agent.stop().success());
}
