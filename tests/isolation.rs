//! CRI-O's high-performance annotations on any runtime (`cpu-quota.crio.io`,
//! `irq-load-balancing.crio.io`, `cpu-load-balancing.crio.io`), read from the pod's annotations
//! in the runtime's config, for containers holding exclusive CPUs.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nix::sys::signal::Signal;

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::kubesim::{ContainerSpec, PodSpec, Qos};

use crate::agent_util::{pod, poll_until, AgentProcess, TestNode, DEADLINE};
use crate::util::{copy_tree, stderr, stdout, testdata};

#[test]
fn cpu_quota_annotation_lifts_the_quota_even_with_keep_cfs_quota() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&["--keep-cfs-quota"]);
    let fast = pod(
        "fast",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 1000)],
    );
    let plain = pod(
        "plain",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 1000)],
    );
    let odd = pod(
        "odd",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 1000)],
    );
    node.fake
        .annotate_pod(&fast.uid, &[("cpu-quota.crio.io", "disable")]);
    node.fake
        .annotate_pod(&odd.uid, &[("cpu-quota.crio.io", "yes please")]);
    let fast_id = node.fake.start_pod(&fast).unwrap().remove(0);
    let plain_id = node.fake.start_pod(&plain).unwrap().remove(0);
    let odd_id = node.fake.start_pod(&odd).unwrap().remove(0);
    node.wait_status("pinned", |s| s.exclusive_cpu_count == 3 && s.converged());
    let quota = |p, id| node.read(p, id, "cpu.cfs_quota_us");
    let lifted = poll_until(DEADLINE, || {
        (quota(&fast, &fast_id) == "-1" && quota(&fast, "") == "-1").then_some(())
    });
    assert!(
        lifted.is_some(),
        "{} {}",
        quota(&fast, &fast_id),
        quota(&fast, "")
    );
    // --keep-cfs-quota holds for the others; a value that means nothing is said once.
    assert_eq!(quota(&plain, &plain_id), "100000");
    assert_eq!(quota(&odd, &odd_id), "100000");
    assert_eq!(
        agent
            .log_lines("annotation cpu-quota.crio.io: \"yes please\" ignored")
            .len(),
        1,
        "{}",
        agent.log()
    );
    assert!(agent.stop().success());
    node.assert_clean();
}

/// A fake `/proc` for the node: kubelet's command line from the fixture, and an `irq`
/// directory with a default mask and three IRQs (one of them on a single CPU).
pub(crate) fn fake_proc(node: &TestNode) -> PathBuf {
    let proc = node.base.join("proc");
    copy_tree(&testdata("sysfs/2s-8c-ht-2numa/proc"), &proc);
    let irq = proc.join("irq");
    fs::create_dir_all(&irq).unwrap();
    fs::write(irq.join("default_smp_affinity"), "ffff\n").unwrap();
    for (n, list) in [(24, "0-15"), (25, "0-7"), (26, "8")] {
        fs::create_dir_all(irq.join(n.to_string())).unwrap();
        fs::write(
            irq.join(format!("{n}/smp_affinity_list")),
            format!("{list}\n"),
        )
        .unwrap();
    }
    proc
}

pub(crate) fn irq_file(proc: &Path, file: &str) -> String {
    fs::read_to_string(proc.join("irq").join(file))
        .unwrap()
        .trim()
        .to_string()
}

/// `cpusetd run` on the node with `proc` as its proc root.
pub(crate) fn start_with_proc(node: &TestNode, proc: &Path) -> AgentProcess {
    node.start_agent(&["--proc-root", proc.to_str().unwrap()])
}

/// A Guaranteed pod of `milli` CPU whose pod says `irq-load-balancing.crio.io: "disable"`,
/// started on the node; waits until IRQ 24 (on every CPU) is off the container's `cpus`.
pub(crate) fn start_irq_pod(
    node: &TestNode,
    proc: &Path,
    agent: &AgentProcess,
    milli: u64,
    irq_24: &str,
) -> (PodSpec, String) {
    let rt = pod(
        "rt",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("dpdk", milli)],
    );
    node.fake
        .annotate_pod(&rt.uid, &[("irq-load-balancing.crio.io", "disable")]);
    let id = node.fake.start_pod(&rt).unwrap().remove(0);
    let off = poll_until(DEADLINE, || {
        (irq_file(proc, "24/smp_affinity_list") == irq_24).then_some(())
    });
    assert!(off.is_some(), "{}", agent.log());
    (rt, id)
}

