//! Hostile and malformed input to the running agent (`hostile.rs` covers the scan and the
//! classifier, `plan_cli.rs` the one-shot `plan`, `checkpoint.rs` the checkpoint on its own):
//! odd cgroup names and planted symlinks and FIFOs under a pinned container, garbage in the
//! CPU interface files, `config.json` files that are huge, deeply nested, mistyped or ask for
//! more than the policy allows, damaged checkpoints at start, and flags out of range. Each
//! time: a clear message, no panic, no write outside the cgroup root, no lost pin.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

use cpusetd::checkpoint::{self, LoadOutcome};
use cpusetd::cpuset::CpuSet;
use cpusetd::kubesim::{new_container_id, new_pod_uid, ContainerSpec, PodSpec, Qos};

use crate::agent_process::TestNode;
use crate::agent_util::{Row, Status};
use crate::harness::now_ms;

fn pod(qos: Qos, containers: Vec<ContainerSpec>) -> PodSpec {
    PodSpec {
        uid: new_pod_uid(),
        name: "hostile".into(),
        qos,
        containers,
    }
}

/// The row of the container with this id.
fn row<'a>(status: &'a Status, id: &str) -> &'a Row {
    status
        .by_id(id)
        .unwrap_or_else(|| panic!("no row for {id}: {status:?}"))
}

/// A started node with one Guaranteed 2-CPU container pinned; returns it, the pod, the
/// container's id and its cpus.
fn pinned_node() -> (TestNode, PodSpec, String, String) {
    let mut node = TestNode::small();
    node.start();
    let p = pod(Qos::Guaranteed, vec![ContainerSpec::guaranteed("db", 2000)]);
    let id = node.fake.start_pod(&p).unwrap().remove(0);
    let status = node.settled(now_ms(), |s| {
        s.containers
            .iter()
            .any(|r| r.container_id.as_deref() == Some(id.as_str()) && r.exclusive)
    });
    let cpus = row(&status, &id).current.clone().unwrap();
    assert_eq!(CpuSet::parse(&cpus).unwrap().len(), 2);
    (node, p, id, cpus)
}

