//! A scripted kubelet and container runtime over a fake cgroup tree: what `cpusetd demo`, the
//! agent's integration tests and the benchmarks use to make pods appear and go.
//!
//! It writes what kubelet (cgroupfs driver) and runc write: pod directories under `kubepods`
//! (Guaranteed) or `kubepods/burstable|besteffort`, a sandbox container and app containers per
//! pod with 64-hex ids, `cpu.shares = milli × 1024 / 1000` (at least 2), `cpu.cfs_quota_us =
//! limit × period / 1000` (or -1), period 100000; on cgroup v2 `cpu.weight` (runc's linear
//! conversion from shares) and `cpu.max`. Like the kernel, a new cgroup directory appears with
//! all its interface files at once (holding the kernel's defaults: empty cpusets on v1, shares
//! 1024, no quota): it is assembled outside the watched tree and renamed into place. Then the
//! runtime writes its values one file at a time, as runc does, and copies the parent's cpuset
//! into an empty v1 cpuset (runc's `ensureParent`). Containers also get an OCI `config.json`
//! with the CRI annotations under `<runtime dir>/<id>/config.json`.
//!
//! [`FakeNode::on_kernel`] drives a real cgroup v1 hierarchy the same way (for the benchmarks):
//! directories are made with `mkdir` (the kernel creates the interface files) and removed with
//! `rmdir`, bottom-up; [`FakeNode::on_kernel_v2`] drives a real cgroup v2 mount (a guest's) the
//! same way. [`FakeNode::start_pods_at_rate`] is the burst helper: it starts many
//! pods, optionally no faster than a given rate.
//!
//! Not for production use: it only ever writes below the roots it is given.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::cgroupfs::CgroupVersion;
use crate::cpuset::CpuSet;

/// kubelet's default CFS period.
pub const PERIOD_US: u64 = 100_000;

/// A pod's QoS class, as kubelet derives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// One container of a pod: requests and limits in millicores (`None` = not set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    pub name: String,
    pub request_milli: Option<u64>,
    pub limit_milli: Option<u64>,
    /// Extra `process.env` entries of its config (`NAME=value`), as device plugins add them.
    pub env: Vec<String>,
    /// Device paths in `linux.devices` of its config (e.g. `/dev/vfio/42`).
    pub devices: Vec<String>,
}

impl ContainerSpec {
    /// request = limit = `milli` (a Guaranteed container).
    pub fn guaranteed(name: &str, milli: u64) -> Self {
        ContainerSpec {
            name: name.into(),
            request_milli: Some(milli),
            limit_milli: Some(milli),
            env: Vec::new(),
            devices: Vec::new(),
        }
    }

    pub fn burstable(name: &str, request: u64, limit: Option<u64>) -> Self {
        ContainerSpec {
            name: name.into(),
            request_milli: Some(request),
            limit_milli: limit,
            env: Vec::new(),
            devices: Vec::new(),
        }
    }

    pub fn best_effort(name: &str) -> Self {
        ContainerSpec {
            name: name.into(),
            request_milli: None,
            limit_milli: None,
            env: Vec::new(),
            devices: Vec::new(),
        }
    }

    /// Adds an environment variable (`NAME=value`) to its config, as a device plugin's
    /// `Allocate` response does (`PCIDEVICE_INTEL_COM_SRIOV=0000:3b:02.0`).
    pub fn with_env(mut self, entry: &str) -> Self {
        self.env.push(entry.to_string());
        self
    }

    /// Adds a device node to `linux.devices` of its config (`/dev/vfio/42`).
    pub fn with_device(mut self, path: &str) -> Self {
        self.devices.push(path.to_string());
        self
    }
}

/// A pod: UID, name (for display), QoS and containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSpec {
    pub uid: String,
    pub name: String,
    pub qos: Qos,
    pub containers: Vec<ContainerSpec>,
}

impl PodSpec {
    /// A pod of one container, with a new UID.
    pub fn one(name: &str, qos: Qos, container: ContainerSpec) -> PodSpec {
        PodSpec {
            uid: new_pod_uid(),
            name: name.into(),
            qos,
            containers: vec![container],
        }
    }
}

