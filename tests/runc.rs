//! Real containers for the end-to-end tests: an [`E2eTree`] names one unique cgroup subtree
//! (`cpusetd-e2e-<pid>-<n>`) and removes it bottom-up from every cgroup mount on drop; a
//! [`Runc`] starts busybox containers with `runc` whose cgroups live in that subtree, the way
//! kubelet's cgroupfs driver lays them out (`<tree>/kubepods/[<qos>/]pod<uid>/<id>`), and kills
//! and deletes them on drop, even when a test panics. runc keeps its state in a temporary
//! directory (`--root`), never in the host's.
//!
//! Tests call [`kernel_skip_reason`] or [`runc_skip_reason`] first and return with the reason
//! printed where this machine cannot run them: not root, no cgroup v1 cpuset mount at
//! `/sys/fs/cgroup/cpuset`, fewer than two online CPUs, no `runc`, no static busybox.
//! `scripts/ci-deps.sh` installs `runc` and `busybox-static` on Debian.

use std::fs::{self, File};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use serde_json::json;

use cpusetd::cgroupfs::parse_mountinfo;
use cpusetd::cpuset::CpuSet;

const CPUSET_MOUNT: &str = "/sys/fs/cgroup/cpuset";
const BUSYBOX: &str = "/bin/busybox";
/// The applets a container may run, as symlinks to busybox in its rootfs.
const APPLETS: &[&str] = &["sh", "sleep", "cat", "grep"];
/// How long anything asynchronous may take before a test gives up.
const DEADLINE: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(10);

/// Why the real-kernel tests cannot run here, if they cannot.
pub fn kernel_skip_reason() -> Option<String> {
    if fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid()) != 0 {
        return Some("not running as root".to_string());
    }
    let is_v1_cpuset = cgroup_mounts().iter().any(|m| {
        m.mount_point == Path::new(CPUSET_MOUNT)
            && m.fs_type == "cgroup"
            && m.super_options.iter().any(|o| o == "cpuset")
    });
    if !is_v1_cpuset {
        return Some(format!("{CPUSET_MOUNT} is not a cgroup v1 cpuset mount"));
    }
    if controller_mount("cpu").is_none() {
        return Some("no cgroup v1 cpu controller mount".to_string());
    }
    let online = online_cpus();
    if online.len() < 2 {
        return Some(format!(
            "fewer than 2 online cpus ({:?})",
            online.to_string()
        ));
    }
    None
}

/// Why the real-container tests cannot run here, if they cannot.
pub fn runc_skip_reason() -> Option<String> {
    if let Some(reason) = kernel_skip_reason() {
        return Some(reason);
    }
    match Command::new("runc").arg("--version").output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => return Some(format!("`runc --version` failed: {}", out.status)),
        Err(err) => return Some(format!("no runc ({err}): run scripts/ci-deps.sh")),
    }
    match is_static_elf(Path::new(BUSYBOX)) {
        Ok(true) => None,
        Ok(false) => Some(format!(
            "{BUSYBOX} is linked dynamically: install busybox-static"
        )),
        Err(err) => Some(format!("no {BUSYBOX} ({err}): run scripts/ci-deps.sh")),
    }
}

/// The online CPUs of this machine.
pub fn online_cpus() -> CpuSet {
    let text = fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    CpuSet::parse(&text).unwrap_or_default()
}

/// Every cgroup mount (v1 hierarchies and the v2 tree, hybrid or not), from mountinfo.
fn cgroup_mounts() -> Vec<cpusetd::cgroupfs::MountEntry> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    parse_mountinfo(&text)
        .into_iter()
        .filter(|m| m.fs_type == "cgroup" || m.fs_type == "cgroup2")
        .collect()
}

/// The mount point of the v1 hierarchy holding `controller` (`cpu` may share it with
/// `cpuacct`: `/sys/fs/cgroup/cpu,cpuacct`).
pub fn controller_mount(controller: &str) -> Option<PathBuf> {
    cgroup_mounts()
        .into_iter()
        .find(|m| m.fs_type == "cgroup" && m.super_options.iter().any(|o| o == controller))
        .map(|m| m.mount_point)
}

