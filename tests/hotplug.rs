//! CPU hotplug while `cpusetd run` runs, on fake nodes whose sysfs is a writable copy of the
//! `2s-8c-ht-2numa` fixture (16 CPUs, cores `{n, n+8}`, NUMA node 0 = cpus 0-3,8-11, CPU 0
//! reserved, a 1 s reconcile period). A CPU goes offline the way the kernel takes it (sysfs'
//! online list; on v1 every cpuset loses it, on v2 the effective sets): a pinned container gets a
//! replacement, or keeps what it has left when none is free; the checkpoint and `status` agree;
//! the CPU coming back joins the shared pool. No write the fake kernel would refuse.

use std::fs;

use serde_json::Value;

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::cpuset::CpuSet;

use crate::agent_util::{best_effort, cpus, guaranteed, poll_until, Status, TestNode, DEADLINE};
use crate::util::stderr;

/// The checkpoint as JSON once `condition` holds (the persist thread writes it a moment after
/// a pass).
fn checkpoint(node: &TestNode, what: &str, condition: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    poll_until(DEADLINE, || {
        last = serde_json::from_slice(&fs::read(node.checkpoint()).ok()?).ok()?;
        condition(&last).then_some(())
    })
    .unwrap_or_else(|| panic!("checkpoint {what}: not within {DEADLINE:?}: {last:#}"));
    last
}

/// Waits until the metrics file shows `value` for `name` (written a moment after a pass).
fn wait_metric(node: &TestNode, name: &str, value: f64) {
    let seen = poll_until(DEADLINE, || {
        let now = node.metric(name);
        (now == value).then_some(now)
    });
    assert_eq!(seen, Some(value), "{name}: {}", node.metric(name));
}

