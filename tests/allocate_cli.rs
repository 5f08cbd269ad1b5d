//! `cpusetd allocate` as an operator runs it: topology from a JSON document or a sysfs tree,
//! kubelet's placements and error texts, exit codes 0 / 1 / 2.

use std::fs;

use crate::util::{cpusetd, stderr, stdout, testdata};

/// The topology document of a fixture machine, written by `cpusetd topology --json`.
fn topology_file(name: &str) -> tempfile::NamedTempFile {
    let root = testdata(&format!("sysfs/{name}"));
    let out = cpusetd(&[
        "topology",
        "--json",
        "--sysfs-root",
        root.to_str().unwrap(),
        "--proc-root",
        root.join("proc").to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let file = tempfile::NamedTempFile::new().unwrap();
    fs::write(file.path(), &out.stdout).unwrap();
    file
}

fn allocate(topology: &tempfile::NamedTempFile, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["allocate", "--topology", topology.path().to_str().unwrap()];
    args.extend_from_slice(extra);
    cpusetd(&args)
}

#[test]
fn two_cpus_are_the_two_threads_of_one_core() {
    let topo = topology_file("1s-4c-ht");
    let out = allocate(&topo, &["--count", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "0,4\n");
    // With CPU 0 reserved, core 0 is broken: the next whole core.
    let out = allocate(&topo, &["--count", "2", "--reserved-cpus", "0"]);
    assert_eq!(stdout(&out), "1,5\n");
}

#[test]
fn full_pcpus_only_refuses_an_odd_request_with_kubelets_text() {
    let topo = topology_file("1s-4c-ht");
    let out = allocate(
        &topo,
        &[
            "--count",
            "3",
            "--cpu-manager-policy-options",
            "full-pcpus-only=true",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2\n"
    );
}

#[test]
fn not_enough_cpus_uses_kubelets_text() {
    let topo = topology_file("1s-4c-ht");
    let out = allocate(&topo, &["--count", "5", "--available", "0,2,4,6"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "not enough cpus available to satisfy request: requested=5, available=4\n"
    );
}

#[test]
fn the_shared_pool_is_never_emptied() {
    let topo = topology_file("1s-4c-ht");
    let out = allocate(&topo, &["--count", "2", "--available", "1,5"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("would leave the shared pool empty"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn usage_errors_exit_2_naming_the_flag() {
    let topo = topology_file("1s-4c-ht");
    let cases: &[(&[&str], &str)] = &[
        (
            &["--count", "2", "--cpu-manager-policy-options", "full-pcpus-only=true,distribute-cpus-across-cores=true"],
            "--cpu-manager-policy-options: policy options full-pcpus-only and distribute-cpus-across-cores can not be used at the same time",
        ),
        (
            &["--count", "2", "--cpu-manager-policy-options", "no-such-option=true"],
            "--cpu-manager-policy-options: unknown cpu manager policy option \"no-such-option\"",
        ),
        (
            &["--count", "2", "--cpu-manager-policy-options", "full-pcpus-only=yes"],
            "--cpu-manager-policy-options: bad value \"yes\"",
        ),
        (&["--count", "2", "--available", "1-"], "--available <LIST>"),
        (&["--count", "2", "--available", "0-15"], "--available: cpus 8-15 are not online cpus"),
        (&["--count", "2", "--numa-hint", "3"], "--numa-hint: NUMA nodes 3 are not in the topology"),
        (&["--count", "0"], "--count <N>"),
        (&["--count", "2", "--reserved-cpus", "0", "--reserved-cpu-count", "1"], "cannot be used with"),
    ];
    for (args, needle) in cases {
        let out = allocate(&topo, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
    }
    let out = cpusetd(&["allocate", "--count", "2"]);
    assert_eq!(out.status.code(), Some(2));
    let out = cpusetd(&[
        "allocate",
        "--count",
        "2",
        "--topology",
        "/nonexistent.json",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--topology /nonexistent.json: cannot read"));
}

#[test]
fn numa_hint_and_sysfs_source() {
    let root = testdata("sysfs/2s-8c-ht-2numa");
    let sysfs = root.to_str().unwrap();
    let proc = root.join("proc");
    let out = cpusetd(&[
        "allocate",
        "--sysfs-root",
        sysfs,
        "--proc-root",
        proc.to_str().unwrap(),
        "--count",
        "2",
        "--numa-hint",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // NUMA node 1 is socket 1: cpus 4-7,12-15; its first core is 4,12.
    assert_eq!(stdout(&out), "4,12\n");
}

#[test]
fn respect_isolcpus_keeps_isolated_cpus_out() {
    let root = testdata("sysfs/isolcpus");
    let proc = root.join("proc");
    let base = [
        "allocate",
        "--sysfs-root",
        root.to_str().unwrap(),
        "--proc-root",
        proc.to_str().unwrap(),
        "--count",
        "4",
        "--reserved-cpus",
        "0",
    ];
    let out = cpusetd(&base);
    assert_eq!(stdout(&out), "1-2,5-6\n", "{}", stderr(&out));
    let mut with_flag = base.to_vec();
    with_flag.push("--respect-isolcpus");
    let out = cpusetd(&with_flag);
    // 2-5 isolated, 0 reserved: only 1,6,7 remain: not enough for 4.
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stderr(&out).starts_with("not enough cpus available"),
        "{}",
        stderr(&out)
    );
}

/// Issue 17, item 27: an offline SMT sibling (cpu 32, core 40's other thread) does not make
/// core 40 a free whole core: two cpus come from one whole core (33,41), not a split (33,40).
#[test]
fn an_offline_sibling_does_not_make_a_half_core_whole() {
    let sysfs = testdata("sysfs/offline-holes");
    let out = cpusetd(&[
        "allocate",
        "--sysfs-root",
        sysfs.to_str().unwrap(),
        "--proc-root",
        sysfs.join("proc").to_str().unwrap(),
        "--reserved-cpus",
        "0",
        "--available",
        "33-47",
        "--count",
        "2",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "33,41");
}

/// `--placement best-fit` (issue 16): node 1 has two free cores, node 0 four. kubelet's
/// algorithm fills node 1 and spills into node 0; best fit takes the six from node 0, with and
/// without `full-pcpus-only`. `--placement kubelet` is the default.
#[test]
fn best_fit_placement_keeps_a_request_in_the_numa_node_that_holds_it() {
    let topo = topology_file("2s-8c-ht-2numa");
    let base = ["--count", "6", "--available", "0-5,8-13"];
    let run = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let out = allocate(&topo, &args);
        assert_eq!(out.status.code(), Some(0), "{extra:?}: {}", stderr(&out));
        stdout(&out)
    };
    assert_eq!(run(&[]), "0,4-5,8,12-13\n");
    assert_eq!(run(&["--placement", "kubelet"]), "0,4-5,8,12-13\n");
    assert_eq!(run(&["--placement", "best-fit"]), "0-2,8-10\n");
    let full = ["--cpu-manager-policy-options", "full-pcpus-only=true"];
    assert_eq!(run(&full), "0,4-5,8,12-13\n");
    assert_eq!(
        run(&[&full[..], &["--placement", "best-fit"]].concat()),
        "0-2,8-10\n"
    );
}

#[test]
fn a_bad_placement_exits_2_with_the_choices() {
    let topo = topology_file("2s-8c-ht-2numa");
    let out = allocate(&topo, &["--count", "2", "--placement", "bestfit"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("invalid value 'bestfit' for '--placement <PLACEMENT>'")
            && err.contains("[possible values: kubelet, best-fit]"),
        "{err}"
    );
    // Best fit packs: the options that spread are refused, naming both flags.
    let out = allocate(
        &topo,
        &[
            "--count",
            "2",
            "--placement",
            "best-fit",
            "--cpu-manager-policy-options",
            "distribute-cpus-across-cores=true",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        "cpusetd: --placement: placement best-fit packs each container into the tightest \
         cache, NUMA node or socket; it cannot be used with policy option \
         distribute-cpus-across-cores, which spreads cpus\n"
    );
}

/// Issue 23 item 3: a NUMA node id past the largest cpu id panicked (`cpu id 9000 out of
/// range`, exit 101) where node ids are kept as a set; it is an error in the document.
#[test]
fn a_numa_node_id_past_the_largest_is_a_usage_error_not_a_panic() {
    let file = tempfile::NamedTempFile::new().unwrap();
    fs::write(
        file.path(),
        r#"{"cpus":[{"id":0,"socket":0,"numa":9000,"core":0,"uncore":0}],"memory_nodes":"0"}"#,
    )
    .unwrap();
    let out = allocate(&file, &["--count", "1", "--numa-hint", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("numa node 9000 is larger than the largest supported id 8191"),
        "{}",
        stderr(&out)
    );
}

/// Issue 23 item 7: `--topology /dev/zero` was read whole (1.86 GB after 3 s, never
/// returning); the document is read up to a limit, and the error names it.
#[test]
fn an_endless_topology_file_is_refused_at_its_limit() {
    let out = cpusetd(&["allocate", "--topology", "/dev/zero", "--count", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--topology /dev/zero: larger than the 16 MiB limit"),
        "{}",
        stderr(&out)
    );
}

/// Issue 28, item 2: on a socket of two dies (2s-8c-ht-2die: socket 0 is die 0 = cores 0-1
/// and die 1 = cores 2-3), with cpu 0 reserved, 4 cpus fit on die 1's two whole cores. Best
/// fit keeps them there; kubelet's algorithm (the default, unchanged) takes cores 1 and 2,
/// across both dies. The same with die ids numbered across the machine, as Linux 6.12 does:
/// a die is its socket and its die id together.
#[test]
fn best_fit_keeps_a_request_within_one_die() {
    let topo = topology_file("2s-8c-ht-2die");
    let base = ["--count", "4", "--reserved-cpu-count", "1"];
    let run = |topo: &tempfile::NamedTempFile, extra: &[&str]| {
        let out = allocate(topo, &[&base[..], extra].concat());
        assert_eq!(out.status.code(), Some(0), "{extra:?}: {}", stderr(&out));
        stdout(&out)
    };
    assert_eq!(run(&topo, &[]), "1-2,9-10\n");
    assert_eq!(run(&topo, &["--placement", "best-fit"]), "2-3,10-11\n");
    // Socket 1's dies renumbered 2 and 3 (ids unique across the machine).
    let doc: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(topo.path()).unwrap()).unwrap();
    let mut renumbered = doc.clone();
    for cpu in renumbered["cpus"].as_array_mut().unwrap() {
        if cpu["socket"] == 1 {
            cpu["die"] = (cpu["die"].as_u64().unwrap() + 2).into();
        }
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    fs::write(file.path(), renumbered.to_string()).unwrap();
    assert_eq!(run(&file, &["--placement", "best-fit"]), "2-3,10-11\n");
    // Socket 1 taken but for one core of each die: 4 cpus still stay in socket 0's die 1.
    let out = allocate(
        &topo,
        &[
            "--count",
            "4",
            "--reserved-cpus",
            "0",
            "--available",
            "0-4,6,8-12,14",
            "--placement",
            "best-fit",
        ],
    );
    assert_eq!(stdout(&out), "2-3,10-11\n", "{}", stderr(&out));
}

/// Issue 28, item 1: on a hybrid part (hybrid-pe: P-cores 0-15 with two threads, E-cores
/// 16-23) best fit gives exclusive cpus from performance cores first, and from efficient cores
/// with `--core-type efficient` (the `cpusetd.io/core-type` pod annotation); where the
/// preferred type cannot hold the request, from both. kubelet's algorithm (the default) is
/// unchanged: it takes E-cores first (its cpus-per-core is 24 / 16 = 1, so every single-thread
/// E-core is a "whole core" with the fewest free cpus).
#[test]
fn best_fit_prefers_performance_cores_on_a_hybrid_part() {
    let topo = topology_file("hybrid-pe");
    let run = |args: &[&str]| {
        let out = allocate(&topo, args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        stdout(&out)
    };
    let best = ["--placement", "best-fit"];
    assert_eq!(run(&["--count", "2"]), "16-17\n");
    assert_eq!(run(&["--count", "1"]), "16\n");
    assert_eq!(run(&[&["--count", "1"][..], &best].concat()), "0\n");
    assert_eq!(run(&[&["--count", "2"][..], &best].concat()), "0-1\n");
    assert_eq!(run(&[&["--count", "3"][..], &best].concat()), "0-2\n");
    // An odd request pairs with a half-used P-core's thread first.
    assert_eq!(
        run(&[&["--count", "3", "--available", "1-23"][..], &best].concat()),
        "1-3\n"
    );
    let efficient = ["--core-type", "efficient"];
    assert_eq!(
        run(&[&["--count", "2"][..], &best, &efficient].concat()),
        "16-17\n"
    );
    // Two P-cores free: four cpus must mix types, and still go where best fit puts them.
    let mixed = run(&[&["--count", "6", "--available", "0-3,16-23"][..], &best].concat());
    assert_eq!(
        mixed
            .trim()
            .parse::<cpusetd::cpuset::CpuSet>()
            .unwrap()
            .len(),
        6
    );
    // Under kubelet's placement the core type is not asked about.
    assert_eq!(
        run(&[&["--count", "2"][..], &efficient].concat()),
        "16-17\n"
    );
    let out = allocate(&topo, &["--count", "2", "--core-type", "fast"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("[possible values: performance, efficient]"),
        "{}",
        stderr(&out)
    );
}
