//! `cpusetd topology` on every fake machine in testdata/sysfs, on this machine, and on bad input.

use std::fs;
use std::path::Path;

use crate::util::{copy_tree, cpusetd, stderr, stdout, testdata};

fn fixture_names() -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(testdata("sysfs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("expected.json").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn topology_json(sysfs: &Path, proc: Option<&Path>) -> serde_json::Value {
    let sysfs = sysfs.to_str().unwrap();
    let mut args = vec!["topology", "--json", "--sysfs-root", sysfs];
    let proc = proc.map(|p| p.to_str().unwrap().to_string());
    if let Some(p) = &proc {
        args.extend(["--proc-root", p]);
    }
    let out = cpusetd(&args);
    assert!(out.status.success(), "{sysfs}: {}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{sysfs}: {e}"))
}

#[test]
fn every_fixture_prints_its_expected_document() {
    let names = fixture_names();
    assert!(names.len() >= 9, "fixtures missing: {names:?}");
    for name in &names {
        let root = testdata(&format!("sysfs/{name}"));
        let expected: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(root.join("expected.json")).unwrap()).unwrap();
        let got = topology_json(&root, Some(&root.join("proc")));
        assert_eq!(got, expected, "fixture {name}");
    }
}

#[test]
fn isolated_cpus_come_from_the_command_line_too() {
    // nohz-full's sysfs `isolated` file is empty: everything comes from its command line,
    // `isolcpus=nohz,2 nohz_full=3,7`: tick isolation only, so nothing is domain-isolated
    // (issue 17, item 28: nohz_full CPUs are the ones meant for pinned pods).
    let root = testdata("sysfs/nohz-full");
    let with_cmdline = topology_json(&root, Some(&root.join("proc")));
    assert_eq!(with_cmdline["isolated"], "");
    assert_eq!(with_cmdline["nohz_full"], "2-3,7");
    let tmp = tempfile::tempdir().unwrap();
    fs::write(
        tmp.path().join("cmdline"),
        "ro isolcpus=domain,managed_irq,1-2 nohz_full=5\n",
    )
    .unwrap();
    let domain = topology_json(&root, Some(tmp.path()));
    assert_eq!(domain["isolated"], "1-2");
    assert_eq!(domain["nohz_full"], "5");
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("cmdline"), "ro quiet\n").unwrap();
    let without = topology_json(&root, Some(tmp.path()));
    assert_eq!(without["isolated"], "");
}

