//! The pod-level cgroups kubelet makes before it asks the runtime for a sandbox, for both of
//! kubelet's cgroup drivers:
//! - `cgroupfs`: directories `kubepods[/burstable|/besteffort]/pod<uid>` under the cgroup root,
//!   in every v1 hierarchy (a new v1 cpuset gets its parent's `cpuset.cpus` and `cpuset.mems`
//!   copied in, as runc's `ensureParent` does) or once in the v2 tree (controllers enabled in
//!   each ancestor's `cgroup.subtree_control`). `cgroup_parent` is the absolute cgroup path.
//! - `systemd`: transient slice units `kubepods.slice`, `kubepods-<qos>.slice` and
//!   `kubepods[-<qos>]-pod<uid>.slice` (dashes in the uid become underscores) started over
//!   D-Bus with `busctl`, the way kubelet's systemd driver starts them. `cgroup_parent` is the
//!   slice's name; runc makes each container a `cri-containerd-<id>.scope` in it.

use std::fs;
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::resources::{self, PodResources, Qos};
use crate::PodSpec;

/// How long a cgroup may stay busy (its last task exiting) or a slice may take to appear.
const SETTLE: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(10);

/// kubelet's `--cgroup-driver`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    Cgroupfs,
    Systemd,
}

impl std::str::FromStr for CgroupDriver {
    type Err = String;
    fn from_str(text: &str) -> Result<CgroupDriver, String> {
        match text {
            "cgroupfs" => Ok(CgroupDriver::Cgroupfs),
            "systemd" => Ok(CgroupDriver::Systemd),
            other => Err(format!(
                "unknown cgroup driver {other:?} (cgroupfs or systemd)"
            )),
        }
    }
}

/// The cgroup hierarchies mounted under the cgroup root.
#[derive(Debug, Clone)]
enum Hierarchies {
    /// The v2 tree, mounted at the root.
    Unified,
    /// v1 hierarchies: mount point and whether it holds the cpuset controller.
    V1(Vec<(PathBuf, bool)>),
}

/// The node's kubepods cgroups for one driver, and the pods' cgroups in them.
#[derive(Debug, Clone)]
pub struct NodeCgroups {
    driver: CgroupDriver,
    root: PathBuf,
    /// cgroupfs: the kubepods cgroup relative to the root (`kubepods`, or a test's unique
    /// `<prefix>/kubepods`). systemd: always `kubepods.slice`.
    kubepods: String,
    hierarchies: Hierarchies,
    node_memory: u64,
}

impl NodeCgroups {
    /// The cgroups under `root` (usually `/sys/fs/cgroup`). `kubepods` is the kubepods cgroup
    /// relative to it for the cgroupfs driver; the systemd driver ignores it.
    pub fn new(driver: CgroupDriver, root: &Path, kubepods: &str) -> io::Result<NodeCgroups> {
        let hierarchies = if root.join("cgroup.controllers").exists() {
            Hierarchies::Unified
        } else {
            let mounts = v1_mounts(root)?;
            if mounts.is_empty() {
                return Err(io::Error::new(
                    ErrorKind::NotFound,
                    format!("no cgroup mounts under {}", root.display()),
                ));
            }
            Hierarchies::V1(mounts)
        };
        let kubepods = match driver {
            CgroupDriver::Cgroupfs => kubepods.trim_matches('/').to_string(),
            CgroupDriver::Systemd => "kubepods.slice".to_string(),
        };
        Ok(NodeCgroups {
            driver,
            root: root.to_path_buf(),
            kubepods,
            hierarchies,
            node_memory: node_memory(),
        })
    }

    pub fn driver(&self) -> CgroupDriver {
        self.driver
    }

    pub fn is_unified(&self) -> bool {
        matches!(self.hierarchies, Hierarchies::Unified)
    }

    /// The memory kubelet sees on the node (for Burstable `oom_score_adj`).
    pub fn node_memory(&self) -> u64 {
        self.node_memory
    }