fn no_panic(node: &TestNode) {
    let log = node.log_text();
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn odd_names_symlinks_and_fifos_under_a_pinned_container() {
    let (mut node, p, id, cpus) = pinned_node();
    let container = format!("{}/{id}", node.fake.pod_dir(&p));
    let cpuset_dir = node.file(&container, "cpuset.cpus");
    let cpuset_dir = cpuset_dir.parent().unwrap();
    // A directory outside the root that a symlink points at, holding "interface files".
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("cpuset.cpus"), "0-7\n").unwrap();
    fs::write(outside.path().join("cpuset.mems"), "0\n").unwrap();
    let names: Vec<Vec<u8>> = vec![
        b"with\nnewline".to_vec(),
        b"with spaces".to_vec(),
        "ünïcødé-✓".as_bytes().to_vec(),
        vec![b'x'; 255],
        vec![0xff, 0xfe, b'n'],
    ];
    for name in &names {
        let dir = cpuset_dir.join(std::ffi::OsStr::from_bytes(name));
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("cpuset.cpus"), format!("{cpus}\n")).unwrap();
        fs::write(dir.join("cpuset.mems"), "0\n").unwrap();
    }
    std::os::unix::fs::symlink(outside.path(), cpuset_dir.join("evil-link")).unwrap();
    let fifo_dir = cpuset_dir.join("fifo-inside");
    fs::create_dir(&fifo_dir).unwrap();
    nix::unistd::mkfifo(
        &fifo_dir.join("cpuset.cpus"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    nix::unistd::mkfifo(
        &cpuset_dir
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .join("cpuset.mems.fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    // A foreign write to the container's set makes the agent narrow everything again.
    fs::write(node.file(&container, "cpuset.cpus"), "0-7\n").unwrap();
    let status = node.settled(now_ms(), |s| {
        row(s, &id).current.as_deref() == Some(cpus.as_str())
    });
    assert!(row(&status, &id).exclusive);
    // The children it could read are inside the container's set; nothing outside changed.
    for name in &names {
        let text = fs::read_to_string(
            cpuset_dir
                .join(std::ffi::OsStr::from_bytes(name))
                .join("cpuset.cpus"),
        )
        .unwrap();
        assert!(
            CpuSet::parse(&text)
                .unwrap()
                .is_subset(&CpuSet::parse(&cpus).unwrap()),
            "{:?}: {text}",
            String::from_utf8_lossy(name)
        );
    }
    assert_eq!(
        fs::read_to_string(outside.path().join("cpuset.cpus")).unwrap(),
        "0-7\n"
    );
    node.assert_running();
    no_panic(&node);
}

#[test]
fn garbage_in_cpu_files_never_drops_a_pin_and_foreign_cpusets_are_repaired() {
    let (mut node, p, id, cpus) = pinned_node();
    let container = format!("{}/{id}", node.fake.pod_dir(&p));
    // Settings files: config.json is the better source and keeps the pin.
    for (file, value) in [
        ("cpu.shares", "garbage"),
        ("cpu.shares", "-5"),
        ("cpu.shares", "999999999999999999999999"),
        ("cpu.shares", ""),
        ("cpu.cfs_quota_us", "-42"),
        ("cpu.cfs_quota_us", "18446744073709551616"),
        ("cpu.cfs_period_us", "0"),
    ] {
        fs::write(node.file(&container, file), value).unwrap();
        let status = node.settled(now_ms(), |_| true);
        assert_eq!(
            row(&status, &id).current.as_deref(),
            Some(cpus.as_str()),
            "{file}={value:?}"
        );
        assert!(row(&status, &id).exclusive, "{file}={value:?}");
    }
    // Without config.json the settings cannot be read: the pin is kept all the same, also by
    // an agent that restarts now (its container name comes from the checkpoint).
    fs::remove_file(node.base.join("runtime").join(&id).join("config.json")).unwrap();
    fs::write(node.file(&container, "cpu.shares"), "bogus").unwrap();
    let status = node.settled(now_ms(), |_| true);
    assert_eq!(row(&status, &id).current.as_deref(), Some(cpus.as_str()));
    node.kill9();
    let restarted = now_ms();
    node.start();
    let status = node.settled(restarted, |_| true);
    assert_eq!(row(&status, &id).current.as_deref(), Some(cpus.as_str()));
    assert!(row(&status, &id).exclusive);
    // Foreign writes of nonsense into the container's cpuset are repaired.
    for value in ["garbage", "0-99999", "-1", "", "7-3", "0,,1"] {
        fs::write(node.file(&container, "cpuset.cpus"), value).unwrap();
        node.settled(now_ms(), |s| {
            row(s, &id).current.as_deref() == Some(cpus.as_str())
        });
    }
    node.assert_running();
    no_panic(&node);
}

/// Starts a container of `p` whose config.json is `config` (bytes as given) and whose cgroup
/// files say `shares`/`quota`; returns its id.
fn raw_container(node: &TestNode, p: &PodSpec, config: &[u8], shares: u64, quota: i64) -> String {
    let id = new_container_id("raw");
    let runtime = node.base.join("runtime").join(&id);
    fs::create_dir_all(&runtime).unwrap();
    fs::write(runtime.join("config.json"), config).unwrap();
    let rel = format!("{}/{id}", node.fake.pod_dir(p));
    let cpuset = node.file(&rel, "cpuset.cpus");
    let cpu = node.file(&rel, "cpu.shares");
    // Assembled beside the tree and renamed in, as the kernel makes a cgroup appear whole.
    for (dir, files) in [
        (
            cpuset.parent().unwrap().to_path_buf(),
            vec![
                (
                    "cpuset.cpus",
                    fs::read_to_string(
                        cpuset
                            .parent()
                            .unwrap()
                            .parent()
                            .unwrap()
                            .join("cpuset.cpus"),
                    )
                    .unwrap(),
                ),
                ("cpuset.mems", "0".to_string()),
                ("cgroup.procs", String::new()),
            ],
        ),
        (
            cpu.parent().unwrap().to_path_buf(),
            vec![
                ("cpu.shares", shares.to_string()),
                ("cpu.cfs_quota_us", quota.to_string()),
                ("cpu.cfs_period_us", "100000".to_string()),
                ("cgroup.procs", String::new()),
            ],
        ),
    ] {
        let staging = node.base.join(format!("staging-{id}"));
        fs::create_dir(&staging).unwrap();
        for (file, value) in files {
            fs::write(staging.join(file), format!("{}\n", value.trim())).unwrap();
        }
        fs::rename(&staging, &dir).unwrap();
    }
    id
}

#[test]
fn config_json_that_is_huge_nested_mistyped_or_asks_for_more() {
    let mut node = TestNode::small();
    node.start();
    node.settled(now_ms(), |_| true);
    let annotated = |uid: &str, name: &str, extra: &str| {
        format!(
            r#"{{"annotations": {{"io.kubernetes.cri.container-type": "container",
                "io.kubernetes.cri.container-name": "{name}",
                "io.kubernetes.cri.sandbox-uid": "{uid}"{extra}}},
               "linux": {{"resources": {{"cpu": {{"shares": 2048, "quota": 200000, "period": 100000}}}}}}}}"#
        )
    };
    // Burstable asking for exclusivity: annotations only narrow.
    let burstable = pod(Qos::Burstable, vec![]);
    node.fake.add_pod(&burstable).unwrap();
    let greedy = raw_container(
        &node,
        &burstable,
        annotated(
            &burstable.uid,
            "greedy",
            r#", "cpusetd.io/exclusive": "true", "cpusetd.io/exclusive.greedy": "true""#,
        )
        .as_bytes(),
        2048,
        -1,
    );
    // Guaranteed 1.5 CPUs asking for exclusivity.
    let guaranteed = pod(Qos::Guaranteed, vec![]);
    node.fake.add_pod(&guaranteed).unwrap();
    let fractional = raw_container(
        &node,
        &guaranteed,
        format!(
            r#"{{"annotations": {{"io.kubernetes.cri.container-name": "half",
                "io.kubernetes.cri.sandbox-uid": "{}", "cpusetd.io/exclusive": "true"}},
               "linux": {{"resources": {{"cpu": {{"shares": 1536, "quota": 150000, "period": 100000}}}}}}}}"#,
            guaranteed.uid
        )
        .as_bytes(),
        1536,
        150_000,
    );
    // Deeply nested, in a field the agent does not read and in one it does.
    let deep = format!("{}{}", "[".repeat(200_000), "]".repeat(200_000));
    let nested_unread = raw_container(
        &node,
        &guaranteed,
        format!(r#"{{"process": {deep}}}"#).as_bytes(),
        1024,
        100_000,
    );
    let nested_read = raw_container(
        &node,
        &guaranteed,
        format!(r#"{{"annotations": {{"x": {deep}}}}}"#).as_bytes(),
        1024,
        100_000,
    );
    // Wrong types everywhere.
    let mistyped = raw_container(
        &node,
        &guaranteed,
        br#"{"annotations": 5, "linux": {"resources": {"cpu": {"shares": "many", "quota": [], "period": -3}}}}"#,
        1024,
        100_000,
    );
    // Huge: 5 MiB.
    let mut huge = b"{\"annotations\": {\"pad\": \"".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 5 << 20));
    huge.extend(b"\"}}");
    let big = raw_container(&node, &guaranteed, &huge, 1024, 100_000);

    let status = node.settled(now_ms(), |s| s.containers.len() >= 8);
    assert!(!row(&status, &greedy).exclusive, "{status:?}");
    assert!(!row(&status, &fractional).exclusive, "{status:?}");
    // The others are classified from their cgroup files: 1 whole CPU each, so exclusive.
    for id in [&nested_unread, &nested_read, &mistyped, &big] {
        assert!(row(&status, id).exclusive, "{id}: {status:?}");
    }
    // Every exclusive set is disjoint from the others and from the shared pool.
    let shared = CpuSet::parse(&status.shared_pool).unwrap();
    let mut seen = CpuSet::new();
    for r in status.containers.iter().filter(|r| r.exclusive) {
        let set = CpuSet::parse(r.current.as_deref().unwrap()).unwrap();
        assert!(
            set.is_disjoint(&seen) && set.is_disjoint(&shared),
            "{status:?}"
        );
        seen.extend_from(&set);
    }
    node.assert_running();
    no_panic(&node);
}