/// Whether an ELF file has no program interpreter (so it runs in an empty rootfs).
fn is_static_elf(path: &Path) -> std::io::Result<bool> {
    let mut bytes = Vec::new();
    File::open(path)?.read_to_end(&mut bytes)?;
    let invalid = || std::io::Error::new(ErrorKind::InvalidData, "not a 64-bit ELF file");
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 {
        return Err(invalid());
    }
    let little = bytes[5] == 1;
    let int = |at: usize, len: usize| -> Option<u64> {
        let field = bytes.get(at..at + len)?;
        let mut value = 0u64;
        for i in 0..len {
            let byte = if little { field[len - 1 - i] } else { field[i] };
            value = value << 8 | u64::from(byte);
        }
        Some(value)
    };
    const PT_INTERP: u64 = 3;
    let (Some(phoff), Some(phentsize), Some(phnum)) = (int(0x20, 8), int(0x36, 2), int(0x38, 2))
    else {
        return Err(invalid());
    };
    for i in 0..phnum {
        let at = usize::try_from(phoff + i * phentsize).map_err(|_| invalid())?;
        if int(at, 4).ok_or_else(invalid)? == PT_INTERP {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Polls `probe` every 10 ms until it returns `Some`, for at most 5 s; `None` on timeout.
pub fn poll<T>(mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(POLL);
    }
}

static UNIQUE: AtomicUsize = AtomicUsize::new(0);

fn unique() -> usize {
    UNIQUE.fetch_add(1, Ordering::SeqCst)
}

/// A pod UID unique to this test process.
pub fn pod_uid() -> String {
    format!(
        "{:08x}-e2e0-4000-8000-{:012x}",
        std::process::id(),
        unique()
    )
}

/// A 64-hex container id unique to this test process, like containerd's and CRI-O's.
pub fn container_id() -> String {
    format!("{:08x}{:08x}", std::process::id(), unique()).repeat(4)
}

/// One uniquely named cgroup subtree, `cpusetd-e2e-<pid>-<n>`, at the top of every cgroup
/// mount. Dropping it removes whatever exists of it, bottom-up, in every mount.
#[derive(Debug)]
pub struct E2eTree {
    name: String,
}

impl E2eTree {
    pub fn new() -> E2eTree {
        E2eTree {
            name: format!("cpusetd-e2e-{}-{}", std::process::id(), unique()),
        }
    }

    /// The subtree's name, a cgroup path relative to each mount.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The kubepods root inside the subtree, relative to each mount: `--kubepods-path`.
    pub fn kubepods(&self) -> String {
        format!("{}/kubepods", self.name)
    }

    /// The directory of `rel` (relative to the kubepods root) in `controller`'s hierarchy.
    pub fn dir(&self, controller: &str, rel: &str) -> PathBuf {
        let mount = controller_mount(controller)
            .unwrap_or_else(|| panic!("no cgroup v1 mount with the {controller} controller"));
        let dir = mount.join(self.kubepods());
        if rel.is_empty() {
            dir
        } else {
            dir.join(rel)
        }
    }

    /// Removes the cgroup `rel` (relative to the kubepods root, childless) from every mount, as
    /// kubelet removes a pod's cgroup once its containers are gone.
    pub fn remove(&self, rel: &str) {
        for mount in cgroup_mounts() {
            let dir = mount.mount_point.join(self.kubepods()).join(rel);
            if dir.exists() {
                remove_cgroup(&dir);
            }
        }
    }

    /// Where the subtree exists now: its top directory in each cgroup mount.
    pub fn existing_tops(&self) -> Vec<PathBuf> {
        cgroup_mounts()
            .into_iter()
            .map(|m| m.mount_point.join(&self.name))
            .filter(|top| top.exists())
            .collect()
    }
}

impl Drop for E2eTree {
    fn drop(&mut self) {
        for top in self.existing_tops() {
            let mut dirs = Vec::new();
            collect_dirs(&top, &mut dirs);
            dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
            for dir in dirs {
                remove_cgroup(&dir);
            }
        }
    }
}

/// Removes one (childless) cgroup directory. A cgroup whose last task is still exiting is
/// busy for a moment; one still holding tasks (a container runc failed to kill, always one
/// of ours: the subtree's name is unique) gets them killed first.
fn remove_cgroup(dir: &Path) {
    let mut killed = false;
    let removed = poll(|| match fs::remove_dir(dir) {
        Ok(()) => Some(Ok(())),
        Err(err) if err.kind() == ErrorKind::NotFound => Some(Ok(())),
        Err(err) if err.raw_os_error() == Some(Errno::EBUSY as i32) => {
            if !killed {
                killed = true;
                kill_tasks(dir);
            }
            None
        }
        Err(err) => Some(Err(err)),
    });
    match removed {
        Some(Ok(())) => {}
        Some(Err(err)) => eprintln!("cleanup: cannot remove {}: {err}", dir.display()),
        None => eprintln!("cleanup: {} still busy after {DEADLINE:?}", dir.display()),
    }
}

fn kill_tasks(dir: &Path) {
    let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    for pid in procs.split_whitespace() {
        eprintln!("cleanup: killing pid {pid} left in {}", dir.display());
        let _ = Command::new("kill").args(["-KILL", pid]).status();
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&entry.path(), out);
            }
        }
    }
    out.push(dir.to_path_buf());
}