    /// Makes kubepods and its QoS cgroups (kubelet's QoS container manager), if missing.
    pub fn create_qos(&self) -> io::Result<()> {
        match self.driver {
            CgroupDriver::Cgroupfs => {
                for rel in [
                    self.kubepods.clone(),
                    format!("{}/burstable", self.kubepods),
                    format!("{}/besteffort", self.kubepods),
                ] {
                    self.mkdir_cgroupfs(&rel)?;
                }
                Ok(())
            }
            CgroupDriver::Systemd => {
                for (slice, parent) in [
                    ("kubepods.slice", "-.slice"),
                    ("kubepods-burstable.slice", "kubepods.slice"),
                    ("kubepods-besteffort.slice", "kubepods.slice"),
                ] {
                    self.start_slice(slice, parent, None)?;
                }
                Ok(())
            }
        }
    }

    /// The pod's cgroup relative to the cgroup root (in each v1 hierarchy).
    pub fn pod_cgroup(&self, pod: &PodSpec) -> String {
        let qos = pod.qos();
        match self.driver {
            CgroupDriver::Cgroupfs => {
                let mut rel = self.kubepods.clone();
                if !qos.dir().is_empty() {
                    rel = format!("{rel}/{}", qos.dir());
                }
                format!("{rel}/pod{}", pod.uid)
            }
            CgroupDriver::Systemd => {
                let slice = pod_slice(qos, &pod.uid);
                match qos {
                    Qos::Guaranteed => format!("kubepods.slice/{slice}"),
                    _ => format!("kubepods.slice/kubepods-{}.slice/{slice}", qos.dir()),
                }
            }
        }
    }

    /// What kubelet passes to RunPodSandbox as `cgroup_parent`.
    pub fn cgroup_parent(&self, pod: &PodSpec) -> String {
        match self.driver {
            CgroupDriver::Cgroupfs => format!("/{}", self.pod_cgroup(pod)),
            CgroupDriver::Systemd => pod_slice(pod.qos(), &pod.uid),
        }
    }

    /// Makes the pod's cgroup with kubelet's settings; returns the `cgroup_parent`.
    pub fn create_pod(&self, pod: &PodSpec) -> io::Result<String> {
        let settings = resources::pod_resources(&pod.containers);
        match self.driver {
            CgroupDriver::Cgroupfs => {
                let rel = self.pod_cgroup(pod);
                self.mkdir_cgroupfs(&rel)?;
                self.write_cpu_settings(&rel, settings)?;
            }
            CgroupDriver::Systemd => {
                let qos = pod.qos();
                let parent = match qos {
                    Qos::Guaranteed => "kubepods.slice".to_string(),
                    _ => format!("kubepods-{}.slice", qos.dir()),
                };
                self.start_slice(&pod_slice(qos, &pod.uid), &parent, Some(settings))?;
            }
        }
        Ok(self.cgroup_parent(pod))
    }

    /// Writes the pod cgroup's CPU settings for the spec as it is now (kubelet's in-place
    /// resize of the pod level). The cgroupfs driver only: with systemd, kubelet sets the
    /// slice's properties, which this does not do yet.
    pub fn update_pod(&self, pod: &PodSpec) -> io::Result<()> {
        match self.driver {
            CgroupDriver::Cgroupfs => {
                let settings = resources::pod_resources(&pod.containers);
                self.write_cpu_settings(&self.pod_cgroup(pod), settings)
            }
            CgroupDriver::Systemd => Err(io::Error::new(
                ErrorKind::Unsupported,
                "an in-place resize with the systemd driver is not scripted yet",
            )),
        }
    }

    /// Removes the pod's cgroup (after its containers are gone), as kubelet's pod cleanup does.
    pub fn remove_pod(&self, pod: &PodSpec) -> io::Result<()> {
        match self.driver {
            CgroupDriver::Cgroupfs => {
                let rel = self.pod_cgroup(pod);
                for dir in self.dirs(&rel) {
                    remove_dir_settled(&dir)?;
                }
                Ok(())
            }
            CgroupDriver::Systemd => {
                let slice = pod_slice(pod.qos(), &pod.uid);
                run(Command::new("systemctl").args(["stop", &slice]))?;
                Ok(())
            }
        }
    }

