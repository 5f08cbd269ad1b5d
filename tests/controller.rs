//! The agent's controller driven as a library on a fake node, one step at a time: cases whose
//! timing the agent binary cannot make deterministic (a cgroup that appears after the
//! controller's model was read, but before it writes).

use std::fs;
use std::time::Instant;

use cpusetd::agent::Controller;
use cpusetd::cgroupfs::{CgroupPath, CgroupVersion};
use cpusetd::cpuset::CpuSet;
use cpusetd::kubesim::{new_pod_uid, ContainerSpec, FakeNode, PodSpec, Qos};
use cpusetd::watcher::TreeEvent;

use crate::agent_process::TestNode;

fn pod(name: &str, qos: Qos, containers: Vec<ContainerSpec>) -> PodSpec {
    PodSpec {
        uid: new_pod_uid(),
        name: name.into(),
        qos,
        containers,
    }
}

/// A controller over the node's tree as `cpusetd run` builds it (CPU 0 reserved), after its
/// first scan and pass (as the agent starts).
fn controller(node: &TestNode) -> Controller {
    let mut controller = node.controller(&[]);
    controller.full_scan().unwrap();
    controller.pass(Instant::now());
    controller
}

/// Every cpuset directory under kubepods holds a subset of its parent's set (where that has
/// one).
fn assert_nested(node: &FakeNode) {
    let top = node.file("kubepods", "cpuset.cpus");
    let top = top.parent().unwrap();
    let read = |dir: &std::path::Path| {
        CpuSet::parse(fs::read_to_string(dir.join("cpuset.cpus")).unwrap().trim()).unwrap()
    };
    let mut dirs = vec![top.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let held = read(&dir);
        for entry in fs::read_dir(&dir).unwrap().flatten() {
            if entry.file_type().unwrap().is_dir() {
                let child = read(&entry.path());
                // An empty parent (v2: one that follows its own parent) bounds nothing.
                assert!(
                    held.is_empty() || child.is_subset(&held),
                    "{} holds {child}, outside its parent's {held}",
                    entry.path().display()
                );
                dirs.push(entry.path());
            }
        }
    }
}

#[test]
fn controller_replans_when_a_cgroup_appeared_after_its_model_was_read() {
    let test = TestNode::new(CgroupVersion::V1);
    let node = &test.fake;
    let mut controller = controller(&test);
    controller.pass(Instant::now());

    // A BestEffort pod starts (its cgroups copy the wide sets down) and a Guaranteed one; the
    // controller has heard of the Guaranteed pod only when it plans.
    let late = pod(
        "late",
        Qos::BestEffort,
        vec![ContainerSpec::best_effort("late")],
    );
    let late_ids = node.start_pod(&late).unwrap();
    let db = pod(
        "db",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("db", 2000)],
    );
    let db_ids = node.start_pod(&db).unwrap();
    let created = TreeEvent::Created {
        cgroup: CgroupPath::new(&format!("kubepods/pod{}", db.uid)).unwrap(),
    };
    controller.apply_event(created, Instant::now()).unwrap();
    let outcome = controller.pass(Instant::now());

    // Narrowing the besteffort directory would have dropped what the late pod holds: the
    // controller read it and planned again instead, in the same pass.
    assert_eq!(outcome.failed_writes, 0);
    assert_eq!(node.container_cpus(&db, &db_ids[0]).unwrap(), "1,9");
    let shared = "0,2-8,10-15";
    assert_eq!(node.container_cpus(&late, &late_ids[0]).unwrap(), shared);
    let late_pod = node.file(&node.pod_dir(&late), "cpuset.cpus");
    assert_eq!(fs::read_to_string(late_pod).unwrap().trim(), shared);
    assert_nested(node);
}