/// `cpusetd reset` on the node with `proc` as its proc root.
pub(crate) fn reset_with_proc(node: &TestNode, proc: &Path) -> Output {
    let mut args: Vec<String> = node.tree_args();
    let at = args.iter().position(|a| a == "--proc-root").unwrap();
    args[at + 1] = proc.display().to_string();
    Command::new(env!("CARGO_BIN_EXE_cpusetd"))
        .arg("reset")
        .args(&args)
        .output()
        .unwrap()
}

#[test]
fn irq_annotation_keeps_interrupts_off_the_cpus_and_gives_them_back() {
    let node = TestNode::new(CgroupVersion::V1);
    let proc = fake_proc(&node);
    let mut agent = start_with_proc(&node, &proc);
    let (rt, id) = start_irq_pod(&node, &proc, &agent, 2000, "0,2-8,10-15");
    node.wait_cpus(&id, "1,9");
    assert_eq!(irq_file(&proc, "default_smp_affinity"), "fdfd");
    assert_eq!(irq_file(&proc, "25/smp_affinity_list"), "0,2-7");
    assert_eq!(
        irq_file(&proc, "26/smp_affinity_list"),
        "8",
        "an IRQ elsewhere stays"
    );
    let status = node.wait_status("in force", |s| {
        s.by_id(&id)
            .is_some_and(|r| r.isolation == ["irq-load-balancing"])
    });
    let table = stdout(&node.cpusetd("status", &[]));
    assert!(
        table.contains("exclusive (no irq-load-balancing)"),
        "{table}"
    );
    assert!(status.by_id(&id).unwrap().exclusive);
    let counted = poll_until(DEADLINE, || {
        (node.metric("cpusetd_irq_isolated_cpus") == 2.0).then_some(())
    });
    assert!(counted.is_some(), "{:?}", node.metrics());

    // kill -9, then a new agent: the pin and the IRQ changes stay; the pod goes: restored.
    agent.signal(Signal::SIGKILL);
    assert!(agent.wait_exit(DEADLINE).is_some());
    let mut agent = start_with_proc(&node, &proc);
    assert_eq!(irq_file(&proc, "24/smp_affinity_list"), "0,2-8,10-15");
    node.fake.remove_pod(&rt).unwrap();
    let back = poll_until(DEADLINE, || {
        (irq_file(&proc, "24/smp_affinity_list") == "0-15").then_some(())
    });
    assert!(back.is_some(), "{}", agent.log());
    assert_eq!(irq_file(&proc, "default_smp_affinity"), "ffff");
    assert_eq!(irq_file(&proc, "25/smp_affinity_list"), "0-7");
    assert!(agent.stop().success());
    node.assert_clean();
}

/// `reset` puts back what the agent changed, from its checkpoint.
#[test]
fn reset_restores_interrupt_affinities() {
    let node = TestNode::new(CgroupVersion::V2);
    let proc = fake_proc(&node);
    let mut agent = start_with_proc(&node, &proc);
    let (_rt, id) = start_irq_pod(&node, &proc, &agent, 1000, "0-7,9-15");
    node.wait_cpus(&id, "8");
    assert!(agent.stop().success());
    let out = reset_with_proc(&node, &proc);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("interrupt affinities restored"),
        "{}",
        stdout(&out)
    );
    assert_eq!(irq_file(&proc, "24/smp_affinity_list"), "0-15");
    assert_eq!(
        irq_file(&proc, "26/smp_affinity_list"),
        "8",
        "never touched"
    );
    assert_eq!(irq_file(&proc, "default_smp_affinity"), "ffff");
}

/// Issue 24: an upgrade keeps every original. The host record an agent wrote is put back in
/// the format of before the effects had one map (`{"version": 1, "irq": …, "sched": …}`, a
/// member per effect) and the checkpoint removed, so only that file knows the originals:
/// `reset` reads it through the list of effects and puts every affinity back.
#[test]
fn reset_restores_the_originals_of_a_host_record_in_the_format_of_before() {
    let node = TestNode::new(CgroupVersion::V2);
    let proc = fake_proc(&node);
    let mut agent = start_with_proc(&node, &proc);
    let (_rt, id) = start_irq_pod(&node, &proc, &agent, 1000, "0-7,9-15");
    node.wait_cpus(&id, "8");
    assert!(agent.stop().success());
    let host = node.state_dir().join("host.json");
    let record: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&host).unwrap()).unwrap();
    let irq = record["effects"]["irq"].clone();
    assert_eq!(irq["irqs"]["24"], "0-15", "{record}");
    let before = serde_json::json!({"version": 1, "sched": {"isolated": ""}, "irq": irq});
    fs::write(&host, serde_json::to_string_pretty(&before).unwrap()).unwrap();
    fs::remove_file(node.checkpoint()).unwrap();
    assert_ne!(irq_file(&proc, "24/smp_affinity_list"), "0-15");
    let out = reset_with_proc(&node, &proc);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(irq_file(&proc, "24/smp_affinity_list"), "0-15");
    assert_eq!(irq_file(&proc, "default_smp_affinity"), "ffff");
    assert!(!host.exists(), "restored, so removed");
}