    /// `rel`'s directory in every hierarchy.
    pub fn dirs(&self, rel: &str) -> Vec<PathBuf> {
        match &self.hierarchies {
            Hierarchies::Unified => vec![self.root.join(rel)],
            Hierarchies::V1(mounts) => mounts.iter().map(|(m, _)| m.join(rel)).collect(),
        }
    }

    /// mkdir `rel` (and missing ancestors) in every hierarchy, the way the cgroupfs driver does.
    fn mkdir_cgroupfs(&self, rel: &str) -> io::Result<()> {
        match &self.hierarchies {
            Hierarchies::Unified => {
                let mut dir = self.root.clone();
                for part in rel.split('/') {
                    enable_controllers(&dir)?;
                    dir.push(part);
                    create_dir(&dir)?;
                }
                Ok(())
            }
            Hierarchies::V1(mounts) => {
                for (mount, is_cpuset) in mounts {
                    let mut dir = mount.clone();
                    for part in rel.split('/') {
                        dir.push(part);
                        create_dir(&dir)?;
                        if *is_cpuset {
                            copy_cpuset_from_parent(&dir)?;
                        }
                    }
                }
                Ok(())
            }
        }
    }

    /// The pod cgroup's CPU shares and quota (v1 `cpu.shares`/`cpu.cfs_*`, v2 `cpu.weight`/
    /// `cpu.max`) and memory limit, where the controller is there.
    fn write_cpu_settings(&self, rel: &str, settings: PodResources) -> io::Result<()> {
        let period = resources::CPU_PERIOD_US;
        match &self.hierarchies {
            Hierarchies::Unified => {
                let dir = self.root.join(rel);
                if dir.join("cpu.weight").exists() {
                    let weight = resources::shares_to_weight(settings.cpu_shares);
                    fs::write(dir.join("cpu.weight"), weight.to_string())?;
                    let max = if settings.cpu_quota > 0 {
                        format!("{} {period}", settings.cpu_quota)
                    } else {
                        format!("max {period}")
                    };
                    fs::write(dir.join("cpu.max"), max)?;
                }
                if settings.memory_limit > 0 && dir.join("memory.max").exists() {
                    fs::write(dir.join("memory.max"), settings.memory_limit.to_string())?;
                }
            }
            Hierarchies::V1(mounts) => {
                for (mount, _) in mounts {
                    let dir = mount.join(rel);
                    if dir.join("cpu.shares").exists() {
                        fs::write(dir.join("cpu.shares"), settings.cpu_shares.to_string())?;
                        fs::write(dir.join("cpu.cfs_period_us"), period.to_string())?;
                        let quota = if settings.cpu_quota > 0 {
                            settings.cpu_quota.to_string()
                        } else {
                            "-1".to_string()
                        };
                        fs::write(dir.join("cpu.cfs_quota_us"), quota)?;
                    }
                    if settings.memory_limit > 0 && dir.join("memory.limit_in_bytes").exists() {
                        fs::write(
                            dir.join("memory.limit_in_bytes"),
                            settings.memory_limit.to_string(),
                        )?;
                    }
                }
            }
        }
        Ok(())
    }

    /// `StartTransientUnit`'s properties for a slice under `parent` (accounting on, the pod's
    /// CPU and memory settings when given): their count and busctl's arguments for them.
    fn slice_properties(
        &self,
        parent: &str,
        settings: Option<PodResources>,
    ) -> (usize, Vec<String>) {
        let mut properties: Vec<String> = Vec::new();
        let mut count = 0;
        let mut add = |p: &mut Vec<String>, fields: &[&str]| {
            p.extend(fields.iter().map(|f| f.to_string()));
            count += 1;
        };
        add(
            &mut properties,
            &["Description", "s", "kubepods slice (crikubelet)"],
        );
        add(&mut properties, &["DefaultDependencies", "b", "false"]);
        add(&mut properties, &["Wants", "as", "1", parent]);
        add(&mut properties, &["CPUAccounting", "b", "true"]);
        add(&mut properties, &["MemoryAccounting", "b", "true"]);
        if let Some(settings) = settings {
            let weight = resources::shares_to_weight(settings.cpu_shares).to_string();
            let shares = settings.cpu_shares.to_string();
            if self.is_unified() {
                add(&mut properties, &["CPUWeight", "t", &weight]);
            } else {
                add(&mut properties, &["CPUShares", "t", &shares]);
            }
            if settings.cpu_quota > 0 {
                // µs of CPU per second of wall time.
                let per_sec =
                    (settings.cpu_quota * 1_000_000 / resources::CPU_PERIOD_US).to_string();
                add(&mut properties, &["CPUQuotaPerSecUSec", "t", &per_sec]);
            }
            if settings.memory_limit > 0 {
                let limit = settings.memory_limit.to_string();
                if self.is_unified() {
                    add(&mut properties, &["MemoryMax", "t", &limit]);
                } else {
                    add(&mut properties, &["MemoryLimit", "t", &limit]);
                }
            }
        }
        (count, properties)
    }