#[test]
fn controller_forgets_the_runtime_configs_of_containers_that_are_gone() {
    let test = TestNode::new(CgroupVersion::V1);
    let node = &test.fake;
    let mut controller = controller(&test);
    let pods: Vec<PodSpec> = (0..3)
        .map(|i| {
            let p = pod(
                &format!("p{i}"),
                Qos::Guaranteed,
                vec![ContainerSpec::guaranteed("app", 1000)],
            );
            node.start_pod(&p).unwrap();
            p
        })
        .collect();
    let cgroup = |p: &PodSpec| CgroupPath::new(&format!("kubepods/pod{}", p.uid)).unwrap();
    for p in &pods {
        let created = TreeEvent::Created { cgroup: cgroup(p) };
        controller.apply_event(created, Instant::now()).unwrap();
    }
    controller.pass(Instant::now());
    // A sandbox and an app container per pod.
    assert_eq!(controller.cached_runtime_configs(), 6);

    for p in &pods {
        node.remove_pod(p).unwrap();
        let removed = TreeEvent::Removed { cgroup: cgroup(p) };
        controller.apply_event(removed, Instant::now()).unwrap();
    }
    controller.pass(Instant::now());
    assert_eq!(controller.cached_runtime_configs(), 0);
}

#[test]
fn controller_releases_the_cpus_of_a_pod_found_gone_while_writing() {
    let test = TestNode::new(CgroupVersion::V1);
    let node = &test.fake;
    let mut controller = controller(&test);
    let guaranteed = |name: &str| {
        let p = pod(
            name,
            Qos::Guaranteed,
            vec![ContainerSpec::guaranteed(name, 1000)],
        );
        node.start_pod(&p).unwrap();
        p
    };
    let (first, second) = (guaranteed("first"), guaranteed("second"));
    let cgroup = |p: &PodSpec| CgroupPath::new(&format!("kubepods/pod{}", p.uid)).unwrap();
    for p in [&first, &second] {
        let created = TreeEvent::Created { cgroup: cgroup(p) };
        controller.apply_event(created, Instant::now()).unwrap();
    }
    controller.pass(Instant::now());
    assert_eq!(controller.assignments().exclusive_cpus().to_string(), "1,8");

    // Both pods are deleted; the controller hears of the first only. Releasing its CPU widens
    // the second pod's sandbox, which is gone: the second pod leaves the model while writing.
    node.remove_pod(&first).unwrap();
    node.remove_pod(&second).unwrap();
    let removed = TreeEvent::Removed {
        cgroup: cgroup(&first),
    };
    assert!(controller.apply_event(removed, Instant::now()).unwrap());
    controller.pass(Instant::now());
    // Its own removal event comes later and finds nothing to do: its CPU is free already.
    let removed = TreeEvent::Removed {
        cgroup: cgroup(&second),
    };
    assert!(!controller.apply_event(removed, Instant::now()).unwrap());
    assert_eq!(controller.assignments().len(), 0);
    assert_eq!(controller.shared_pool().unwrap().to_string(), "0-15");
}

#[test]
fn controller_measures_event_to_pin_until_the_cpuset_is_written() {
    let test = TestNode::new(CgroupVersion::V1);
    let node = &test.fake;
    let mut controller = controller(&test);
    let p = pod(
        "g",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("g", 1000)],
    );
    node.start_pod(&p).unwrap();
    let seen = Instant::now();
    let cgroup = CgroupPath::new(&format!("kubepods/pod{}", p.uid)).unwrap();
    controller
        .apply_event(TreeEvent::Created { cgroup }, seen)
        .unwrap();
    controller.pass(seen);
    let took = seen.elapsed();
    let summary = &controller.metrics.event_to_pin;
    // The sandbox is not counted; the app container is, with the time its pass took.
    assert_eq!(summary.count(), 1);
    let median = summary.quantile(0.5).unwrap();
    assert!(
        median > std::time::Duration::ZERO && median <= took,
        "{median:?} of {took:?}"
    );
}

