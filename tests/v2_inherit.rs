//! cgroup v2 inheritance (issues 24 (b), 25 item 4): a cgroup whose `cpuset.cpus` is empty
//! follows its parent's effective set, so the agent sets the shared pool on the QoS parents
//! and on the non-exclusive members of Guaranteed pods only, and a pod event costs a few writes
//! instead of one per shared container. The agent binary on a fake v2 node whose fake kernel
//! keeps `cpuset.cpus.effective` as the real one does.

use std::fs;
use std::time::Instant;

use cpusetd::agent::Controller;
use cpusetd::cgroupfs::{CgroupPath, CgroupVersion};
use cpusetd::cpuset::CpuSet;
use cpusetd::kubesim::{ContainerSpec, PodSpec, Qos};
use cpusetd::watcher::{Arrivals, TreeEvent};

use crate::agent_util::{cpus, guaranteed, pod, poll_until, TestNode, DEADLINE};

/// The large-node mix of the benches: Burstable pods of three app containers (four cgroups
/// with the sandbox).
fn burstable(n: usize) -> PodSpec {
    pod(
        &format!("b{n}"),
        Qos::Burstable,
        vec![
            ContainerSpec::burstable("app", 250, Some(2000)),
            ContainerSpec::burstable("sidecar", 100, None),
            ContainerSpec::burstable("log", 50, Some(200)),
        ],
    )
}

/// The agent's `cpusetd_cgroup_writes_total` once it has stayed the same for a while (the
/// held-back shared rewrites have fallen due).
fn settled_writes(node: &TestNode) -> f64 {
    let mut last = -1.0;
    let mut stable = 0;
    poll_until(DEADLINE, || {
        let now = node.metric("cpusetd_cgroup_writes_total");
        stable = if now == last { stable + 1 } else { 0 };
        last = now;
        std::thread::sleep(std::time::Duration::from_millis(50));
        (stable >= 10).then_some(now)
    })
    .expect("the writes settle")
}

/// A file of a pod's container (or of the pod with `id` empty), trimmed.
fn read(node: &TestNode, p: &PodSpec, id: &str, file: &str) -> String {
    node.read(p, id, file)
}

/// Waits until `gid` runs on cpu 8 and no other container does; how long since `started`
/// (`None` past the deadline). What each runs on is what the fake kernel says is in force.
fn until_exclusive(
    node: &TestNode,
    pods: &[PodSpec],
    ids: &[Vec<String>],
    g: &PodSpec,
    gid: &str,
    started: Instant,
) -> Option<std::time::Duration> {
    let others_off = || {
        pods.iter()
            .zip(ids)
            .all(|(p, ids)| ids.iter().all(|id| !cpus(&node.cpus_of(p, id)).contains(8)))
    };
    poll_until(DEADLINE, || {
        (node.cpus_of(g, gid) == "8" && others_off()).then(|| started.elapsed())
    })
}

/// 110 Burstable pods, then one Guaranteed pod (a 1-CPU container) starts and is removed:
/// the writes that cost, and every container's effective set meanwhile.
#[test]
fn v2_pod_start_and_release_writes_where_children_do_not_inherit() {
    let node = TestNode::new(CgroupVersion::V2);
    let mut agent = node.start_agent(&[]);
    let pods: Vec<PodSpec> = (0..110).map(burstable).collect();
    let mut ids = Vec::new();
    for p in &pods {
        ids.push(node.fake.start_pod(p).unwrap());
    }
    node.wait_status("110 pods seen", |s| {
        s.containers.len() == 110 * 4 && s.converged()
    });
    let before = settled_writes(&node);

    let g = guaranteed("g", 1000);
    let started = Instant::now();
    let gid = node.fake.start_pod(&g).unwrap().remove(0);
    let pin = poll_until(DEADLINE, || {
        (node.cpus_of(&g, &gid) == "8").then(|| started.elapsed())
    });
    println!("v2, 110 pods: pinned {pin:?} after its pod started (debug build)");
    let alone = until_exclusive(&node, &pods, &ids, &g, &gid, started);
    // On the fake tree this includes the fake kernel's own work (in the agent's debug build):
    // each QoS write rewrites the effective sets of the 440 cgroups below it. The figure is
    // the writes.
    println!("v2, 110 pods: the pin exclusive {alone:?} after its pod started (debug build)");
    assert!(alone.is_some(), "the pin never became exclusive");
    node.wait_cpus(&gid, "8");
    let pinned = settled_writes(&node);
    // Every shared container runs on the shared pool, inherited or its own.
    let mut wrong = Vec::new();
    for (p, ids) in pods.iter().zip(&ids) {
        for id in ids {
            let effective = read(&node, p, id, "cpuset.cpus.effective");
            let own = read(&node, p, id, "cpuset.cpus");
            if effective != "0-7,9-15" || !own.is_empty() {
                wrong.push(format!("{id}: {own:?}, effective {effective} while pinned"));
            }
        }
    }
    // The pool is the burstable QoS cgroup's own; the pods follow it.
    let qos = |file| fs::read_to_string(node.fake.file("kubepods/burstable", file)).unwrap();
    assert_eq!(qos("cpuset.cpus").trim(), "0-7,9-15");
    assert_eq!(read(&node, &pods[0], "", "cpuset.cpus"), "");
    node.fake.remove_pod(&g).unwrap();
    node.wait_status("the pin released", |s| {
        s.exclusive_cpu_count == 0 && s.converged()
    });
    let released = settled_writes(&node);
    for (p, ids) in pods.iter().zip(&ids) {
        for id in ids {
            let effective = read(&node, p, id, "cpuset.cpus.effective");
            if effective != "0-15" {
                wrong.push(format!("{id}: {effective} after the release"));
            }
        }
    }
    let (start, release) = (pinned - before, released - pinned);
    println!(
        "v2, 110 pods: {start} writes for a pod start, {release} for its release, {} in all",
        start + release
    );
    assert!(
        wrong.is_empty(),
        "{} wrong, e.g. {:?}",
        wrong.len(),
        wrong.first()
    );
    assert!(start + release <= 20.0, "{start} + {release} writes");
    assert!(agent.stop().success());
    node.assert_clean();
}

