//! Hostile and malformed input: what a compromised or buggy container (or runtime) can plant in
//! the tree must never make the agent follow a symlink out of the root, hang, panic, or stop
//! scanning. Each case asserts the clear log line an operator would see.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use cpusetd::cgroupfs::{
    CgroupError, CgroupFs, CgroupLayout, CgroupPath, CpuSettings, FileKind, FileValue,
    InterfaceFile, Refusal, SkipReason, MAX_SCAN_DEPTH,
};
use cpusetd::classify::{CgroupKind, Exclusivity, SharedReason, UnknownReason};
use cpusetd::runtime::RuntimeLookup;

use crate::util::*;

/// A writable copy of a fixture tree (and the runtime configs) in a temporary directory.
struct Copy {
    dir: tempfile::TempDir,
    layout: CgroupLayout,
}

impl Copy {
    fn of(tree: &str) -> Copy {
        let dir = tempfile::tempdir().unwrap();
        copy_tree(&cgroup_testdata(tree), &dir.path().join("cgroup"));
        copy_tree(&cgroup_testdata("runtime"), &dir.path().join("runtime"));
        let layout = layout_of(&dir.path().join("cgroup"));
        Copy { dir, layout }
    }

    fn runtime(&self) -> std::path::PathBuf {
        self.dir.path().join("runtime")
    }

    /// The host directory of a cgroup (under the cpuset root) whose short name is `short_rel`.
    fn cgroup(&self, short_rel: &str) -> CgroupPath {
        let scan = scanner(&self.layout).scan().unwrap();
        scan.cgroups
            .iter()
            .find(|c| short(&c.relative.to_string()) == short_rel)
            .unwrap_or_else(|| panic!("no cgroup {short_rel}"))
            .path
            .clone()
    }

    fn cpuset_dir(&self, cgroup: &CgroupPath) -> std::path::PathBuf {
        cgroup.under(&self.layout.cpuset_root)
    }

    fn cpu_dir(&self, cgroup: &CgroupPath) -> std::path::PathBuf {
        cgroup.under(&self.layout.cpu_root)
    }
}

/// Runs `f` on another thread and fails the test if it does not finish in time (a FIFO hang).
fn within<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("did not finish: blocked on a planted file?")
}

