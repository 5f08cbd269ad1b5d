//! The agent binary on this machine's cgroup v1 hierarchies: `cpusetd run` on a uniquely named
//! kubepods-like subtree of `/sys/fs/cgroup/{cpuset,cpu}` (topology from the real `/sys`, CPU 0
//! reserved), with runc containers started and deleted while it runs, checked the way the
//! kernel sees them (`Cpus_allowed_list` of the container's process), a foreign write undone,
//! and the event-to-pin latency over 200 container cgroups made by hand (printed). Skipped with
//! a printed reason without root, a v1 cpuset hierarchy or runc; the subtree and containers are
//! removed whatever happens (see `runc`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::errno::Errno;
use nix::sys::signal::Signal;
use serde_json::json;

use cpusetd::cpuset::CpuSet;

use crate::agent_util::{
    parse_metrics, pin_latency, poll_until, status_of, wait_status_of, AgentProcess, Status,
    DEADLINE,
};
use crate::runc::{
    container_id, controller_mount, kernel_skip_reason, online_cpus, pod_uid, runc_skip_reason,
    CpuResources, E2eTree, Runc,
};

/// The folder holding the v1 controller mounts, as `--cgroup-root`.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

fn read(path: &Path) -> String {
    fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

fn write(path: &Path, value: &str) -> std::io::Result<()> {
    fs::write(path, value)
}

/// What runc's `ensureParent` does for a new v1 cpuset: copy the parent's mems and cpus into an
/// empty one. The parent may be narrowed meanwhile (the kernel refuses a stale copy): read again.
fn copy_cpuset_from_parent(dir: &Path) {
    let parent = dir.parent().unwrap();
    for file in ["cpuset.mems", "cpuset.cpus"] {
        let copied = poll_until(DEADLINE, || {
            if !read(&dir.join(file)).is_empty() {
                return Some(());
            }
            write(&dir.join(file), &read(&parent.join(file))).ok()
        });
        assert!(copied.is_some(), "{}: cannot copy {file}", dir.display());
    }
}

/// The subtree's kubepods root and QoS directories in the cpuset and cpu hierarchies, cpusets
/// copied down from the mount's root.
fn make_kubepods(tree: &E2eTree) {
    let cpuset = controller_mount("cpuset").unwrap();
    let cpu = controller_mount("cpu").unwrap();
    for rel in [
        tree.name().to_string(),
        tree.kubepods(),
        format!("{}/besteffort", tree.kubepods()),
        format!("{}/burstable", tree.kubepods()),
    ] {
        fs::create_dir(cpuset.join(&rel)).unwrap();
        copy_cpuset_from_parent(&cpuset.join(&rel));
        fs::create_dir_all(cpu.join(&rel)).unwrap();
    }
}

/// `cpusetd run` on a subtree, and `status` on it.
pub(crate) struct RealAgent {
    pub(crate) agent: AgentProcess,
    pub(crate) tree_args: Vec<String>,
    metrics: PathBuf,
    /// Its `--projection-dir` (in the scratch directory: never the host's `/run/cpusetd`).
    pub(crate) projection: PathBuf,
}

impl RealAgent {
    /// Starts the agent on `tree` with CPU 0 reserved, its state and log in `scratch`, runtime
    /// configs at `<scratch>/<runtime>/{id}/config.json`; waits for its first pass.
    pub(crate) fn start(tree: &E2eTree, scratch: &Path, runtime: &str) -> RealAgent {
        RealAgent::start_as(tree, scratch, runtime, &[], "none")
    }

    /// [`RealAgent::start`] reading kubelet's checkpoint at `kubelet_state`.
    pub(crate) fn start_migrating(
        tree: &E2eTree,
        scratch: &Path,
        runtime: &str,
        kubelet_state: &Path,
    ) -> RealAgent {
        let path = kubelet_state.display().to_string();
        RealAgent::start_as(tree, scratch, runtime, &[], &path)
    }

    /// [`RealAgent::start`] the way the shipped unit runs it: root without any capability
    /// (`setpriv` drops the bounding set), so file modes bind it.
    fn start_without_capabilities(tree: &E2eTree, scratch: &Path) -> RealAgent {
        RealAgent::start_as(
            tree,
            scratch,
            ".",
            &[
                "setpriv",
                "--bounding-set",
                "-all",
                "--inh-caps",
                "-all",
                "--",
            ],
            "none",
        )
    }

    /// [`RealAgent::start`] under a wrapper command (`setpriv …` to run it the way the shipped
    /// unit does: root without capabilities).
    fn start_as(
        tree: &E2eTree,
        scratch: &Path,
        runtime: &str,
        wrapper: &[&str],
        kubelet_state: &str,
    ) -> RealAgent {
        let state = scratch.join("state");
        fs::create_dir_all(&state).unwrap();
        let metrics = scratch.join("m.prom");
        let projection = scratch.join("projection");
        let tree_args: Vec<String> = [
            "--cgroup-root",
            CGROUP_ROOT,
            "--kubepods-path",
            &tree.kubepods(),
            "--runtime-config-path",
            &format!("{}/{runtime}/{{id}}/config.json", scratch.display()),
            "--state-dir",
            &state.display().to_string(),
            "--projection-dir",
            &projection.display().to_string(),
        ]
        .map(String::from)
        .to_vec();
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(env!("CARGO_BIN_EXE_cpusetd"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_cpusetd")),
        };
        command.arg("run").args(&tree_args).args([
            "--kubelet-state",
            kubelet_state,
            "--reserved-cpus",
            "0",
            "--cpu-manager-reconcile-period",
            "1s",
            // Never this machine's kubelet: the PodResources answers are cpusetd's alone.
            "--kubelet-pod-resources-socket",
            "none",
            "--metrics-file",
        ]);
        command.arg(&metrics);
        let mut agent = AgentProcess::spawn(command, &scratch.join("agent.log"), None);
        agent.wait_for_log("first pass:");
        RealAgent {
            agent,
            tree_args,
            metrics,
            projection,
        }
    }

    pub(crate) fn status(&self) -> Option<Status> {
        status_of(&self.tree_args)
    }

    pub(crate) fn wait_status(&self, what: &str, condition: impl FnMut(&Status) -> bool) -> Status {
        wait_status_of(&self.tree_args, what, condition)
    }

    pub(crate) fn metrics(&self) -> std::collections::BTreeMap<String, f64> {
        parse_metrics(&fs::read_to_string(&self.metrics).unwrap_or_default())
    }

    /// Stops the agent (exit 0) and checks no cgroup write failed.
    pub(crate) fn stop_clean(&mut self) {
        assert!(self.agent.stop().success(), "{}", self.agent.log());
        let errors: Vec<_> = self
            .metrics()
            .into_iter()
            .filter(|(k, v)| k.starts_with("cpusetd_cgroup_write_errors_total") && *v > 0.0)
            .collect();
        assert!(errors.is_empty(), "failed cgroup writes: {errors:?}");
    }
}

#[test]
fn agent_pins_real_containers_started_and_deleted_while_it_runs() {
    if let Some(reason) = runc_skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let online = online_cpus();
    let mut runc = Runc::new();
    make_kubepods(runc.tree());
    // runc's bundles hold the containers' OCI configs (CPU settings, no CRI annotations).
    let mut agent = RealAgent::start(runc.tree(), runc.scratch(), ".");

    let guaranteed_pod = format!("pod{}", pod_uid());
    let guaranteed = runc.start(&guaranteed_pod, CpuResources::guaranteed(1));
    let best_effort = runc.start(
        &format!("besteffort/pod{}", pod_uid()),
        CpuResources::best_effort(),
    );
    let container_cpus = runc
        .tree()
        .dir("cpuset", &guaranteed.cgroup)
        .join("cpuset.cpus");
    let exclusive = poll_until(DEADLINE, || {
        CpuSet::parse(&read(&container_cpus))
            .ok()
            .filter(|c| c.len() == 1 && !c.contains(0))
    })
    .unwrap_or_else(|| {
        panic!(
            "not pinned: {}\n{}",
            read(&container_cpus),
            agent.agent.log()
        )
    });
    if online == CpuSet::range(0, 1) {
        assert_eq!(exclusive, CpuSet::range(1, 1));
    }
    let shared = online.difference(&exclusive);
    assert_eq!(guaranteed.wait_cpus_allowed(&exclusive), exclusive);
    assert_eq!(best_effort.wait_cpus_allowed(&shared), shared);
    let status = agent.wait_status("converged", |s| s.converged());
    assert_eq!(status.exclusive_cpus, exclusive.to_string());
    assert_eq!(
        read(
            &runc
                .tree()
                .dir("cpu", &guaranteed.cgroup)
                .join("cpu.cfs_quota_us")
        ),
        "-1"
    );

    // Someone widens the pod, then the container (the kernel allows no other order), while
    // the agent is stopped (it would undo the first write before the second).
    let pod_cpus = runc
        .tree()
        .dir("cpuset", &guaranteed_pod)
        .join("cpuset.cpus");
    agent.agent.signal(Signal::SIGSTOP);
    let widened = write(&pod_cpus, &online.to_string())
        .and_then(|()| write(&container_cpus, &online.to_string()));
    // Read while the agent is still stopped: once it runs, it repairs at once.
    let foreign = read(&container_cpus);
    agent.agent.signal(Signal::SIGCONT);
    widened.unwrap();
    // The container could run on every cpu: the foreign write took effect.
    assert_eq!(foreign, online.to_string());
    assert_eq!(guaranteed.wait_cpus_allowed(&exclusive), exclusive);
    assert_eq!(read(&container_cpus), exclusive.to_string());
    let repairs = poll_until(DEADLINE, || {
        agent
            .metrics()
            .get("cpusetd_drift_repairs_total")
            .copied()
            .filter(|n| *n >= 1.0)
    });
    assert!(repairs.is_some(), "{:?}", agent.metrics());

    // The Guaranteed pod is deleted: its CPU goes back to the shared pool.
    runc.delete(&guaranteed);
    runc.tree().remove(&guaranteed_pod);
    assert_eq!(best_effort.wait_cpus_allowed(&online), online);
    agent.wait_status("the pod's cpu released", |s| {
        s.exclusive_cpu_count == 0 && s.converged()
    });
    // A new one gets a CPU again.
    let again = runc.start(&format!("pod{}", pod_uid()), CpuResources::guaranteed(1));
    assert_eq!(again.wait_cpus_allowed(&exclusive), exclusive);
    assert_eq!(best_effort.wait_cpus_allowed(&shared), shared);
    agent.stop_clean();
}

/// Issue 17, item 1: a pod directory the agent cannot open (EACCES: the unit runs as root
/// without capabilities, and someone made the directory mode 000) is not "gone": its pin is
/// kept, and a Guaranteed pod that arrives next never gets the same CPU.
#[test]
fn agent_keeps_the_pin_of_a_pod_it_cannot_read() {
    if let Some(reason) = runc_skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        println!("skipped: setpriv (util-linux) is missing");
        return;
    }
    let mut runc = Runc::new();
    make_kubepods(runc.tree());
    let mut agent = RealAgent::start_without_capabilities(runc.tree(), runc.scratch());
    let first_pod = format!("pod{}", pod_uid());
    let first = runc.start(&first_pod, CpuResources::guaranteed(1));
    let status = agent.wait_status("the first pin", |s| {
        s.exclusive_cpu_count == 1 && s.converged()
    });
    let exclusive = CpuSet::parse(&status.exclusive_cpus).unwrap();
    assert_eq!(first.wait_cpus_allowed(&exclusive), exclusive);

    // The pod directory becomes unreadable to the agent; restored whatever happens.
    struct Restore(PathBuf);
    impl Drop for Restore {
        fn drop(&mut self) {
            use std::os::unix::fs::PermissionsExt;
            let _ = fs::set_permissions(&self.0, fs::Permissions::from_mode(0o755));
        }
    }
    let pod_dir = runc.tree().dir("cpuset", &first_pod);
    let _restore = Restore(pod_dir.clone());
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&pod_dir, fs::Permissions::from_mode(0o000)).unwrap();
    }
    // A full rescan now (the reconcile would make one within a few periods anyway).
    agent.agent.signal(Signal::SIGHUP);
    agent.agent.wait_for_log("Permission denied");

    // A second Guaranteed pod: the only free CPUs are the shared pool's, never the first's.
    let second = runc.start(&format!("pod{}", pod_uid()), CpuResources::guaranteed(1));
    poll_until(std::time::Duration::from_secs(3), || {
        agent.agent.log().contains("not enough cpus").then_some(())
    });
    let second_cpus = CpuSet::parse(
        fs::read_to_string(format!("/proc/{}/status", second.pid))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim(),
    )
    .unwrap();
    assert!(
        second_cpus.is_disjoint(&exclusive),
        "the second pod runs on {second_cpus}, the first holds {exclusive}:\n{}",
        agent.agent.log()
    );
    assert_eq!(first.wait_cpus_allowed(&exclusive), exclusive);
    drop(_restore);
    assert!(agent.agent.stop().success(), "{}", agent.agent.log());
}