/// A shared container that follows its QoS cgroup's set, then someone writes a set into it:
/// drift, repaired by writing the shared pool (not by emptying the file again: the agent never
/// writes an empty cpuset). `status` shows an inheriting container's effective set as current.
#[test]
fn v2_a_foreign_write_into_an_inheriting_container_is_repaired_with_the_pool() {
    let node = TestNode::new(CgroupVersion::V2);
    let mut agent = node.start_agent(&["--cpu-manager-reconcile-period", "1h"]);
    let b = burstable(0);
    let ids = node.fake.start_pod(&b).unwrap();
    let g = guaranteed("g", 1000);
    let gid = node.fake.start_pod(&g).unwrap().remove(0);
    let status = node.wait_cpus(&gid, "8");
    let shared = "0-7,9-15";
    for id in &ids {
        assert!(status.has(id, shared), "{id}: {status:#?}");
        assert_eq!(
            read(&node, &b, id, "cpuset.cpus"),
            "",
            "{id} follows its pod"
        );
    }

    let app = &ids[1];
    node.write(&b, app, "cpuset.cpus", "0-15");
    let repaired = poll_until(DEADLINE, || {
        (read(&node, &b, app, "cpuset.cpus") == shared).then_some(())
    });
    assert!(
        repaired.is_some(),
        "{}",
        read(&node, &b, app, "cpuset.cpus")
    );
    let status = node.wait_status("converged", |s| s.converged());
    assert!(status.has(app, shared), "{status:#?}");
    assert!(node.metric("cpusetd_drift_repairs_total") >= 1.0);
    // The others still follow.
    assert_eq!(read(&node, &b, &ids[2], "cpuset.cpus"), "");
    assert!(agent.stop().success());
    node.assert_clean();
}

/// Every leaf cgroup below kubepods (the containers and sandboxes) but `except`, with what the
/// kernel runs it on: its `cpuset.cpus.effective` where the fake kernel keeps it (`effective`),
/// else its `cpuset.cpus` (v1, a plain tmpfs v2 tree).
fn leaves(node: &TestNode, except: &str, effective: bool) -> Vec<(String, CpuSet)> {
    let file = |rel: &str| match effective {
        false => node.fake.file(rel, "cpuset.cpus"),
        true => node.fake.file(rel, "cpuset.cpus.effective"),
    };
    let root = node.fake.file("kubepods", "cpuset.cpus");
    let base = root.parent().unwrap().parent().unwrap().to_path_buf();
    let (mut found, mut dirs) = (Vec::new(), vec![root.parent().unwrap().to_path_buf()]);
    while let Some(dir) = dirs.pop() {
        let subdirs: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_type().unwrap().is_dir())
            .map(|e| e.path())
            .collect();
        let rel = dir.strip_prefix(&base).unwrap().display().to_string();
        if subdirs.is_empty() && !rel.ends_with(except) {
            let held = fs::read_to_string(file(&rel)).unwrap();
            found.push((rel, CpuSet::parse(held.trim()).unwrap()));
        }
        dirs.extend(subdirs);
    }
    found
}

