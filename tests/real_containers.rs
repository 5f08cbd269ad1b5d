//! End-to-end tests of `cpusetd plan --apply` on this machine's cgroup v1 hierarchies, run the
//! way an operator would: against real containers started with runc, and against a
//! kubepods-like subtree made by hand where a parent must shrink under its children (the
//! kernel refuses a wrong write order with EBUSY, so passing proves the order). Each test works
//! in its own uniquely named subtree and removes it, and its containers, whatever happens.
//! Skipped with a printed reason where the machine cannot run them (see `runc`).

use std::fs;
use std::path::Path;
use std::process::Output;

use cpusetd::cpuset::CpuSet;

use crate::runc::{
    container_id, controller_mount, kernel_skip_reason, online_cpus, pod_uid, runc_skip_reason,
    CpuResources, E2eTree, Runc,
};
use crate::util::{cpusetd, stderr, stdout};

/// The folder holding the v1 controller mounts, as `--cgroup-root`.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// `cpusetd plan` on the kubepods root `kubepods` (relative to each controller mount) with CPU
/// 0 reserved and no runtime configs to find.
fn plan(kubepods: &str, scratch: &Path, extra: &[&str]) -> Output {
    let no_configs = format!("{}/no-runtime/{{id}}/config.json", scratch.display());
    let mut args = vec![
        "plan",
        "--cgroup-root",
        CGROUP_ROOT,
        "--kubepods-path",
        kubepods,
        "--reserved-cpus",
        "0",
        "--runtime-config-path",
        &no_configs,
    ];
    args.extend_from_slice(extra);
    cpusetd(&args)
}

/// Applies a plan, checks it succeeded, and shows what it did.
fn apply(kubepods: &str, scratch: &Path) {
    let out = plan(kubepods, scratch, &["--apply"]);
    println!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// A second plan after `--apply` has nothing left to write.
fn assert_no_more_writes(kubepods: &str, scratch: &Path) {
    let out = plan(kubepods, scratch, &["--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|err| panic!("plan --json: {err}: {}", stdout(&out)));
    assert_eq!(doc["writes"], serde_json::json!([]), "{doc:#}");
}

fn read(dir: &Path, file: &str) -> String {
    let path = dir.join(file);
    fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("{}: {err}", path.display()))
        .trim()
        .to_string()
}

fn write(dir: &Path, file: &str, value: &str) {
    let path = dir.join(file);
    fs::write(&path, value).unwrap_or_else(|err| panic!("{value:?} > {}: {err}", path.display()));
}

fn cpuset_cpus(dir: &Path) -> CpuSet {
    CpuSet::parse(&read(dir, "cpuset.cpus")).unwrap()
}

/// The one exclusive CPU a single-CPU Guaranteed container should get with CPU 0 reserved,
/// checked loosely (any CPU but 0), and the shared pool that leaves.
fn exclusive_and_shared(exclusive: &CpuSet) -> CpuSet {
    assert_eq!(exclusive.len(), 1, "exclusive set {exclusive}");
    assert!(
        !exclusive.contains(0),
        "reserved cpu 0 handed out: {exclusive}"
    );
    online_cpus().difference(exclusive)
}

#[test]
fn real_containers_get_exclusive_and_shared_cpus() {
    if let Some(reason) = runc_skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let online = online_cpus();
    let mut runc = Runc::new();
    let guaranteed = runc.start(&format!("pod{}", pod_uid()), CpuResources::guaranteed(1));
    let best_effort = runc.start(
        &format!("besteffort/pod{}", pod_uid()),
        CpuResources::best_effort(),
    );
    assert_eq!(guaranteed.cpus_allowed(), online);
    assert_eq!(best_effort.cpus_allowed(), online);
    let kubepods = runc.tree().kubepods();

    apply(&kubepods, runc.scratch());

    let exclusive = cpuset_cpus(&runc.tree().dir("cpuset", &guaranteed.cgroup));
    let shared = exclusive_and_shared(&exclusive);
    if online == CpuSet::range(0, 1) {
        assert_eq!(exclusive, CpuSet::range(1, 1));
    }
    assert_eq!(guaranteed.wait_cpus_allowed(&exclusive), exclusive);
    assert_eq!(best_effort.wait_cpus_allowed(&shared), shared);
    let guaranteed_cpu = runc.tree().dir("cpu", &guaranteed.cgroup);
    assert_eq!(read(&guaranteed_cpu, "cpu.cfs_quota_us"), "-1");
    assert_eq!(read(&guaranteed_cpu, "cpu.shares"), "1024");

    assert_no_more_writes(&kubepods, runc.scratch());
    assert_eq!(guaranteed.cpus_allowed(), exclusive);
    assert_eq!(best_effort.cpus_allowed(), shared);
}

#[test]
fn real_kernel_accepts_the_write_order_when_parents_shrink_under_children() {
    if let Some(reason) = kernel_skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let tree = E2eTree::new();
    let guaranteed_pod = format!("pod{}", pod_uid());
    let guaranteed = format!("{guaranteed_pod}/{}", container_id());
    let best_effort_pod = format!("besteffort/pod{}", pod_uid());
    let best_effort = format!("{best_effort_pod}/{}", container_id());

    // The subtree's top, then every level below it, all on every CPU, the way a runtime
    // leaves them: a fresh v1 cpuset is empty until its mems and cpus are copied down.
    let cpuset_mount = controller_mount("cpuset").unwrap();
    let all_cpus = read(&cpuset_mount, "cpuset.cpus");
    let all_mems = read(&cpuset_mount, "cpuset.mems");
    let top = cpuset_mount.join(tree.name());
    fs::create_dir(&top).unwrap();
    write(&top, "cpuset.mems", &all_mems);
    write(&top, "cpuset.cpus", &all_cpus);
    let levels = [
        "",
        "besteffort",
        &best_effort_pod,
        &best_effort,
        &guaranteed_pod,
        &guaranteed,
    ];
    for rel in levels {
        let dir = tree.dir("cpuset", rel);
        fs::create_dir(&dir).unwrap();
        write(&dir, "cpuset.mems", &all_mems);
        write(&dir, "cpuset.cpus", &all_cpus);
        fs::create_dir_all(tree.dir("cpu", rel)).unwrap();
    }
    let guaranteed_cpu = tree.dir("cpu", &guaranteed);
    write(&guaranteed_cpu, "cpu.shares", "1024");
    write(&guaranteed_cpu, "cpu.cfs_period_us", "100000");
    write(&guaranteed_cpu, "cpu.cfs_quota_us", "100000");
    write(&tree.dir("cpu", &best_effort), "cpu.shares", "2");

    apply(&tree.kubepods(), scratch.path());

    let exclusive = cpuset_cpus(&tree.dir("cpuset", &guaranteed));
    let shared = exclusive_and_shared(&exclusive);
    if online_cpus() == CpuSet::range(0, 1) {
        assert_eq!(exclusive, CpuSet::range(1, 1));
    }
    let all = CpuSet::parse(&all_cpus).unwrap();
    let expected = [
        ("", &all),
        ("besteffort", &shared),
        (&best_effort_pod, &shared),
        (&best_effort, &shared),
        (&guaranteed_pod, &exclusive),
        (&guaranteed, &exclusive),
    ];
    for (rel, cpus) in expected {
        assert_eq!(
            &cpuset_cpus(&tree.dir("cpuset", rel)),
            cpus,
            "kubepods/{rel}"
        );
    }
    assert_eq!(read(&guaranteed_cpu, "cpu.cfs_quota_us"), "-1");

    assert_no_more_writes(&tree.kubepods(), scratch.path());
}