/// Issue 17, item 5: an empty child cgroup the agent cannot write (owned by another user; the
/// unit has no capabilities) blocks its parent's narrowing. The agent says so once, naming the
/// parent, the child and the fix, does not spin, and narrows once the child is fixed.
#[test]
fn agent_names_an_unwritable_child_that_blocks_a_narrowing() {
    if let Some(reason) = runc_skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        println!("skipped: setpriv (util-linux) is missing");
        return;
    }
    let online = online_cpus();
    if online.len() < 2 {
        println!("skipped: one cpu only");
        return;
    }
    let mut runc = Runc::new();
    make_kubepods(runc.tree());
    let mut agent = RealAgent::start_without_capabilities(runc.tree(), runc.scratch());
    let shared = runc.start(
        &format!("besteffort/pod{}", pod_uid()),
        CpuResources::best_effort(),
    );
    assert_eq!(shared.wait_cpus_allowed(&online), online);
    // The container's own empty sub-cgroup, owned by another user.
    let container_dir = runc.tree().dir("cpuset", &shared.cgroup);
    let sub = container_dir.join("sub");
    fs::create_dir(&sub).unwrap();
    copy_cpuset_from_parent(&sub);
    let chown = |uid: u32| {
        for path in [
            sub.clone(),
            sub.join("cpuset.cpus"),
            sub.join("cpuset.mems"),
        ] {
            nix::unistd::chown(&path, Some(nix::unistd::Uid::from_raw(uid)), None).unwrap();
        }
    };
    chown(4242);
    let sub_cpus = sub.join("cpuset.cpus");
    let guaranteed = runc.start(&format!("pod{}", pod_uid()), CpuResources::guaranteed(1));
    agent
        .agent
        .wait_for_log("cannot be narrowed while its child");
    let said = agent.agent.log_lines("cannot be narrowed while its child");
    assert_eq!(said.len(), 1, "{}", agent.agent.log());
    assert!(
        said[0].contains("/sub") && said[0].contains("chown"),
        "{}",
        said[0]
    );
    assert_eq!(read(&sub_cpus), online.to_string());
    // Fixed by the operator: the next reconcile narrows the chain.
    chown(0);
    let exclusive = poll_until(DEADLINE, || {
        let status = agent.status()?;
        (status.exclusive_cpu_count == 1).then(|| CpuSet::parse(&status.exclusive_cpus).ok())?
    })
    .unwrap();
    let rest = online.difference(&exclusive);
    assert_eq!(shared.wait_cpus_allowed(&rest), rest);
    assert_eq!(guaranteed.wait_cpus_allowed(&exclusive), exclusive);
    assert!(
        poll_until(DEADLINE, || (read(&sub_cpus) == rest.to_string())
            .then_some(()))
        .is_some()
    );
    assert!(agent.agent.stop().success(), "{}", agent.agent.log());
}

