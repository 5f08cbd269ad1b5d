//! CRI-O's other high-performance annotations on any runtime, on fake sysfs and procfs trees:
//! `cpu-c-states.crio.io` (each exclusive cpu's `power/pm_qos_resume_latency_us`),
//! `cpu-freq-governor.crio.io` (`cpufreq/scaling_governor`) and
//! `irq-load-balancing.crio.io: "housekeeping"` (interrupts kept on the first core only).
//! Each is restored when the pod goes, after a `kill -9` and a new agent, and by `reset`.

use std::fs;
use std::path::PathBuf;

use nix::sys::signal::Signal;

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::kubesim::{ContainerSpec, PodSpec, Qos};

use crate::agent_util::{pod, poll_until, AgentProcess, TestNode, DEADLINE};
use crate::isolation::{fake_proc, irq_file, reset_with_proc, start_with_proc};
use crate::util::{stderr, stdout};

pub(crate) const LATENCY: &str = "power/pm_qos_resume_latency_us";
pub(crate) const GOVERNOR: &str = "cpufreq/scaling_governor";

/// Gives each of the node's 16 cpus the power files a kernel with cpuidle and cpufreq has:
/// no resume latency limit (`0`), `schedutil` of `performance powersave schedutil`.
pub(crate) fn fake_power(node: &TestNode) {
    for cpu in 0..16 {
        let dir = cpu_dir(node, cpu);
        fs::create_dir_all(dir.join("power")).unwrap();
        fs::create_dir_all(dir.join("cpufreq")).unwrap();
        fs::write(dir.join(LATENCY), "0\n").unwrap();
        fs::write(dir.join(GOVERNOR), "schedutil\n").unwrap();
        fs::write(
            dir.join("cpufreq/scaling_available_governors"),
            "performance powersave schedutil\n",
        )
        .unwrap();
    }
}

fn cpu_dir(node: &TestNode, cpu: u32) -> PathBuf {
    node.sysfs.join(format!("devices/system/cpu/cpu{cpu}"))
}

pub(crate) fn power_file(node: &TestNode, cpu: u32, file: &str) -> String {
    fs::read_to_string(cpu_dir(node, cpu).join(file))
        .unwrap()
        .trim()
        .to_string()
}