/// The CPU settings of a container (`linux.resources.cpu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuResources {
    pub shares: u64,
    /// CFS quota and period in µs; `None` leaves the kernel's default (no quota).
    pub quota: Option<(i64, u64)>,
}

impl CpuResources {
    /// What kubelet sets for a container requesting and limited to `cpus` whole CPUs.
    pub fn guaranteed(cpus: u64) -> CpuResources {
        let period = 100_000;
        CpuResources {
            shares: cpus * 1024,
            quota: Some((i64::try_from(cpus * period).unwrap(), period)),
        }
    }

    /// What kubelet sets for a BestEffort container.
    pub fn best_effort() -> CpuResources {
        CpuResources {
            shares: 2,
            quota: None,
        }
    }
}

/// A running container.
#[derive(Debug, Clone)]
pub struct Container {
    pub id: String,
    /// Its init process (busybox `sleep`), in the host's pid namespace.
    pub pid: u32,
    /// Its cgroup relative to the kubepods root: `[<qos>/]pod<uid>/<id>`.
    pub cgroup: String,
}

impl Container {
    /// `Cpus_allowed_list` of its process, from `/proc/<pid>/status`.
    pub fn cpus_allowed(&self) -> CpuSet {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid))
            .unwrap_or_else(|err| panic!("container {} pid {}: {err}", self.id, self.pid));
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap_or_else(|| panic!("no Cpus_allowed_list in /proc/{}/status", self.pid));
        CpuSet::parse(line).unwrap()
    }

    /// Waits (5 s at most) until its process may run on `expected` only; returns what it may
    /// run on at the end, for the assertion.
    pub fn wait_cpus_allowed(&self, expected: &CpuSet) -> CpuSet {
        poll(|| Some(self.cpus_allowed()).filter(|cpus| cpus == expected))
            .unwrap_or_else(|| self.cpus_allowed())
    }
}

/// Busybox containers started with runc under one [`E2eTree`]. Dropping it kills and deletes
/// every container, then the tree's cgroups, then the bundles and runc's state.
#[derive(Debug)]
pub struct Runc {
    containers: Vec<String>,
    // Dropped in this order, after `drop` has removed the containers.
    tree: E2eTree,
    dir: tempfile::TempDir,
}

impl Runc {
    /// A fresh tree and runc state directory. Call [`runc_skip_reason`] first.
    pub fn new() -> Runc {
        let dir = tempfile::Builder::new()
            .prefix("cpusetd-e2e-")
            .tempdir()
            .unwrap();
        fs::create_dir(dir.path().join("state")).unwrap();
        Runc {
            containers: Vec::new(),
            tree: E2eTree::new(),
            dir,
        }
    }

    pub fn tree(&self) -> &E2eTree {
        &self.tree
    }