#[test]
fn controller_counts_each_new_container_once_when_its_final_set_is_written() {
    let test = TestNode::new(CgroupVersion::V1);
    let node = &test.fake;
    let mut controller = controller(&test);
    let p = pod(
        "g",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("g", 1000)],
    );
    let id = node.start_pod(&p).unwrap().remove(0);
    // Its CPU settings cannot be read yet, and the runtime's config is not there.
    let container = format!("{}/{id}", node.pod_dir(&p));
    let shares = node.file(&container, "cpu.shares");
    fs::write(&shares, "").unwrap();
    let config = test.base.join("runtime").join(&id).join("config.json");
    let config_text = fs::read(&config).unwrap();
    fs::remove_file(&config).unwrap();

    let pod_cgroup = CgroupPath::new(&format!("kubepods/pod{}", p.uid)).unwrap();
    // On v1 the pod appears under both hierarchies: two events, one new pod.
    for _ in 0..2 {
        let created = TreeEvent::Created {
            cgroup: pod_cgroup.clone(),
        };
        controller.apply_event(created, Instant::now()).unwrap();
    }
    controller.pass(Instant::now());
    assert_eq!(node.container_cpus(&p, &id).unwrap(), "0-15");
    assert_eq!(controller.metrics.event_to_pin.count(), 0, "still waiting");

    fs::write(&shares, "1024\n").unwrap();
    fs::write(&config, config_text).unwrap();
    let modified = TreeEvent::Modified {
        cgroup: CgroupPath::new(&format!("kubepods/pod{}/{id}", p.uid)).unwrap(),
        file: cpusetd::cgroupfs::InterfaceFile::CpuShares,
    };
    controller.apply_event(modified, Instant::now()).unwrap();
    controller.pass(Instant::now());
    assert_eq!(node.container_cpus(&p, &id).unwrap(), "8");
    let again = TreeEvent::Created { cgroup: pod_cgroup };
    controller.apply_event(again, Instant::now()).unwrap();
    controller.pass(Instant::now());
    assert_eq!(controller.metrics.event_to_pin.count(), 1);
}

#[test]
fn controller_leaves_a_new_cgroup_to_its_runtime_and_narrows_its_parent_once_it_is_set_up() {
    let test = TestNode::new(CgroupVersion::V1);
    let node = &test.fake;
    let mut controller = controller(&test);
    // A BestEffort container whose runtime has not copied the pod's cpuset into it yet.
    let be = pod(
        "be",
        Qos::BestEffort,
        vec![ContainerSpec::best_effort("be")],
    );
    let be_id = node.start_pod(&be).unwrap().remove(0);
    let be_cpus = node.file(&format!("{}/{be_id}", node.pod_dir(&be)), "cpuset.cpus");
    fs::write(&be_cpus, "\n").unwrap();
    let db = pod(
        "db",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("db", 2000)],
    );
    node.start_pod(&db).unwrap();
    controller.full_scan().unwrap();
    controller.pass(Instant::now());

    // The new container is not written, and its pod not narrowed over it: the runtime is
    // about to copy the pod's set into it, and the kernel would refuse one of the writes.
    assert_eq!(fs::read_to_string(&be_cpus).unwrap(), "\n");
    let be_pod = node.file(&node.pod_dir(&be), "cpuset.cpus");
    assert_eq!(fs::read_to_string(&be_pod).unwrap().trim(), "0-15");
    let retry = controller
        .next_deadline()
        .expect("a pass planned for later");

    // The runtime sets it up; the pass planned for later narrows both.
    fs::write(&be_cpus, "0-15\n").unwrap();
    assert!(controller.on_deadlines(retry));
    controller.pass(retry);
    let shared = "0,2-8,10-15";
    assert_eq!(node.container_cpus(&be, &be_id).unwrap(), shared);
    assert_eq!(fs::read_to_string(&be_pod).unwrap().trim(), shared);
    assert_nested(node);
}

