//! Real-kernel tests on this machine's cgroup v1 cpuset hierarchy: read and write `cpuset.cpus`
//! through the agent's API, scan and classify a kubepods-like subtree, and check that the
//! kernel's refusals (a child that is not a subset, a parent shrunk under a child) come back
//! with path, value and errno. Each test builds its own uniquely named subtree and removes it
//! bottom-up whatever happens. Skipped with a printed reason without a v1 cpuset mount at
//! `/sys/fs/cgroup/cpuset` or without root.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::errno::Errno;

use cpusetd::cgroupfs::{
    detect_layout, parse_mountinfo, CgroupFs, CgroupPath, CgroupVersion, CpuSettings, FileValue,
    InterfaceFile, LayoutConfig, Quota,
};
use cpusetd::classify::{classify_scan, CgroupKind, CgroupNaming, Exclusivity};
use cpusetd::cpuset::CpuSet;
use cpusetd::logging::error_chain;

use crate::util::scanner;

const CPUSET_MOUNT: &str = "/sys/fs/cgroup/cpuset";
const POD_UID: &str = "5e1f0000-0000-4000-8000-000000000001";
const CONTAINER_ID: &str = "5e1f5e1f5e1f5e1f5e1f5e1f5e1f5e1f5e1f5e1f5e1f5e1f5e1f5e1f5e1f5e1f";

/// Why the real-kernel tests cannot run here, if they cannot.
fn skip_reason() -> Option<String> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mounted = parse_mountinfo(&mountinfo).iter().any(|m| {
        m.mount_point == Path::new(CPUSET_MOUNT)
            && m.fs_type == "cgroup"
            && m.super_options.iter().any(|o| o == "cpuset")
    });
    if !mounted {
        return Some(format!("{CPUSET_MOUNT} is not a cgroup v1 cpuset mount"));
    }
    if fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX)
        != 0
    {
        return Some("not running as root".to_string());
    }
    None
}

/// A uniquely named subtree in one or more hierarchies, removed bottom-up on drop.
struct Subtree {
    name: String,
    tops: Vec<PathBuf>,
}

impl Subtree {
    fn new(mounts: &[&Path]) -> Subtree {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "cpusetd-test-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let mut tops = Vec::new();
        let mut seen = Vec::new();
        for mount in mounts {
            if seen.contains(mount) {
                continue;
            }
            seen.push(*mount);
            tops.push(mount.join(&name));
        }
        Subtree { name, tops }
    }

    /// Creates `rel` (relative to the subtree) in every hierarchy.
    fn create(&self, rel: &str) {
        for top in &self.tops {
            fs::create_dir_all(top.join(rel)).unwrap();
        }
    }
}

impl Drop for Subtree {
    fn drop(&mut self) {
        for top in &self.tops {
            let mut dirs = Vec::new();
            collect_dirs(top, &mut dirs);
            dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
            for dir in dirs {
                if let Err(err) = fs::remove_dir(&dir) {
                    eprintln!("cleanup: cannot remove {}: {err}", dir.display());
                }
            }
        }
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    if !dir.is_dir() {
        return;
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&entry.path(), out);
            }
        }
    }
    out.push(dir.to_path_buf());
}

fn path(text: &str) -> CgroupPath {
    CgroupPath::new(text).unwrap()
}