/// `reset` on a node without a kubepods cgroup (kubelet gone, or never ran pods): nothing to
/// reset in the tree, but the interrupt affinities come back and the checkpoint goes, exit 0
/// (`scripts/uninstall.sh` runs it with `set -e`; found by the systemd node test).
#[test]
fn reset_without_kubepods_still_restores_and_succeeds() {
    let node = TestNode::new(CgroupVersion::V2);
    let proc = fake_proc(&node);
    let mut agent = start_with_proc(&node, &proc);
    let (rt, _) = start_irq_pod(&node, &proc, &agent, 1000, "0-7,9-15");
    assert!(agent.stop().success());
    node.fake.remove_pod(&rt).unwrap();
    let kubepods = node.fake.file("kubepods", "cpuset.cpus");
    let kubepods = kubepods.parent().unwrap();
    for dir in ["burstable", "besteffort", ""] {
        let _ = fs::remove_dir_all(kubepods.join(dir));
    }
    assert!(!kubepods.exists());
    let out = reset_with_proc(&node, &proc);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("no cgroup to reset"),
        "{}",
        stdout(&out)
    );
    assert_eq!(irq_file(&proc, "24/smp_affinity_list"), "0-15");
    assert!(!node.checkpoint().exists());
}

/// Host cgroups in the cpuset hierarchy, outside kubepods, as systemd would make them on v1:
/// `system.slice` on every CPU with a service below it, `user.slice` not set up (empty).
pub(crate) fn add_host_cgroups(node: &TestNode) {
    let root = node.fake.file("", "cpuset.cpus");
    let root = root.parent().unwrap();
    for (rel, cpus) in [
        ("system.slice", "0-15"),
        ("system.slice/ssh.service", "0-15"),
        ("user.slice", ""),
    ] {
        fs::create_dir_all(root.join(rel)).unwrap();
        fs::write(root.join(rel).join("cpuset.cpus"), format!("{cpus}\n")).unwrap();
        fs::write(root.join(rel).join("cpuset.mems"), "0-1\n").unwrap();
        fs::write(root.join(rel).join("cpuset.sched_load_balance"), "1\n").unwrap();
    }
}

/// A cpuset file of the fake tree (`rel` relative to the cpuset root; "" the root).
pub(crate) fn cpuset_file(node: &TestNode, rel: &str, file: &str) -> String {
    fs::read_to_string(node.fake.file(rel, file))
        .unwrap()
        .trim()
        .to_string()
}

fn flag(node: &TestNode, rel: &str) -> String {
    cpuset_file(node, rel, "cpuset.sched_load_balance")
}

/// A Guaranteed 2-CPU pod whose pod says `cpu-load-balancing.crio.io: value`, started.
fn start_lb_pod(node: &TestNode, value: &str) -> (PodSpec, String) {
    let rt = pod(
        "rt",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("dpdk", 2000)],
    );
    node.fake
        .annotate_pod(&rt.uid, &[("cpu-load-balancing.crio.io", value)]);
    let id = node.fake.start_pod(&rt).unwrap().remove(0);
    (rt, id)
}

/// The fake kernel refused no write to a host cgroup (the narrowing of a parent before its
/// child would be EBUSY, which `assert_clean` lets pass as a runtime's race).
fn assert_no_host_refusal(node: &TestNode) {
    let refused = fs::read_to_string(node.refusal_log()).unwrap_or_default();
    assert!(
        !refused.contains("system.slice") && !refused.contains("sched_load_balance"),
        "{refused}"
    );
}