/// A fake node: a cgroup tree (v1 with `cpuset/` and `cpu,cpuacct/` side by side, or v2) with a
/// `kubepods` cgroup, plus the runtime's config directory.
#[derive(Debug)]
pub struct FakeNode {
    root: PathBuf,
    /// The cpuset hierarchy's root and the cpu hierarchy's (the same tree on v2).
    cpuset_root: PathBuf,
    cpu_root: PathBuf,
    /// A real cgroup v1 hierarchy: `mkdir`/`rmdir` instead of staged directories.
    kernel: bool,
    version: CgroupVersion,
    cpus: CpuSet,
    mems: CpuSet,
    runtime_dir: PathBuf,
    /// Pod annotations (by pod UID) the runtime copies into each container's config, as
    /// containerd's `pod_annotations` does.
    annotations: Mutex<BTreeMap<String, BTreeMap<String, String>>>,
    /// v2: cgroups have `cpuset.cpus.exclusive`, as on Linux 6.7 or newer (remote partitions).
    remote_partitions: bool,
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A fresh 64-hex container id, distinct within the process.
pub fn new_container_id(tag: &str) -> String {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let seed = format!("{:016x}{:08x}{}", n, std::process::id(), hex_of(tag));
    seed.chars().cycle().take(64).collect()
}

/// A fresh pod UID, distinct within the process.
pub fn new_pod_uid() -> String {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        std::process::id(),
        n & 0xffff,
        (n >> 16) & 0xfff,
        (n >> 28) & 0xfff,
        n
    )
}

fn hex_of(text: &str) -> String {
    text.bytes().map(|b| format!("{:02x}", b)).collect()
}

/// kubelet's shares for a request (`MilliCPUToShares`).
pub fn shares(request_milli: Option<u64>) -> u64 {
    match request_milli {
        None | Some(0) => 2,
        Some(m) => (m * 1024 / 1000).max(2),
    }
}

/// runc's (pre-1.3.2) linear shares → cpu.weight conversion.
pub fn weight(shares: u64) -> u64 {
    1 + (shares.saturating_sub(2) * 9999) / 262_142
}

impl FakeNode {
    /// Creates the tree under `root` (which must exist and be empty) with `kubepods`,
    /// `kubepods/burstable` and `kubepods/besteffort`, each holding every CPU and memory node.
    pub fn create(
        root: &Path,
        version: CgroupVersion,
        cpus: CpuSet,
        mems: CpuSet,
        runtime_dir: &Path,
    ) -> io::Result<FakeNode> {
        let (cpuset_root, cpu_root) = match version {
            CgroupVersion::V1 => (root.join("cpuset"), root.join("cpu,cpuacct")),
            CgroupVersion::V2 => (root.to_path_buf(), root.to_path_buf()),
        };
        let node = FakeNode {
            root: root.to_path_buf(),
            cpuset_root,
            cpu_root,
            kernel: false,
            remote_partitions: false,
            version,
            cpus,
            mems,
            runtime_dir: runtime_dir.to_path_buf(),
            annotations: Mutex::default(),
        };
        fs::create_dir_all(runtime_dir)?;
        match version {
            CgroupVersion::V1 => {
                for controller in ["cpuset", "cpu,cpuacct"] {
                    fs::create_dir_all(root.join(controller))?;
                }
                // The root cgroups' interface files, as the kernel shows them.
                let cpus = node.cpus.to_string();
                let mems = node.mems.to_string();
                for (file, value) in [
                    ("cpuset/cpuset.cpus", cpus.as_str()),
                    ("cpuset/cpuset.mems", mems.as_str()),
                    ("cpuset/cpuset.effective_cpus", cpus.as_str()),
                    ("cpuset/cpuset.effective_mems", mems.as_str()),
                    ("cpuset/cpuset.sched_load_balance", "1"),
                    ("cpuset/cgroup.procs", ""),
                    ("cpu,cpuacct/cpu.shares", "1024"),
                    ("cpu,cpuacct/cpu.cfs_quota_us", "-1"),
                    ("cpu,cpuacct/cpu.cfs_period_us", "100000"),
                    ("cpu,cpuacct/cgroup.procs", ""),
                ] {
                    write(&root.join(file), value)?;
                }
            }
            CgroupVersion::V2 => {
                fs::create_dir_all(root)?;
                write(
                    &root.join("cgroup.controllers"),
                    "cpuset cpu io memory pids",
                )?;
                write(&root.join("cgroup.subtree_control"), "cpuset cpu")?;
                write(&root.join("cpuset.cpus.effective"), &node.cpus.to_string())?;
                write(&root.join("cpuset.mems.effective"), &node.mems.to_string())?;
            }
        }
        for dir in ["kubepods", "kubepods/burstable", "kubepods/besteffort"] {
            node.add_cgroup(dir, None, None)?;
            // kubelet leaves cpusets alone; runc-style inheritance fills them.
            node.inherit_cpuset(dir)?;
        }
        Ok(node)
    }