/// Issue 23 item 5 on the real v1 kernel: with the host confined for a load-balancing pod, a
/// service cgroup made meanwhile gets its parent's narrowed cpus (as runc, libvirt and systemd
/// copy them); when the pod goes, it is widened with its parent. The subtree stands in for the
/// hierarchy (its top for the root; the machine's root keeps balancing).
#[test]
fn real_host_cgroups_made_during_confinement_are_widened_with_their_parents() {
    use cpusetd::sched_balance::{SchedBalance, SchedSaved};
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let root = Path::new(CPUSET_MOUNT);
    let all = fs::read_to_string(root.join("cpuset.cpus")).unwrap();
    let all = CpuSet::parse(all.trim()).unwrap();
    if all.len() < 2 {
        println!("skipped: fewer than 2 cpus");
        return;
    }
    let first = all.iter().next().unwrap();
    let last = all.iter().last().unwrap();
    let mems = fs::read_to_string(root.join("cpuset.mems")).unwrap();
    let tree = Subtree::new(&[root]);
    let top = root.join(&tree.name);
    let set_up = |rel: &str, cpus: &str| {
        tree.create(rel);
        let dir = top.join(rel);
        fs::write(dir.join("cpuset.mems"), mems.trim()).unwrap();
        fs::write(dir.join("cpuset.cpus"), cpus).unwrap();
    };
    set_up("", &all.to_string());
    for rel in ["kp", "system.slice", "system.slice/old.service"] {
        set_up(rel, &all.to_string());
    }
    set_up("kp/c", &last.to_string());
    let fs_top = CgroupFs::open(&top).unwrap();
    let reserved = CpuSet::parse(&first.to_string()).unwrap();
    let mut sched = SchedBalance::new(
        fs_top.clone(),
        CgroupVersion::V1,
        path("kp"),
        Some(reserved.clone()),
        SchedSaved::default(),
    );
    let wanted = [(path("kp/c"), CpuSet::parse(&last.to_string()).unwrap())];
    let outcome = sched.apply(&wanted);
    assert!(outcome.errors.is_empty(), "{outcome:?}");
    let cpus = |rel: &str| {
        fs::read_to_string(top.join(rel).join("cpuset.cpus"))
            .unwrap()
            .trim()
            .to_string()
    };
    assert_eq!(cpus("system.slice"), reserved.to_string());
    assert_eq!(cpus("system.slice/old.service"), reserved.to_string());
    // A service started meanwhile: its maker copies the parent's cpus, as runc does.
    set_up("system.slice/new.service", &cpus("system.slice"));
    set_up("system.slice/new.service/payload", &cpus("system.slice"));
    let outcome = sched.apply(&[]);
    assert!(outcome.errors.is_empty(), "{outcome:?}");
    for rel in [
        "system.slice",
        "system.slice/old.service",
        "system.slice/new.service",
        "system.slice/new.service/payload",
    ] {
        assert_eq!(cpus(rel), all.to_string(), "{rel}");
    }
    let flag = fs::read_to_string(top.join("cpuset.sched_load_balance")).unwrap();
    assert_eq!(flag.trim(), "1");
    assert!(sched.saved().is_empty(), "{:?}", sched.saved());
}

