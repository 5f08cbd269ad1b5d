//! A real containerd driven over CRI the way kubelet drives it (`crikubelet`: pod cgroups made
//! first with the cgroupfs driver, RunPodSandbox with `cgroup_parent` and host network,
//! CreateContainer/StartContainer with kubelet's resources, restarts as attempt + 1, pod
//! deletion), with `cpusetd run` on the same tree reading containerd's own `config.json` files
//! through its default path template for the test's state directory. Everything is asserted on
//! `Cpus_allowed_list` of the real container processes and on `cpusetd status --json`.
//!
//! Each test starts its own containerd (own root, state directory and socket in a temporary
//! directory; CRI plugin on; `restrict_oom_score_adj`, since lowering `oom_score_adj` is
//! refused on machines like CI's) with locally built pause and busybox images, on its own
//! uniquely named cgroup subtree. Skipped with a printed reason without root, a v1 cpuset
//! hierarchy, runc, a static busybox or containerd (`scripts/ci-deps.sh` installs them).

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use cpusetd::cpuset::CpuSet;
use crikubelet::{image, CgroupDriver, ContainerSpec, Cri, NodeCgroups, PodSpec, RunningPod};

use crate::agent_real::RealAgent;
use crate::agent_util::{poll_until, Status, DEADLINE};
use crate::runc::{online_cpus, pod_uid, runc_skip_reason, E2eTree};
use crate::util::{stderr, stdout};

/// containerd's state directory inside the test's scratch directory: the agent finds
/// `config.json` at `<scratch>/<RUN>/io.containerd.runtime.v2.task/k8s.io/{id}/config.json`,
/// containerd's default layout for that state directory.
const RUN: &str = "run";
const TASKS: &str = "run/io.containerd.runtime.v2.task/k8s.io";

/// Why the containerd tests cannot run here, if they cannot.
fn skip_reason() -> Option<String> {
    if let Some(reason) = runc_skip_reason() {
        return Some(reason);
    }
    for tool in ["containerd", "ctr"] {
        match Command::new(tool).arg("--version").output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => return Some(format!("`{tool} --version` failed: {}", out.status)),
            Err(err) => {
                return Some(format!(
                    "no {tool} ({err}): apt-get install containerd (scripts/ci-deps.sh)"
                ))
            }
        }
    }
    None
}

/// A containerd of its own: config, root, state and socket in a temporary directory, the
/// pause and busybox images imported. Dropping it stops it, kills what its shims left and
/// unmounts its container root file systems.
struct Containerd {
    child: Child,
    dir: tempfile::TempDir,
}