    /// v2: the node's kernel has remote partitions (Linux 6.7 or newer): every cgroup, those
    /// that exist and those made from now on, has `cpuset.cpus.exclusive` (empty).
    pub fn with_remote_partitions(&mut self) -> io::Result<()> {
        self.remote_partitions = true;
        for dir in ["kubepods", "kubepods/burstable", "kubepods/besteffort"] {
            write(&self.root.join(dir).join("cpuset.cpus.exclusive"), "")?;
        }
        // The root's list of cpus in isolated partitions (Linux 6.8 or newer).
        write(&self.root.join("cpuset.cpus.isolated"), "")
    }

    /// The same node on a real cgroup v1 hierarchy: `cpuset_top` and `cpu_top` are one new,
    /// uniquely named cgroup directory under the cpuset and the cpu controller mounts (created
    /// here, cpuset copied from the mount's root); `kubepods` and its QoS cgroups go below them.
    /// The caller removes the tops (see [`FakeNode::remove_all`]).
    pub fn on_kernel(
        cpuset_top: &Path,
        cpu_top: &Path,
        runtime_dir: &Path,
    ) -> io::Result<FakeNode> {
        let mount = cpuset_top.parent().unwrap_or(cpuset_top);
        let read = |file: &str| -> io::Result<CpuSet> {
            let text = fs::read_to_string(mount.join(file))?;
            CpuSet::parse(text.trim())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
        };
        let node = FakeNode {
            root: cpuset_top.to_path_buf(),
            cpuset_root: cpuset_top.to_path_buf(),
            cpu_root: cpu_top.to_path_buf(),
            kernel: true,
            remote_partitions: false,
            version: CgroupVersion::V1,
            cpus: read("cpuset.cpus")?,
            mems: read("cpuset.mems")?,
            runtime_dir: runtime_dir.to_path_buf(),
            annotations: Mutex::default(),
        };
        fs::create_dir_all(runtime_dir)?;
        for top in [cpuset_top, cpu_top] {
            match fs::create_dir(top) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
        }
        write(&cpuset_top.join("cpuset.cpus"), &node.cpus.to_string())?;
        write(&cpuset_top.join("cpuset.mems"), &node.mems.to_string())?;
        for dir in ["kubepods", "kubepods/burstable", "kubepods/besteffort"] {
            node.add_cgroup(dir, None, None)?;
            node.inherit_cpuset(dir)?;
        }
        Ok(node)
    }

    /// The same node on a real cgroup v2 hierarchy mounted at `root` (Linux: the cpuset and
    /// cpu controllers available there): `kubepods` and its QoS cgroups go below it, made with
    /// `mkdir`; every new cgroup's parent first gets `+cpuset +cpu` in its
    /// `cgroup.subtree_control`, as runc enables the controllers up the path on v2. The caller
    /// removes `kubepods` ([`FakeNode::remove_all`]); the mount's root is left alone.
    pub fn on_kernel_v2(root: &Path, runtime_dir: &Path) -> io::Result<FakeNode> {
        let read = |file: &str| -> io::Result<CpuSet> {
            let text = fs::read_to_string(root.join(file))?;
            CpuSet::parse(text.trim())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
        };
        let node = FakeNode {
            root: root.to_path_buf(),
            cpuset_root: root.to_path_buf(),
            cpu_root: root.to_path_buf(),
            kernel: true,
            remote_partitions: false,
            version: CgroupVersion::V2,
            cpus: read("cpuset.cpus.effective")?,
            mems: read("cpuset.mems.effective")?,
            runtime_dir: runtime_dir.to_path_buf(),
            annotations: Mutex::default(),
        };
        fs::create_dir_all(runtime_dir)?;
        for dir in ["kubepods", "kubepods/burstable", "kubepods/besteffort"] {
            node.add_cgroup(dir, None, None)?;
        }
        Ok(node)
    }