#[test]
fn real_cpuset_reads_writes_and_kernel_refusals() {
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let layout_probe = detect_layout(&LayoutConfig {
        proc_root: PathBuf::from("/proc"),
        cgroup_root: None,
        driver: None,
        kubepods: Some(path("kubepods")),
    })
    .unwrap();
    assert_eq!(layout_probe.version, CgroupVersion::V1);
    let tree = Subtree::new(&[&layout_probe.cpuset_root, &layout_probe.cpu_root]);
    let pod = format!("kubepods/pod{POD_UID}");
    let container = format!("{pod}/{CONTAINER_ID}");
    tree.create("");
    // Children must start with empty cpusets even where the mount clones them by default.
    fs::write(
        layout_probe
            .cpuset_root
            .join(&tree.name)
            .join("cgroup.clone_children"),
        "0",
    )
    .unwrap();
    tree.create(&container);

    let layout = detect_layout(&LayoutConfig {
        proc_root: PathBuf::from("/proc"),
        cgroup_root: None,
        driver: None,
        kubepods: Some(path(&format!("{}/kubepods", tree.name))),
    })
    .unwrap();
    let cpuset = CgroupFs::open(&layout.cpuset_root).unwrap();
    let cpu = CgroupFs::open(&layout.cpu_root).unwrap();
    let all_cpus = cpuset
        .read(&CgroupPath::root(), InterfaceFile::CpusetCpus)
        .unwrap();
    let all_mems = cpuset
        .read(&CgroupPath::root(), InterfaceFile::CpusetMems)
        .unwrap();
    let cpus = CpuSet::parse(&all_cpus).unwrap();

    // Fresh v1 cpusets start empty; initialise the levels down to the pod.
    let top = path(&tree.name);
    let kubepods = top.join("kubepods".as_ref()).unwrap();
    let pod_cg = path(&format!("{}/{pod}", tree.name));
    let container_cg = path(&format!("{}/{container}", tree.name));
    assert_eq!(
        cpuset.read(&kubepods, InterfaceFile::CpusetCpus).unwrap(),
        ""
    );
    for cg in [&top, &kubepods, &pod_cg] {
        cpuset
            .write(cg, InterfaceFile::CpusetCpus, &all_cpus)
            .unwrap();
        cpuset
            .write(cg, InterfaceFile::CpusetMems, &all_mems)
            .unwrap();
        assert_eq!(
            cpuset.read(cg, InterfaceFile::CpusetCpus).unwrap(),
            all_cpus
        );
    }
    cpu.write(&container_cg, InterfaceFile::CpuShares, "2048")
        .unwrap();
    cpu.write(&container_cg, InterfaceFile::CpuCfsQuotaUs, "200000")
        .unwrap();

    // The scan sees the container as not yet initialised, and the classifier as Guaranteed
    // with 2 CPUs, from the real cpu controller.
    let scan = scanner(&layout).scan().unwrap();
    assert_eq!(scan.cgroups.len(), 3);
    let scanned = scan
        .cgroups
        .iter()
        .find(|c| c.path == container_cg)
        .unwrap();
    assert_eq!(scanned.cpus.value().map(CpuSet::is_empty), Some(true));
    assert_eq!(scanned.cpus.configured(), None);
    assert_eq!(
        scanned.cpu,
        CpuSettings::V1 {
            shares: FileValue::Value(2048),
            cfs_quota: FileValue::Value(Quota::Micros(200_000)),
            cfs_period_us: FileValue::Value(100_000),
        }
    );
    let naming = CgroupNaming::new(layout.driver, &layout.kubepods);
    let classes = classify_scan(&naming, &scan, |_| None);
    let at = scan
        .cgroups
        .iter()
        .position(|c| c.path == container_cg)
        .unwrap();
    assert_eq!(classes[at].kind, CgroupKind::Container);
    assert_eq!(classes[at].exclusivity, Exclusivity::Exclusive { cpus: 2 });

    let (Some(first), Some(last)) = (cpus.first(), cpus.last()) else {
        panic!("no cpus in {all_cpus:?}");
    };
    if first == last {
        println!("skipped the refusal checks: only one cpu ({all_cpus})");
        return;
    }
    let (first, last) = (first.to_string(), last.to_string());
    cpuset
        .write(&container_cg, InterfaceFile::CpusetMems, &all_mems)
        .unwrap();
    cpuset
        .write(&container_cg, InterfaceFile::CpusetCpus, &last)
        .unwrap();
    assert_eq!(
        cpuset
            .read(&container_cg, InterfaceFile::CpusetCpus)
            .unwrap(),
        last
    );

    // Shrinking the pod under its container: the kernel says EBUSY.
    let err = cpuset
        .write(&pod_cg, InterfaceFile::CpusetCpus, &first)
        .unwrap_err();
    assert_eq!(
        err.errno(),
        Some(Errno::EBUSY as i32),
        "{}",
        error_chain(&err)
    );
    let shown = error_chain(&err);
    assert!(
        shown.contains(&format!("cannot write {first:?} to ")),
        "{shown}"
    );
    assert!(shown.contains(&format!("{pod}/cpuset.cpus")), "{shown}");
    assert!(shown.contains("busy"), "{shown}");
    println!("kernel refused as expected: {shown}");
    assert_eq!(
        cpuset.read(&pod_cg, InterfaceFile::CpusetCpus).unwrap(),
        all_cpus
    );

    // Narrow bottom-up, then a container outside its pod's set is refused.
    cpuset
        .write(&container_cg, InterfaceFile::CpusetCpus, &first)
        .unwrap();
    cpuset
        .write(&pod_cg, InterfaceFile::CpusetCpus, &first)
        .unwrap();
    let err = cpuset
        .write(&container_cg, InterfaceFile::CpusetCpus, &last)
        .unwrap_err();
    let errno = err.errno();
    assert!(
        errno == Some(Errno::EACCES as i32) || errno == Some(Errno::EINVAL as i32),
        "{}",
        error_chain(&err)
    );
    assert!(!err.is_gone());
    let shown = error_chain(&err);
    assert!(
        shown.contains(&format!("cannot write {last:?} to ")),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("{container}/cpuset.cpus")),
        "{shown}"
    );
    println!("kernel refused as expected: {shown}");
    assert_eq!(
        cpuset
            .read(&container_cg, InterfaceFile::CpusetCpus)
            .unwrap(),
        first
    );

    // Writing to a cgroup that is gone is distinguishable.
    let gone = pod_cg.join("not-there".as_ref()).unwrap();
    let err = cpuset
        .write(&gone, InterfaceFile::CpusetCpus, &first)
        .unwrap_err();
    assert!(err.is_gone(), "{}", error_chain(&err));
}