#[test]
fn cpu_load_balancing_annotation_takes_the_cpus_out_of_every_sched_domain_and_gives_them_back() {
    let node = TestNode::new(CgroupVersion::V1);
    add_host_cgroups(&node);
    let mut agent = node.start_agent(&["--isolate-host"]);
    // Nothing changes while no pod asks.
    assert_eq!(flag(&node, ""), "1");
    assert_eq!(cpuset_file(&node, "system.slice", "cpuset.cpus"), "0-15");
    let (rt, id) = start_lb_pod(&node, "disable");
    node.wait_cpus(&id, "1,9");
    let status = node.wait_status("in force", |s| {
        s.by_id(&id)
            .is_some_and(|r| r.isolation == ["cpu-load-balancing"])
    });
    assert!(status.by_id(&id).unwrap().exclusive);
    let pod_dir = node.fake.pod_dir(&rt);
    let container = format!("{pod_dir}/{id}");
    for rel in ["", "kubepods", pod_dir.as_str(), container.as_str()] {
        assert_eq!(flag(&node, rel), "0", "{rel}");
    }
    // Every other cpuset keeps balancing: the shared pool's, and the host's on the reserved cpu.
    for rel in ["kubepods/besteffort", "kubepods/burstable", "system.slice"] {
        assert_eq!(flag(&node, rel), "1", "{rel}");
    }
    assert_eq!(cpuset_file(&node, "system.slice", "cpuset.cpus"), "0");
    assert_eq!(
        cpuset_file(&node, "system.slice/ssh.service", "cpuset.cpus"),
        "0"
    );
    assert_eq!(cpuset_file(&node, "user.slice", "cpuset.cpus"), "");
    let table = stdout(&node.cpusetd("status", &[]));
    assert!(
        table.contains("exclusive (no cpu-load-balancing)"),
        "{table}"
    );
    let counted = poll_until(DEADLINE, || {
        (node.metric("cpusetd_sched_isolated_cpus") == 2.0).then_some(())
    });
    assert!(counted.is_some(), "{:?}", node.metrics());

    // kill -9, then a new agent: everything stays; the pod goes: everything comes back.
    agent.signal(Signal::SIGKILL);
    assert!(agent.wait_exit(DEADLINE).is_some());
    let mut agent = node.start_agent(&["--isolate-host"]);
    assert_eq!(flag(&node, "kubepods"), "0");
    node.fake.remove_pod(&rt).unwrap();
    let back = poll_until(DEADLINE, || {
        (flag(&node, "") == "1"
            && cpuset_file(&node, "system.slice/ssh.service", "cpuset.cpus") == "0-15")
            .then_some(())
    });
    assert!(back.is_some(), "{}", agent.log());
    assert_eq!(flag(&node, "kubepods"), "1");
    assert_eq!(cpuset_file(&node, "system.slice", "cpuset.cpus"), "0-15");
    assert_eq!(
        cpuset_file(&node, "system.slice/ssh.service", "cpuset.cpus"),
        "0-15"
    );
    let cleared = poll_until(DEADLINE, || {
        (node.metric("cpusetd_sched_isolated_cpus") == 0.0).then_some(())
    });
    assert!(cleared.is_some(), "{:?}", node.metrics());
    assert!(agent.stop().success());
    assert_no_host_refusal(&node);
    node.assert_clean();
    let saved = fs::read_to_string(node.checkpoint()).unwrap();
    assert!(!saved.contains("\"sched\""), "{saved}");
}

/// Issue 25 item 3: a host cgroup someone widens while a pod asks for `--isolate-host` (an admin,
/// a tool, systemd asked to) is confined again at the next reconcile tick, a quiet one included:
/// a quiet tick's snapshot covers kubepods only, so before this only a full reconcile (every
/// sixth tick) saw it. A flag set back to 1 the same way.
#[test]
fn a_host_cgroup_widened_while_confined_is_confined_again_on_a_quiet_tick() {
    let node = TestNode::new(CgroupVersion::V1);
    add_host_cgroups(&node);
    let mut agent = node.start_agent(&["--isolate-host", "--cpu-manager-reconcile-period", "1s"]);
    let (_rt, id) = start_lb_pod(&node, "disable");
    node.wait_cpus(&id, "1,9");
    node.wait_status("in force", |s| {
        s.by_id(&id)
            .is_some_and(|r| r.isolation == ["cpu-load-balancing"])
    });
    let full = || node.metric("cpusetd_reconciles_without_pass_total");
    let quiet = || node.metric("cpusetd_quiet_reconciles_total");
    for (rel, file, widened, confined) in [
        ("system.slice", "cpuset.cpus", "0-15", "0"),
        ("kubepods", "cpuset.sched_load_balance", "1", "0"),
    ] {
        // Just after a full reconcile: the next five ticks are quiet ones.
        let since = full();
        let after_full = poll_until(DEADLINE, || (full() > since).then(full));
        let (full_before, quiet_before) = (after_full.unwrap(), quiet());
        fs::write(node.fake.file(rel, file), format!("{widened}\n")).unwrap();
        let back = poll_until(DEADLINE, || {
            (cpuset_file(&node, rel, file) == confined).then_some(())
        });
        assert!(back.is_some(), "{rel} {file}: {}", agent.log());
        // Only a quiet tick says it (`SchedBalance::host_moved`): a full reconcile re-applies
        // without looking. The counters are published after the tick, so they are read last,
        // and only to show which came first.
        assert!(
            !agent.log_lines(&format!("{rel}: {file} reads")).is_empty(),
            "set again by a full reconcile ({} full, {} quiet since): {}",
            full() - full_before,
            quiet() - quiet_before,
            agent.log()
        );
    }
    assert!(agent.stop().success());
    assert_no_host_refusal(&node);
}