/// An in-process controller over `node` as `cpusetd run` builds it, after its first scan
/// and pass, watching arrivals as the agent does (the shared pool's rewrites may be held
/// back); and `pods` started before it. With `effective`, the fake kernel's rules keep the
/// v2 tree's effective sets in this process, as they do for the agent binary of the tests (a
/// plain tmpfs tree without: every cgroup there holds a set of its own, as on v1).
fn watching_controller(node: &TestNode, pods: &[PodSpec], effective: bool) -> Controller {
    if effective {
        cpusetd::cgroupfs::fake_kernel_rules_for(node.fake.cgroup_root());
    }
    for p in pods {
        node.fake.start_pod(p).unwrap();
    }
    let mut controller = node.controller(&[]);
    controller.full_scan().unwrap();
    controller.pass(Instant::now());
    controller.watch_arrivals(Arrivals::channel().1);
    assert!(
        controller.next_deadline().is_none(),
        "the first pass owes nothing"
    );
    controller
}

/// A Guaranteed pod with one 1-CPU container starts and its pass runs (the pass the agent runs
/// on its event): the pod, its container and its pin.
fn pin_one(node: &TestNode, controller: &mut Controller) -> (PodSpec, String, CpuSet) {
    let g = guaranteed("g", 1000);
    let gid = node.fake.start_pod(&g).unwrap().remove(0);
    let now = Instant::now();
    let cgroup = CgroupPath::new(&node.fake.pod_dir(&g)).unwrap();
    controller
        .apply_event(TreeEvent::Created { cgroup }, now)
        .unwrap();
    controller.pass(now);
    let pin = CpuSet::parse(&node.fake.container_cpus(&g, &gid).unwrap()).unwrap();
    assert_eq!(pin.len(), 1, "{gid} is pinned in its pod's pass");
    (g, gid, pin)
}

/// The leaves that still run on `pin` (see [`leaves`]).
fn on_the_pin(node: &TestNode, gid: &str, pin: &CpuSet, effective: bool) -> Vec<String> {
    let leaves = leaves(node, gid, effective).into_iter();
    leaves
        .filter(|(_, cpus)| !cpus.is_disjoint(pin))
        .map(|(rel, cpus)| format!("{rel}: {cpus}"))
        .collect()
}

/// Issue 24's v2 target, event → exclusive: on v2 with inheritance the shared pool's members
/// are few (the QoS cgroups, here), and the pin's own incremental pass narrows them off the
/// pin right after it. When that pass ends no other container runs on the pin; no full pass
/// ran and none is owed.
#[test]
fn v2_the_pins_own_pass_narrows_the_qos_cgroups_off_it() {
    let node = TestNode::new(CgroupVersion::V2);
    let mut pods: Vec<PodSpec> = (0..20).map(burstable).collect();
    pods.push(crate::agent_util::best_effort("e"));
    let mut controller = watching_controller(&node, &pods, true);
    let m = &controller.metrics;
    let (full, incremental, held) = (
        m.passes - m.incremental_passes,
        m.incremental_passes,
        m.writes_held_back,
    );

    let (g, gid, pin) = pin_one(&node, &mut controller);
    for qos in ["kubepods/burstable", "kubepods/besteffort"] {
        let own = fs::read_to_string(node.fake.file(qos, "cpuset.cpus")).unwrap();
        let own = CpuSet::parse(own.trim()).unwrap();
        assert!(own.is_disjoint(&pin), "{qos} holds {own}, the pin is {pin}");
    }
    let left = on_the_pin(&node, &gid, &pin, true);
    assert!(
        left.is_empty(),
        "{} still run on {pin}: {left:?}",
        left.len()
    );
    let m = &controller.metrics;
    assert_eq!(
        m.incremental_passes,
        incremental + 1,
        "the pin's pass was incremental"
    );
    assert_eq!(m.passes - m.incremental_passes, full, "no full pass ran");
    assert_eq!(m.writes_held_back, held, "nothing was held back");
    assert_eq!(controller.next_deadline(), None, "nothing is owed");
    // The pods still follow their QoS cgroup: nothing was written below it.
    assert_eq!(read(&node, &pods[0], "", "cpuset.cpus"), "");

    // The pod goes: its pass widens the QoS cgroups back, and owes nothing either.
    node.fake.remove_pod(&g).unwrap();
    let cgroup = CgroupPath::new(&node.fake.pod_dir(&g)).unwrap();
    let now = Instant::now();
    controller
        .apply_event(TreeEvent::Removed { cgroup }, now)
        .unwrap();
    controller.pass(now);
    for qos in ["kubepods/burstable", "kubepods/besteffort"] {
        let own = fs::read_to_string(node.fake.file(qos, "cpuset.cpus")).unwrap();
        assert_eq!(own.trim(), "0-15", "{qos} after the release");
    }
    let m = &controller.metrics;
    assert_eq!(
        m.incremental_passes,
        incremental + 2,
        "the release's pass was incremental"
    );
    assert_eq!(m.passes - m.incremental_passes, full, "no full pass ran");
    assert_eq!(controller.next_deadline(), None, "nothing is owed");
}