    /// A scratch directory that lives as long as this.
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }

    /// `runc` with this harness's state directory.
    pub fn runc(&self) -> Command {
        let mut command = Command::new("runc");
        command.arg("--root").arg(self.dir.path().join("state"));
        command
    }

    /// Writes the bundle of a new container running `args` in cgroup `<pod_dir>/<id>` and
    /// registers it for deletion on drop; returns its id and bundle directory. For callers
    /// that drive `runc create` / `runc start` themselves (`benches/runc_start.rs`).
    #[allow(dead_code)]
    pub fn bundle(&mut self, pod_dir: &str, cpu: CpuResources, args: &[&str]) -> (String, PathBuf) {
        let id = container_id();
        let bundle = self.dir.path().join(&id);
        make_rootfs(&bundle.join("rootfs"));
        let config = oci_config(
            args,
            &format!("/{}/{pod_dir}/{id}", self.tree.kubepods()),
            cpu,
        );
        fs::write(
            bundle.join("config.json"),
            serde_json::to_vec_pretty(&config).unwrap(),
        )
        .unwrap();
        self.containers.push(id.clone());
        (id, bundle)
    }

    /// Deletes a container made with [`Runc::bundle`] now (killed first if still running).
    #[allow(dead_code)]
    pub fn delete_by_id(&mut self, id: &str) {
        let _ = self
            .runc()
            .args(["delete", "--force", id])
            .stderr(Stdio::null())
            .status();
        self.containers.retain(|c| c != id);
        let _ = fs::remove_dir_all(self.dir.path().join(id));
    }

    /// Starts `sleep 1000` in a new container whose cgroup is `<pod_dir>/<id>` under the
    /// kubepods root (`pod_dir`: `pod<uid>`, `burstable/pod<uid>`, `besteffort/pod<uid>`),
    /// with `cpu` as its CPU settings, and waits until it runs.
    pub fn start(&mut self, pod_dir: &str, cpu: CpuResources) -> Container {
        let id = container_id();
        let cgroup = format!("{pod_dir}/{id}");
        let bundle = self.dir.path().join(&id);
        make_rootfs(&bundle.join("rootfs"));
        let config = oci_config(
            &["sleep", "1000"],
            &format!("/{}/{cgroup}", self.tree.kubepods()),
            cpu,
        );
        fs::write(
            bundle.join("config.json"),
            serde_json::to_vec_pretty(&config).unwrap(),
        )
        .unwrap();

        // Registered first, so a half-created container is deleted too.
        self.containers.push(id.clone());
        // The container inherits runc's stdio (`-d`): files, never pipes, or output() would
        // wait for the container to exit.
        let log = bundle.join("runc.log");
        let status = self
            .runc()
            .args(["run", "--detach", "--bundle"])
            .arg(&bundle)
            .arg(&id)
            .stdin(Stdio::null())
            .stdout(File::create(bundle.join("stdout")).unwrap())
            .stderr(File::create(&log).unwrap())
            .status()
            .expect("run runc");
        assert!(
            status.success(),
            "runc run {id}: {status}: {}",
            fs::read_to_string(&log).unwrap_or_default()
        );
        let pid = self.pid(&id);
        // `runc run` returns once the container was started; wait for busybox to be sleeping.
        poll(|| {
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            (comm.trim() == "sleep").then_some(())
        })
        .unwrap_or_else(|| panic!("container {id} (pid {pid}) did not exec sleep"));
        Container { id, pid, cgroup }
    }

    /// Kills and deletes one container; runc removes its cgroups.
    pub fn delete(&mut self, container: &Container) {
        self.kill_and_delete(&container.id);
        self.containers.retain(|id| *id != container.id);
    }

    fn kill_and_delete(&self, id: &str) {
        let _ = self
            .runc()
            .args(["kill", id, "KILL"])
            .stderr(Stdio::null())
            .status();
        match self.runc().args(["delete", "--force", id]).output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "cleanup: runc delete {id}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(err) => eprintln!("cleanup: runc delete {id}: {err}"),
        }
    }

    /// The host pid of a container's init, from `runc state`.
    fn pid(&self, id: &str) -> u32 {
        let out = self.runc().args(["state", id]).output().expect("run runc");
        assert!(
            out.status.success(),
            "runc state {id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let state: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(state["status"], "running", "runc state {id}: {state}");
        let pid = state["pid"].as_u64().filter(|&pid| pid > 0);
        u32::try_from(pid.unwrap_or_else(|| panic!("runc state {id}: no pid: {state}"))).unwrap()
    }
}

impl Drop for Runc {
    fn drop(&mut self) {
        for id in std::mem::take(&mut self.containers).into_iter().rev() {
            self.kill_and_delete(&id);
        }
    }
}

/// A read-only rootfs holding busybox and its applet links.
fn make_rootfs(rootfs: &Path) {
    let bin = rootfs.join("bin");
    fs::create_dir_all(&bin).unwrap();
    for dir in ["proc", "dev", "tmp"] {
        fs::create_dir(rootfs.join(dir)).unwrap();
    }
    fs::copy(BUSYBOX, bin.join("busybox")).unwrap();
    for applet in APPLETS {
        symlink("busybox", bin.join(applet)).unwrap();
    }
}