    /// Starts a transient slice over D-Bus (what kubelet's systemd driver does through
    /// `StartTransientUnit`) and waits until its cgroup exists.
    fn start_slice(
        &self,
        slice: &str,
        parent: &str,
        settings: Option<PodResources>,
    ) -> io::Result<()> {
        let (count, properties) = self.slice_properties(parent, settings);
        let dir = self.root.join(slice_path(slice));
        if self.is_unified() && dir.exists() {
            return Ok(());
        }
        let mut command = Command::new("busctl");
        command
            .args([
                "call",
                // The properties hold `-.slice`, which busctl would read as options.
                "--",
                "org.freedesktop.systemd1",
                "/org/freedesktop/systemd1",
                "org.freedesktop.systemd1.Manager",
                "StartTransientUnit",
                "ssa(sv)a(sa(sv))",
                slice,
                "replace",
            ])
            .arg(count.to_string())
            .args(&properties)
            .arg("0");
        match run(&mut command) {
            Ok(_) => {}
            // Already there (kubelet's driver treats "already exists" as success too). systemd
            // 252 says "Unit X was already loaded or has a fragment file" for a live slice; on
            // v1 there is no directory check above to skip the call.
            Err(err)
                if err.to_string().contains("already exists")
                    || err.to_string().contains("already loaded") => {}
            Err(err) => return Err(err),
        }
        let deadline = Instant::now() + SETTLE;
        let probe = match &self.hierarchies {
            Hierarchies::Unified => dir,
            Hierarchies::V1(mounts) => mounts
                .iter()
                .find(|(m, _)| m.ends_with("systemd") || m.ends_with("cpu,cpuacct"))
                .map_or(dir, |(m, _)| m.join(slice_path(slice))),
        };
        while !probe.exists() {
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    ErrorKind::TimedOut,
                    format!(
                        "slice {slice} started but {} never appeared",
                        probe.display()
                    ),
                ));
            }
            thread::sleep(POLL);
        }
        Ok(())
    }
}

/// `kubepods[-<qos>]-pod<uid>.slice`, dashes in the uid turned to underscores.
pub fn pod_slice(qos: Qos, uid: &str) -> String {
    let uid = uid.replace('-', "_");
    match qos {
        Qos::Guaranteed => format!("kubepods-pod{uid}.slice"),
        _ => format!("kubepods-{}-pod{uid}.slice", qos.dir()),
    }
}

/// Where systemd puts a slice's cgroup: `a-b-c.slice` → `a.slice/a-b.slice/a-b-c.slice`.
pub fn slice_path(slice: &str) -> PathBuf {
    let stem = slice.strip_suffix(".slice").unwrap_or(slice);
    let mut path = PathBuf::new();
    let mut prefix = String::new();
    for part in stem.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path.push(format!("{prefix}.slice"));
    }
    path
}

/// The v1 hierarchies mounted directly under `root`, from `/proc/self/mounts`.
fn v1_mounts(root: &Path) -> io::Result<Vec<(PathBuf, bool)>> {
    let mounts = fs::read_to_string("/proc/self/mounts")?;
    let mut found = Vec::new();
    for line in mounts.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [_, mount_point, fs_type, options, ..] = fields[..] else {
            continue;
        };
        let mount_point = PathBuf::from(mount_point);
        if fs_type != "cgroup" || mount_point.parent() != Some(root) {
            continue;
        }
        let is_cpuset = options.split(',').any(|o| o == "cpuset");
        if !found.iter().any(|(m, _)| *m == mount_point) {
            found.push((mount_point, is_cpuset));
        }
    }
    Ok(found)
}