/// What happens on the node in one step of [`incremental_passes_plan_what_a_full_plan_would`].
#[derive(Debug, Clone)]
enum Step {
    /// A Guaranteed pod: its containers' whole-CPU requests.
    Guaranteed(Vec<u64>),
    /// A Guaranteed pod with a fractional request (shared).
    Fractional,
    Burstable,
    BestEffort,
    /// A container of the n-th live pod starts again (a new id, same name); its old cgroup
    /// goes a step later.
    Restart(usize),
    /// The n-th live pod is deleted.
    Delete(usize),
    /// Time passes: whatever the controller scheduled is due.
    Wait,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        4 => proptest::collection::vec(1u64..=3, 1..=2).prop_map(Step::Guaranteed),
        1 => Just(Step::Fractional),
        2 => Just(Step::Burstable),
        1 => Just(Step::BestEffort),
        2 => (0usize..8).prop_map(Step::Restart),
        2 => (0usize..8).prop_map(Step::Delete),
        2 => Just(Step::Wait),
    ]
}

/// Every exclusive set is held by one container and the tree nests, always; once nothing is
/// owed (`settled`: no shared rewrites held back), no other container runs on it either.
fn assert_exclusive_sets_alone(
    node: &FakeNode,
    pods: &[(PodSpec, Vec<(String, u64)>)],
    settled: bool,
) {
    assert_nested(node);
    let mut owners: Vec<(String, CpuSet)> = Vec::new();
    let mut others: Vec<(String, CpuSet)> = Vec::new();
    for (p, containers) in pods {
        for (id, whole) in containers {
            let cpus = match node.version() {
                CgroupVersion::V1 => CpuSet::parse(&node.container_cpus(p, id).unwrap()).unwrap(),
                CgroupVersion::V2 => v2_effective(node, &format!("{}/{id}", node.pod_dir(p))),
            };
            if *whole > 0 {
                assert_eq!(cpus.len() as u64, *whole, "{id} holds {cpus}");
                owners.push((id.clone(), cpus));
            } else {
                others.push((id.clone(), cpus));
            }
        }
    }
    for (i, (a, x)) in owners.iter().enumerate() {
        let others = others.iter().filter(|_| settled);
        for (b, y) in owners.iter().skip(i + 1).chain(others) {
            assert!(x.is_disjoint(y), "{a} holds {x}, {b} runs on {y}");
        }
    }
}

/// The incremental controller against its reference. Random sequences of pods starting,
/// containers restarting, pods going and time passing, each step handed to the controller as
/// the watcher would (its event, then a pass). Debug builds check every incremental pass
/// against a full plan of the same model (`assert_chain_is_full_plan`: same assignments,
/// pools, events, desired sets and writes in the new pods); this test checks the node after
/// every step (exclusive sets alone, the tree nested) and, once everything due has run, that a
/// full pass finds nothing left to write.
#[test]
fn incremental_passes_plan_what_a_full_plan_would() {
    incremental_property(CgroupVersion::V1, false);
}

/// The same on cgroup v2, where shared containers and pods follow their parent's set (issue
/// 24 (b)): what each container runs on is its effective set, derived from the files by the
/// kernel's rule ([`v2_effective`]).
#[test]
fn incremental_passes_plan_what_a_full_plan_would_v2() {
    incremental_property(CgroupVersion::V2, false);
}

/// The same on a v2 tree whose effective sets the fake kernel keeps in this process, as the
/// real kernel does: shared containers are left to inherit, the shared pool's members are few,
/// and an incremental pass plans and rewrites them itself (its check is then that the full
/// plan writes nothing outside the chain).
#[test]
fn incremental_passes_plan_what_a_full_plan_would_v2_with_effective_sets() {
    incremental_property(CgroupVersion::V2, true);
}