/// Issue 23, item 2: a Burstable container that made a child cgroup the agent cannot write
/// (owned by another user; the unit has no capabilities) and left it empty (its
/// `cgroup.clone_children` off). The kernel lets the container be narrowed with the empty child
/// in place: the agent narrows it, and names the child it cannot write once, with the errno,
/// counted in `cpusetd_narrowings_blocked_total`.
#[test]
fn agent_narrows_a_container_past_an_empty_child_it_cannot_write() {
    if let Some(reason) = runc_skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        println!("skipped: setpriv (util-linux) is missing");
        return;
    }
    let online = online_cpus();
    if online.len() < 2 {
        println!("skipped: one cpu only");
        return;
    }
    let mut runc = Runc::new();
    make_kubepods(runc.tree());
    let mut agent = RealAgent::start_without_capabilities(runc.tree(), runc.scratch());
    let burstable = CpuResources {
        shares: 512,
        quota: None,
    };
    let shared = runc.start(&format!("burstable/pod{}", pod_uid()), burstable);
    assert_eq!(shared.wait_cpus_allowed(&online), online);
    // The container's own child, left empty by the kernel, owned by another user.
    let container_dir = runc.tree().dir("cpuset", &shared.cgroup);
    write(&container_dir.join("cgroup.clone_children"), "0").unwrap();
    let sub = container_dir.join("sub");
    fs::create_dir(&sub).unwrap();
    for path in [
        sub.clone(),
        sub.join("cpuset.cpus"),
        sub.join("cpuset.mems"),
    ] {
        nix::unistd::chown(&path, Some(nix::unistd::Uid::from_raw(4242)), None).unwrap();
    }
    let sub_cpus = sub.join("cpuset.cpus");
    assert_eq!(read(&sub_cpus), "");
    let guaranteed = runc.start(&format!("pod{}", pod_uid()), CpuResources::guaranteed(1));
    let exclusive = poll_until(DEADLINE, || {
        let status = agent.status()?;
        (status.exclusive_cpu_count == 1).then(|| CpuSet::parse(&status.exclusive_cpus).ok())?
    })
    .unwrap();
    assert_eq!(guaranteed.wait_cpus_allowed(&exclusive), exclusive);
    // The kernel allows it: the Burstable container leaves the pinned cpu.
    let rest = online.difference(&exclusive);
    assert_eq!(
        shared.wait_cpus_allowed(&rest),
        rest,
        "{}",
        agent.agent.log()
    );
    // The child it cannot write is named once, with the errno, and counted.
    agent.agent.wait_for_log("/sub");
    let said = agent.agent.log_lines("/sub");
    assert_eq!(said.len(), 1, "{}", agent.agent.log());
    assert!(said[0].contains("Permission denied"), "{}", said[0]);
    let blocked = poll_until(DEADLINE, || {
        let metrics = agent.metrics();
        metrics
            .get("cpusetd_narrowings_blocked_total")
            .copied()
            .filter(|v| *v >= 1.0)
    });
    assert!(blocked.is_some(), "{:?}", agent.metrics());
    assert_eq!(read(&sub_cpus), "");
    assert!(agent.agent.stop().success(), "{}", agent.agent.log());
}

