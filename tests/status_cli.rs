//! `cpusetd status` and `cpusetd health` tell the truth (issue 23, items 13–18): what policy
//! `none` means, the agent's own refusals, the live request, the last reconcile, whether an
//! agent runs at all, and a table and map an operator can read. On fake nodes with the real
//! agent binary; waiting always polls with a deadline.

use std::fs;
use std::process::{Child, Command, Stdio};

use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::Signal;

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::kubesim::{ContainerSpec, Qos};

use crate::agent::resize;
use crate::agent_process::cpusetd_command;
use crate::agent_util::{
    best_effort, cpus, guaranteed, pod, poll_until, Status, TestNode, DEADLINE,
};
use crate::util::{stderr, stdout};

/// `status` exits with this when no agent runs on the state directory (LSB's "program is not
/// running", as `systemctl status` exits).
const NOT_RUNNING: i32 = 3;

/// The table's data rows (after the header line `POD …`), split on whitespace.
fn table_rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .skip_while(|l| !l.starts_with("POD"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

/// A process that is not cpusetd, alive until dropped.
struct Sleeper(Child);

impl Sleeper {
    fn start() -> Sleeper {
        Sleeper(
            Command::new("sleep")
                .arg("300")
                .stdin(Stdio::null())
                .spawn()
                .expect("start sleep"),
        )
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Item 13: under policy `none` nothing is managed: no row is marked, no DESIRED is shown as
/// empty, the header says what `none` means and no footer counts differences.
#[test]
fn status_under_policy_none_marks_nothing_and_says_what_none_means() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&["--cpu-manager-policy", "none"]);
    let db = guaranteed("db", 2000);
    let db_id = node.fake.start_pod(&db).unwrap().remove(0);
    let be_id = node.fake.start_pod(&best_effort("be")).unwrap().remove(0);
    node.wait_status("both pods seen", |s| {
        s.by_id(&db_id).is_some() && s.by_id(&be_id).is_some()
    });
    let out = node.cpusetd("status", &[]);
    let table = stdout(&out);
    assert!(out.status.success(), "{table}{}", stderr(&out));
    assert!(
        table.starts_with("policy none: cpusetd manages no cpusets"),
        "{table}"
    );
    assert!(!table.contains("reserved ,"), "{table}");
    assert!(!table.contains('*'), "{table}");
    assert!(!table.contains("differ"), "{table}");
    let rows = table_rows(&table);
    assert_eq!(rows.len(), 4, "{table}");
    for row in rows {
        let line = row.join(" ");
        assert!(line.contains("not managed (policy none)"), "{table}");
    }
    let status = node.status().unwrap();
    assert_eq!(status.differing, 0, "{status:#?}");
    assert!(status.containers.iter().all(|r| r.desired.is_none()));
    assert!(agent.stop().success());
}

/// Item 14: the refusal `status` shows is the agent's own, with kubelet's text as the log said
/// it, with or without the agent's flags; never "not given yet", never a recomputation.
#[test]
fn status_shows_the_refusal_the_agent_made() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let four = guaranteed("four", 4000);
    let four_id = node.fake.start_pod(&four).unwrap().remove(0);
    let six = guaranteed("six", 6000);
    let six_id = node.fake.start_pod(&six).unwrap().remove(0);
    node.wait_status("four and six pinned", |s| {
        s.converged()
            && [&four_id, &six_id]
                .iter()
                .all(|id| s.by_id(id).is_some_and(|r| r.exclusive))
    });
    // 15 allocatable cpus, 10 held: 5 free for a request of 8.
    let eight = guaranteed("eight", 8000);
    let eight_id = node.fake.start_pod(&eight).unwrap().remove(0);
    agent.wait_for_log("requested=8");
    let logged = agent.log_lines("requested=8");
    assert_eq!(logged.len(), 1, "{}", agent.log());
    assert!(logged[0].contains("available=5"), "{}", logged[0]);
    // A 2-cpu pod takes two of the five afterwards: the agent said its refusal once.
    let two = guaranteed("two", 2000);
    let two_id = node.fake.start_pod(&two).unwrap().remove(0);
    node.wait_status("two pinned", |s| {
        s.converged() && s.by_id(&two_id).is_some_and(|r| r.exclusive)
    });
    let kubelet_text = "not enough cpus available to satisfy request: requested=8, available=5";
    for flags in [&[][..], &["--reserved-cpus", "0"][..]] {
        let status = node.status().unwrap();
        let row = status.by_id(&eight_id).unwrap();
        assert!(!row.exclusive);
        assert!(
            row.note.contains("rejected") && row.note.contains(kubelet_text),
            "{flags:?}: {}",
            row.note
        );
        let table = stdout(&node.cpusetd("status", flags));
        let line = table
            .lines()
            .find(|l| l.split_whitespace().take(2).eq(["default/eight", "eight"]))
            .unwrap_or_else(|| panic!("{table}"));
        assert!(line.contains(kubelet_text), "{flags:?}: {table}");
        assert!(!table.contains("not given yet"), "{flags:?}: {table}");
    }
    assert!(agent.stop().success());
}

/// Item 15: after an in-place resize, REQUEST is what the container asks for now.
#[test]
fn status_shows_the_live_request_after_an_in_place_resize() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let g = guaranteed("g", 1000);
    let id = node.fake.start_pod(&g).unwrap().remove(0);
    node.wait_cpus(&id, "8");
    resize(&node, &g, &id, 2000);
    node.wait_status("resized to 2 cpus", |s| {
        s.converged()
            && s.by_id(&id).is_some_and(|r| {
                r.exclusive && r.current.as_deref().map(cpus).map(|c| c.len()) == Some(2)
            })
    });
    let table = stdout(&node.cpusetd("status", &[]));
    let line = table
        .lines()
        .find(|l| l.starts_with("default/g ") && l.contains(" g "))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(line.contains("2000m"), "{table}");
    assert!(!line.contains("1000m"), "{table}");
    assert!(agent.stop().success());
}