    /// Removes everything this node made below its roots (on a real hierarchy, the tops too;
    /// on a real v2 mount, `kubepods`).
    pub fn remove_all(&self) -> io::Result<()> {
        if self.kernel && self.version == CgroupVersion::V2 {
            return remove_cgroup_tree(&self.root.join("kubepods"));
        }
        if self.kernel {
            for top in [&self.cpuset_root, &self.cpu_root] {
                remove_cgroup_tree(top)?;
            }
            Ok(())
        } else {
            for root in self.controller_roots() {
                self.remove_tree(&root.join("kubepods"))?;
            }
            Ok(())
        }
    }

    /// Starts every pod, no faster than `per_second` pods a second (`None`: as fast as
    /// possible). Returns each pod's app container ids, in order, and when each pod's last
    /// container had appeared with its CPU settings.
    pub fn start_pods_at_rate(
        &self,
        pods: &[PodSpec],
        per_second: Option<f64>,
    ) -> io::Result<Vec<(Vec<String>, Instant)>> {
        let started = Instant::now();
        let mut out = Vec::with_capacity(pods.len());
        for (n, pod) in pods.iter().enumerate() {
            if let Some(rate) = per_second.filter(|r| *r > 0.0) {
                let due = started + Duration::from_secs_f64(n as f64 / rate);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
            }
            let ids = self.start_pod(pod)?;
            out.push((ids, Instant::now()));
        }
        Ok(out)
    }

    /// The `--cgroup-root` to give the agent.
    pub fn cgroup_root(&self) -> &Path {
        &self.root
    }

    /// The `--runtime-config-path` template to give the agent.
    pub fn runtime_template(&self) -> String {
        format!("{}/{{id}}/config.json", self.runtime_dir.display())
    }

    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The pod's directory relative to the controller roots.
    pub fn pod_dir(&self, pod: &PodSpec) -> String {
        match pod.qos {
            Qos::Guaranteed => format!("kubepods/pod{}", pod.uid),
            Qos::Burstable => format!("kubepods/burstable/pod{}", pod.uid),
            Qos::BestEffort => format!("kubepods/besteffort/pod{}", pod.uid),
        }
    }

    /// Gives the pod (by UID) annotations that every container started from now on carries
    /// in its config, as containerd's `pod_annotations` copies them.
    pub fn annotate_pod(&self, uid: &str, annotations: &[(&str, &str)]) {
        let mut all = self.annotations.lock().unwrap_or_else(|e| e.into_inner());
        let pod = all.entry(uid.to_string()).or_default();
        for (k, v) in annotations {
            pod.insert(k.to_string(), v.to_string());
        }
    }

    /// Creates the pod cgroup and its sandbox container; returns the sandbox's id.
    pub fn add_pod(&self, pod: &PodSpec) -> io::Result<String> {
        let requests: u64 = pod.containers.iter().filter_map(|c| c.request_milli).sum();
        let limits: Option<u64> = pod
            .containers
            .iter()
            .map(|c| c.limit_milli)
            .sum::<Option<u64>>();
        self.add_pod_cgroup(pod, shares(Some(requests)), limits)
    }

    /// Creates the pod cgroup with the given CPU settings and its sandbox container; returns
    /// the sandbox's id.
    fn add_pod_cgroup(
        &self,
        pod: &PodSpec,
        cpu_shares: u64,
        limit: Option<u64>,
    ) -> io::Result<String> {
        let dir = self.pod_dir(pod);
        self.add_cgroup(&dir, Some(cpu_shares), limit)?;
        self.inherit_cpuset(&dir)?;
        let sandbox = new_container_id("pause");
        let pause = ContainerSpec::best_effort("POD");
        self.add_container_cgroup(pod, &sandbox, &pause, true)?;
        Ok(sandbox)
    }

    /// Starts one container of the pod (runc create: cgroup, config, CPU settings, cpuset);
    /// returns its id.
    pub fn add_container(&self, pod: &PodSpec, container: &ContainerSpec) -> io::Result<String> {
        let id = new_container_id(&container.name);
        self.add_container_cgroup(pod, &id, container, false)?;
        Ok(id)
    }