#[test]
fn damaged_checkpoints_at_start_are_set_aside_and_no_pin_is_lost() {
    let (mut node, _p, id, cpus) = pinned_node();
    let state = node.state_dir().join("state.json");
    let good = fs::read(&state).unwrap();
    let text = String::from_utf8(good.clone()).unwrap();
    let LoadOutcome::Loaded(loaded) = checkpoint::load(&node.state_dir()) else {
        panic!("the agent's checkpoint does not load")
    };
    let mut foreign = loaded.clone();
    foreign.online = CpuSet::range(0, 63);
    foreign.shared_pool.extend_from(&CpuSet::range(8, 63));
    let damaged: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "truncated",
            good[..good.len() / 2].to_vec(),
            "is unusable: it is not JSON or is truncated",
        ),
        (
            "wrong checksum",
            text.replacen("\"reserved\": \"0\"", "\"reserved\": \"1\"", 1)
                .into_bytes(),
            "is unusable: wrong checksum",
        ),
        (
            "future version",
            text.replacen("\"version\": 3", "\"version\": 99", 1)
                .into_bytes(),
            "written by a newer cpusetd (format version 99",
        ),
        ("empty", Vec::new(), "is unusable"),
        ("cpus that do not exist", Vec::new(), "are no longer online"),
    ];
    for (what, bytes, message) in damaged {
        node.stop();
        if what == "cpus that do not exist" {
            checkpoint::save(&node.state_dir(), &foreign).unwrap();
        } else {
            fs::write(&state, &bytes).unwrap();
        }
        let log_before = node.log_text().len();
        let started = now_ms();
        node.start();
        let status = node.settled(started, |s| {
            s.containers
                .iter()
                .any(|r| r.container_id.as_deref() == Some(id.as_str()))
        });
        assert_eq!(
            row(&status, &id).current.as_deref(),
            Some(cpus.as_str()),
            "{what}"
        );
        assert!(row(&status, &id).exclusive, "{what}");
        let log = node.log_text()[log_before..].to_string();
        assert_eq!(
            log.lines().filter(|l| l.contains(message)).count(),
            1,
            "{what}: {log}"
        );
        assert!(matches!(
            checkpoint::load(&node.state_dir()),
            LoadOutcome::Loaded(_)
        ));
    }
    let quarantined = fs::read_dir(node.state_dir())
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            let name = name.to_string_lossy();
            name.contains(".corrupt-") && !name.ends_with(".reason")
        })
        .count();
    assert_eq!(quarantined, 4);
    node.assert_running();
    no_panic(&node);
}