/// `MemTotal` from `/proc/meminfo`, in bytes.
fn node_memory() -> u64 {
    fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}

fn create_dir(dir: &Path) -> io::Result<()> {
    match fs::create_dir(dir) {
        Err(err) if err.kind() != ErrorKind::AlreadyExists => Err(io::Error::new(
            err.kind(),
            format!("mkdir {}: {err}", dir.display()),
        )),
        _ => Ok(()),
    }
}

/// Turns on the cpuset, cpu, memory and pids controllers for `dir`'s children (v2), those the
/// kernel offers.
fn enable_controllers(dir: &Path) -> io::Result<()> {
    let available = fs::read_to_string(dir.join("cgroup.controllers"))?;
    let enabled = fs::read_to_string(dir.join("cgroup.subtree_control"))?;
    for controller in ["cpuset", "cpu", "memory", "pids"] {
        let offered = available.split_whitespace().any(|c| c == controller);
        let on = enabled.split_whitespace().any(|c| c == controller);
        if offered && !on {
            fs::write(dir.join("cgroup.subtree_control"), format!("+{controller}")).map_err(
                |err| {
                    io::Error::new(
                        err.kind(),
                        format!("enable {controller} in {}: {err}", dir.display()),
                    )
                },
            )?;
        }
    }
    Ok(())
}

/// What runc's `ensureParent` does for a new v1 cpuset: copy the parent's mems and cpus into
/// an empty one. The parent may be narrowed meanwhile (the kernel refuses a stale copy, and an
/// agent may be narrowing it): read it again until the copy is taken.
fn copy_cpuset_from_parent(dir: &Path) -> io::Result<()> {
    let parent = dir.parent().expect("a cgroup below a mount point");
    for file in ["cpuset.mems", "cpuset.cpus"] {
        let deadline = Instant::now() + SETTLE;
        loop {
            if !fs::read_to_string(dir.join(file))?.trim().is_empty() {
                break;
            }
            let value = fs::read_to_string(parent.join(file))?;
            match fs::write(dir.join(file), value.trim()) {
                Ok(()) => break,
                Err(err) if Instant::now() >= deadline => {
                    return Err(io::Error::new(
                        err.kind(),
                        format!("copy {file} into {}: {err}", dir.display()),
                    ))
                }
                Err(_) => thread::sleep(POLL),
            }
        }
    }
    Ok(())
}

/// rmdir, waiting while the cgroup is busy (its last task exiting); gone already is fine.
fn remove_dir_settled(dir: &Path) -> io::Result<()> {
    let deadline = Instant::now() + SETTLE;
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(err) if err.kind() == ErrorKind::NotFound => return Ok(()),
            Err(err) if Instant::now() >= deadline => {
                return Err(io::Error::new(
                    err.kind(),
                    format!("rmdir {}: {err}", dir.display()),
                ))
            }
            Err(_) => thread::sleep(POLL),
        }
    }
}

/// Runs a command; its stderr is the error when it fails.
pub(crate) fn run(command: &mut Command) -> io::Result<String> {
    let out = command
        .output()
        .map_err(|err| io::Error::new(err.kind(), format!("{:?}: {err}", command.get_program())))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{:?} {:?} failed ({}): {}",
            command.get_program(),
            command.get_args().collect::<Vec<_>>(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_named_and_nested_as_systemd_does() {
        let uid = "5e2c7f1a-0b3d-4c8e-9f2a-1b2c3d4e5f60";
        assert_eq!(
            pod_slice(Qos::Burstable, uid),
            "kubepods-burstable-pod5e2c7f1a_0b3d_4c8e_9f2a_1b2c3d4e5f60.slice"
        );
        assert_eq!(pod_slice(Qos::Guaranteed, "a-b"), "kubepods-poda_b.slice");
        assert_eq!(
            slice_path("kubepods-besteffort-podx.slice"),
            Path::new("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podx.slice")
        );
        assert_eq!(slice_path("kubepods.slice"), Path::new("kubepods.slice"));
    }
}