    /// Creates the pod, its sandbox and every container; returns the app containers' ids.
    pub fn start_pod(&self, pod: &PodSpec) -> io::Result<Vec<String>> {
        self.add_pod(pod)?;
        pod.containers
            .iter()
            .map(|c| self.add_container(pod, c))
            .collect()
    }

    /// Creates a pod whose CPU is set at pod level (`spec.resources`, KEP-2837, request = limit
    /// = `pod_milli`; `pod.qos` must be the class that gives, Guaranteed) and every container,
    /// as kubelet 1.34+ does: the pod cgroup from the pod-level values, and a container that
    /// sets no CPU limit gets the pod's limit in its config and cgroup (`getCPULimit`), and one
    /// that sets no request the shares of that limit (`calculateLinuxResources` defaults a
    /// missing request to the limit). Returns the app containers' ids.
    pub fn start_pod_with_pod_level_cpu(
        &self,
        pod: &PodSpec,
        pod_milli: u64,
    ) -> io::Result<Vec<String>> {
        self.add_pod_cgroup(pod, shares(Some(pod_milli)), Some(pod_milli))?;
        pod.containers
            .iter()
            .map(|c| {
                let limit = c.limit_milli.or(Some(pod_milli));
                let implied = ContainerSpec {
                    request_milli: c.request_milli.or(limit),
                    limit_milli: limit,
                    ..c.clone()
                };
                self.add_container(pod, &implied)
            })
            .collect()
    }

    /// A container exits and is removed (its cgroup goes, bottom-up).
    pub fn remove_container(&self, pod: &PodSpec, id: &str) -> io::Result<()> {
        let rel = format!("{}/{id}", self.pod_dir(pod));
        for root in self.controller_roots() {
            self.remove_tree(&root.join(&rel))?;
        }
        let _ = fs::remove_dir_all(self.runtime_dir.join(id));
        Ok(())
    }

    /// The pod is deleted: every container and the pod cgroup go.
    pub fn remove_pod(&self, pod: &PodSpec) -> io::Result<()> {
        let rel = self.pod_dir(pod);
        for root in self.controller_roots() {
            self.remove_tree(&root.join(&rel))?;
        }
        Ok(())
    }

    /// Path of an interface file of a cgroup (relative path as returned by [`Self::pod_dir`],
    /// optionally with `/<container id>`), in the controller that holds it.
    pub fn file(&self, rel: &str, file: &str) -> PathBuf {
        match self.version {
            CgroupVersion::V1 if file.starts_with("cpu.") => self.cpu_root.join(rel).join(file),
            _ => self.cpuset_root.join(rel).join(file),
        }
    }

    /// A container's `cpuset.cpus` as the file says.
    pub fn container_cpus(&self, pod: &PodSpec, id: &str) -> io::Result<String> {
        let text =
            fs::read_to_string(self.file(&format!("{}/{id}", self.pod_dir(pod)), "cpuset.cpus"))?;
        Ok(text.trim().to_string())
    }

    fn controller_roots(&self) -> Vec<PathBuf> {
        match self.version {
            CgroupVersion::V1 => vec![self.cpuset_root.clone(), self.cpu_root.clone()],
            CgroupVersion::V2 => vec![self.root.clone()],
        }
    }