/// Without `--isolate-host` a host cgroup on every CPU keeps them balanced: the chain is set,
/// the host left alone, and status says why it is not in force and what would fix it.
#[test]
fn without_isolate_host_status_says_what_still_balances_the_cpus() {
    let node = TestNode::new(CgroupVersion::V1);
    add_host_cgroups(&node);
    let mut agent = node.start_agent(&[]);
    let (_rt, id) = start_lb_pod(&node, "disable");
    node.wait_cpus(&id, "1,9");
    let status = node.wait_status("said", |s| {
        s.by_id(&id)
            .is_some_and(|r| r.note.contains("cpu-load-balancing.crio.io not in force"))
    });
    let row = status.by_id(&id).unwrap();
    assert!(row.isolation.is_empty(), "{row:?}");
    assert!(
        row.note.contains("system.slice (0-15)") && row.note.contains("--isolate-host"),
        "{}",
        row.note
    );
    assert_eq!(cpuset_file(&node, "system.slice", "cpuset.cpus"), "0-15");
    assert_eq!(
        agent
            .log_lines("cpu-load-balancing.crio.io not in force")
            .len(),
        1,
        "{}",
        agent.log()
    );
    assert!(agent.stop().success());
    node.assert_clean();
}

/// Values CRI-O does not take, and a pod without exclusive cpus, change nothing.
#[test]
fn hostile_cpu_load_balancing_values_change_nothing() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&["--isolate-host"]);
    let mut ids = Vec::new();
    for (name, value) in [
        ("upper", "DISABLE"),
        ("space", "disable "),
        ("zero", "0"),
        ("nul", "disable\u{0}"),
        ("long", &"d".repeat(4096)),
    ] {
        let p = pod(
            name,
            Qos::Guaranteed,
            vec![ContainerSpec::guaranteed("app", 1000)],
        );
        node.fake
            .annotate_pod(&p.uid, &[("cpu-load-balancing.crio.io", value)]);
        ids.push(node.fake.start_pod(&p).unwrap().remove(0));
    }
    let shared = pod(
        "shared",
        Qos::Burstable,
        vec![ContainerSpec::burstable("app", 500, Some(1000))],
    );
    node.fake
        .annotate_pod(&shared.uid, &[("cpu-load-balancing.crio.io", "disable")]);
    node.fake.start_pod(&shared).unwrap();
    node.wait_status("pinned", |s| s.exclusive_cpu_count == 5 && s.converged());
    // A reconcile tick later still nothing.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert_eq!(flag(&node, ""), "1");
    assert_eq!(flag(&node, "kubepods"), "1");
    assert_eq!(node.metric("cpusetd_sched_balance_writes_total"), 0.0);
    let status = node.status().unwrap();
    for id in &ids {
        let row = status.by_id(id).unwrap();
        assert!(row.isolation.is_empty(), "{row:?}");
        assert!(!row.note.contains("cpu-load-balancing"), "{row:?}");
    }
    assert!(
        agent
            .log_lines("annotation cpu-load-balancing.crio.io")
            .len()
            >= 4,
        "{}",
        agent.log()
    );
    assert!(agent.stop().success());
    node.assert_clean();
}

/// `reset` puts the flags and the host cpusets back, from the checkpoint.
#[test]
fn reset_restores_load_balancing_and_the_host_cpusets() {
    let node = TestNode::new(CgroupVersion::V1);
    add_host_cgroups(&node);
    let mut agent = node.start_agent(&["--isolate-host"]);
    let (_rt, id) = start_lb_pod(&node, "disable");
    node.wait_status("in force", |s| {
        s.by_id(&id)
            .is_some_and(|r| r.isolation == ["cpu-load-balancing"])
    });
    assert!(agent.stop().success());
    assert_eq!(
        flag(&node, ""),
        "0",
        "the pod still runs: the agent's stop changes nothing"
    );
    let out = node.cpusetd("reset", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("scheduler load balancing restored"),
        "{}",
        stdout(&out)
    );
    assert_eq!(flag(&node, ""), "1");
    assert_eq!(flag(&node, "kubepods"), "1");
    assert_eq!(cpuset_file(&node, "system.slice", "cpuset.cpus"), "0-15");
    assert_eq!(
        cpuset_file(&node, "system.slice/ssh.service", "cpuset.cpus"),
        "0-15"
    );
    assert!(!node.checkpoint().exists());
}