#[test]
fn flags_out_of_range_are_refused_naming_the_flag() {
    let node = TestNode::small();
    let run = |extra: &[&str], drop_flag: Option<&str>| {
        let mut args = node.run_args();
        if let Some(flag) = drop_flag {
            let at = args.iter().position(|a| a == flag).unwrap();
            args.drain(at..at + 2);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        Command::new(env!("CARGO_BIN_EXE_cpusetd"))
            .args(&args)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    };
    let file_as_state_dir = node.base.join("not-a-dir");
    fs::write(&file_as_state_dir, "").unwrap();
    let cases: Vec<(Vec<&str>, Option<&str>, &str)> = vec![
        (
            vec!["--cpu-manager-reconcile-period", "0s"],
            None,
            "--cpu-manager-reconcile-period",
        ),
        (
            vec!["--cpu-manager-reconcile-period=-1s"],
            None,
            "--cpu-manager-reconcile-period",
        ),
        (
            vec!["--cpu-manager-reconcile-period", "9999999999h"],
            None,
            "--cpu-manager-reconcile-period",
        ),
        (
            vec!["--reserved-cpu-count", "0"],
            Some("--reserved-cpus"),
            "--reserved-cpu-count",
        ),
        (
            vec!["--reserved-cpu-count", "100"],
            Some("--reserved-cpus"),
            "unable to reserve",
        ),
        (
            vec!["--reserved-cpu-count", "99999999999"],
            Some("--reserved-cpus"),
            "--reserved-cpu-count",
        ),
        (
            vec!["--reserved-cpus", "0-99999"],
            Some("--reserved-cpus"),
            "--reserved-cpus",
        ),
        (
            vec!["--reserved-cpus=-3"],
            Some("--reserved-cpus"),
            "--reserved-cpus",
        ),
        (
            vec![
                "--reserved-cpus",
                "0-7",
                "--cpu-manager-policy-options",
                "strict-cpu-reservation=true",
            ],
            Some("--reserved-cpus"),
            "no cpu is left for pods",
        ),
        // (`--kubepods-path /etc` names a cgroup `etc` that does not exist: the agent waits
        // for it as for any kubepods cgroup kubelet has not made yet; see
        // agent::agent_waits_for_a_kubepods_cgroup_kubelet_has_not_made_yet.)
    ];
    for (extra, drop_flag, needle) in cases {
        let out = run(&extra, drop_flag);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            matches!(out.status.code(), Some(2 | 78)),
            "{extra:?}: {:?} {stderr}",
            out.status
        );
        assert!(stderr.contains(needle), "{extra:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{extra:?}: {stderr}");
    }
    // A state directory that is a file: a configuration error naming it (issue 23, item 23).
    let out = run(
        &["--state-dir", file_as_state_dir.to_str().unwrap()],
        Some("--state-dir"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("not-a-dir"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