#[test]
fn a_symlink_pointing_outside_is_never_followed() {
    capture_logs();
    let copy = Copy::of("v1-cgroupfs");
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("cpuset.cpus"), "0-7\n").unwrap();
    fs::write(outside.path().join("cpuset.mems"), "0\n").unwrap();
    let pod = copy.cgroup("pod<0a>");
    let app = copy.cgroup("pod<0a>/<a1>");
    let link = copy
        .cpuset_dir(&pod)
        .join(format!("{}-evil", "f".repeat(64)));
    std::os::unix::fs::symlink(outside.path(), &link).unwrap();
    // And a symlinked interface file in a container.
    let mems = copy.cpuset_dir(&app).join("cpuset.mems");
    fs::remove_file(&mems).unwrap();
    std::os::unix::fs::symlink(outside.path().join("cpuset.mems"), &mems).unwrap();

    let scan = scanner(&copy.layout).scan().unwrap();
    let evil = pod.join(link.file_name().unwrap()).unwrap();
    assert!(scan.cgroups.iter().all(|c| c.path != evil));
    assert!(scan
        .skipped
        .iter()
        .any(|s| s.path == evil && s.reason == SkipReason::Symlink));
    let scanned_app = scan.cgroups.iter().find(|c| c.path == app).unwrap();
    assert!(
        matches!(&scanned_app.mems, FileValue::Unreadable { error } if error.contains("symlink")),
        "{:?}",
        scanned_app.mems
    );

    let fs_handle = CgroupFs::open(&copy.layout.cpuset_root).unwrap();
    let err = fs_handle
        .write(&evil, InterfaceFile::CpusetCpus, "3")
        .unwrap_err();
    assert!(
        matches!(
            err,
            CgroupError::Refused {
                reason: Refusal::Symlink,
                ..
            }
        ),
        "{err:?}"
    );
    let err = fs_handle
        .write(&app, InterfaceFile::CpusetMems, "1")
        .unwrap_err();
    assert!(
        matches!(
            err,
            CgroupError::Refused {
                reason: Refusal::Symlink,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        fs::read_to_string(outside.path().join("cpuset.cpus")).unwrap(),
        "0-7\n"
    );
    assert_eq!(
        fs::read_to_string(outside.path().join("cpuset.mems")).unwrap(),
        "0\n"
    );
    assert_eq!(
        logged(&format!(
            "{}-evil skipped: symlink, not followed",
            "f".repeat(64)
        ))
        .len(),
        1
    );
}

#[test]
fn a_symlinked_kubepods_root_is_refused() {
    let copy = Copy::of("v2-cgroupfs");
    let root = &copy.layout.cpuset_root;
    fs::rename(root.join("kubepods"), root.join("real-kubepods")).unwrap();
    std::os::unix::fs::symlink(root.join("real-kubepods"), root.join("kubepods")).unwrap();
    let err = scanner(&copy.layout).scan().unwrap_err();
    assert!(
        matches!(
            err,
            CgroupError::Refused {
                reason: Refusal::Symlink,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("refusing to use"), "{err}");
}

#[test]
fn a_fifo_named_cpuset_cpus_does_not_hang_the_scan() {
    capture_logs();
    let copy = Copy::of("v1-cgroupfs");
    let app = copy.cgroup("pod<0a>/<a1>");
    let cpus = copy.cpuset_dir(&app).join("cpuset.cpus");
    fs::remove_file(&cpus).unwrap();
    nix::unistd::mkfifo(&cpus, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    // A FIFO next to the interface files, too.
    let stray = copy.cpuset_dir(&app).join("stray-fifo");
    nix::unistd::mkfifo(&stray, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();

    let layout = copy.layout.clone();
    let scan = within(move || scanner(&layout).scan().unwrap());
    let scanned = scan.cgroups.iter().find(|c| c.path == app).unwrap();
    assert!(
        matches!(&scanned.cpus, FileValue::Unreadable { error } if error.contains("it is a fifo, not a regular file")),
        "{:?}",
        scanned.cpus
    );
    assert!(scan
        .skipped
        .iter()
        .any(|s| s.reason == SkipReason::SpecialFile(FileKind::Fifo)));
    // The rest of the tree was scanned.
    assert_eq!(scan.cgroups.len(), 26);

    let fs_handle = CgroupFs::open(&copy.layout.cpuset_root).unwrap();
    let err = within(move || {
        fs_handle
            .write(&app, InterfaceFile::CpusetCpus, "1")
            .unwrap_err()
    });
    assert!(
        matches!(
            err,
            CgroupError::Refused {
                reason: Refusal::NotRegularFile {
                    kind: FileKind::Fifo
                },
                ..
            }
        ),
        "{err:?}"
    );
    let lines = logged(&cpus.display().to_string());
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with("WARN"), "{lines:?}");
}

#[test]
fn garbage_cpu_max_is_kept_as_invalid_and_logged_once() {
    capture_logs();
    let copy = Copy::of("v2-cgroupfs");
    let app = copy.cgroup("pod<0a>/<a1>");
    fs::write(copy.cpu_dir(&app).join("cpu.max"), "garbage\n").unwrap();
    let mut scanner = scanner(&copy.layout);
    for _ in 0..3 {
        let scan = scanner.scan().unwrap();
        let scanned = scan.cgroups.iter().find(|c| c.path == app).unwrap();
        assert!(
            matches!(&scanned.cpu, CpuSettings::V2 { max: FileValue::Invalid { text, .. }, weight: FileValue::Value(_) } if text == "garbage"),
            "{:?}",
            scanned.cpu
        );
    }
    let (_, classes) = scan_and_classify(&copy.layout, &copy.runtime());
    let scan = scanner.scan().unwrap();
    let at = scan.cgroups.iter().position(|c| c.path == app).unwrap();
    // Without an exact limit the weight alone cannot say "2 CPUs": shared, not guessed.
    assert!(
        matches!(
            classes[at].exclusivity,
            Exclusivity::Shared {
                reason: SharedReason::Undecidable { .. }
            }
        ),
        "{:?}",
        classes[at]
    );
    let lines = logged("cpu.max: \"garbage\" is not of the form 'max PERIOD' or 'QUOTA PERIOD'");
    // Once for the scanner above (three passes), once for the one in scan_and_classify.
    assert_eq!(lines.len(), 2, "{lines:?}");
}

#[test]
fn negative_cpu_shares_keep_a_container_shared() {
    capture_logs();
    let copy = Copy::of("v1-cgroupfs");
    let c1 = copy.cgroup("pod<0c>/<c1>");
    fs::write(copy.cpu_dir(&c1).join("cpu.shares"), "-5\n").unwrap();
    let (scan, classes) = scan_and_classify(&copy.layout, &copy.runtime());
    let at = scan.cgroups.iter().position(|c| c.path == c1).unwrap();
    assert!(
        matches!(&scan.cgroups[at].cpu, CpuSettings::V1 { shares: FileValue::Invalid { text, .. }, .. } if text == "-5"),
        "{:?}",
        scan.cgroups[at].cpu
    );
    assert_eq!(
        classes[at].exclusivity,
        Exclusivity::Shared {
            reason: SharedReason::CpuSettingsUnavailable
        }
    );
    assert!(!logged("cpu.shares: \"-5\" is outside 2..=262144").is_empty());
}

#[test]
fn a_ten_mib_config_json_is_ignored_with_a_log_line() {
    capture_logs();
    let copy = Copy::of("v1-cgroupfs");
    let app = copy.cgroup("pod<0a>/<a1>");
    let id = app.name().unwrap().to_str().unwrap().to_string();
    let config = copy
        .runtime()
        .join("containerd")
        .join(&id)
        .join("config.json");
    let mut big = fs::read(&config).unwrap();
    big.truncate(big.len() - 2);
    big.extend_from_slice(b", \"padding\": \"");
    big.resize(10 << 20, b'x');
    big.extend_from_slice(b"\"}\n");
    fs::write(&config, &big).unwrap();

    let mut lookup = RuntimeLookup::new(templates(&copy.runtime()));
    assert!(lookup.lookup(&id).is_none());
    assert!(lookup.lookup(&id).is_none());
    let lines = logged(&config.display().to_string());
    assert_eq!(lines.len(), 1, "logged once per container: {lines:?}");
    assert!(
        lines[0].contains("is 10485763 bytes, more than the 4194304 bytes read"),
        "{lines:?}"
    );

    // The container is still classified, from its cgroup: 2 CPUs, name unknown.
    let (scan, classes) = scan_and_classify(&copy.layout, &copy.runtime());
    let at = scan.cgroups.iter().position(|c| c.path == app).unwrap();
    assert_eq!(classes[at].exclusive_cpus(), 2);
    assert_eq!(classes[at].container_name, None);
}

#[test]
fn a_config_json_that_is_not_an_oci_config_is_ignored() {
    capture_logs();
    let copy = Copy::of("v1-cgroupfs");
    let app = copy.cgroup("pod<0a>/<a2>");
    let id = app.name().unwrap().to_str().unwrap().to_string();
    let config = copy
        .runtime()
        .join("containerd")
        .join(&id)
        .join("config.json");
    fs::write(&config, "[\"not\", \"an\", \"object\"]").unwrap();
    let mut lookup = RuntimeLookup::new(templates(&copy.runtime()));
    assert!(lookup.lookup(&id).is_none());
    let lines = logged(&config.display().to_string());
    assert!(
        lines[0].contains("is not a JSON OCI config: an OCI config must be a JSON object"),
        "{lines:?}"
    );
}

#[test]
fn odd_names_classify_as_unknown_and_never_panic() {
    let copy = Copy::of("v1-cgroupfs");
    let root = copy.layout.cpuset_root.join("kubepods");
    let app = copy.cgroup("pod<0a>/<a1>");
    let names: Vec<&[u8]> = vec![
        b"pod with space",
        b"pod\nnewline",
        "pöd-✓".as_bytes(),
        b"pod\xff\xfe",
        b"burstable\t",
    ];
    for name in &names {
        let dir = root.join(OsStr::from_bytes(name));
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("cpuset.cpus"), "0-7\n").unwrap();
    }
    let long = "p".repeat(255);
    fs::create_dir(root.join(&long)).unwrap();
    // A container's own children may be named anything.
    let own = copy.cpuset_dir(&app).join(OsStr::from_bytes(b"x\n\xff y"));
    fs::create_dir(&own).unwrap();

    let (scan, classes) = scan_and_classify(&copy.layout, &copy.runtime());
    let kind_of = |rel: &CgroupPath| {
        let at = scan
            .cgroups
            .iter()
            .position(|c| &c.relative == rel)
            .unwrap();
        classes[at].kind.clone()
    };
    for name in names.iter().copied().chain([long.as_bytes()]) {
        let rel = CgroupPath::root().join(OsStr::from_bytes(name)).unwrap();
        match kind_of(&rel) {
            CgroupKind::Unknown { reason } => {
                let text = reason.to_string();
                assert!(!text.contains('\n'), "{text}");
                if name == b"pod\xff\xfe" {
                    assert_eq!(
                        reason,
                        UnknownReason::NotUtf8 {
                            name: "pod\\xff\\xfe".into()
                        }
                    );
                }
            }
            other => panic!("{rel} classified as {other:?}"),
        }
    }
    let own_rel = app
        .strip_prefix(&copy.layout.kubepods)
        .unwrap()
        .join(OsStr::from_bytes(b"x\n\xff y"))
        .unwrap();
    assert_eq!(kind_of(&own_rel), CgroupKind::ContainerChild);
    assert_eq!(own_rel.to_string().lines().count(), 1);
}

#[test]
fn the_scan_depth_is_bounded() {
    capture_logs();
    let copy = Copy::of("v2-cgroupfs");
    let mut dir = copy.layout.cpuset_root.join("kubepods/debug-shell");
    for level in 0..MAX_SCAN_DEPTH + 3 {
        dir = dir.join(format!("d{level}"));
    }
    fs::create_dir_all(&dir).unwrap();
    let scan = scanner(&copy.layout).scan().unwrap();
    let deepest = scan
        .cgroups
        .iter()
        .map(|c| c.relative.depth())
        .max()
        .unwrap();
    assert_eq!(deepest, MAX_SCAN_DEPTH);
    let skipped: Vec<_> = scan
        .skipped
        .iter()
        .filter(|s| s.reason == SkipReason::TooDeep)
        .collect();
    assert_eq!(skipped.len(), 1);
    assert!(!logged("skipped: deeper than 32 levels").is_empty());
}

#[test]
fn a_missing_cpu_controller_directory_reads_as_missing() {
    let copy = Copy::of("v1-cgroupfs");
    let c1 = copy.cgroup("pod<0c>/<c1>");
    fs::remove_dir_all(copy.cpu_dir(&c1)).unwrap();
    let (scan, classes) = scan_and_classify(&copy.layout, &copy.runtime());
    let at = scan.cgroups.iter().position(|c| c.path == c1).unwrap();
    assert_eq!(
        scan.cgroups[at].cpu,
        CpuSettings::V1 {
            shares: FileValue::Missing,
            cfs_quota: FileValue::Missing,
            cfs_period_us: FileValue::Missing,
        }
    );
    assert_eq!(classes[at].exclusive_cpus(), 0);
    // Its children are still scanned from the cpuset hierarchy.
    assert!(scan
        .cgroups
        .iter()
        .any(|c| c.path.to_string().ends_with("/sub/leaf")));
}

#[test]
fn writes_never_create_files() {
    let copy = Copy::of("v2-systemd");
    let fs_handle = CgroupFs::open(&copy.layout.cpuset_root).unwrap();
    let pod = copy.cgroup("kubepods-pod<0a>.slice");
    let gone = pod.join(OsStr::new("not-there")).unwrap();
    let err = fs_handle
        .write(&gone, InterfaceFile::CpusetCpus, "0")
        .unwrap_err();
    assert!(err.is_gone(), "{err:?}");
    assert!(!Path::new(&gone.under(&copy.layout.cpuset_root)).exists());
    // v1 file names do not exist on v2: a misspelt file is an error, not a new file.
    let err = fs_handle
        .write(&pod, InterfaceFile::CpuShares, "1024")
        .unwrap_err();
    assert!(err.is_gone(), "{err:?}");
    assert!(!copy.cpuset_dir(&pod).join("cpu.shares").exists());
}

/// A bind mount (here a tmpfs) over a directory of the tree is never crossed (issue 17,
/// item 16), neither by the one-call `openat2` path nor by the component walk.
#[test]
fn a_mount_over_a_cgroup_directory_is_never_crossed() {
    if !nix::unistd::Uid::effective().is_root() {
        println!("skipped: mounting needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cpuset");
    let pod = root.join("kubepods/podx");
    fs::create_dir_all(&pod).unwrap();
    fs::write(root.join("kubepods/cpuset.cpus"), "0-3\n").unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "cpusetd-xdev"])
        .arg(&pod)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        println!("skipped: cannot mount a tmpfs here");
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
    let _unmount = Unmount(pod.clone());
    fs::write(pod.join("cpuset.cpus"), "0-3\n").unwrap();
    fs::create_dir(pod.join("ctr")).unwrap();
    fs::write(pod.join("ctr/cpuset.cpus"), "0-3\n").unwrap();

    let cgroupfs = CgroupFs::open(&root).unwrap();
    let kubepods = CgroupPath::new("kubepods").unwrap();
    assert_eq!(
        cgroupfs.read(&kubepods, InterfaceFile::CpusetCpus).unwrap(),
        "0-3"
    );
    for path in ["kubepods/podx", "kubepods/podx/ctr"] {
        let path = CgroupPath::new(path).unwrap();
        for read in [
            cgroupfs.read(&path, InterfaceFile::CpusetCpus),
            cgroupfs.read_file(&path, InterfaceFile::CpusetCpus),
        ] {
            let err = read.expect_err("crossed a mount");
            let chain = cpusetd::logging::error_chain(&err);
            assert!(chain.contains("mounted"), "{path}: {chain}");
        }
        let write = cgroupfs.write(&path, InterfaceFile::CpusetCpus, "0");
        assert!(write.is_err(), "{path}: wrote across a mount");
    }
    assert_eq!(
        fs::read_to_string(pod.join("ctr/cpuset.cpus")).unwrap(),
        "0-3\n"
    );
}