/// Where the shared pool's members are many, or the tree's cgroups do not inherit, the pin's
/// pass still holds their rewrites back for the coalesced full pass (issue 24 (a)), as before:
/// on v1 and on a plain tmpfs v2 tree (no effective sets: every shared container holds a set
/// of its own; here few pods, which these never plan in a chain), and on v2 with inheritance
/// when Guaranteed pods with fractional requests (whose sandbox and container hold the pool)
/// are many. Once the full pass ran, the pin is exclusive.
#[test]
fn the_pools_rewrites_stay_held_back_where_its_members_are_many() {
    let fractional = |n| {
        let specs = vec![ContainerSpec::guaranteed("f", 1500)];
        pod(&format!("f{n}"), Qos::Guaranteed, specs)
    };
    let few: Vec<PodSpec> = (0..3).map(burstable).collect();
    let mut many: Vec<PodSpec> = (0..12).map(fractional).collect();
    many.push(guaranteed("first", 1000));
    let cases = [
        (CgroupVersion::V1, few.clone(), false),
        (CgroupVersion::V2, few, false),
        (CgroupVersion::V2, many, true),
    ];
    for (version, pods, effective) in cases {
        let node = TestNode::new(version);
        let mut controller = watching_controller(&node, &pods, effective);
        let held = controller.metrics.writes_held_back;
        let (_, gid, pin) = pin_one(&node, &mut controller);
        let case = format!(
            "{version:?}, {} pods, effective sets: {effective}",
            pods.len()
        );
        assert!(
            controller.metrics.writes_held_back > held,
            "{case}: nothing held back"
        );
        let left = on_the_pin(&node, &gid, &pin, effective);
        assert!(
            !left.is_empty(),
            "{case}: the pool was rewritten in the pin's pass"
        );
        let due = controller.next_deadline().expect("the full pass is owed");
        assert!(controller.on_deadlines(due));
        controller.pass(due);
        let left = on_the_pin(&node, &gid, &pin, effective);
        assert!(left.is_empty(), "{case}: {left:?} after the full pass");
    }
}

/// After the pin's own pass narrowed the QoS cgroups (the pool's few members, planned alone),
/// the containers that follow them want the new pool: a foreign write into one is repaired
/// with the pool as it is now, never with the one from before the pin (which holds the pin).
#[test]
fn v2_a_foreign_write_after_the_pins_pass_is_repaired_without_the_pin() {
    let node = TestNode::new(CgroupVersion::V2);
    let pods: Vec<PodSpec> = (0..3).map(burstable).collect();
    let mut controller = watching_controller(&node, &pods, true);
    let (_g, _gid, pin) = pin_one(&node, &mut controller);
    let pod_dir = node.fake.pod_dir(&pods[0]);
    let container = fs::read_dir(node.fake.cgroup_root().join(&pod_dir))
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.file_type().unwrap().is_dir())
        .unwrap()
        .file_name();
    let rel = format!("{pod_dir}/{}", container.to_string_lossy());
    fs::write(node.fake.file(&rel, "cpuset.cpus"), "3\n").unwrap();
    let cgroup = CgroupPath::new(&rel).unwrap();
    let file = cpusetd::cgroupfs::InterfaceFile::CpusetCpus;
    let now = Instant::now();
    controller
        .apply_event(TreeEvent::Modified { cgroup, file }, now)
        .unwrap();
    controller.pass(now);
    let repaired = fs::read_to_string(node.fake.file(&rel, "cpuset.cpus")).unwrap();
    let repaired = CpuSet::parse(repaired.trim()).unwrap();
    let pool = fs::read_to_string(node.fake.file("kubepods/burstable", "cpuset.cpus")).unwrap();
    assert!(
        repaired.is_disjoint(&pin),
        "{rel} repaired to {repaired}, the pin is {pin}"
    );
    assert_eq!(
        repaired,
        CpuSet::parse(pool.trim()).unwrap(),
        "the pool as it is now"
    );
}