/// A minimal OCI runtime config for runc on cgroup v1: own pid, ipc, uts and mount
/// namespaces (the host's network), no capabilities, a read-only root, and `cgroups_path`
/// absolute so runc's cgroupfs manager creates it under every controller mount.
fn oci_config(args: &[&str], cgroups_path: &str, cpu: CpuResources) -> serde_json::Value {
    let mut resources_cpu = json!({ "shares": cpu.shares });
    if let Some((quota, period)) = cpu.quota {
        resources_cpu["quota"] = json!(quota);
        resources_cpu["period"] = json!(period);
    }
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": { "uid": 0, "gid": 0 },
            "args": args,
            "env": ["PATH=/bin", "TERM=xterm"],
            "cwd": "/",
            "noNewPrivileges": true
        },
        "root": { "path": "rootfs", "readonly": true },
        "hostname": "cpusetd-e2e",
        "mounts": [
            { "destination": "/proc", "type": "proc", "source": "proc" },
            {
                "destination": "/dev",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]
            },
            {
                "destination": "/tmp",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "nodev", "mode=1777", "size=1024k"]
            }
        ],
        "linux": {
            "cgroupsPath": cgroups_path,
            "resources": {
                "devices": [{ "allow": false, "access": "rwm" }],
                "cpu": resources_cpu
            },
            "namespaces": [
                { "type": "pid" },
                { "type": "ipc" },
                { "type": "uts" },
                { "type": "mount" }
            ],
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
        }
    })
}

#[test]
fn runc_harness_container_follows_a_hand_written_cpuset() {
    if let Some(reason) = runc_skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let online = online_cpus();
    let mut runc = Runc::new();
    let pod = format!("pod{}", pod_uid());
    let container = runc.start(&pod, CpuResources::guaranteed(1));
    let name = runc.tree().name().to_string();

    // runc made the cgroup in every hierarchy, with the CPU settings asked for, and copied
    // the parent's cpuset down.
    assert_eq!(container.cpus_allowed(), online);
    let cpu = runc.tree().dir("cpu", &container.cgroup);
    let read = |file: &str| {
        fs::read_to_string(cpu.join(file))
            .unwrap()
            .trim()
            .to_string()
    };
    assert_eq!(read("cpu.shares"), "1024");
    assert_eq!(read("cpu.cfs_quota_us"), "100000");
    assert_eq!(read("cpu.cfs_period_us"), "100000");
    let cgroup_file = fs::read_to_string(format!("/proc/{}/cgroup", container.pid)).unwrap();
    assert!(
        cgroup_file.lines().any(|l| l.ends_with(&format!(
            ":cpuset:/{}/{}",
            runc.tree().kubepods(),
            container.cgroup
        ))),
        "{cgroup_file}"
    );

    // A hand-written cpuset moves the process.
    let last = CpuSet::from_iter([online.last().unwrap()]);
    let cpuset = runc.tree().dir("cpuset", &container.cgroup);
    fs::write(cpuset.join("cpuset.cpus"), last.to_string()).unwrap();
    assert_eq!(container.wait_cpus_allowed(&last), last);

    // Dropping removes the container, its cgroups in every mount and runc's state.
    let state = runc.scratch().join("state");
    assert!(!runc.tree().existing_tops().is_empty());
    drop(runc);
    assert!(!state.exists());
    assert!(poll(|| exited(container.pid).then_some(())).is_some());
    assert_eq!(left_behind(&name), Vec::<PathBuf>::new());
}

#[test]
fn runc_harness_cleans_up_after_a_panic() {
    if let Some(reason) = runc_skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let mut started = None;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut runc = Runc::new();
        let pod = format!("besteffort/pod{}", pod_uid());
        let container = runc.start(&pod, CpuResources::best_effort());
        started = Some((runc.tree().name().to_string(), container.pid));
        panic!("a failing test");
    }));
    assert!(result.is_err());
    let (name, pid) = started.unwrap();
    assert!(poll(|| exited(pid).then_some(())).is_some());
    assert_eq!(left_behind(&name), Vec::<PathBuf>::new());
}

/// Whether a process is gone or a zombie (its parent, init, has not reaped it yet).
fn exited(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // pid (comm) state ...: comm may hold spaces and parentheses, the state follows the last.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// What exists of a subtree named `name` in any cgroup mount.
fn left_behind(name: &str) -> Vec<PathBuf> {
    cgroup_mounts()
        .into_iter()
        .map(|m| m.mount_point.join(name))
        .filter(|top| top.exists())
        .collect()
}