    fn add_container_cgroup(
        &self,
        pod: &PodSpec,
        id: &str,
        container: &ContainerSpec,
        sandbox: bool,
    ) -> io::Result<()> {
        let (name, request, limit) = (
            container.name.as_str(),
            container.request_milli,
            container.limit_milli,
        );
        // The runtime's config first: containerd writes it before creating the task.
        let cpu_shares = if sandbox { 2 } else { shares(request) };
        let quota = limit.map(|l| (l * PERIOD_US / 1000) as i64).unwrap_or(-1);
        let mut annotations = serde_json::json!({
            "io.kubernetes.cri.container-type": if sandbox { "sandbox" } else { "container" },
            "io.kubernetes.cri.container-name": name,
            "io.kubernetes.cri.sandbox-uid": pod.uid,
            "io.kubernetes.cri.sandbox-name": pod.name,
            "io.kubernetes.cri.sandbox-namespace": "default",
        });
        let extra = self.annotations.lock().unwrap_or_else(|e| e.into_inner());
        for (k, v) in extra.get(&pod.uid).into_iter().flatten() {
            annotations[k] = serde_json::Value::from(v.as_str());
        }
        drop(extra);
        let mut env = vec![
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
            format!("HOSTNAME={}", pod.name),
        ];
        env.extend(container.env.iter().cloned());
        // Device nodes as runtimes write them (type, numbers and mode are not read).
        let devices: Vec<serde_json::Value> = container
            .devices
            .iter()
            .map(|path| serde_json::json!({"path": path, "type": "c", "major": 242, "minor": 0}))
            .collect();
        let config = serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {
                "args": if sandbox { vec!["/pause"] } else { vec!["sleep", "infinity"] },
                "env": env,
                "cwd": "/",
            },
            "annotations": annotations,
            "linux": {
                "resources": {"cpu": {
                    "shares": cpu_shares,
                    "quota": quota,
                    "period": PERIOD_US,
                }},
                "devices": devices,
            },
        });
        let dir = self.runtime_dir.join(id);
        fs::create_dir_all(&dir)?;
        write(&dir.join("config.json"), &config.to_string())?;

        let rel = format!("{}/{id}", self.pod_dir(pod));
        self.add_cgroup(&rel, Some(cpu_shares), limit)?;
        self.inherit_cpuset(&rel)
    }

    /// A new cgroup: appears with the kernel's default files, then gets the given CPU settings
    /// one file at a time.
    fn add_cgroup(&self, rel: &str, cpu_shares: Option<u64>, limit: Option<u64>) -> io::Result<()> {
        match self.version {
            CgroupVersion::V1 => self.add_cgroup_v1(rel, cpu_shares, limit),
            CgroupVersion::V2 => self.add_cgroup_v2(rel, cpu_shares, limit),
        }
    }

    /// [`Self::add_cgroup`] on v1: the cpuset and cpu hierarchies' directories.
    fn add_cgroup_v1(
        &self,
        rel: &str,
        cpu_shares: Option<u64>,
        limit: Option<u64>,
    ) -> io::Result<()> {
        self.appear(
            &self.cpuset_root,
            rel,
            &[
                ("cpuset.cpus", ""),
                ("cpuset.mems", ""),
                ("cpuset.effective_cpus", ""),
                ("cpuset.effective_mems", ""),
                // The kernel gives every new cpuset 1, whatever its parent's.
                ("cpuset.sched_load_balance", "1"),
                ("cgroup.procs", ""),
            ],
        )?;
        self.appear(
            &self.cpu_root,
            rel,
            &[
                ("cpu.shares", "1024"),
                ("cpu.cfs_quota_us", "-1"),
                ("cpu.cfs_period_us", "100000"),
                ("cgroup.procs", ""),
            ],
        )?;
        let cpu = self.cpu_root.join(rel);
        if let Some(s) = cpu_shares {
            write(&cpu.join("cpu.shares"), &s.to_string())?;
        }
        if let Some(l) = limit {
            write(
                &cpu.join("cpu.cfs_quota_us"),
                &(l * PERIOD_US / 1000).to_string(),
            )?;
        }
        Ok(())
    }

    /// [`Self::add_cgroup`] on v2: one directory with both controllers.
    fn add_cgroup_v2(
        &self,
        rel: &str,
        cpu_shares: Option<u64>,
        limit: Option<u64>,
    ) -> io::Result<()> {
        // A new cgroup's `cpuset.cpus` is empty: it has its parent's effective sets
        // (read under the fake kernel's lock, which an agent's write holds while the
        // fake kernel updates the effective sets below it).
        let _cgroup_mutex = self.fake_kernel_lock()?;
        let parent = self.root.join(rel);
        let parent = parent.parent().unwrap_or(&self.root);
        let inherited = |file: &str, all: &CpuSet| {
            fs::read_to_string(parent.join(file))
                .ok()
                .and_then(|text| CpuSet::parse(text.trim()).ok())
                .filter(|set| !set.is_empty())
                .unwrap_or_else(|| all.clone())
                .to_string()
        };
        let cpus = inherited("cpuset.cpus.effective", &self.cpus);
        let mems = inherited("cpuset.mems.effective", &self.mems);
        let mut files = vec![
            ("cgroup.controllers", "cpuset cpu"),
            ("cgroup.subtree_control", "cpuset cpu"),
            ("cgroup.procs", ""),
            ("cpuset.cpus", ""),
            ("cpuset.mems", ""),
            ("cpuset.cpus.effective", &cpus),
            ("cpuset.mems.effective", &mems),
            // Partitions since 5.13; cpuset.cpus.exclusive since 6.7.
            ("cpuset.cpus.partition", "member"),
            ("cpu.max", "max 100000"),
            ("cpu.weight", "100"),
        ];
        if self.remote_partitions {
            files.push(("cpuset.cpus.exclusive", ""));
        }
        self.appear(&self.root, rel, &files)?;
        let dir = self.root.join(rel);
        if let Some(s) = cpu_shares {
            write(&dir.join("cpu.weight"), &weight(s).to_string())?;
        }
        if let Some(l) = limit {
            write(
                &dir.join("cpu.max"),
                &format!("{} {PERIOD_US}", l * PERIOD_US / 1000),
            )?;
        }
        Ok(())
    }

    /// runc's `ensureParent` on v1: an empty cpuset gets its parent's values. On v2 an empty
    /// cpuset inherits by itself; nothing is written.
    fn inherit_cpuset(&self, rel: &str) -> io::Result<()> {
        if self.version == CgroupVersion::V2 {
            return Ok(());
        }
        let dir = self.cpuset_root.join(rel);
        let parent = dir.parent().unwrap_or(&dir).to_path_buf();
        // The fake kernel's cgroup_mutex (see `cgroupfs::fake_kernel`): an agent's write cannot
        // land between reading the parent's set and copying it, which would leave the child
        // outside its parent (the real kernel refuses that copy, as runc's own copy races).
        let _cgroup_mutex = self.fake_kernel_lock()?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let own = fs::read_to_string(dir.join(file))?;
            if own.trim().is_empty() {
                let inherited = read_whole(&parent.join(file))?;
                write(&dir.join(file), &inherited)?;
            }
        }
        Ok(())
    }
    /// The fake kernel's `cgroup_mutex` (an exclusive `flock` on the cpuset hierarchy's root,
    /// see `cgroupfs::fake_kernel::lock`); `None` on a real hierarchy, whose kernel has its own.
    fn fake_kernel_lock(&self) -> io::Result<Option<nix::fcntl::Flock<fs::File>>> {
        if self.kernel {
            return Ok(None);
        }
        let root = fs::File::open(&self.cpuset_root)?;
        nix::fcntl::Flock::lock(root, nix::fcntl::FlockArg::LockExclusive)
            .map(Some)
            .map_err(|(_, errno)| io::Error::from(errno))
    }

    /// Makes `root/rel` appear at once with the given files: assembled in a staging directory
    /// beside `root` (outside any watched tree) and renamed into place. On a real hierarchy a
    /// `mkdir`, and the kernel makes the files.
    fn appear(&self, root: &Path, rel: &str, files: &[(&str, &str)]) -> io::Result<()> {
        let target = root.join(rel);
        if target.exists() {
            return Ok(());
        }
        if self.kernel {
            if self.version == CgroupVersion::V2 {
                // runc's way on v2: the parent hands the controllers down first.
                let parent = target.parent().unwrap_or(root);
                write(&parent.join("cgroup.subtree_control"), "+cpuset +cpu")?;
            }
            return fs::create_dir(&target);
        }
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let staging = root.join(format!(".staging-{}-{n}", std::process::id()));
        fs::create_dir(&staging)?;
        for (name, value) in files {
            write(&staging.join(name), value)?;
        }
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::rename(&staging, &target)
    }

    /// Removes a cgroup directory and everything below it.
    fn remove_tree(&self, path: &Path) -> io::Result<()> {
        if self.kernel {
            return remove_cgroup_tree(path);
        }
        remove_tree(path)
    }
}