#[test]
fn hybrid_cores_keep_their_real_thread_counts() {
    let root = testdata("sysfs/hybrid-pe");
    let doc = topology_json(&root, Some(&root.join("proc")));
    let cpus = doc["cpus"].as_array().unwrap();
    let threads_of = |core: u64| cpus.iter().filter(|c| c["core"] == core).count();
    assert_eq!(threads_of(0), 2, "P-core 0 has two threads");
    assert_eq!(threads_of(16), 1, "E-core 16 has one thread");
    let out = cpusetd(&[
        "topology",
        "--sysfs-root",
        root.to_str().unwrap(),
        "--proc-root",
        root.join("proc").to_str().unwrap(),
    ]);
    assert!(
        stdout(&out).contains("1-2 threads per core (heterogeneous cores)"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn the_tree_marks_isolated_and_offline_cpus() {
    let root = testdata("sysfs/isolcpus");
    let proc = root.join("proc");
    let out = cpusetd(&[
        "topology",
        "--sysfs-root",
        root.to_str().unwrap(),
        "--proc-root",
        proc.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let text = stdout(&out);
    assert!(text.contains("core 2: 2 (isolated), 6"), "{text}");
    assert!(text.contains("isolated: 2-5"), "{text}");

    let root = testdata("sysfs/offline-holes");
    let proc = root.join("proc");
    let out = cpusetd(&[
        "topology",
        "--sysfs-root",
        root.to_str().unwrap(),
        "--proc-root",
        proc.to_str().unwrap(),
    ]);
    assert!(
        stdout(&out).contains("offline: 5,13,32"),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains("numa 1 (no memory)"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn this_machine_is_read_from_the_real_sys() {
    if !Path::new("/sys/devices/system/cpu/online").exists() {
        eprintln!("skipped: no /sys/devices/system/cpu/online on this machine");
        return;
    }
    let doc = topology_json(Path::new("/sys"), None);
    let online = fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let online = cpusetd::cpuset::CpuSet::parse(&online).unwrap();
    let ids: cpusetd::cpuset::CpuSet = doc["cpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ids, online);
}

/// A fresh copy of a fixture in a temporary directory, for tests that damage it.
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let dst = tempfile::tempdir().unwrap();
    copy_tree(&testdata(&format!("sysfs/{name}")), dst.path());
    dst
}

#[test]
fn garbage_and_missing_files_are_named() {
    let copy = copy_fixture("1s-4c-ht");
    let root = copy.path().to_path_buf();
    let proc = root.join("proc");
    let args = |root: &Path| {
        vec![
            "topology".to_string(),
            "--sysfs-root".into(),
            root.to_str().unwrap().into(),
            "--proc-root".into(),
            proc.to_str().unwrap().into(),
        ]
    };
    let run = |root: &Path| {
        let a = args(root);
        cpusetd(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };

    let file = root.join("devices/system/cpu/cpu3/topology/physical_package_id");
    fs::write(&file, "zero\n").unwrap();
    let out = run(&root);
    // A sysfs that cannot be read is the flag's fault, as for `plan` (issue 23, item 23).
    assert_eq!(out.status.code(), Some(2));
    let msg = stderr(&out);
    assert!(
        msg.contains(file.to_str().unwrap()) && msg.contains("\"zero\""),
        "{msg}"
    );

    fs::remove_file(&file).unwrap();
    let out = run(&root);
    assert_eq!(out.status.code(), Some(2));
    let msg = stderr(&out);
    assert!(
        msg.contains("cannot read socket id from") && msg.contains("physical_package_id"),
        "{msg}"
    );
    fs::write(&file, "0\n").unwrap();

    let online = root.join("devices/system/cpu/online");
    fs::write(&online, "0-3,\n").unwrap();
    let out = run(&root);
    assert_eq!(out.status.code(), Some(2));
    let msg = stderr(&out);
    assert!(
        msg.contains("invalid online cpu list in") && msg.contains("\"0-3,\\n\""),
        "{msg}"
    );
    fs::write(&online, "0-7\n").unwrap();

    // A parameter the kernel would ignore is ignored and said, never an error.
    fs::write(proc.join("cmdline"), "ro isolcpus=domain,x\n").unwrap();
    let out = run(&root);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("isolcpus=domain,x ignored"),
        "{}",
        stderr(&out)
    );

    let out = cpusetd(&["topology", "--sysfs-root", "/nonexistent-sysfs"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--sysfs-root /nonexistent-sysfs"));
    let out = cpusetd(&["topology", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));
}

/// `topology --map` on every fixture: the committed snapshot (`testdata/maps/<name>.txt`; regenerate
/// with `CPUSETD_BLESS=1` after a deliberate change), no line over 120 columns, every online
/// CPU once, and plain text when not writing to a terminal.
#[test]
fn every_fixture_draws_its_map() {
    let bless = std::env::var_os("CPUSETD_BLESS").is_some();
    for name in fixture_names() {
        let root = testdata(&format!("sysfs/{name}"));
        let proc = root.join("proc");
        let out = cpusetd(&[
            "topology",
            "--map",
            "--sysfs-root",
            root.to_str().unwrap(),
            "--proc-root",
            proc.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let map = stdout(&out);
        assert!(!map.contains('\x1b'), "{name}: colour without a terminal");
        assert!(
            map.lines().all(|l| l.chars().count() <= 120),
            "{name}:\n{map}"
        );
        let expected: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(root.join("expected.json")).unwrap()).unwrap();
        // Online cpus in their place, offline ones (`X`) in a block of their own.
        let offline = expected["offline"].as_str().map_or(0, |list| {
            cpusetd::cpuset::CpuSet::parse(list).unwrap().len()
        });
        let online = expected["cpus"].as_array().unwrap().len() + offline;
        let drawn: usize = map
            .lines()
            .filter(|l| l.starts_with("  ["))
            .map(|l| l.replace(['[', ']'], " ").split_whitespace().count())
            .sum();
        assert_eq!(drawn, online, "{name}:\n{map}");
        let snapshot = testdata(&format!("maps/{name}.txt"));
        if bless {
            fs::write(&snapshot, &map).unwrap();
        }
        let want = fs::read_to_string(&snapshot)
            .unwrap_or_else(|e| panic!("{}: {e} (CPUSETD_BLESS=1 writes it)", snapshot.display()));
        assert_eq!(
            map,
            want,
            "{name}: the map differs from {}",
            snapshot.display()
        );
    }
}

/// Issue 28, item 1: the core types of a hybrid part, from the kernel's hybrid PMUs
/// (`devices/cpu_core/cpus`, `devices/cpu_atom/cpus`) or, without them, from
/// `cpuN/cpu_capacity` (the highest capacity is the performance type), in the document, the
/// tree and the map. Garbage in either is an error naming the file.
#[test]
fn hybrid_core_types_are_read_and_shown() {
    let copy = copy_fixture("hybrid-pe");
    let root = copy.path().to_path_buf();
    let proc = root.join("proc");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "topology",
            "--sysfs-root",
            root.to_str().unwrap(),
            "--proc-root",
            proc.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        cpusetd(&args)
    };
    let check = |why: &str| {
        let doc: serde_json::Value = serde_json::from_str(&stdout(&run(&["--json"]))).unwrap();
        assert_eq!(doc["core_types"]["performance"], "0-15", "{why}");
        assert_eq!(doc["core_types"]["efficient"], "16-23", "{why}");
        let tree = stdout(&run(&[]));
        assert!(
            tree.contains(
                "core types: performance cpus 0-15 (8 cores), efficient cpus 16-23 (8 cores)"
            ) && tree.contains("core 2 (performance): 2, 3")
                && tree.contains("core 16 (efficient): 16"),
            "{why}: {tree}"
        );
        let map = stdout(&run(&["--map"]));
        assert!(
            map.contains("L3 0 · performance cores · cpus 0-15")
                && map.contains("L3 0 · efficient cores · cpus 16-23"),
            "{why}: {map}"
        );
    };
    check("hybrid PMUs");
    fs::remove_dir_all(root.join("devices/cpu_core")).unwrap();
    fs::remove_dir_all(root.join("devices/cpu_atom")).unwrap();
    let doc = stdout(&run(&["--json"]));
    assert!(!doc.contains("core_types"), "one core type: {doc}");
    for cpu in 0..24 {
        let capacity = if cpu < 16 { "1024\n" } else { "384\n" };
        let file = root.join(format!("devices/system/cpu/cpu{cpu}/cpu_capacity"));
        fs::write(file, capacity).unwrap();
    }
    check("cpu_capacity");
    let file = root.join("devices/system/cpu/cpu5/cpu_capacity");
    fs::write(&file, "big\n").unwrap();
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains(file.to_str().unwrap()) && stderr(&out).contains("cpu capacity"),
        "{}",
        stderr(&out)
    );
}