#[test]
fn real_interface_files_cannot_be_created() {
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let root = Path::new(CPUSET_MOUNT);
    let tree = Subtree::new(&[root]);
    tree.create("x");
    let cpuset = CgroupFs::open(root).unwrap();
    // `cpu.shares` does not exist in the cpuset hierarchy; a write must not create it.
    let err = cpuset
        .write(
            &path(&format!("{}/x", tree.name)),
            InterfaceFile::CpuShares,
            "2",
        )
        .unwrap_err();
    assert!(err.is_gone(), "{}", error_chain(&err));
    assert!(!root.join(&tree.name).join("x/cpu.shares").exists());
}

/// Issue 23, item 2: the kernel narrows a v1 cpuset past an empty child (one never set up:
/// `cgroup.clone_children` off), while a child holding the CPUs refuses it (EBUSY). The writer
/// relies on the first to narrow a container past an empty child it cannot write.
#[test]
fn real_kernel_narrows_a_parent_past_an_empty_child() {
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let mount = Path::new(CPUSET_MOUNT);
    let cpuset = CgroupFs::open(mount).unwrap();
    let all_cpus = cpuset
        .read(&CgroupPath::root(), InterfaceFile::CpusetCpus)
        .unwrap();
    let all_mems = cpuset
        .read(&CgroupPath::root(), InterfaceFile::CpusetMems)
        .unwrap();
    let cpus = CpuSet::parse(&all_cpus).unwrap();
    if cpus.len() < 2 {
        println!("skipped: one cpu only");
        return;
    }
    let tree = Subtree::new(&[mount]);
    tree.create("");
    fs::write(mount.join(&tree.name).join("cgroup.clone_children"), "0").unwrap();
    tree.create("parent/empty");
    let top = path(&tree.name);
    let parent = path(&format!("{}/parent", tree.name));
    let empty = path(&format!("{}/parent/empty", tree.name));
    for cg in [&top, &parent] {
        cpuset
            .write(cg, InterfaceFile::CpusetCpus, &all_cpus)
            .unwrap();
        cpuset
            .write(cg, InterfaceFile::CpusetMems, &all_mems)
            .unwrap();
    }
    assert_eq!(cpuset.read(&empty, InterfaceFile::CpusetCpus).unwrap(), "");
    let first = cpus.iter().next().unwrap().to_string();
    cpuset
        .write(&parent, InterfaceFile::CpusetCpus, &first)
        .unwrap();
    assert_eq!(
        cpuset.read(&parent, InterfaceFile::CpusetCpus).unwrap(),
        first
    );
    assert_eq!(cpuset.read(&empty, InterfaceFile::CpusetCpus).unwrap(), "");
    // A child that holds the cpus keeps its parent wide.
    cpuset
        .write(&parent, InterfaceFile::CpusetCpus, &all_cpus)
        .unwrap();
    cpuset
        .write(&empty, InterfaceFile::CpusetMems, &all_mems)
        .unwrap();
    cpuset
        .write(&empty, InterfaceFile::CpusetCpus, &all_cpus)
        .unwrap();
    let refused = cpuset
        .write(&parent, InterfaceFile::CpusetCpus, &first)
        .unwrap_err();
    assert_eq!(
        refused.errno(),
        Some(Errno::EBUSY as i32),
        "{}",
        error_chain(&refused)
    );
}