/// `file` of every cpu, as `cpu=value` joined by spaces (for one comparison).
pub(crate) fn all(node: &TestNode, file: &str) -> String {
    (0..16)
        .map(|cpu| format!("{cpu}={}", power_file(node, cpu, file)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `all` as it would read with `value` on `cpus` and `rest` elsewhere.
fn expect(cpus: &[u32], value: &str, rest: &str) -> String {
    (0..16)
        .map(|cpu| {
            let v = if cpus.contains(&cpu) { value } else { rest };
            format!("{cpu}={v}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn start_pod(
    node: &TestNode,
    name: &str,
    milli: u64,
    annotations: &[(&str, &str)],
) -> (PodSpec, String) {
    let p = pod(
        name,
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", milli)],
    );
    node.fake.annotate_pod(&p.uid, annotations);
    let id = node.fake.start_pod(&p).unwrap().remove(0);
    (p, id)
}

fn wait(agent: &AgentProcess, what: &str, mut done: impl FnMut() -> bool) {
    let ok = poll_until(DEADLINE, || done().then_some(()));
    assert!(ok.is_some(), "{what}: {}", agent.log());
}

fn host_record(node: &TestNode) -> String {
    fs::read_to_string(node.state_dir().join("host.json")).unwrap_or_default()
}

#[test]
fn c_states_are_set_on_the_exclusive_cpus_and_restored_after_kill_9_and_restart() {
    let node = TestNode::with_writable_sysfs(CgroupVersion::V1);
    fake_power(&node);
    let mut agent = node.start_agent(&[]);
    let (rt, id) = start_pod(&node, "rt", 2000, &[("cpu-c-states.crio.io", "disable")]);
    node.wait_cpus(&id, "1,9");
    wait(&agent, "c-states disabled", || {
        all(&node, LATENCY) == expect(&[1, 9], "n/a", "0")
    });
    // Written ahead: the originals are in the host record.
    let record = host_record(&node);
    assert!(record.contains("\"latency\""), "{record}");
    let status = node.wait_status("in force", |s| {
        s.by_id(&id).is_some_and(|r| {
            r.note
                .contains("cpu-c-states.crio.io in force (pm_qos_resume_latency_us n/a)")
        })
    });
    assert!(status.by_id(&id).unwrap().exclusive);
    wait(&agent, "counted", || {
        node.metric("cpusetd_cstates_cpus") == 2.0
    });
    assert!(node.metric("cpusetd_cpu_power_writes_total") >= 2.0);

    // kill -9, then a new agent: the values stay while the pod does; it goes: restored.
    agent.signal(Signal::SIGKILL);
    assert!(agent.wait_exit(DEADLINE).is_some());
    let mut agent = node.start_agent(&[]);
    assert_eq!(all(&node, LATENCY), expect(&[1, 9], "n/a", "0"));
    // Someone else's value on cpu 9 meanwhile: put back to what the pod asks.
    fs::write(cpu_dir(&node, 9).join(LATENCY), "0\n").unwrap();
    wait(&agent, "re-applied", || {
        power_file(&node, 9, LATENCY) == "n/a"
    });
    node.fake.remove_pod(&rt).unwrap();
    wait(&agent, "restored", || {
        all(&node, LATENCY) == expect(&[], "", "0")
    });
    wait(&agent, "nothing left to restore", || {
        !host_record(&node).contains("\"latency\"")
    });
    assert!(agent.stop().success());

    // max_latency:N and enable, as CRI-O writes them, on cpus that had a limit of zero.
    for cpu in 0..16 {
        fs::write(cpu_dir(&node, cpu).join(LATENCY), "n/a\n").unwrap();
    }
    let mut agent = node.start_agent(&[]);
    let (a, a_id) = start_pod(
        &node,
        "a",
        1000,
        &[("cpu-c-states.crio.io", "max_latency:10")],
    );
    let (b, b_id) = start_pod(&node, "b", 1000, &[("cpu-c-states.crio.io", "enable")]);
    let status = node.wait_status("pinned", |s| {
        s.by_id(&a_id).is_some_and(|r| r.exclusive) && s.by_id(&b_id).is_some_and(|r| r.exclusive)
    });
    let cpu_of = |id: &str| -> u32 {
        status
            .by_id(id)
            .unwrap()
            .desired
            .as_deref()
            .unwrap()
            .parse()
            .unwrap()
    };
    let (a_cpu, b_cpu) = (cpu_of(&a_id), cpu_of(&b_id));
    wait(&agent, "max_latency and enable", || {
        power_file(&node, a_cpu, LATENCY) == "10" && power_file(&node, b_cpu, LATENCY) == "0"
    });
    node.fake.remove_pod(&a).unwrap();
    node.fake.remove_pod(&b).unwrap();
    wait(&agent, "restored", || {
        all(&node, LATENCY) == expect(&[], "", "n/a")
    });
    assert!(agent.stop().success());
    node.assert_clean();
}

#[test]
fn governor_is_set_refused_when_not_offered_and_restored_by_reset() {
    let node = TestNode::with_writable_sysfs(CgroupVersion::V1);
    fake_power(&node);
    let mut agent = node.start_agent(&[]);
    let (_fast, fast_id) = start_pod(
        &node,
        "fast",
        2000,
        &[("cpu-freq-governor.crio.io", "performance")],
    );
    node.wait_cpus(&fast_id, "1,9");
    wait(&agent, "governor set", || {
        all(&node, GOVERNOR) == expect(&[1, 9], "performance", "schedutil")
    });
    node.wait_status("in force", |s| {
        s.by_id(&fast_id).is_some_and(|r| {
            r.note
                .contains("cpu-freq-governor.crio.io in force (performance)")
        })
    });
    // A governor the cpus do not offer: refused, one line, nothing written.
    let (_slow, slow_id) = start_pod(
        &node,
        "slow",
        1000,
        &[("cpu-freq-governor.crio.io", "ondemand")],
    );
    // An odd value: ignored with one line.
    let (_odd, odd_id) = start_pod(
        &node,
        "odd",
        1000,
        &[("cpu-c-states.crio.io", "max_latency:0")],
    );
    let status = node.wait_status("refused", |s| {
        s.by_id(&slow_id)
            .is_some_and(|r| r.note.contains("cpu-freq-governor.crio.io not in force"))
            && s.by_id(&odd_id).is_some_and(|r| r.exclusive)
    });
    let slow_cpus = status.by_id(&slow_id).unwrap().current.clone().unwrap();
    let slow_cpu: u32 = slow_cpus.parse().unwrap();
    wait(&agent, "refused counted", || {
        node.metric("cpusetd_governor_refused_cpus") == 1.0
    });
    assert_eq!(power_file(&node, slow_cpu, GOVERNOR), "schedutil");
    assert_eq!(all(&node, LATENCY), expect(&[], "", "0"));
    // Said once, however many reconciles pass.
    std::thread::sleep(std::time::Duration::from_millis(600));
    assert_eq!(
        agent
            .log_lines("governor \"ondemand\" refused on cpu")
            .len(),
        1,
        "{}",
        agent.log()
    );
    assert_eq!(
        agent
            .log_lines("annotation cpu-c-states.crio.io: \"max_latency:0\" ignored")
            .len(),
        1,
        "{}",
        agent.log()
    );

    // kill -9, pods still there, then reset: every original back.
    agent.signal(Signal::SIGKILL);
    assert!(agent.wait_exit(DEADLINE).is_some());
    let out = reset_with_proc(&node, &fake_proc(&node));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("cpu power settings restored"),
        "{}",
        stdout(&out)
    );
    assert_eq!(all(&node, GOVERNOR), expect(&[], "", "schedutil"));
}

/// `housekeeping`: interrupts stay on the first cpu of the set and its SMT sibling (cpus 1
/// and 9 of `1-2,9-10` on this node: core 1 is cpus 1 and 9), off the rest.
#[test]
fn irq_housekeeping_keeps_interrupts_on_the_first_core_only_and_restores() {
    let node = TestNode::new(CgroupVersion::V1);
    let proc = fake_proc(&node);
    let mut agent = start_with_proc(&node, &proc);
    let (rt, id) = start_pod(
        &node,
        "rt",
        4000,
        &[("irq-load-balancing.crio.io", "housekeeping")],
    );
    node.wait_cpus(&id, "1-2,9-10");
    wait(&agent, "off cpus 2 and 10", || {
        irq_file(&proc, "24/smp_affinity_list") == "0-1,3-9,11-15"
    });
    assert_eq!(irq_file(&proc, "default_smp_affinity"), "fbfb");
    assert_eq!(irq_file(&proc, "25/smp_affinity_list"), "0-1,3-7");
    node.wait_status("in force", |s| {
        s.by_id(&id)
            .is_some_and(|r| r.isolation == ["irq-load-balancing (housekeeping)"])
    });
    wait(&agent, "counted", || {
        node.metric("cpusetd_irq_isolated_cpus") == 2.0
    });
    // kill -9 and a new agent: kept; the pod goes: restored.
    agent.signal(Signal::SIGKILL);
    assert!(agent.wait_exit(DEADLINE).is_some());
    let mut agent = start_with_proc(&node, &proc);
    assert_eq!(irq_file(&proc, "24/smp_affinity_list"), "0-1,3-9,11-15");
    node.fake.remove_pod(&rt).unwrap();
    wait(&agent, "restored", || {
        irq_file(&proc, "24/smp_affinity_list") == "0-15"
            && irq_file(&proc, "default_smp_affinity") == "ffff"
            && irq_file(&proc, "25/smp_affinity_list") == "0-7"
    });
    // Again, then kill -9 and reset.
    let (_rt2, id2) = start_pod(
        &node,
        "rt2",
        4000,
        &[("irq-load-balancing.crio.io", "housekeeping")],
    );
    node.wait_cpus(&id2, "1-2,9-10");
    wait(&agent, "off again", || {
        irq_file(&proc, "24/smp_affinity_list") == "0-1,3-9,11-15"
    });
    agent.signal(Signal::SIGKILL);
    assert!(agent.wait_exit(DEADLINE).is_some());
    let out = reset_with_proc(&node, &proc);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(irq_file(&proc, "24/smp_affinity_list"), "0-15");
    assert_eq!(irq_file(&proc, "default_smp_affinity"), "ffff");
}