/// cgroup v2 before Linux 6.7 (no `cpuset.cpus.exclusive`): said at start-up and in status,
/// nothing written.
#[test]
fn cgroup_v2_without_remote_partitions_refuses_clearly() {
    let node = TestNode::new(CgroupVersion::V2);
    let mut agent = node.start_agent(&[]);
    assert_eq!(
        agent
            .log_lines("cpu-load-balancing.crio.io cannot be honoured here")
            .len(),
        1,
        "{}",
        agent.log()
    );
    let (rt, id) = start_lb_pod(&node, "disable");
    node.wait_cpus(&id, "1,9");
    let status = node.wait_status("refused", |s| {
        s.by_id(&id)
            .is_some_and(|r| r.note.contains("Linux 6.7 or newer"))
    });
    assert!(status.by_id(&id).unwrap().isolation.is_empty());
    let container = format!("{}/{id}", node.fake.pod_dir(&rt));
    for rel in ["kubepods", container.as_str()] {
        assert_eq!(cpuset_file(&node, rel, "cpuset.cpus.partition"), "member");
    }
    assert_eq!(node.metric("cpusetd_sched_balance_writes_total"), 0.0);
    assert!(agent.stop().success());
    node.assert_clean();
}

/// cgroup v2 with remote partitions (Linux 6.7 or newer; the fake kernel answers as 6.12 did):
/// the exclusive cpus down the chain, the container isolated, read back; the root's effective
/// set shrinking by it moves no pin; an invalid partition is said as the kernel says it and
/// undone; all undone when the pod goes, and by `reset`.
#[test]
fn cgroup_v2_remote_partitions_on_the_fake_tree() {
    let mut node = TestNode::new(CgroupVersion::V2);
    node.fake.with_remote_partitions().unwrap();
    let mut agent = node.start_agent(&[]);
    assert!(agent
        .log_lines("cpu-load-balancing.crio.io cannot be honoured here")
        .is_empty());
    let (rt, id) = start_lb_pod(&node, "disable");
    node.wait_cpus(&id, "1,9");
    node.wait_status("in force", |s| {
        s.by_id(&id)
            .is_some_and(|r| r.isolation == ["cpu-load-balancing"])
    });
    let pod_dir = node.fake.pod_dir(&rt);
    let container = format!("{pod_dir}/{id}");
    for rel in ["kubepods", pod_dir.as_str(), container.as_str()] {
        assert_eq!(
            cpuset_file(&node, rel, "cpuset.cpus.exclusive"),
            "1,9",
            "{rel}"
        );
    }
    assert_eq!(
        cpuset_file(&node, &container, "cpuset.cpus.partition"),
        "isolated"
    );
    assert_eq!(
        cpuset_file(&node, "kubepods/besteffort", "cpuset.cpus.exclusive"),
        ""
    );
    // The root's effective set lost them (Linux 6.12); the pin stays where it is.
    assert_eq!(cpuset_file(&node, "", "cpuset.cpus.isolated"), "1,9");
    std::thread::sleep(std::time::Duration::from_secs(2));
    node.wait_cpus(&id, "1,9");
    assert!(
        agent.log_lines("gives pods only").is_empty(),
        "{}",
        agent.log()
    );
    // The kernel invalidates it (a hotplug, a conflict): status says what the kernel says,
    // and the agent undoes it (nothing half applied).
    fs::write(
        node.fake.file(&container, "cpuset.cpus.partition"),
        "isolated invalid (Cpu list in cpuset.cpus.exclusive not exclusive)\n",
    )
    .unwrap();
    let status = node.wait_status("invalid said", |s| {
        s.by_id(&id)
            .is_some_and(|r| r.note.contains("isolated invalid (Cpu list"))
    });
    assert!(status.by_id(&id).unwrap().isolation.is_empty());
    let undone = poll_until(DEADLINE, || {
        (cpuset_file(&node, &container, "cpuset.cpus.partition") == "member"
            && cpuset_file(&node, "kubepods", "cpuset.cpus.exclusive").is_empty())
        .then_some(())
    });
    assert!(undone.is_some(), "{}", agent.log());
    // The pod goes: kubepods hands down nothing again.
    node.fake.remove_pod(&rt).unwrap();
    let back = poll_until(DEADLINE, || {
        (cpuset_file(&node, "kubepods", "cpuset.cpus.exclusive").is_empty()).then_some(())
    });
    assert!(back.is_some(), "{}", agent.log());
    // Another, then the agent stops and `reset` undoes it.
    let (rt, id) = start_lb_pod(&node, "disable");
    node.wait_status("in force", |s| {
        s.by_id(&id)
            .is_some_and(|r| r.isolation == ["cpu-load-balancing"])
    });
    assert!(agent.stop().success());
    node.assert_clean();
    let out = node.cpusetd("reset", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let container = format!("{}/{id}", node.fake.pod_dir(&rt));
    assert_eq!(
        cpuset_file(&node, &container, "cpuset.cpus.partition"),
        "member"
    );
    for rel in ["kubepods", container.as_str()] {
        assert_eq!(
            cpuset_file(&node, rel, "cpuset.cpus.exclusive"),
            "",
            "{rel}"
        );
    }
}

/// A container that loses its exclusive cpus (an in-place resize to 1.5 cpus) gives load
/// balancing back at once, though its pod still says `disable`.
#[test]
fn losing_the_exclusive_cpus_gives_load_balancing_back() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let (rt, id) = start_lb_pod(&node, "disable");
    node.wait_status("in force", |s| {
        s.by_id(&id)
            .is_some_and(|r| r.isolation == ["cpu-load-balancing"])
    });
    let container = format!("{}/{id}", node.fake.pod_dir(&rt));
    assert_eq!(flag(&node, &container), "0");
    crate::agent::resize(&node, &rt, &id, 1500);
    node.wait_status("shared", |s| {
        s.converged() && s.by_id(&id).is_some_and(|r| !r.exclusive)
    });
    let back = poll_until(DEADLINE, || (flag(&node, "") == "1").then_some(()));
    assert!(back.is_some(), "{}", agent.log());
    for rel in ["kubepods", container.as_str()] {
        assert_eq!(flag(&node, rel), "1", "{rel}");
    }
    let row = node.status().unwrap();
    let row = row.by_id(&id).unwrap();
    assert!(
        row.isolation.is_empty() && !row.note.contains("cpu-load-balancing"),
        "{row:?}"
    );
    assert!(agent.stop().success());
    node.assert_clean();
}