/// The checkpoint's assignment of the container named `name`: its cpus and `wanted`.
fn assignment(cp: &Value, name: &str) -> (CpuSet, Option<u64>) {
    let entry = cp["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["named"]["container"] == name)
        .unwrap_or_else(|| panic!("no assignment of {name} in {cp:#}"));
    (
        cpus(entry["cpus"].as_str().unwrap()),
        entry["wanted"].as_u64(),
    )
}

/// The container's row holds `expected` both desired and actual, and the tree has converged.
fn holds(status: &Status, id: &str, expected: &CpuSet) -> bool {
    status.has(id, &expected.to_string()) && status.converged()
}

fn a_pinned_container_gets_a_replacement_and_the_cpu_comes_back(version: CgroupVersion) {
    let node = TestNode::with_writable_sysfs(version);
    let mut agent = node.start_agent(&[]);
    let db = guaranteed("db", 2000);
    let db_id = node.fake.start_pod(&db).unwrap().remove(0);
    let be = best_effort("be");
    let be_id = node.fake.start_pod(&be).unwrap().remove(0);
    node.wait_cpus(&db_id, "1,9");
    node.wait_cpus(&be_id, "0,2-8,10-15");

    node.set_cpu_online(9, false);
    agent.wait_for_log("cpus 9 went offline");
    let status = node.wait_status("db gets a replacement for cpu 9", |s| {
        s.by_id(&db_id)
            .and_then(|r| r.current.as_deref())
            .is_some_and(|c| {
                let c = cpus(c);
                c.len() == 2 && c.contains(1) && !c.contains(9)
            })
            && s.by_id(&db_id).is_some_and(|r| r.exclusive)
            && s.converged()
    });
    let db_cpus = cpus(status.by_id(&db_id).unwrap().current.as_deref().unwrap());
    // Near the cpu it kept: on its NUMA node.
    assert!(db_cpus.is_subset(&cpus("0-3,8-11")), "{db_cpus}");
    let online = cpus("0-8,10-15");
    let shared = online.difference(&db_cpus);
    assert_eq!(status.shared_pool, shared.to_string());
    assert_eq!(node.cpus_of(&be, &be_id), shared.to_string());
    assert!(holds(&status, &be_id, &shared));
    assert_eq!(status.exclusive_cpus, db_cpus.to_string());
    agent.wait_for_log(&format!(
        "lost cpus 9 (offline or out of reach), replacement cpus {}: cpus={db_cpus}",
        db_cpus.difference(&cpus("1"))
    ));
    // The checkpoint says the same.
    let cp = checkpoint(&node, "without cpu 9", |cp| {
        cp["online"] == online.to_string()
    });
    assert_eq!(cp["shared_pool"], shared.to_string());
    assert_eq!(assignment(&cp, "db"), (db_cpus.clone(), None));
    wait_metric(
        &node,
        "cpusetd_cpu_hotplug_events_total{direction=\"offline\"}",
        1.0,
    );
    wait_metric(&node, "cpusetd_online_cpus", 15.0);
    // Said once.
    assert_eq!(agent.log_lines("cpus 9 went offline").len(), 1);

    // Back online: it joins the shared pool; db keeps its cpus.
    node.set_cpu_online(9, true);
    agent.wait_for_log("cpus 9 came online");
    let shared = cpus("0-15").difference(&db_cpus);
    let status = node.wait_status("cpu 9 back in the shared pool", |s| {
        holds(s, &be_id, &shared) && holds(s, &db_id, &db_cpus)
    });
    assert_eq!(status.shared_pool, shared.to_string());
    assert_eq!(
        fs::read_to_string(node.fake.file("kubepods", "cpuset.cpus"))
            .unwrap()
            .trim(),
        "0-15"
    );
    let cp = checkpoint(&node, "with cpu 9", |cp| cp["online"] == "0-15");
    assert_eq!(cp["shared_pool"], shared.to_string());
    wait_metric(
        &node,
        "cpusetd_cpu_hotplug_events_total{direction=\"online\"}",
        1.0,
    );
    wait_metric(&node, "cpusetd_online_cpus", 16.0);
    assert!(agent.stop().success());
    node.assert_clean();
}

#[test]
fn hotplug_v1_a_pinned_container_gets_a_replacement_and_the_cpu_comes_back() {
    a_pinned_container_gets_a_replacement_and_the_cpu_comes_back(CgroupVersion::V1);
}

#[test]
fn hotplug_v2_a_pinned_container_gets_a_replacement_and_the_cpu_comes_back() {
    a_pinned_container_gets_a_replacement_and_the_cpu_comes_back(CgroupVersion::V2);
}

/// Every cpu but the reserved one is pinned: db keeps the cpu it has left, `status` and the
/// checkpoint say it is short, and it gets cpu 9 back when it comes online.
#[test]
fn hotplug_without_a_free_cpu_the_container_keeps_what_it_has_left() {
    let node = TestNode::with_writable_sysfs(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let db = guaranteed("db", 2000);
    let db_id = node.fake.start_pod(&db).unwrap().remove(0);
    node.wait_cpus(&db_id, "1,9");
    let big = guaranteed("big", 13000);
    let big_id = node.fake.start_pod(&big).unwrap().remove(0);
    node.wait_cpus(&big_id, "2-8,10-15");
    let be = best_effort("be");
    let be_id = node.fake.start_pod(&be).unwrap().remove(0);
    node.wait_cpus(&be_id, "0");

    node.set_cpu_online(9, false);
    agent.wait_for_log(
        "lost cpus 9 (offline or out of reach) and no replacement can be given: keeps cpus=1 \
         (1 of 2) and asks again every pass: not enough cpus available to satisfy request: \
         requested=1, available=0",
    );
    let status = node.wait_status("db keeps cpu 1", |s| {
        holds(s, &db_id, &cpus("1")) && holds(s, &big_id, &cpus("2-8,10-15"))
    });
    let row = status.by_id(&db_id).unwrap();
    assert!(row.exclusive);
    // `status` says why as the agent said it (from its checkpoint), with or without its flags.
    assert_eq!(
        row.note,
        "exclusive, 1 of 2 cpus (the others went offline or out of reach): not enough cpus \
         available to satisfy request: requested=1, available=0"
    );
    let out = node.cpusetd("status", &["--json", "--reserved-cpus", "0"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let with_policy: Status = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        with_policy.by_id(&db_id).unwrap().note,
        "exclusive, 1 of 2 cpus (the others went offline or out of reach): not enough cpus \
         available to satisfy request: requested=1, available=0"
    );
    assert_eq!(status.shared_pool, "0");
    let cp = checkpoint(&node, "db short", |cp| assignment(cp, "db").0 == cpus("1"));
    assert_eq!(assignment(&cp, "db"), (cpus("1"), Some(2)));
    wait_metric(&node, "cpusetd_exclusive_cpus_missing", 1.0);
    // Said once, though every reconcile asks again.
    node.wait_status("a few reconciles later", |s| {
        s.last_reconcile_unix_ms != status.last_reconcile_unix_ms
    });
    assert_eq!(agent.log_lines("no replacement can be given").len(), 1);

    node.set_cpu_online(9, true);
    node.wait_cpus(&db_id, "1,9");
    agent.wait_for_log("replacement cpus 9: cpus=1,9");
    let cp = checkpoint(&node, "db whole", |cp| {
        assignment(cp, "db").0 == cpus("1,9")
    });
    assert_eq!(assignment(&cp, "db"), (cpus("1,9"), None));
    wait_metric(&node, "cpusetd_exclusive_cpus_missing", 0.0);
    node.wait_cpus(&be_id, "0");
    assert!(agent.stop().success());
    node.assert_clean();
}

/// `--reserved-cpus 0,8` with cpu 8 offline at start: the agent starts (kubelet would refuse),
/// says so, and reserves 8 again when it comes online; taken offline again, it is said too.
#[test]
fn hotplug_reserved_cpus_offline_at_start_and_while_running() {
    let node = TestNode::with_writable_sysfs(CgroupVersion::V1);
    node.set_cpu_online(8, false);
    let mut agent = node.start_agent(&["--reserved-cpus", "0,8"]);
    agent
        .wait_for_log("--reserved-cpus: cpus 8 are offline: reserved are 0 until they come online");
    let be = best_effort("be");
    let be_id = node.fake.start_pod(&be).unwrap().remove(0);
    node.wait_cpus(&be_id, "0-7,9-15");
    checkpoint(&node, "reserved 0", |cp| cp["reserved"] == "0");

    node.set_cpu_online(8, true);
    agent.wait_for_log("cpus 8 came online");
    agent.wait_for_log("reserved cpus 8 are online again: reserved now 0,8");
    node.wait_cpus(&be_id, "0-15");
    checkpoint(&node, "reserved 0,8", |cp| cp["reserved"] == "0,8");
    // Reserved: a 14-cpu container gets every cpu but 0 and 8.
    let big = guaranteed("big", 14000);
    let big_id = node.fake.start_pod(&big).unwrap().remove(0);
    node.wait_cpus(&big_id, "1-7,9-15");

    node.set_cpu_online(8, false);
    agent.wait_for_log("reserved cpus 8 went offline: reserved now 0");
    node.wait_cpus(&be_id, "0");
    node.wait_cpus(&big_id, "1-7,9-15");
    assert!(agent.stop().success());
    node.assert_clean();
}

/// Issue 23 item 8: a cpu goes offline while `--isolate-host` confines the host cpusets. When
/// the pod goes, the host gets back only the online part of what it had (the kernel refuses an
/// offline cpu with EINVAL, as the fake kernel does), and the rest once the cpu is back.
#[test]
fn hotplug_v1_confined_host_cpusets_get_back_online_cpus_then_the_rest() {
    let node = TestNode::with_writable_sysfs(CgroupVersion::V1);
    crate::isolation::add_host_cgroups(&node);
    let host = |rel: &str| crate::isolation::cpuset_file(&node, rel, "cpuset.cpus");
    let mut agent = node.start_agent(&["--isolate-host"]);
    let rt = guaranteed("rt", 2000);
    node.fake
        .annotate_pod(&rt.uid, &[("cpu-load-balancing.crio.io", "disable")]);
    let id = node.fake.start_pod(&rt).unwrap().remove(0);
    node.wait_cpus(&id, "1,9");
    agent.wait_until("the host confined", DEADLINE, || {
        host("system.slice/ssh.service") == "0"
    });
    node.set_cpu_online(5, false);
    agent.wait_for_log("cpus 5 went offline");
    node.fake.remove_pod(&rt).unwrap();
    agent.wait_until("the host's online cpus back", DEADLINE, || {
        host("system.slice/ssh.service") == "0-4,6-15"
    });
    assert_eq!(host("system.slice"), "0-4,6-15");
    node.set_cpu_online(5, true);
    agent.wait_for_log("cpus 5 came online");
    agent.wait_until("the rest back", DEADLINE, || {
        host("system.slice/ssh.service") == "0-15"
    });
    assert_eq!(host("system.slice"), "0-15");
    assert!(agent.stop().success());
    let refused = fs::read_to_string(node.refusal_log()).unwrap_or_default();
    assert!(!refused.contains("system.slice"), "{refused}");
    node.assert_clean();
}