/// Item 16: the last reconcile is the agent's last (not the checkpoint's age), and with no
/// agent running `status` says so first and exits non-zero.
#[test]
fn status_shows_the_last_reconcile_and_says_when_no_agent_runs() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&["--cpu-manager-reconcile-period", "300ms"]);
    node.fake.start_pod(&best_effort("be")).unwrap();
    node.wait_status("settled", |s| s.converged() && !s.containers.is_empty());
    // Quiet ticks (no full scan, no checkpoint) follow: the metrics file has each.
    let quiet = node.metric("cpusetd_quiet_reconciles_total");
    let found = poll_until(DEADLINE, || {
        (node.metric("cpusetd_quiet_reconciles_total") >= quiet + 2.0).then_some(())
    });
    assert!(found.is_some(), "{:?}", node.metrics());
    let mut seen = Vec::new();
    for _ in 0..5 {
        let metric = node.metric("cpusetd_last_reconcile_timestamp_seconds");
        let status = node.status().unwrap();
        let shown = status.last_reconcile_unix_ms.unwrap_or(0) as f64 / 1000.0;
        seen.push((metric, shown));
        if shown + 0.002 < metric {
            break;
        }
    }
    assert!(
        seen.iter().all(|(metric, shown)| shown + 0.002 >= *metric),
        "status showed an older reconcile than the agent's last (metric, shown): {seen:?}"
    );

    // Stopped: said first, exit 3.
    assert!(agent.stop().success());
    let out = node.cpusetd("status", &[]);
    assert_eq!(out.status.code(), Some(NOT_RUNNING), "{}", stdout(&out));
    let table = stdout(&out);
    assert!(table.starts_with("cpusetd is not running on "), "{table}");
    assert!(table.contains("POD"), "the table follows: {table}");
    let json = node.cpusetd("status", &["--json"]);
    assert_eq!(json.status.code(), Some(NOT_RUNNING));
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(doc["agent"]["running"], false, "{doc}");

    // Killed, and its pid now another program's.
    let mut agent = node.start_agent(&[]);
    agent.signal(Signal::SIGKILL);
    agent.wait_exit(DEADLINE);
    let sleeper = Sleeper::start();
    fs::write(
        node.state_dir().join("lock"),
        format!("{}\n", sleeper.pid()),
    )
    .unwrap();
    let out = node.cpusetd("status", &[]);
    assert_eq!(out.status.code(), Some(NOT_RUNNING), "{}", stdout(&out));
    assert!(
        stdout(&out).starts_with("cpusetd is not running on "),
        "{}",
        stdout(&out)
    );
}