/// Issue 23 item 27: quotas lifted by a run without `--keep-cfs-quota` are put back (from the
/// checkpoint's originals) when the agent restarts with it, the container's and its pod's;
/// those `cpu-quota.crio.io: "disable"` asks for stay lifted.
#[test]
fn restarting_with_keep_cfs_quota_puts_back_the_quotas_lifted_before() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let plain = pod(
        "plain",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 1000)],
    );
    let fast = pod(
        "fast",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 1000)],
    );
    node.fake
        .annotate_pod(&fast.uid, &[("cpu-quota.crio.io", "disable")]);
    let plain_id = node.fake.start_pod(&plain).unwrap().remove(0);
    let fast_id = node.fake.start_pod(&fast).unwrap().remove(0);
    node.wait_status("pinned", |s| s.exclusive_cpu_count == 2 && s.converged());
    let quota = |p, id| node.read(p, id, "cpu.cfs_quota_us");
    let lifted = poll_until(DEADLINE, || {
        [
            quota(&plain, &plain_id),
            quota(&plain, ""),
            quota(&fast, &fast_id),
            quota(&fast, ""),
        ]
        .iter()
        .all(|q| q == "-1")
        .then_some(())
    });
    assert!(lifted.is_some(), "{}", agent.log());
    assert!(agent.stop().success());

    let mut agent = node.start_agent(&["--keep-cfs-quota"]);
    let back = poll_until(DEADLINE, || {
        (quota(&plain, &plain_id) == "100000" && quota(&plain, "") == "100000").then_some(())
    });
    assert!(
        back.is_some(),
        "container {} pod {}: {}",
        quota(&plain, &plain_id),
        quota(&plain, ""),
        agent.log()
    );
    assert_eq!(quota(&fast, &fast_id), "-1");
    assert_eq!(quota(&fast, ""), "-1");
    assert!(agent.stop().success());
    // Put back: nothing left to restore for it; the annotated pod's lifts stay recorded.
    let saved: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(node.checkpoint()).unwrap()).unwrap();
    let lifted = saved["effects"]["quota"].to_string();
    assert!(!lifted.contains(&plain.uid), "{lifted}");
    assert!(lifted.contains(&fast.uid), "{lifted}");
    node.assert_clean();
}