/// runc's mkdir-then-write on the real v1 cpu controller (issue 23, item 22): a cgroup just
/// made reads the kernel's default `cpu.shares` (1024) until the runtime writes the config's
/// value. Classified in between, with the config (shares 2), it is settling: no
/// `runtime config and cgroup disagree` notice; after the write the two agree.
#[test]
fn real_new_cgroup_settles_without_a_disagreement() {
    use cpusetd::classify::{holds_kernel_default, Notice, KERNEL_DEFAULT_SHARES};
    use cpusetd::runtime::parse_config;
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let probe = detect_layout(&LayoutConfig {
        proc_root: PathBuf::from("/proc"),
        cgroup_root: None,
        driver: None,
        kubepods: Some(path("kubepods")),
    })
    .unwrap();
    let tree = Subtree::new(&[&probe.cpuset_root, &probe.cpu_root]);
    let container = format!("kubepods/besteffort/pod{POD_UID}/{CONTAINER_ID}");
    // runc's mkdir.
    tree.create(&container);
    let layout = detect_layout(&LayoutConfig {
        proc_root: PathBuf::from("/proc"),
        cgroup_root: None,
        driver: None,
        kubepods: Some(path(&format!("{}/kubepods", tree.name))),
    })
    .unwrap();
    let config = parse_config(
        br#"{"annotations": {"io.kubernetes.cri.container-type": "container",
                             "io.kubernetes.cri.container-name": "app"},
             "linux": {"resources": {"cpu": {"shares": 2}}}}"#,
    )
    .unwrap();
    let naming = CgroupNaming::new(layout.driver, &layout.kubepods);
    let classify_container = || {
        let scan = scanner(&layout).scan().unwrap();
        let classes = classify_scan(&naming, &scan, |_| Some(config.clone()));
        let at = scan
            .cgroups
            .iter()
            .position(|c| c.path.to_string().ends_with(CONTAINER_ID))
            .unwrap();
        (scan.cgroups[at].cpu.clone(), classes[at].clone())
    };
    let (settings, class) = classify_container();
    assert!(
        matches!(&settings, CpuSettings::V1 { shares: FileValue::Value(s), .. } if *s == KERNEL_DEFAULT_SHARES),
        "a new cgroup's cpu.shares: {settings:?}"
    );
    assert!(holds_kernel_default(&settings));
    assert!(
        !class
            .notices
            .iter()
            .any(|n| matches!(n, Notice::RuntimeConfigDisagrees { .. })),
        "{:?}",
        class.notices
    );
    // The runtime writes the config's value.
    let cpu = CgroupFs::open(&layout.cpu_root).unwrap();
    let container_cg = path(&format!("{}/{container}", tree.name));
    cpu.write(&container_cg, InterfaceFile::CpuShares, "2")
        .unwrap();
    let (settings, class) = classify_container();
    assert!(!holds_kernel_default(&settings));
    assert!(class.notices.is_empty(), "{:?}", class.notices);
}

/// Unmounts a bind mount on drop, before the subtree under it is removed.
struct BindMount(PathBuf);