fn incremental_property(version: CgroupVersion, effective: bool) {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let mut runner = TestRunner::new(Config {
        cases: 32,
        failure_persistence: None,
        ..Config::default()
    });
    let incremental = std::cell::Cell::new(0u64);
    runner
        .run(
            &(any::<bool>(), proptest::collection::vec(step(), 1..30)),
            |(agent, steps)| {
                let test = TestNode::new(version);
                let node = &test.fake;
                if effective {
                    cpusetd::cgroupfs::fake_kernel_rules_for(node.cgroup_root());
                }
                let mut controller = controller(&test);
                if agent {
                    // As the agent runs it: the shared pool's rewrites wait while pods arrive.
                    let (_arrived, arrivals) = cpusetd::watcher::Arrivals::channel();
                    controller.watch_arrivals(arrivals);
                }
                let mut pods: Vec<(PodSpec, Vec<(String, u64)>)> = Vec::new();
                let mut old: Vec<(PodSpec, String)> = Vec::new();
                let pod_dir = |p: &PodSpec| CgroupPath::new(&node.pod_dir(p)).unwrap();
                for step in steps {
                    let now = Instant::now();
                    // A restarted container's old cgroup goes one step after its successor came.
                    for (p, id) in old.drain(..) {
                        node.remove_container(&p, &id).unwrap();
                        let cgroup =
                            CgroupPath::new(&format!("{}/{id}", node.pod_dir(&p))).unwrap();
                        controller
                            .apply_event(TreeEvent::Removed { cgroup }, now)
                            .unwrap();
                    }
                    let event = match step {
                        Step::Guaranteed(cpus) if held(&pods) + cpus.iter().sum::<u64>() > 12 => {
                            // The node is full (15 allocatable cpus, the shared pool keeps some).
                            None
                        }
                        Step::Guaranteed(cpus) => {
                            let specs = cpus
                                .iter()
                                .enumerate()
                                .map(|(i, n)| ContainerSpec::guaranteed(&format!("c{i}"), n * 1000))
                                .collect();
                            Some(start(node, &mut pods, pod("g", Qos::Guaranteed, specs)))
                        }
                        Step::Fractional => {
                            let specs = vec![ContainerSpec::guaranteed("f", 1500)];
                            Some(start(node, &mut pods, pod("f", Qos::Guaranteed, specs)))
                        }
                        Step::Burstable => {
                            let specs = vec![ContainerSpec::burstable("b", 250, Some(1000))];
                            Some(start(node, &mut pods, pod("b", Qos::Burstable, specs)))
                        }
                        Step::BestEffort => {
                            let specs = vec![ContainerSpec::best_effort("e")];
                            Some(start(node, &mut pods, pod("e", Qos::BestEffort, specs)))
                        }
                        Step::Restart(n) if !pods.is_empty() => {
                            let live = pods.len();
                            let (p, containers) = &mut pods[n % live];
                            let spec = p.containers[0].clone();
                            let id = node.add_container(p, &spec).unwrap();
                            let whole = containers[0].1;
                            let (gone, _) =
                                std::mem::replace(&mut containers[0], (id.clone(), whole));
                            old.push((p.clone(), gone));
                            Some(TreeEvent::Created {
                                cgroup: CgroupPath::new(&format!("{}/{id}", node.pod_dir(p)))
                                    .unwrap(),
                            })
                        }
                        Step::Delete(n) if !pods.is_empty() => {
                            let (p, _) = pods.remove(n % pods.len());
                            node.remove_pod(&p).unwrap();
                            Some(TreeEvent::Removed {
                                cgroup: pod_dir(&p),
                            })
                        }
                        Step::Wait => {
                            if let Some(due) = controller.next_deadline() {
                                if controller.on_deadlines(due) {
                                    controller.pass(due);
                                }
                            }
                            None
                        }
                        Step::Restart(_) | Step::Delete(_) => None,
                    };
                    if let Some(event) = event {
                        controller.apply_event(event, now).unwrap();
                    }
                    controller.pass(now);
                    assert_exclusive_sets_alone(node, &pods, controller.next_deadline().is_none());
                }
                // Everything due, then a full pass: nothing left to write.
                while let Some(due) = controller.next_deadline() {
                    if !controller.on_deadlines(due) {
                        break;
                    }
                    controller.pass(due);
                }
                controller.full_scan().unwrap();
                let outcome = controller.pass(Instant::now());
                prop_assert_eq!(outcome.writes, 0, "a full pass after the steps still wrote");
                assert_exclusive_sets_alone(node, &pods, true);
                incremental.set(incremental.get() + controller.metrics.incremental_passes);
                Ok(())
            },
        )
        .unwrap();
    // The property is about incremental passes: the sequences made many.
    assert!(
        incremental.get() >= 32,
        "{} incremental passes",
        incremental.get()
    );
}