/// Item 17: `health` checks that a cpusetd holds the lock, not that the pid in it exists.
#[test]
fn health_is_unhealthy_unless_a_cpusetd_holds_the_lock() {
    let node = TestNode::new(CgroupVersion::V1);
    let health = || {
        let out = node.cpusetd("health", &[]);
        (out.status.code(), stdout(&out), stderr(&out))
    };
    let mut agent = node.start_agent(&[]);
    let healthy = poll_until(DEADLINE, || (health().0 == Some(0)).then_some(()));
    assert!(healthy.is_some(), "{:?}", health());
    // An agent in a container records the pid of its own namespace: the holder the kernel
    // names is what counts.
    let lock = node.state_dir().join("lock");
    fs::write(&lock, "1\n").unwrap();
    let (code, out, err) = health();
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.starts_with(&format!("healthy: pid {},", agent.pid())),
        "{out}"
    );
    agent.signal(Signal::SIGKILL);
    agent.wait_exit(DEADLINE);

    // The lock is free; the pid it names runs, but is not cpusetd (pid reuse).
    let sleeper = Sleeper::start();
    fs::write(&lock, format!("{}\n", sleeper.pid())).unwrap();
    let (code, out, err) = health();
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("unhealthy: no agent holds"), "{err}");

    // Another program holds the lock and names itself in it.
    let held = Flock::lock(fs::File::open(&lock).unwrap(), FlockArg::LockExclusive).unwrap();
    fs::write(&lock, format!("{}\n", std::process::id())).unwrap();
    let (code, out, err) = health();
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("not cpusetd"), "{err}");
    drop(held);
}

/// Item 18: rows sorted by pod (namespace/name), the sandbox first, then containers by name;
/// no request reads `-`; no log line on stderr.
#[test]
fn status_rows_are_sorted_and_readable() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let zeta = pod(
        "zeta",
        Qos::Burstable,
        vec![
            ContainerSpec::burstable("web", 100, None),
            ContainerSpec::burstable("app", 200, None),
            ContainerSpec::burstable("sidecar", 300, None),
        ],
    );
    node.fake.start_pod(&zeta).unwrap();
    node.fake.start_pod(&best_effort("alpha")).unwrap();
    node.fake.start_pod(&guaranteed("mid", 1000)).unwrap();
    node.wait_status("all seen, mid pinned", |s| {
        s.converged() && s.containers.len() == 8 && s.exclusive_cpu_count == 1
    });
    let out = cpusetd_command()
        .arg("status")
        .args(node.tree_args())
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out), "", "no log line on stderr");
    let table = stdout(&out);
    let order: Vec<(String, String)> = table_rows(&table)
        .into_iter()
        .map(|r| (r[0].clone(), r[1].clone()))
        .collect();
    let expected = [
        ("default/alpha", "POD"),
        ("default/alpha", "alpha"),
        ("default/mid", "POD"),
        ("default/mid", "mid"),
        ("default/zeta", "POD"),
        ("default/zeta", "app"),
        ("default/zeta", "sidecar"),
        ("default/zeta", "web"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(p, c)| (p.to_string(), c.to_string()))
        .collect();
    assert_eq!(order, expected, "{table}");
    // REQUEST is the fourth column: none for a sandbox or BestEffort container.
    for row in table_rows(&table) {
        let request = &row[3];
        if row[1] == "POD" || row[2] == "BestEffort" {
            assert_eq!(request, "-", "{table}");
        }
        assert!(!request.contains(".."), "{table}");
    }
    assert!(agent.stop().success());
}

/// Item 18: cpus held for a container that is restarting have a row and a mark in the map;
/// offline cpus are drawn `X` in the grid.
#[test]
fn status_shows_cpus_held_for_a_restart_and_offline_cpus() {
    let node = TestNode::with_writable_sysfs(CgroupVersion::V1);
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
    node.wait_cpus(&ids[1], "8");
    node.fake.remove_container(&db, &ids[0]).unwrap();
    node.wait_status("db gone, its cpus held", |s: &Status| {
        s.converged() && s.by_id(&ids[0]).is_none() && s.exclusive_cpus == "1,8-9"
    });
    let table = stdout(&node.cpusetd("status", &[]));
    let held = table
        .lines()
        .find(|l| l.starts_with("default/db ") && l.split_whitespace().nth(1) == Some("db"))
        .unwrap_or_else(|| panic!("no row for the restarting container: {table}"));
    assert!(held.contains("1,9") && held.contains("held"), "{table}");
    let map = stdout(&node.cpusetd("status", &["--map"]));
    assert!(map.contains("[ 0R  8b] [ 1a  9a]"), "{map}");
    assert!(map.contains("a  default/db/db  cpus 1,9"), "{map}");

    node.set_cpu_online(5, false);
    let offline = poll_until(DEADLINE, || {
        let map = stdout(&node.cpusetd("status", &["--map"]));
        map.contains("[ 5X]").then_some(map)
    });
    assert!(
        offline.is_some(),
        "{}",
        stdout(&node.cpusetd("status", &["--map"]))
    );
    assert!(agent.stop().success());
}