/// Issue 17, item 7: runc copies a new cgroup's cpuset from its parent when it finds it empty,
/// and the agent narrowing the parent between runc's read and its write made a start fail
/// (EACCES). The agent sets `cgroup.clone_children` (v1), so the kernel fills a new cgroup at
/// `mkdir`, atomically with the agent's writes, and runc copies nothing. Shown directly (a new
/// pod directory is born with its parent's set) and by container starts under pin churn.
#[test]
fn agent_makes_the_kernel_fill_new_cgroups_so_runc_never_copies() {
    if let Some(reason) = runc_skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let mut runc = Runc::new();
    make_kubepods(runc.tree());
    let mut agent = RealAgent::start(runc.tree(), runc.scratch(), ".");
    let kubepods = runc.tree().dir("cpuset", "");
    assert_eq!(read(&kubepods.join("cgroup.clone_children")), "1");
    // What kubelet does for a pod: mkdir. The kernel fills it at once.
    let pod_dir = format!("besteffort/pod{}", pod_uid());
    let dir = runc.tree().dir("cpuset", &pod_dir);
    fs::create_dir(&dir).unwrap();
    let parent = read(&runc.tree().dir("cpuset", "besteffort").join("cpuset.cpus"));
    assert_eq!(read(&dir.join("cpuset.cpus")), parent);
    assert!(!read(&dir.join("cpuset.mems")).is_empty());
    runc.tree().remove(&pod_dir);
    // Starts under pin churn: every one succeeds (runc.start asserts it).
    let shared = runc.start(
        &format!("besteffort/pod{}", pod_uid()),
        CpuResources::best_effort(),
    );
    for _ in 0..10 {
        let pinned_pod = format!("pod{}", pod_uid());
        let pinned = runc.start(&pinned_pod, CpuResources::guaranteed(1));
        let other = runc.start(
            &format!("besteffort/pod{}", pod_uid()),
            CpuResources::best_effort(),
        );
        runc.delete(&pinned);
        runc.tree().remove(&pinned_pod);
        runc.delete(&other);
    }
    let online = online_cpus();
    assert_eq!(shared.wait_cpus_allowed(&online), online);
    agent.stop_clean();
    // `reset` puts the kernel's default back.
    let out = Command::new(env!("CARGO_BIN_EXE_cpusetd"))
        .arg("reset")
        .args(&agent.tree_args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(read(&kubepods.join("cgroup.clone_children")), "0");
}

/// A container cgroup made by hand on the real hierarchies the way kubelet and runc make one
/// (no process in it), with a CRI-like runtime config.
struct HandMadePod {
    rel: String,
    containers: Vec<String>,
}

impl HandMadePod {
    /// A pod with one container: Guaranteed with `milli` CPUs, or BestEffort.
    fn start(tree: &E2eTree, runtime: &Path, milli: Option<u64>) -> HandMadePod {
        let uid = pod_uid();
        let rel = match milli {
            Some(_) => format!("pod{uid}"),
            None => format!("besteffort/pod{uid}"),
        };
        let (shares, quota) = match milli {
            Some(m) => (m * 1024 / 1000, (m * 100) as i64),
            None => (2, -1),
        };
        let id = container_id();
        let config = json!({
            "annotations": {
                "io.kubernetes.cri.container-type": "container",
                "io.kubernetes.cri.container-name": "app",
                "io.kubernetes.cri.sandbox-uid": uid,
            },
            "linux": {"resources": {"cpu": {"shares": shares, "quota": quota, "period": 100000}}},
        });
        fs::create_dir_all(runtime.join(&id)).unwrap();
        fs::write(runtime.join(&id).join("config.json"), config.to_string()).unwrap();
        for dir in [rel.clone(), format!("{rel}/{id}")] {
            let cpuset = tree.dir("cpuset", &dir);
            fs::create_dir(&cpuset).unwrap();
            copy_cpuset_from_parent(&cpuset);
            let cpu = tree.dir("cpu", &dir);
            fs::create_dir(&cpu).unwrap();
            write(&cpu.join("cpu.shares"), &shares.to_string()).unwrap();
            write(&cpu.join("cpu.cfs_quota_us"), &quota.to_string()).unwrap();
        }
        HandMadePod {
            rel,
            containers: vec![id],
        }
    }

    fn remove(&self, tree: &E2eTree) {
        for id in &self.containers {
            for controller in ["cpuset", "cpu"] {
                let dir = tree.dir(controller, &format!("{}/{id}", self.rel));
                if let Err(e) = fs::remove_dir(&dir) {
                    assert_eq!(e.raw_os_error(), Some(Errno::ENOENT as i32), "{e}");
                }
            }
        }
        tree.remove(&self.rel);
    }
}

/// Event → pin latency on the real v1 hierarchy (printed, not asserted): 20 rounds of one
/// Guaranteed 1-CPU pod and nine BestEffort pods made back to back, waited for, deleted.
#[test]
fn agent_event_to_pin_latency_on_the_real_v1_hierarchy() {
    if let Some(reason) = kernel_skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let runtime = scratch.path().join("runtime");
    let tree = E2eTree::new();
    make_kubepods(&tree);
    let mut agent = RealAgent::start(&tree, scratch.path(), "runtime");
    let online = online_cpus();
    for round in 0..20 {
        let pods: Vec<HandMadePod> = (0..10)
            .map(|i| HandMadePod::start(&tree, &runtime, (i == 0).then_some(1000)))
            .collect();
        // The agent's own count: each container is counted once, when its set is final.
        let counted = (round + 1) as f64 * 10.0;
        let pinned = poll_until(DEADLINE, || {
            let count = agent
                .metrics()
                .get("cpusetd_event_to_pin_seconds_count")
                .copied();
            count.filter(|n| *n >= counted)
        });
        assert!(pinned.is_some(), "round {round}: {:?}", agent.metrics());
        agent.wait_status(&format!("round {round} converged"), |s| {
            s.converged() && s.exclusive_cpu_count == 1
        });
        for p in &pods {
            p.remove(&tree);
        }
        agent.wait_status(&format!("round {round} gone"), |s| {
            s.containers.is_empty() && s.shared_pool == online.to_string()
        });
    }
    println!(
        "event-to-pin latency, real cgroup v1 hierarchy ({}): {}",
        crate::agent_util::build(),
        pin_latency(&agent.metrics())
    );
    agent.stop_clean();
}