/// A v2 cgroup's effective cpus by the kernel's rule (cgroup-v2.rst, "cpuset.cpus.effective"),
/// from the `cpuset.cpus` files up to the tree's root (whose effective set is the node's): its
/// own cpus within its parent's effective set, or all of that where it has none of them (an
/// empty `cpuset.cpus` among them).
fn v2_effective(node: &FakeNode, rel: &str) -> CpuSet {
    let read = |rel: &str, file| {
        CpuSet::parse(fs::read_to_string(node.file(rel, file)).unwrap().trim()).unwrap()
    };
    let Some((parent, _)) = rel.rsplit_once('/') else {
        let root = node.file("", "cpuset.cpus.effective");
        let root = CpuSet::parse(fs::read_to_string(root).unwrap().trim()).unwrap();
        return own_within(read(rel, "cpuset.cpus"), &root);
    };
    own_within(read(rel, "cpuset.cpus"), &v2_effective(node, parent))
}

fn own_within(own: CpuSet, parent: &CpuSet) -> CpuSet {
    let within = own.intersection(parent);
    if within.is_empty() {
        parent.clone()
    } else {
        within
    }
}

/// Exclusive CPUs the live pods' containers hold.
fn held(pods: &[(PodSpec, Vec<(String, u64)>)]) -> u64 {
    pods.iter()
        .flat_map(|(_, containers)| containers.iter().map(|(_, n)| n))
        .sum()
}

/// Starts a pod; records its app containers with their whole-CPU entitlement (0: shared).
fn start(node: &FakeNode, pods: &mut Vec<(PodSpec, Vec<(String, u64)>)>, p: PodSpec) -> TreeEvent {
    let ids = node.start_pod(&p).unwrap();
    let guaranteed = matches!(p.qos, Qos::Guaranteed);
    let whole = |c: &ContainerSpec| match c.request_milli {
        Some(m) if guaranteed && m % 1000 == 0 => m / 1000,
        _ => 0,
    };
    let containers = ids
        .into_iter()
        .zip(&p.containers)
        .map(|(id, c)| (id, whole(c)))
        .collect();
    let event = TreeEvent::Created {
        cgroup: CgroupPath::new(&node.pod_dir(&p)).unwrap(),
    };
    pods.push((p, containers));
    event
}

/// Issue 23, item 26: a pod kubelet would reject, arriving on a settled node, is planned by
/// an incremental pass (its pod's chain alone), which debug builds hold to a full plan of the
/// same model: the same rejection, the same released cpus, the same events. Then full passes
/// agree with it, and the pod's going ends the rejection.
#[test]
fn an_incremental_pass_rejects_a_pod_as_a_full_plan_would() {
    let test = TestNode::new(CgroupVersion::V1);
    let node = &test.fake;
    let mut controller = test.controller(&["--cpu-manager-policy-options", "full-pcpus-only=true"]);
    controller.full_scan().unwrap();
    controller.pass(Instant::now());
    let mut pods = Vec::new();
    let first = pod(
        "first",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 2000)],
    );
    let event = start(node, &mut pods, first);
    controller.apply_event(event, Instant::now()).unwrap();
    controller.pass(Instant::now());
    let before = controller.metrics.incremental_passes;
    assert!(before >= 1, "the first pod was not planned incrementally");

    let mixed = pod(
        "mixed",
        Qos::Guaranteed,
        vec![
            ContainerSpec::guaranteed("even", 2000),
            ContainerSpec::guaranteed("odd", 1000),
        ],
    );
    let uid = mixed.uid.clone();
    let event = start(node, &mut pods, mixed.clone());
    controller.apply_event(event, Instant::now()).unwrap();
    controller.pass(Instant::now());
    assert_eq!(controller.metrics.incremental_passes, before + 1);
    let rejection = controller.assignments().rejection(&uid).cloned().unwrap();
    assert_eq!(rejection.reason.to_string(), "SMTAlignmentError");
    assert!(controller
        .assignments()
        .iter()
        .all(|(k, _)| k.pod_uid() != uid));
    for (id, _) in &pods[1].1 {
        assert_eq!(node.container_cpus(&mixed, id).unwrap(), "0,2-8,10-15");
    }
    // A full pass decides the same.
    controller.full_scan().unwrap();
    controller.pass(Instant::now());
    assert_eq!(controller.assignments().rejection(&uid), Some(&rejection));
    assert_eq!(controller.assignments().len(), 1);

    node.remove_pod(&mixed).unwrap();
    let cgroup = CgroupPath::new(&node.pod_dir(&mixed)).unwrap();
    controller
        .apply_event(TreeEvent::Removed { cgroup }, Instant::now())
        .unwrap();
    controller.pass(Instant::now());
    assert!(controller.assignments().rejection(&uid).is_none());
    assert_nested(node);
}