impl BindMount {
    fn over(source: &Path, target: &Path) -> Option<BindMount> {
        let mounted = std::process::Command::new("mount")
            .arg("--bind")
            .arg(source)
            .arg(target)
            .status()
            .is_ok_and(|s| s.success());
        mounted.then(|| BindMount(target.to_path_buf()))
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let unmounted = std::process::Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
}

/// On kernfs the one-call open of an interface file is not followed by an `fstat` (see
/// `CgroupFs::open_file_at_once`, DECISIONS "Fewer system calls per cgroup write"): a file
/// bind-mounted over a real cgroup's `cpuset.cpus` is still never read nor written, by any of
/// the agent's reads (the scan's, the echo's, the walk's) or its write.
#[test]
fn real_a_bind_mount_over_an_interface_file_is_never_crossed() {
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let root = Path::new(CPUSET_MOUNT);
    let tree = Subtree::new(&[root]);
    tree.create("x");
    let outside = tempfile::tempdir().unwrap();
    let decoy = outside.path().join("cpuset.cpus");
    fs::write(&decoy, "0\n").unwrap();
    let target = root.join(&tree.name).join("x/cpuset.cpus");
    let Some(_mount) = BindMount::over(&decoy, &target) else {
        println!("skipped: cannot bind-mount over {}", target.display());
        return;
    };
    let cpuset = CgroupFs::open(root).unwrap();
    let x = path(&format!("{}/x", tree.name));
    for read in [
        cpuset.read(&x, InterfaceFile::CpusetCpus),
        cpuset.read_file(&x, InterfaceFile::CpusetCpus),
    ] {
        let err = read.expect_err("read across a mount");
        assert!(error_chain(&err).contains("mounted"), "{err:?}");
    }
    let err = cpuset
        .write(&x, InterfaceFile::CpusetCpus, "0-1")
        .expect_err("wrote across a mount");
    assert!(!err.is_gone(), "{err:?}");
    let hierarchy = cpusetd::cgroupfs::Hierarchy {
        version: CgroupVersion::V1,
        cpuset: cpuset.clone(),
        cpu: cpuset.clone(),
    };
    let scan = cpusetd::cgroupfs::Scanner::new(hierarchy, path(&tree.name))
        .scan()
        .unwrap();
    let scanned = scan.cgroups.iter().find(|c| c.path == x).unwrap();
    assert!(
        matches!(scanned.cpus, FileValue::Unreadable { .. }),
        "{:?}",
        scanned.cpus
    );
    assert_eq!(fs::read_to_string(&decoy).unwrap(), "0\n");
}

/// A child cgroup named like an interface file its hierarchy lacks (`cpu.max` in the v1
/// cpuset hierarchy) is a directory where a file is expected: on kernfs, without an `fstat`,
/// the one-call read and write still refuse it (EISDIR) and name it.
#[test]
fn real_a_cgroup_named_like_an_interface_file_is_refused() {
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let root = Path::new(CPUSET_MOUNT);
    let tree = Subtree::new(&[root]);
    tree.create("x/cpu.max");
    let cpuset = CgroupFs::open(root).unwrap();
    let x = path(&format!("{}/x", tree.name));
    let refused_directory = |err: &cpusetd::cgroupfs::CgroupError| {
        matches!(
            err,
            cpusetd::cgroupfs::CgroupError::Refused {
                reason: cpusetd::cgroupfs::Refusal::NotRegularFile {
                    kind: cpusetd::cgroupfs::FileKind::Directory
                },
                ..
            }
        )
    };
    for read in [
        cpuset.read(&x, InterfaceFile::CpuMax),
        cpuset.read_file(&x, InterfaceFile::CpuMax),
    ] {
        let err = read.expect_err("read a directory");
        assert!(refused_directory(&err), "{err:?}");
    }
    let err = cpuset
        .write(&x, InterfaceFile::CpuMax, "max")
        .expect_err("wrote a directory");
    assert!(refused_directory(&err), "{err:?}");
    assert!(root.join(&tree.name).join("x/cpu.max").is_dir());
}