impl Containerd {
    fn start() -> Containerd {
        let dir = tempfile::Builder::new()
            .prefix("cpusetd-containerd-")
            .tempdir()
            .unwrap();
        let path = dir.path();
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      pod_annotations = ["cpusetd.io/*", "*.crio.io", "cpu-shared.crio.io/*"]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni}"
    conf_dir = "{cni}"
"#,
            root = path.join("root").display(),
            state = path.join(RUN).display(),
            socket = path.join("containerd.sock").display(),
            pause = image::PAUSE_IMAGE,
            cni = path.join("cni").display(),
        );
        fs::write(path.join("config.toml"), config).unwrap();
        let log = fs::File::create(path.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(path.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            // Its own process group: a test's Ctrl-C does not reach it before cleanup does.
            .process_group(0)
            .spawn()
            .expect("containerd");
        let containerd = Containerd { child, dir };
        // The socket answers CRI once the plugin is up; images go in after that.
        if let Err(err) = containerd.cri() {
            panic!("{err}\n{}", containerd.log_tail());
        }
        image::build_and_import(
            Path::new("/bin/busybox"),
            &containerd.dir.path().join("images"),
            Path::new("ctr"),
            &containerd.socket(),
        )
        .unwrap_or_else(|err| panic!("images: {err}\n{}", containerd.log_tail()));
        containerd
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    fn scratch(&self) -> &Path {
        self.dir.path()
    }

    /// A new CRI connection (one per thread).
    fn cri(&self) -> Result<Cri, crikubelet::CriError> {
        Cri::connect(
            &self.socket(),
            &self.dir.path().join("logs"),
            Duration::from_secs(30),
        )
    }

    fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Shims outlive containerd; ours name our socket on their command line.
        let socket = self.socket().display().to_string();
        if let Ok(entries) = fs::read_dir("/proc") {
            for entry in entries.flatten() {
                let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
                let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                if cmdline.contains("containerd-shim") && cmdline.contains(&socket) {
                    if let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() {
                        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                    }
                }
            }
        }
        // Container root file systems and sandbox mounts still mounted under the directory.
        let dir = self.dir.path().display().to_string();
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let mut ours: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter(|m| m.starts_with(&dir))
            .collect();
        ours.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for mount in ours {
            let _ = nix::mount::umount2(mount, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// A node: containerd, the kubepods tree (cgroupfs driver, unique subtree), the CRI
/// connection and the pods still running, deleted on drop.
struct CriNode {
    cri: Cri,
    node: NodeCgroups,
    pods: Vec<RunningPod>,
    containerd: Containerd,
    tree: E2eTree,
}

impl CriNode {
    fn start() -> CriNode {
        let tree = E2eTree::new();
        let containerd = Containerd::start();
        let node = NodeCgroups::new(
            CgroupDriver::Cgroupfs,
            Path::new("/sys/fs/cgroup"),
            &tree.kubepods(),
        )
        .unwrap();
        node.create_qos().unwrap();
        let cri = containerd.cri().unwrap();
        CriNode {
            cri,
            node,
            pods: Vec::new(),
            containerd,
            tree,
        }
    }

    /// `cpusetd run` on this node with CPU 0 reserved, reading containerd's configs.
    fn agent(&self) -> RealAgent {
        RealAgent::start(&self.tree, self.containerd.scratch(), TASKS)
    }

    /// Runs a pod; the node deletes it on drop unless the test does.
    fn run(&mut self, spec: &PodSpec) -> RunningPod {
        let pod = self
            .cri
            .run_pod(&self.node, spec)
            .unwrap_or_else(|err| panic!("{err}\n{}", self.containerd.log_tail()));
        self.pods.push(pod.clone());
        pod
    }

    /// kubelet's in-place resize of a container's CPU (requests = limits = `milli`).
    fn resize(&mut self, pod: &mut RunningPod, name: &str, milli: u64) {
        self.cri
            .resize_cpu(&self.node, pod, name, milli, milli)
            .unwrap_or_else(|err| panic!("{err}\n{}", self.containerd.log_tail()));
        if let Some(kept) = self
            .pods
            .iter_mut()
            .find(|p| p.sandbox_id == pod.sandbox_id)
        {
            *kept = pod.clone();
        }
    }

    fn delete(&mut self, pod: &RunningPod) {
        self.cri.delete_pod(&self.node, pod).unwrap();
        self.pods.retain(|p| p.sandbox_id != pod.sandbox_id);
    }

    fn restart(&mut self, pod: &mut RunningPod, name: &str) -> crikubelet::RunningContainer {
        let new = self
            .cri
            .restart(&self.node, pod, name)
            .unwrap_or_else(|err| panic!("{err}\n{}", self.containerd.log_tail()));
        if let Some(kept) = self
            .pods
            .iter_mut()
            .find(|p| p.sandbox_id == pod.sandbox_id)
        {
            *kept = pod.clone();
        }
        new
    }

    /// `cpuset.cpus` of a container's cgroup.
    fn cpuset_file(&self, pod: &RunningPod, id: &str) -> PathBuf {
        let rel = format!("{}/{id}", self.node.pod_cgroup(&pod.spec));
        Path::new("/sys/fs/cgroup/cpuset")
            .join(rel)
            .join("cpuset.cpus")
    }

    /// `cpusetd plan --json` on this node: the writes it would make now.
    fn plan_writes(&self) -> serde_json::Value {
        let out = Command::new(env!("CARGO_BIN_EXE_cpusetd"))
            .args([
                "plan",
                "--json",
                "--cgroup-root",
                "/sys/fs/cgroup",
                "--kubepods-path",
                &self.tree.kubepods(),
                "--reserved-cpus",
                "0",
                "--runtime-config-path",
                &format!(
                    "{}/{TASKS}/{{id}}/config.json",
                    self.containerd.scratch().display()
                ),
                "--state-dir",
                &self
                    .containerd
                    .scratch()
                    .join("state")
                    .display()
                    .to_string(),
            ])
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|err| panic!("plan --json: {err}: {}", stdout(&out)));
        doc["writes"].clone()
    }
}

impl Drop for CriNode {
    fn drop(&mut self) {
        for pod in std::mem::take(&mut self.pods) {
            if let Err(err) = self.cri.delete_pod(&self.node, &pod) {
                eprintln!("cleanup: pod {}: {err}", pod.spec.name);
            }
        }
    }
}

/// `Cpus_allowed_list` of a process.
fn cpus_allowed(pid: u32) -> CpuSet {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|err| panic!("pid {pid}: {err}"));
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or_else(|| panic!("no Cpus_allowed_list in /proc/{pid}/status"));
    CpuSet::parse(line).unwrap()
}

/// Waits until the process may run on `expected` only; returns what it may run on at the end.
fn wait_allowed(pid: u32, expected: &CpuSet) -> CpuSet {
    poll_until(DEADLINE, || {
        Some(cpus_allowed(pid)).filter(|c| c == expected)
    })
    .unwrap_or_else(|| cpus_allowed(pid))
}

/// What the container's first instruction could run on: the first line it printed
/// (`Cpus_allowed_list:\t…`), from its CRI log (`<time> stdout F <line>`).
fn first_cpus(log_path: &str) -> CpuSet {
    let line = poll_until(DEADLINE, || {
        let text = fs::read_to_string(log_path).ok()?;
        let line = text.lines().find(|l| l.contains("Cpus_allowed_list:"))?;
        Some(line.to_string())
    })
    .unwrap_or_else(|| panic!("{log_path}: no Cpus_allowed_list line"));
    let value = line.rsplit("Cpus_allowed_list:").next().unwrap();
    CpuSet::parse(value.trim()).unwrap_or_else(|err| panic!("{line:?}: {err}"))
}

fn spec(name: &str, namespace: &str, containers: Vec<ContainerSpec>) -> PodSpec {
    PodSpec {
        name: name.to_string(),
        namespace: namespace.to_string(),
        uid: pod_uid(),
        annotations: Default::default(),
        containers,
    }
}

/// The exclusive CPU this machine can give with CPU 0 reserved, and the shared pool then.
fn exclusive_and_shared(status: &Status) -> (CpuSet, CpuSet) {
    let exclusive = CpuSet::parse(&status.exclusive_cpus).unwrap();
    (exclusive.clone(), online_cpus().difference(&exclusive))
}

#[test]
fn containerd_pods_of_every_class_are_pinned_kept_repaired_and_released() {
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let online = online_cpus();
    let mut node = CriNode::start();
    let mut agent = node.agent();

    // A Guaranteed pod: an integer container and a fractional sidecar.
    let mut guaranteed = node.run(&spec(
        "db-0",
        "payments",
        vec![
            ContainerSpec::guaranteed("db", 1000),
            ContainerSpec::guaranteed("sidecar", 500),
        ],
    ));
    let burstable = node.run(&spec(
        "web-7f9c",
        "shop",
        vec![ContainerSpec::burstable("web", 250)],
    ));
    let best_effort = node.run(&spec(
        "batch",
        "default",
        vec![ContainerSpec::best_effort("job")],
    ));
    let status = agent.wait_status("one exclusive cpu, converged", |s| {
        s.exclusive_cpu_count == 1 && s.converged() && s.containers.len() >= 7
    });
    let (exclusive, shared) = exclusive_and_shared(&status);
    assert!(!exclusive.contains(0), "CPU 0 is reserved: {exclusive}");
    let db = guaranteed.container("db").unwrap().clone();
    assert_eq!(wait_allowed(db.pid, &exclusive), exclusive);
    assert_eq!(
        first_cpus(&db.log_path),
        exclusive,
        "db's first instruction"
    );
    for (pod, name) in [
        (&guaranteed, "sidecar"),
        (&burstable, "web"),
        (&best_effort, "job"),
    ] {
        let c = pod.container(name).unwrap();
        assert_eq!(wait_allowed(c.pid, &shared), shared, "{name}");
    }

    // Names and namespaces come from containerd's annotations; sandboxes are shared.
    let row = status.by_id(&db.id).unwrap();
    assert_eq!(
        (
            row.pod_name.as_deref(),
            row.namespace.as_deref(),
            row.container.as_deref()
        ),
        (Some("db-0"), Some("payments"), Some("db"))
    );
    assert!(row.exclusive, "{row:?}");
    let sandbox = status.by_id(&guaranteed.sandbox_id).unwrap();
    assert_eq!(sandbox.kind, "sandbox");
    assert_eq!(sandbox.pod_name.as_deref(), Some("db-0"));
    assert_eq!(sandbox.current, Some(shared.to_string()));
    let web = status
        .by_id(&burstable.container("web").unwrap().id)
        .unwrap();
    assert_eq!(
        (web.pod_name.as_deref(), web.namespace.as_deref()),
        (Some("web-7f9c"), Some("shop"))
    );
    // The quota is lifted on the exclusive container and its pod (kubelet set both).
    let cpu_dir = |rel: String| Path::new("/sys/fs/cgroup/cpu").join(rel);
    let pod_rel = node.node.pod_cgroup(&guaranteed.spec);
    let quota = |rel: String| {
        fs::read_to_string(cpu_dir(rel).join("cpu.cfs_quota_us"))
            .unwrap()
            .trim()
            .to_string()
    };
    let lifted = poll_until(DEADLINE, || {
        (quota(format!("{pod_rel}/{}", db.id)) == "-1" && quota(pod_rel.clone()) == "-1")
            .then_some(())
    });
    assert!(
        lifted.is_some(),
        "quota not lifted: container {} pod {}",
        quota(format!("{pod_rel}/{}", db.id)),
        quota(pod_rel.clone())
    );

    // kubelet restarts the container: a new id, attempt 1, the same CPU from its first
    // instruction.
    let restarted = node.restart(&mut guaranteed, "db");
    assert_eq!(restarted.attempt, 1);
    assert_ne!(restarted.id, db.id);
    assert_eq!(
        first_cpus(&restarted.log_path),
        exclusive,
        "after a restart"
    );
    assert_eq!(wait_allowed(restarted.pid, &exclusive), exclusive);

    // A foreign write (the pod, then the container: the only order the kernel allows) is
    // undone.
    let container_cpus = node.cpuset_file(&guaranteed, &restarted.id);
    let pod_cpus = container_cpus
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("cpuset.cpus");
    agent.agent.signal(Signal::SIGSTOP);
    let widened = fs::write(&pod_cpus, online.to_string())
        .and_then(|()| fs::write(&container_cpus, online.to_string()));
    let foreign = cpus_allowed(restarted.pid);
    agent.agent.signal(Signal::SIGCONT);
    widened.unwrap();
    assert_eq!(foreign, online, "the foreign write took effect");
    assert_eq!(wait_allowed(restarted.pid, &exclusive), exclusive);
    let repaired = poll_until(DEADLINE, || {
        agent
            .metrics()
            .get("cpusetd_drift_repairs_total")
            .copied()
            .filter(|n| *n >= 1.0)
    });
    assert!(repaired.is_some(), "{:?}", agent.metrics());

    // kill -9: every pin stays while it is dead and after it is back.
    let before: Vec<(u32, CpuSet)> = node
        .pods
        .iter()
        .flat_map(|p| p.containers.iter())
        .map(|c| (c.pid, cpus_allowed(c.pid)))
        .collect();
    agent.agent.signal(Signal::SIGKILL);
    assert!(agent.agent.wait_exit(DEADLINE).is_some());
    let mut agent = node.agent();
    let status = agent.wait_status("converged after kill -9", |s| s.converged());
    assert_eq!(status.exclusive_cpus, exclusive.to_string());
    for (pid, cpus) in &before {
        assert_eq!(&cpus_allowed(*pid), cpus, "pid {pid} after kill -9");
    }
    assert!(node.plan_writes().as_array().unwrap().is_empty());

    // Pod deletion gives the CPU back to the shared pool.
    node.delete(&guaranteed);
    let job = best_effort.container("job").unwrap();
    assert_eq!(wait_allowed(job.pid, &online), online);
    agent.wait_status("the pod's cpu released", |s| {
        s.exclusive_cpu_count == 0 && s.converged()
    });
    agent.stop_clean();
}

/// The integer container's first instruction already runs on its exclusive CPU: 200
/// containers created via CRI (40 Guaranteed pods, each container restarted 4 times), at
/// least 99.5 % of them (all but one) pinned before they run.
#[test]
fn containerd_containers_start_on_their_exclusive_cpus() {
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let mut node = CriNode::start();
    let mut agent = node.agent();
    // The pool (everything online but CPU 0) once a pod holds a CPU.
    let mut exclusive = None;
    let (mut created, mut pinned) = (0u32, 0u32);
    let mut misses = Vec::new();
    for i in 0..40 {
        let mut pod = node.run(&spec(
            &format!("latency-{i}"),
            "default",
            vec![ContainerSpec::guaranteed("app", 1000)],
        ));
        let exclusive = exclusive
            .get_or_insert_with(|| {
                let status = agent.wait_status("the first pin", |s| s.exclusive_cpu_count == 1);
                CpuSet::parse(&status.exclusive_cpus).unwrap()
            })
            .clone();
        for attempt in 0..5 {
            let container = if attempt == 0 {
                pod.container("app").unwrap().clone()
            } else {
                node.restart(&mut pod, "app")
            };
            created += 1;
            let first = first_cpus(&container.log_path);
            if first == exclusive {
                pinned += 1;
            } else {
                misses.push(format!("{} attempt {attempt}: {first}", pod.spec.name));
            }
            assert_eq!(wait_allowed(container.pid, &exclusive), exclusive);
        }
        node.delete(&pod);
    }
    println!(
        "containerd first instruction: {pinned}/{created} on the exclusive cpu; misses {misses:?}"
    );
    assert_eq!(created, 200);
    assert!(
        f64::from(pinned) >= 0.995 * f64::from(created),
        "{pinned}/{created} pinned before their first instruction: {misses:?}"
    );
    agent.stop_clean();
}

/// 50 pods created as fast as CRI allows (four clients at once): every pin right at the end,
/// and a second `plan` has nothing to write.
#[test]
fn containerd_burst_of_pods_converges() {
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let node = CriNode::start();
    let mut agent = node.agent();
    let specs: Vec<PodSpec> = (0..50)
        .map(|i| {
            let containers = match i % 5 {
                // One Guaranteed integer pod: this machine has one CPU to give.
                0 if i == 0 => vec![ContainerSpec::guaranteed("app", 1000)],
                0 | 1 => vec![
                    ContainerSpec::guaranteed("app", 500),
                    ContainerSpec::guaranteed("log", 100),
                ],
                2 | 3 => vec![ContainerSpec::burstable("web", 200)],
                _ => vec![ContainerSpec::best_effort("job")],
            };
            spec(&format!("burst-{i}"), "burst", containers)
        })
        .collect();
    let started = Instant::now();
    let pods: Vec<RunningPod> = thread::scope(|scope| {
        let workers: Vec<_> = specs
            .chunks(13)
            .map(|chunk| {
                let containerd = &node.containerd;
                let cgroups = &node.node;
                scope.spawn(move || {
                    let mut cri = containerd.cri().unwrap();
                    chunk
                        .iter()
                        .map(|s| {
                            cri.run_pod(cgroups, s)
                                .unwrap_or_else(|e| panic!("{}: {e}", s.name))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    let elapsed = started.elapsed();
    let mut node = node;
    node.pods.extend(pods.iter().cloned());
    let containers: usize = pods.iter().map(|p| p.containers.len()).sum();
    let status = agent.wait_status("the burst converged", |s| {
        s.converged() && s.containers.len() == containers + pods.len() && s.exclusive_cpu_count == 1
    });
    println!(
        "containerd burst: {} pods, {containers} containers via CRI in {elapsed:?}",
        pods.len()
    );
    let (exclusive, shared) = exclusive_and_shared(&status);
    for pod in &pods {
        for c in &pod.containers {
            let expected = if pod.spec.name == "burst-0" {
                &exclusive
            } else {
                &shared
            };
            assert_eq!(
                wait_allowed(c.pid, expected),
                *expected,
                "{}/{}",
                pod.spec.name,
                c.name
            );
        }
    }
    assert_eq!(node.plan_writes(), serde_json::json!([]));
    agent.stop_clean();
}

/// The DaemonSet (`deploy/daemonset.json`) as kubelet would run it: its container, args,
/// volumes and resources, on this node through CRI (the host paths of this test's tree,
/// containerd and state directory substituted). The agent in a Burstable pod pins the
/// Guaranteed pod beside it, stays on the shared pool itself, and keeps every pin when its own
/// container is killed and restarted (attempt + 1).
#[test]
fn containerd_daemonset_pod_pins_its_node_and_survives_its_own_restart() {
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let mut node = CriNode::start();
    let scratch = node.containerd.scratch().to_path_buf();
    let image = "localhost/cpusetd:test";
    image::build_binary_image(
        Path::new(env!("CARGO_BIN_EXE_cpusetd")),
        image,
        &scratch.join("images"),
        Path::new("ctr"),
        &node.containerd.socket(),
    )
    .unwrap();
    let manifest: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/deploy/daemonset.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let pod_spec = &manifest["spec"]["template"]["spec"];
    let container = &pod_spec["containers"][0];

    // The host side of each hostPath volume on this test node.
    let state = scratch.join("agent-state");
    let kubelet = scratch.join("kubelet");
    fs::create_dir_all(&kubelet).unwrap();
    let host_path = |path: &str| -> PathBuf {
        match path {
            "/run/containerd" => scratch.join(RUN),
            "/var/lib/cpusetd" => state.clone(),
            "/var/lib/kubelet" => kubelet.clone(),
            "/run/cpusetd" => scratch.join("run-cpusetd"),
            other => PathBuf::from(other),
        }
    };
    let volumes: std::collections::HashMap<&str, PathBuf> = pod_spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            let path = v["hostPath"]["path"].as_str().unwrap();
            (v["name"].as_str().unwrap(), host_path(path))
        })
        .collect();
    let mounts = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| crikubelet::MountSpec {
            host_path: volumes[m["name"].as_str().unwrap()].display().to_string(),
            container_path: m["mountPath"].as_str().unwrap().to_string(),
            readonly: m["readOnly"].as_bool().unwrap_or(false),
        })
        .collect();
    // The manifest's args; the kubepods cgroup is this test's unique subtree.
    let mut command = vec!["/cpusetd".to_string()];
    command.extend(
        container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string()),
    );
    command.extend(["--kubepods-path".to_string(), node.tree.kubepods()]);
    let quantity = |q: &serde_json::Value| -> u64 {
        let q = q.as_str().unwrap();
        if let Some(m) = q.strip_suffix('m') {
            m.parse().unwrap()
        } else if let Some(mi) = q.strip_suffix("Mi") {
            mi.parse::<u64>().unwrap() << 20
        } else {
            panic!("quantity {q}")
        }
    };
    let resources = &container["resources"];
    let agent_spec = PodSpec {
        name: "cpusetd-x7k2p".to_string(),
        namespace: manifest["metadata"]["namespace"]
            .as_str()
            .unwrap()
            .to_string(),
        uid: pod_uid(),
        annotations: Default::default(),
        containers: vec![ContainerSpec {
            name: container["name"].as_str().unwrap().to_string(),
            cpu_request_milli: quantity(&resources["requests"]["cpu"]),
            cpu_limit_milli: 0,
            memory_request: quantity(&resources["requests"]["memory"]),
            memory_limit: quantity(&resources["limits"]["memory"]),
            command,
            image: Some(image.to_string()),
            mounts,
            privileged: container["securityContext"]["privileged"] == true,
            cpuset_cpus: None,
        }],
    };
    assert_eq!(agent_spec.qos(), crikubelet::Qos::Burstable);
    let mut agent_pod = node.run(&agent_spec);
    let kubepods = node.tree.kubepods();
    let status_of = |state: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_cpusetd"))
            .args([
                "status",
                "--json",
                "--cgroup-root",
                "/sys/fs/cgroup",
                "--kubepods-path",
            ])
            .arg(&kubepods)
            .arg("--state-dir")
            .arg(state)
            .arg("--runtime-config-path")
            .arg(format!("{}/{TASKS}/{{id}}/config.json", scratch.display()))
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| serde_json::from_slice::<Status>(&out.stdout).unwrap())
    };
    let wait = |what: &str, ok: &dyn Fn(&Status) -> bool| -> Status {
        poll_until(Duration::from_secs(20), || {
            status_of(&state).filter(|s| ok(s))
        })
        .unwrap_or_else(|| panic!("{what}: {:?}", status_of(&state)))
    };
    wait("the agent's first pass", &|s| s.converged());

    let mut db_spec = spec(
        "db-0",
        "payments",
        vec![ContainerSpec::guaranteed("db", 1000)],
    );
    db_spec
        .annotations
        .insert("cpusetd.io/projection".into(), "enable".into());
    let mut db = node.run(&db_spec);
    let status = wait("db pinned", &|s| {
        s.exclusive_cpu_count == 1 && s.converged()
    });
    let (exclusive, shared) = exclusive_and_shared(&status);
    let db_pid = db.container("db").unwrap().pid;
    assert_eq!(wait_allowed(db_pid, &exclusive), exclusive);
    // Its PodResources socket, on the host in the state directory's hostPath, where NFD's
    // topology-updater or the resource-topology-exporter is pointed.
    let podres = crate::podresources::Asker::new(state.join("pod-resources.sock"));
    let db_ids: Vec<i64> = exclusive.iter().map(i64::from).collect();
    let answered = podres.get("payments", "db-0").unwrap();
    assert_eq!(answered.containers[0].cpu_ids, db_ids);
    // Its projection files, on the host in the /run/cpusetd hostPath, where the pod's own
    // hostPath volume (subPathExpr: its UID) finds them.
    let projected = scratch
        .join("run-cpusetd/projection")
        .join(&db_spec.uid)
        .join("db.json");
    let doc = poll_until(Duration::from_secs(20), || {
        let text = fs::read_to_string(&projected).ok()?;
        serde_json::from_str::<serde_json::Value>(&text).ok()
    })
    .unwrap_or_else(|| panic!("no {}", projected.display()));
    assert_eq!(
        doc["exclusive_cpus"],
        exclusive.to_string().as_str(),
        "{doc}"
    );
    // The agent's own container: shared, never pinned, never starved.
    let agent_container = agent_pod.container("cpusetd").unwrap().clone();
    assert_eq!(wait_allowed(agent_container.pid, &shared), shared);
    let own = status.by_id(&agent_container.id).unwrap();
    assert!(!own.exclusive, "{own:?}");
    assert_eq!(own.namespace.as_deref(), Some("kube-system"));
    // Its container is killed; kubelet starts it again as attempt 1.
    kill(Pid::from_raw(agent_container.pid as i32), Signal::SIGKILL).unwrap();
    let restarted = node.restart(&mut agent_pod, "cpusetd");
    assert_eq!(restarted.attempt, 1);
    assert_eq!(
        cpus_allowed(db_pid),
        exclusive,
        "the pin stays while the agent is down"
    );
    let status = wait("converged after its restart", &|s| {
        s.converged() && s.by_id(&restarted.id).is_some()
    });
    assert_eq!(status.exclusive_cpus, exclusive.to_string());
    assert_eq!(cpus_allowed(db_pid), exclusive);
    assert_eq!(wait_allowed(restarted.pid, &shared), shared);

    // And it still works: a restart of db keeps its CPU.
    let again = node.restart(&mut db, "db");
    assert_eq!(
        first_cpus(&again.log_path),
        exclusive,
        "db after its restart"
    );
    // Both agents logged to the CRI log of their container: started, and the second did
    // not allocate anew.
    let first_log = fs::read_to_string(&agent_container.log_path).unwrap();
    let second_log = fs::read_to_string(&restarted.log_path).unwrap();
    assert!(first_log.contains("allocated cpus="), "{first_log}");
    assert!(second_log.contains("first pass:"), "{second_log}");
    assert!(!second_log.contains("allocated cpus="), "{second_log}");
    println!("daemonset agent log after its restart:\n{second_log}");
}

/// Migration from kubelet's static policy on a real containerd: a container kubelet pinned
/// (its `cpuset_cpus` passed through CRI) and named in its `cpu_manager_state` is adopted as it
/// runs, never moved; `status` says where the pin came from.
#[test]
fn containerd_kubelet_pins_are_adopted_on_a_first_start() {
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let online = online_cpus();
    let exclusive = CpuSet::parse(&online.iter().last().unwrap().to_string()).unwrap();
    let mut node = CriNode::start();
    let mut db = ContainerSpec::guaranteed("db", 1000);
    db.cpuset_cpus = Some(exclusive.to_string());
    let pod = node.run(&spec("db-0", "payments", vec![db]));
    let db = pod.container("db").unwrap().clone();
    assert_eq!(
        cpus_allowed(db.pid),
        exclusive,
        "kubelet's pin, through CRI"
    );
    let file = node.containerd.scratch().join("cpu_manager_state");
    let entries = std::collections::BTreeMap::from([(
        pod.spec.uid.clone(),
        std::collections::BTreeMap::from([("db".to_string(), exclusive.to_string())]),
    )]);
    let shared = online.difference(&exclusive);
    fs::write(
        &file,
        crate::migration::kubelet_v2(&shared.to_string(), &entries),
    )
    .unwrap();

    let mut agent = RealAgent::start_migrating(&node.tree, node.containerd.scratch(), TASKS, &file);
    let status = agent.wait_status("adopted", |s| s.converged() && s.exclusive_cpu_count == 1);
    let row = status.by_id(&db.id).unwrap();
    assert_eq!(
        row.note, "exclusive, adopted from kubelet's cpu_manager_state",
        "{row:?}"
    );
    assert_eq!(status.exclusive_cpus, exclusive.to_string());
    assert_eq!(cpus_allowed(db.pid), exclusive);
    let log = agent.agent.log();
    assert!(
        log.contains("adopted 1 of kubelet's 1 pin(s) (format V2)"),
        "{log}"
    );
    assert!(!log.contains("allocated cpus="), "{log}");
    agent.stop_clean();
}

/// Pod annotations reach the agent through containerd's `pod_annotations` (the README's
/// setting): an opted-out Guaranteed pod stays shared, an annotated one is pinned and its
/// isolation is in force (`cpu-quota`), an odd value is said.
#[test]
fn containerd_pod_annotations_reach_the_agent() {
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let mut node = CriNode::start();
    let mut agent = node.agent();
    let mut opted_out = spec(
        "batch",
        "default",
        vec![ContainerSpec::guaranteed("app", 1000)],
    );
    opted_out
        .annotations
        .insert("cpusetd.io/exclusive".into(), "false".into());
    let mut fast = spec("upf", "telco", vec![ContainerSpec::guaranteed("dp", 1000)]);
    fast.annotations
        .insert("cpu-quota.crio.io".into(), "disable".into());
    fast.annotations
        .insert("cpu-load-balancing.crio.io".into(), "maybe".into());
    let opted_out = node.run(&opted_out);
    let fast = node.run(&fast);
    let status = agent.wait_status("converged", |s| {
        s.converged() && s.exclusive_cpu_count == 1 && s.containers.len() == 4
    });
    let (exclusive, shared) = exclusive_and_shared(&status);
    let dp = fast.container("dp").unwrap();
    let app = opted_out.container("app").unwrap();
    assert_eq!(wait_allowed(dp.pid, &exclusive), exclusive);
    assert_eq!(wait_allowed(app.pid, &shared), shared);
    let row = status.by_id(&dp.id).unwrap();
    assert_eq!(row.isolation, ["cpu-quota"], "{row:?}");
    let row = status.by_id(&app.id).unwrap();
    assert!(row.note.contains("cpusetd.io/exclusive"), "{row:?}");
    let log = agent.agent.log();
    assert!(
        log.contains("annotation cpu-load-balancing.crio.io: \"maybe\" ignored"),
        "{log}"
    );
    agent.stop_clean();
}

/// kubelet's PodResources API served by the agent, asked the way NFD's topology-updater asks
/// kubelet: a real pod's exclusive container reports the cpus its process may run on, shared
/// ones none, and a deleted pod is gone from the answer.
#[test]
fn containerd_pod_resources_cpu_ids_are_the_containers_cpus_allowed() {
    use crate::podresources::Asker;
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let mut node = CriNode::start();
    let mut agent = node.agent();
    let asker = Asker::new(node.containerd.scratch().join("state/pod-resources.sock"));
    let guaranteed = node.run(&spec(
        "db-0",
        "payments",
        vec![
            ContainerSpec::guaranteed("db", 1000),
            ContainerSpec::guaranteed("sidecar", 500),
        ],
    ));
    let burstable = node.run(&spec(
        "web-7f9c",
        "shop",
        vec![ContainerSpec::burstable("web", 250)],
    ));
    let status = agent.wait_status("one exclusive cpu, converged", |s| {
        s.exclusive_cpu_count == 1 && s.converged()
    });
    let (exclusive, shared) = exclusive_and_shared(&status);
    let db = guaranteed.container("db").unwrap();
    assert_eq!(wait_allowed(db.pid, &exclusive), exclusive);
    let ids = |cpus: &CpuSet| cpus.iter().map(i64::from).collect::<Vec<i64>>();

    let got = asker.get("payments", "db-0").unwrap();
    let by_name = |pod: &cpusetd::podresources::v1::PodResources, name: &str| {
        let mut ids = pod
            .containers
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no {name} in {pod:?}"))
            .cpu_ids
            .clone();
        ids.sort_unstable();
        ids
    };
    assert_eq!(by_name(&got, "db"), ids(&cpus_allowed(db.pid)));
    let sidecar = guaranteed.container("sidecar").unwrap();
    assert_eq!(wait_allowed(sidecar.pid, &shared), shared);
    assert!(
        by_name(&got, "sidecar").is_empty(),
        "a shared container has none"
    );
    let list = asker.list();
    let web = list
        .iter()
        .find(|p| p.name == "web-7f9c" && p.namespace == "shop")
        .unwrap_or_else(|| panic!("no web-7f9c in {list:?}"));
    assert!(by_name(web, "web").is_empty());
    assert_eq!(
        asker.allocatable().cpu_ids,
        ids(&online_cpus().difference(&CpuSet::parse("0").unwrap()))
    );

    node.delete(&guaranteed);
    poll_until(DEADLINE, || {
        asker.get("payments", "db-0").is_err().then_some(())
    })
    .expect("the deleted pod is gone from the answers");
    drop(burstable);
    agent.stop_clean();
}

/// The last projection the container printed (`@@ {…}` lines of its CRI log) that satisfies
/// `ok`, waited for.
fn projection_seen(
    log_path: &str,
    what: &str,
    mut ok: impl FnMut(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut last = None;
    let found = poll_until(DEADLINE, || {
        let text = fs::read_to_string(log_path).ok()?;
        let doc = text
            .lines()
            .rev()
            .filter_map(|l| l.split_once(" @@ ").map(|(_, json)| json))
            .find_map(|json| serde_json::from_str::<serde_json::Value>(json).ok())?;
        if ok(&doc) {
            return Some(doc);
        }
        last = Some(doc);
        None
    });
    found.unwrap_or_else(|| panic!("{what}: last projection seen inside: {last:?}"))
}

/// The projection read from inside a real container (issue 27): the pod's own directory is
/// mounted read-only at `/projection` (what a hostPath volume with `subPathExpr: $(POD_UID)`
/// gives it), and the container prints its file every 100 ms. It sees its exclusive CPU, then,
/// after kubelet's in-place resize to half a CPU (the agent gives the CPU back: a 2-CPU machine
/// has no second one to grow into), a new generation with no exclusive CPU and the pool.
#[test]
fn containerd_container_reads_its_projection_and_sees_a_resize() {
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let mut node = CriNode::start();
    let mut agent = node.agent();
    let mut dp = spec("upf", "telco", vec![ContainerSpec::guaranteed("dp", 1000)]);
    dp.annotations
        .insert("cpusetd.io/projection".into(), "enable".into());
    // kubelet makes the subPath directory before the container starts.
    let pod_dir = agent.projection.join(&dp.uid);
    fs::create_dir_all(&pod_dir).unwrap();
    dp.containers[0].mounts.push(crikubelet::MountSpec {
        host_path: pod_dir.display().to_string(),
        container_path: "/projection".into(),
        readonly: true,
    });
    dp.containers[0].command = [
        "/bin/sh",
        "-c",
        "if touch /projection/x 2>/dev/null; then echo '@@ writable'; else echo '@@ read-only'; fi; \
         while :; do echo \"@@ $(tr -d '\\n' < /projection/dp.json 2>/dev/null)\"; sleep 0.1; done",
    ]
    .map(String::from)
    .to_vec();
    let mut pod = node.run(&dp);
    let status = agent.wait_status("pinned", |s| {
        s.converged() && s.exclusive_cpu_count == 1 && s.containers.len() == 2
    });
    let (exclusive, shared) = exclusive_and_shared(&status);
    let log_path = pod.container("dp").unwrap().log_path.clone();
    let pinned = projection_seen(&log_path, "its exclusive cpu", |doc| {
        doc["exclusive_cpus"] == exclusive.to_string().as_str()
    });
    assert_eq!(pinned["version"], 1, "{pinned}");
    assert_eq!(pinned["pod_uid"], dp.uid.as_str());
    assert_eq!(pinned["cpus"], exclusive.to_string().as_str());
    assert_eq!(pinned["shared_cpus"], "");
    let log = fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("@@ read-only"), "{log}");
    let first = pinned["generation"].as_u64().unwrap();

    node.resize(&mut pod, "dp", 500);
    let resized = projection_seen(&log_path, "after the resize", |doc| {
        doc["exclusive_cpus"] == ""
    });
    assert!(resized["generation"].as_u64().unwrap() > first, "{resized}");
    let everything = exclusive.union(&shared);
    assert_eq!(
        resized["shared_cpus"],
        everything.to_string().as_str(),
        "{resized}"
    );
    let dp_pid = pod.container("dp").unwrap().pid;
    assert_eq!(wait_allowed(dp_pid, &everything), everything);
    agent.stop_clean();
}

/// `cpu-shared.crio.io/<container>` through containerd's `pod_annotations`: the container runs
/// on its exclusive CPU and the shared pool, and its projection says which is which.
#[test]
fn containerd_cpu_shared_container_runs_on_its_cpu_and_the_pool() {
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let mut node = CriNode::start();
    let mut agent = node.agent();
    let mut dp = spec("upf", "telco", vec![ContainerSpec::guaranteed("dp", 1000)]);
    for (key, value) in [
        ("cpu-shared.crio.io/dp", "enable"),
        ("cpusetd.io/projection", "enable"),
    ] {
        dp.annotations.insert(key.into(), value.into());
    }
    let pod = node.run(&dp);
    let status = agent.wait_status("pinned with the pool", |s| {
        s.converged() && s.exclusive_cpu_count == 1 && s.containers.len() == 2
    });
    let (exclusive, shared) = exclusive_and_shared(&status);
    let dp_row = status.by_id(&pod.container("dp").unwrap().id).unwrap();
    assert!(dp_row.note.contains("cpu-shared.crio.io"), "{dp_row:?}");
    let everything = exclusive.union(&shared);
    let pid = pod.container("dp").unwrap().pid;
    assert_eq!(wait_allowed(pid, &everything), everything);
    let file = agent.projection.join(&dp.uid).join("dp.json");
    let doc = poll_until(DEADLINE, || {
        let doc: serde_json::Value = serde_json::from_str(&fs::read_to_string(&file).ok()?).ok()?;
        (doc["shared_cpus"] == shared.to_string().as_str()).then_some(doc)
    })
    .unwrap_or_else(|| panic!("{:?}", fs::read_to_string(&file)));
    assert_eq!(doc["exclusive_cpus"], exclusive.to_string().as_str());
    assert_eq!(doc["isolation"], serde_json::json!(["cpu-shared.crio.io"]));
    agent.stop_clean();
}