/// Issue 23, item 26: a pod rejected for a request that is not whole cores stays rejected
/// while it lives, also when none of its containers is left for a while and another pod's
/// incremental pass (which does not see it) runs: a container of it starting again is not
/// pinned.
#[test]
fn a_rejection_outlives_its_containers_and_incremental_passes() {
    let test = TestNode::new(CgroupVersion::V1);
    let node = &test.fake;
    let mut controller = test.controller(&["--cpu-manager-policy-options", "full-pcpus-only=true"]);
    controller.full_scan().unwrap();
    controller.pass(Instant::now());
    let mut pods = Vec::new();
    let mixed = pod(
        "mixed",
        Qos::Guaranteed,
        vec![
            ContainerSpec::guaranteed("even", 2000),
            ContainerSpec::guaranteed("odd", 1000),
        ],
    );
    let uid = mixed.uid.clone();
    let event = start(node, &mut pods, mixed.clone());
    controller.apply_event(event, Instant::now()).unwrap();
    controller.pass(Instant::now());
    assert!(controller.assignments().rejection(&uid).is_some());
    // Both containers go (the odd one an init container, the other restarting).
    for (id, _) in pods[0].1.clone() {
        node.remove_container(&mixed, &id).unwrap();
        let cgroup = CgroupPath::new(&format!("{}/{id}", node.pod_dir(&mixed))).unwrap();
        controller
            .apply_event(TreeEvent::Removed { cgroup }, Instant::now())
            .unwrap();
        controller.pass(Instant::now());
    }
    controller.full_scan().unwrap();
    controller.pass(Instant::now());
    // Another pod: planned by an incremental pass that does not see the rejected one.
    let before = controller.metrics.incremental_passes;
    let other = pod(
        "other",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("app", 2000)],
    );
    let event = start(node, &mut pods, other);
    controller.apply_event(event, Instant::now()).unwrap();
    controller.pass(Instant::now());
    assert_eq!(controller.metrics.incremental_passes, before + 1);
    assert!(controller.assignments().rejection(&uid).is_some());
    // The even container starts again: still not pinned.
    let id = node.add_container(&mixed, &mixed.containers[0]).unwrap();
    let cgroup = CgroupPath::new(&format!("{}/{id}", node.pod_dir(&mixed))).unwrap();
    controller
        .apply_event(TreeEvent::Created { cgroup }, Instant::now())
        .unwrap();
    controller.pass(Instant::now());
    assert!(controller
        .assignments()
        .iter()
        .all(|(k, _)| k.pod_uid() != uid));
    assert_ne!(node.container_cpus(&mixed, &id).unwrap(), "1,9");
    assert_nested(node);
}