/// Issue 23 item 5: a host cgroup made while `--isolate-host` confines its parent copies the
/// parent's narrowed cpus (as systemd and runc do); it gets the parent's cpus back with it,
/// when the pod goes and on `reset`.
#[test]
fn host_cgroups_made_during_confinement_are_widened_when_the_pod_goes_and_by_reset() {
    let node = TestNode::new(CgroupVersion::V1);
    add_host_cgroups(&node);
    let made_now = |rel: &str| {
        let file = node.fake.file(rel, "cpuset.cpus");
        let dir = file.parent().unwrap();
        fs::create_dir_all(dir).unwrap();
        let parent = fs::read_to_string(dir.parent().unwrap().join("cpuset.cpus")).unwrap();
        fs::write(&file, parent).unwrap();
        fs::write(dir.join("cpuset.mems"), "0-1\n").unwrap();
        fs::write(dir.join("cpuset.sched_load_balance"), "1\n").unwrap();
    };
    for recovery in ["pod goes", "reset"] {
        let mut agent = node.start_agent(&["--isolate-host"]);
        let (rt, id) = start_lb_pod(&node, "disable");
        node.wait_cpus(&id, "1,9");
        agent.wait_until("the host confined", DEADLINE, || {
            cpuset_file(&node, "system.slice/ssh.service", "cpuset.cpus") == "0"
        });
        let service = format!("system.slice/new-{}.service", recovery.len());
        made_now(&service);
        made_now(&format!("{service}/payload"));
        assert_eq!(cpuset_file(&node, &service, "cpuset.cpus"), "0");
        if recovery == "reset" {
            assert!(agent.stop().success());
            let out = node.cpusetd("reset", &[]);
            assert!(out.status.success(), "{}", stderr(&out));
        } else {
            node.fake.remove_pod(&rt).unwrap();
            agent.wait_until("the host widened", DEADLINE, || {
                cpuset_file(&node, "system.slice", "cpuset.cpus") == "0-15"
            });
            assert!(agent.stop().success());
        }
        for rel in [
            "system.slice",
            "system.slice/ssh.service",
            &service,
            &format!("{service}/payload"),
        ] {
            assert_eq!(
                cpuset_file(&node, rel, "cpuset.cpus"),
                "0-15",
                "{recovery}: {rel}"
            );
        }
        if recovery == "reset" {
            node.fake.remove_pod(&rt).unwrap();
        }
    }
    assert_no_host_refusal(&node);
    node.assert_clean();
}

/// A directory bind-mounted read-only onto itself (as `ProtectKernelTunables=yes` or a
/// DaemonSet's read-only `/host/proc` make `/proc/irq`), unmounted on drop.
struct ReadOnly(PathBuf);

impl ReadOnly {
    /// Or why it cannot be (not root, no mount).
    fn bind(dir: &Path) -> Result<ReadOnly, String> {
        let run = |args: &[&str]| {
            Command::new("mount")
                .args(args)
                .arg(dir)
                .arg(dir)
                .output()
                .map_err(|e| format!("mount: {e}"))
                .and_then(|out| {
                    out.status
                        .success()
                        .then_some(())
                        .ok_or_else(|| stderr(&out))
                })
        };
        run(&["--bind"])?;
        let guard = ReadOnly(dir.to_path_buf());
        run(&["-o", "remount,bind,ro"])?;
        Ok(guard)
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Issue 23 item 19: with `/proc/irq` read-only the writes fail (`Read-only file system`),
/// the IRQs stay on every cpu, and the annotation is not in force: not in `status`, not in
/// the metric, and said in the log and in the row's NOTE.
#[test]
fn a_read_only_proc_irq_is_not_reported_in_force() {
    let node = TestNode::new(CgroupVersion::V1);
    let proc = fake_proc(&node);
    let _ro = match ReadOnly::bind(&proc.join("irq")) {
        Ok(ro) => ro,
        Err(reason) => {
            println!("skipped: cannot bind-mount read-only: {reason}");
            return;
        }
    };
    let mut agent = start_with_proc(&node, &proc);
    let rt = pod(
        "rt",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("dpdk", 2000)],
    );
    node.fake
        .annotate_pod(&rt.uid, &[("irq-load-balancing.crio.io", "disable")]);
    let id = node.fake.start_pod(&rt).unwrap().remove(0);
    node.wait_cpus(&id, "1,9");
    let said = poll_until(DEADLINE, || {
        (!agent.log_lines("Read-only file system").is_empty()).then_some(())
    });
    assert!(said.is_some(), "{}", agent.log());
    assert_eq!(irq_file(&proc, "24/smp_affinity_list"), "0-15");
    // A few reconciles later (the checkpoint written after each), still not in force.
    let passes = || {
        node.metric("cpusetd_passes_total")
            + node.metric("cpusetd_reconciles_without_pass_total")
            + node.metric("cpusetd_quiet_reconciles_total")
    };
    let before = passes();
    let later = poll_until(DEADLINE, || (passes() >= before + 2.0).then_some(()));
    assert!(later.is_some(), "{:?}", node.metrics());
    let status = node.status().unwrap();
    let row = status.by_id(&id).unwrap();
    assert!(row.exclusive, "{row:?}");
    assert!(row.isolation.is_empty(), "{row:?}");
    assert!(
        row.note.contains("irq-load-balancing.crio.io not in force"),
        "{row:?}"
    );
    assert_eq!(node.metric("cpusetd_irq_isolated_cpus"), 0.0);
    assert!(
        !agent
            .log_lines("device interrupts are not kept off cpus 1,9")
            .is_empty(),
        "{}",
        agent.log()
    );
    assert!(agent.stop().success());
}