/// Removes a real cgroup directory and its child cgroups, bottom-up with `rmdir` (the kernel's
/// interface files go with their directory).
fn remove_cgroup_tree(path: &Path) -> io::Result<()> {
    let entries = match fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            remove_cgroup_tree(&entry.path())?;
        }
    }
    match fs::remove_dir(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Reads a parent's cpuset the way the kernel shows it: never half-written. A fake tree's file
/// is empty for a moment while someone rewrites it (truncate, then write); the kernel's never
/// is, and copying that moment into a child would leave the child uninitialised.
fn read_whole(path: &Path) -> io::Result<String> {
    for _ in 0..1000 {
        let text = fs::read_to_string(path)?;
        if !text.trim().is_empty() {
            return Ok(text.trim().to_string());
        }
        std::thread::yield_now();
    }
    Ok(String::new())
}

/// Writes a value with the kernel's trailing newline, into an existing or new file.
fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, format!("{value}\n"))
}

/// Removes a cgroup directory and everything below it, files first (a fake tree has real
/// files; the kernel would refuse an rmdir with children, the runtime removes bottom-up).
fn remove_tree(path: &Path) -> io::Result<()> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An 8-CPU, one-memory-node fake node in a fresh temporary directory.
    fn node(version: CgroupVersion) -> (tempfile::TempDir, FakeNode) {
        let dir = tempfile::tempdir().unwrap();
        let node = FakeNode::create(
            &dir.path().join("cg"),
            version,
            CpuSet::range(0, 7),
            CpuSet::range(0, 0),
            &dir.path().join("runtime"),
        )
        .unwrap();
        (dir, node)
    }

    #[test]
    fn kubelets_conversions() {
        assert_eq!(shares(Some(1000)), 1024);
        assert_eq!(shares(Some(1500)), 1536);
        assert_eq!(shares(None), 2);
        assert_eq!(shares(Some(1)), 2);
        assert_eq!(weight(1024), 39);
        assert_eq!(weight(2048), 79);
    }

    #[test]
    fn a_guaranteed_pod_on_v1_looks_like_kubelets() {
        let (dir, node) = node(CgroupVersion::V1);
        let pod = PodSpec::one(
            "db",
            Qos::Guaranteed,
            ContainerSpec::guaranteed("app", 2000),
        );
        // The roots hold the kernel's files, so layout detection finds both controllers.
        let cg = dir.path().join("cg");
        assert_eq!(
            fs::read_to_string(cg.join("cpu,cpuacct/cpu.shares")).unwrap(),
            "1024\n"
        );
        assert_eq!(
            fs::read_to_string(cg.join("cpuset/cpuset.cpus")).unwrap(),
            "0-7\n"
        );
        let ids = node.start_pod(&pod).unwrap();
        let rel = format!("{}/{}", node.pod_dir(&pod), ids[0]);
        let read = |f| fs::read_to_string(node.file(&rel, f)).unwrap();
        assert_eq!(read("cpu.shares"), "2048\n");
        assert_eq!(read("cpu.cfs_quota_us"), "200000\n");
        assert_eq!(read("cpuset.cpus"), "0-7\n");
        assert_eq!(node.container_cpus(&pod, &ids[0]).unwrap(), "0-7");
        let config: serde_json::Value = serde_json::from_str(
            &fs::read_to_string(dir.path().join("runtime").join(&ids[0]).join("config.json"))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            config["annotations"]["io.kubernetes.cri.container-name"],
            "app"
        );
        node.remove_pod(&pod).unwrap();
        assert!(!node.file(&rel, "cpu.shares").exists());
        // No staging directories left behind.
        let leftovers: Vec<_> = fs::read_dir(dir.path().join("cg/cpuset"))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(".staging"))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn a_burstable_pod_on_v2_gets_weight_and_max() {
        let (_dir, node) = node(CgroupVersion::V2);
        let pod = PodSpec::one(
            "api",
            Qos::Burstable,
            ContainerSpec::burstable("api", 1000, Some(2000)),
        );
        let ids = node.start_pod(&pod).unwrap();
        let rel = format!("{}/{}", node.pod_dir(&pod), ids[0]);
        let read = |f| fs::read_to_string(node.file(&rel, f)).unwrap();
        assert_eq!(read("cpu.weight"), "39\n");
        assert_eq!(read("cpu.max"), "200000 100000\n");
        assert_eq!(read("cpuset.cpus"), "\n");
    }
}