/// runc makes a container's cgroup (`cpu.shares` then reads the kernel's 1024) and writes the
/// config's value a moment later (issue 23, item 22): a value still being written settles, it
/// does not disagree, so nothing is said while the cgroup holds the kernel's default; a
/// settled value other than the config's is still said.
#[test]
fn controller_says_nothing_while_a_new_containers_cpu_shares_settle() {
    crate::util::capture_logs();
    let test = TestNode::new(CgroupVersion::V1);
    let node = &test.fake;
    let mut controller = controller(&test);
    let said = |id: &str| {
        crate::util::logged(id)
            .into_iter()
            .filter(|l| l.contains("disagree"))
            .collect::<Vec<_>>()
    };
    for (qos, container, in_between) in [
        (Qos::BestEffort, ContainerSpec::best_effort("app"), "1024"),
        (
            Qos::Guaranteed,
            ContainerSpec::guaranteed("app", 2000),
            "1024",
        ),
        (Qos::BestEffort, ContainerSpec::best_effort("odd"), "1536"),
    ] {
        let p = pod("settling", qos, vec![container]);
        let id = node.start_pod(&p).unwrap().remove(0);
        let shares = node.file(&format!("{}/{id}", node.pod_dir(&p)), "cpu.shares");
        let config_value = fs::read_to_string(&shares).unwrap();
        // As runc's mkdir leaves the cgroup: the config's value not written yet.
        fs::write(&shares, format!("{in_between}\n")).unwrap();
        let cgroup = CgroupPath::new(&node.pod_dir(&p)).unwrap();
        controller
            .apply_event(TreeEvent::Created { cgroup }, Instant::now())
            .unwrap();
        controller.pass(Instant::now());
        if in_between == "1024" {
            assert_eq!(said(&id), Vec::<String>::new(), "while settling");
            // runc writes the config's value.
            fs::write(&shares, &config_value).unwrap();
            let cgroup = CgroupPath::new(&format!("{}/{id}", node.pod_dir(&p))).unwrap();
            let modified = TreeEvent::Modified {
                cgroup,
                file: cpusetd::cgroupfs::InterfaceFile::CpuShares,
            };
            controller.apply_event(modified, Instant::now()).unwrap();
            controller.pass(Instant::now());
            assert_eq!(said(&id), Vec::<String>::new(), "once settled");
        } else {
            assert_eq!(
                said(&id).len(),
                1,
                "a value that is no default: {:?}",
                said(&id)
            );
        }
    }
}

/// Issue 24 item 5: the in-process controller is the one `cpusetd run` builds, its host
/// effects and hotplug included, on the node's (fake) procfs and sysfs: a pod asking for
/// `irq-load-balancing.crio.io: disable` has the interrupts moved off its pin by a pass, and a
/// cpu going offline is seen. (`Controller::new` alone did neither.)
#[test]
fn the_in_process_controller_moves_irqs_and_follows_hotplug_as_run_does() {
    let test = TestNode::with_writable_sysfs(CgroupVersion::V1);
    let irq = test.sysfs.join("proc/irq");
    fs::create_dir_all(irq.join("24")).unwrap();
    fs::write(irq.join("default_smp_affinity"), "ffff\n").unwrap();
    fs::write(irq.join("24/smp_affinity_list"), "0-15\n").unwrap();
    let mut controller = controller(&test);

    let rt = pod(
        "rt",
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed("dpdk", 2000)],
    );
    test.fake
        .annotate_pod(&rt.uid, &[("irq-load-balancing.crio.io", "disable")]);
    let id = test.fake.start_pod(&rt).unwrap().remove(0);
    let created = TreeEvent::Created {
        cgroup: CgroupPath::new(&format!("kubepods/pod{}", rt.uid)).unwrap(),
    };
    controller.apply_event(created, Instant::now()).unwrap();
    controller.pass(Instant::now());
    let pinned = CpuSet::parse(&test.fake.container_cpus(&rt, &id).unwrap()).unwrap();
    assert_eq!(pinned.len(), 2);
    let mut off_pin = CpuSet::parse("0-15").unwrap();
    for cpu in pinned.iter() {
        off_pin.remove(cpu);
    }
    let irq_24 = fs::read_to_string(irq.join("24/smp_affinity_list")).unwrap();
    assert_eq!(CpuSet::parse(irq_24.trim()).unwrap(), off_pin);

    assert!(!controller.online_cpus_changed());
    test.set_cpu_online(15, false);
    assert!(controller.online_cpus_changed());
}
