//! The inotify watcher on temporary trees and on the real cgroup v1 hierarchy: what the
//! controller is told when cgroups appear, go away, are renamed or have their CPU settings
//! written, what it is not told about, how lost events turn into one rescan request, and that
//! the thread stops when asked. Waiting is always `recv_timeout` with a deadline.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use cpusetd::cgroupfs::{parse_mountinfo, CgroupPath, InterfaceFile};
use cpusetd::watcher::{
    RescanReason, TreeEvent, WatchRoot, Watcher, WatcherHandle, MAX_WATCH_DEPTH,
};

/// Longest wait for an event that must come.
const WAIT: Duration = Duration::from_secs(20);

fn path(text: &str) -> CgroupPath {
    CgroupPath::new(text).unwrap()
}

fn created(text: &str) -> TreeEvent {
    TreeEvent::Created { cgroup: path(text) }
}

fn removed(text: &str) -> TreeEvent {
    TreeEvent::Removed { cgroup: path(text) }
}

fn modified(text: &str, file: InterfaceFile) -> TreeEvent {
    TreeEvent::Modified {
        cgroup: path(text),
        file,
    }
}

/// A temporary controller root with an empty `kubepods` directory.
fn tree() -> (tempfile::TempDir, WatchRoot) {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("kubepods")).unwrap();
    let root = WatchRoot {
        controller_root: dir.path().to_path_buf(),
        kubepods: path("kubepods"),
    };
    (dir, root)
}

fn spawn(roots: Vec<WatchRoot>) -> (WatcherHandle, Receiver<TreeEvent>) {
    let (tx, rx) = crossbeam_channel::bounded(1024);
    let handle = Watcher::spawn(roots, tx).unwrap();
    (handle, rx)
}

fn next(rx: &Receiver<TreeEvent>) -> TreeEvent {
    rx.recv_timeout(WAIT)
        .unwrap_or_else(|err| panic!("no tree event within {WAIT:?}: {err}"))
}

fn next_n(rx: &Receiver<TreeEvent>, n: usize) -> Vec<TreeEvent> {
    (0..n).map(|_| next(rx)).collect()
}

/// Writes like a cgroup tool does: open the existing file without truncating, one write. (With
/// `O_TRUNC` the kernel reports the truncation as a modification of its own.)
fn write_in_place(file: &Path, value: &str) -> std::io::Result<()> {
    OpenOptions::new()
        .write(true)
        .open(file)?
        .write_all(value.as_bytes())
}

/// Creates a marker directory and checks that it is the next event: everything done before it
/// produced no event.
fn expect_nothing_before_marker(rx: &Receiver<TreeEvent>, dir: &Path, rel: &str) {
    fs::create_dir(dir.join(rel)).unwrap();
    assert_eq!(next(rx), created(rel));
}

#[test]
fn nested_directories_created_at_once_arrive_parent_first_and_once() {
    let (dir, root) = tree();
    let (_handle, rx) = spawn(vec![root]);
    fs::create_dir_all(dir.path().join("kubepods/a/b/c/d")).unwrap();
    assert_eq!(
        next_n(&rx, 4),
        [
            created("kubepods/a"),
            created("kubepods/a/b"),
            created("kubepods/a/b/c"),
            created("kubepods/a/b/c/d"),
        ]
    );
    // No late duplicate from a creation event read after the listing found the directory.
    expect_nothing_before_marker(&rx, dir.path(), "kubepods/z");
    // The deepest one is watched too.
    fs::create_dir(dir.path().join("kubepods/a/b/c/d/e")).unwrap();
    assert_eq!(next(&rx), created("kubepods/a/b/c/d/e"));
}

#[test]
fn the_existing_tree_is_watched_without_events() {
    let (dir, root) = tree();
    let pod = "kubepods/burstable/pod1234/0123abcd";
    fs::create_dir_all(dir.path().join(pod)).unwrap();
    let watcher = Watcher::new(vec![root]).unwrap();
    assert_eq!(watcher.watched_dirs(), 4);
    let (tx, rx) = crossbeam_channel::bounded(16);
    let _handle = watcher.start(tx).unwrap();
    fs::create_dir(dir.path().join(pod).join("sub")).unwrap();
    assert_eq!(next(&rx), created(&format!("{pod}/sub")));
    assert!(rx.is_empty());
}

#[test]
fn removed_directories_are_reported_once() {
    let (dir, root) = tree();
    fs::create_dir_all(dir.path().join("kubepods/pod1/c1")).unwrap();
    let (_handle, rx) = spawn(vec![root]);
    fs::remove_dir(dir.path().join("kubepods/pod1/c1")).unwrap();
    fs::remove_dir(dir.path().join("kubepods/pod1")).unwrap();
    assert_eq!(
        next_n(&rx, 2),
        [removed("kubepods/pod1/c1"), removed("kubepods/pod1")]
    );
    expect_nothing_before_marker(&rx, dir.path(), "kubepods/z");
    // Re-created under the same name: a new directory, watched again.
    fs::create_dir_all(dir.path().join("kubepods/pod1/c1")).unwrap();
    assert_eq!(
        next_n(&rx, 2),
        [created("kubepods/pod1"), created("kubepods/pod1/c1")]
    );
}

#[test]
fn a_renamed_directory_is_removed_and_created_with_its_children() {
    let (dir, root) = tree();
    fs::create_dir_all(dir.path().join("kubepods/old/c1/sub")).unwrap();
    let (_handle, rx) = spawn(vec![root]);
    fs::rename(
        dir.path().join("kubepods/old"),
        dir.path().join("kubepods/new"),
    )
    .unwrap();
    assert_eq!(
        next_n(&rx, 4),
        [
            removed("kubepods/old"),
            created("kubepods/new"),
            created("kubepods/new/c1"),
            created("kubepods/new/c1/sub"),
        ]
    );
    // Events below the moved directory carry the new path.
    fs::create_dir(dir.path().join("kubepods/new/c1/sub/x")).unwrap();
    assert_eq!(next(&rx), created("kubepods/new/c1/sub/x"));
    // Moved out of the tree: removed, and no longer reported.
    let outside = tempfile::tempdir().unwrap();
    fs::rename(dir.path().join("kubepods/new"), outside.path().join("gone")).unwrap();
    assert_eq!(next(&rx), removed("kubepods/new"));
    fs::create_dir(outside.path().join("gone/c1/y")).unwrap();
    expect_nothing_before_marker(&rx, dir.path(), "kubepods/z");
}

#[test]
fn cpu_settings_writes_are_reported_and_other_files_are_not() {
    let (dir, root) = tree();
    let pod = dir.path().join("kubepods/pod1");
    fs::create_dir(&pod).unwrap();
    let files = [
        InterfaceFile::CpusetCpus,
        InterfaceFile::CpusetMems,
        InterfaceFile::CpuMax,
        InterfaceFile::CpuCfsQuotaUs,
        InterfaceFile::CpuShares,
        InterfaceFile::CpuWeight,
    ];
    for file in files {
        fs::write(pod.join(file.name()), "\n").unwrap();
    }
    for other in ["cgroup.procs", "cpu.cfs_period_us", "cpuset.effective_cpus"] {
        fs::write(pod.join(other), "\n").unwrap();
    }
    let (_handle, rx) = spawn(vec![root]);
    write_in_place(&pod.join("cgroup.procs"), "1234\n").unwrap();
    write_in_place(&pod.join("cpu.cfs_period_us"), "100000\n").unwrap();
    write_in_place(&pod.join("cpuset.effective_cpus"), "0-3\n").unwrap();
    for file in files {
        write_in_place(&pod.join(file.name()), "1\n").unwrap();
        assert_eq!(next(&rx), modified("kubepods/pod1", file));
    }
    // A write to the root itself names the root.
    fs::write(dir.path().join("kubepods/cpuset.cpus"), "").unwrap();
    write_in_place(&dir.path().join("kubepods/cpuset.cpus"), "0-3\n").unwrap();
    assert_eq!(next(&rx), modified("kubepods", InterfaceFile::CpusetCpus));
    // Creating a regular file is no directory event.
    fs::write(pod.join("notes"), "x").unwrap();
    expect_nothing_before_marker(&rx, dir.path(), "kubepods/z");
}

#[test]
fn symlinked_directories_are_not_followed() {
    let (dir, root) = tree();
    let elsewhere = tempfile::tempdir().unwrap();
    fs::create_dir(elsewhere.path().join("inside")).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("kubepods/link")).unwrap();
    let watcher = Watcher::new(vec![root]).unwrap();
    assert_eq!(watcher.watched_dirs(), 1, "only kubepods itself");
    let (tx, rx) = crossbeam_channel::bounded(16);
    let _handle = watcher.start(tx).unwrap();
    // Changes behind the symlink, and a symlink to a directory appearing, are not reported.
    fs::create_dir(elsewhere.path().join("inside/new")).unwrap();
    fs::write(elsewhere.path().join("cpuset.cpus"), "1\n").unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("kubepods/link2")).unwrap();
    expect_nothing_before_marker(&rx, dir.path(), "kubepods/z");
}

#[test]
fn depth_is_bounded_like_the_scan() {
    let (dir, root) = tree();
    let chain: Vec<String> = (1..=MAX_WATCH_DEPTH).map(|i| format!("d{i}")).collect();
    let deepest = format!("kubepods/{}", chain.join("/"));
    let parent_of_deepest = format!("kubepods/{}", chain[..MAX_WATCH_DEPTH - 1].join("/"));
    fs::create_dir_all(dir.path().join(&deepest)).unwrap();
    let watcher = Watcher::new(vec![root]).unwrap();
    assert_eq!(watcher.watched_dirs(), 1 + MAX_WATCH_DEPTH);
    let (tx, rx) = crossbeam_channel::bounded(16);
    let _handle = watcher.start(tx).unwrap();
    // One level too deep: neither created nor removed.
    fs::create_dir(dir.path().join(&deepest).join("too-deep")).unwrap();
    fs::remove_dir(dir.path().join(&deepest).join("too-deep")).unwrap();
    // At the deepest level: reported.
    let sibling = format!("{parent_of_deepest}/sibling");
    fs::create_dir(dir.path().join(&sibling)).unwrap();
    assert_eq!(next(&rx), created(&sibling));
}

#[test]
fn a_queue_overflow_resynchronises_and_asks_for_one_rescan() {
    let max_queued: usize = fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(16_384);
    if max_queued > 100_000 {
        println!(
            "skipped: fs.inotify.max_queued_events is {max_queued}, too many directories to create"
        );
        return;
    }
    let (dir, root) = tree();
    let watcher = Watcher::new(vec![root]).unwrap();
    // Nobody reads the queue until the watcher starts: it must overflow.
    let count = max_queued + 2_000;
    for i in 0..count {
        fs::create_dir(dir.path().join(format!("kubepods/d{i:05}"))).unwrap();
    }
    let (tx, rx) = crossbeam_channel::unbounded();
    let handle = watcher.start(tx).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut created_before = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left).expect("a rescan request") {
            TreeEvent::Created { .. } => created_before += 1,
            TreeEvent::Rescan { reason } => {
                assert_eq!(reason, RescanReason::QueueOverflow);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    println!("{created_before} directories reported before the overflow, {count} created");
    assert!(created_before <= max_queued);
    // The directories whose creation events were lost are watched now.
    let last = format!("kubepods/d{:05}", count - 1);
    fs::create_dir(dir.path().join(&last).join("x")).unwrap();
    assert_eq!(next(&rx), created(&format!("{last}/x")));
    handle.stop_and_join(Duration::from_secs(10)).unwrap();
}

#[test]
fn stop_joins_within_a_deadline() {
    let (dir, root) = tree();
    let (handle, rx) = spawn(vec![root]);
    fs::create_dir(dir.path().join("kubepods/a")).unwrap();
    assert_eq!(next(&rx), created("kubepods/a"));
    let started = Instant::now();
    handle.stop_and_join(Duration::from_secs(2)).unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    // The thread dropped its sender.
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(2)),
        Err(RecvTimeoutError::Disconnected)
    );
}

#[test]
fn stop_works_while_the_channel_is_full() {
    let (dir, root) = tree();
    let (tx, rx) = crossbeam_channel::bounded(1);
    let handle = Watcher::spawn(vec![root], tx).unwrap();
    for i in 0..20 {
        fs::create_dir(dir.path().join(format!("kubepods/p{i}"))).unwrap();
    }
    // Wait until the watcher has filled the channel, without reading from it.
    let deadline = Instant::now() + WAIT;
    while !rx.is_full() {
        assert!(Instant::now() < deadline, "the channel never filled");
        std::thread::yield_now();
    }
    handle.stop_and_join(Duration::from_secs(2)).unwrap();
    assert_eq!(next(&rx), created("kubepods/p0"));
}

#[test]
fn dropping_the_handle_or_the_receiver_ends_the_thread() {
    let (_dir, root) = tree();
    let (handle, rx) = spawn(vec![root.clone()]);
    drop(handle);
    assert_eq!(rx.recv_timeout(WAIT), Err(RecvTimeoutError::Disconnected));

    let (dir, root) = tree();
    let (handle, rx) = spawn(vec![root]);
    drop(rx);
    // The thread notices when it next has something to send.
    fs::create_dir(dir.path().join("kubepods/a")).unwrap();
    handle.join(WAIT).unwrap();
}

#[test]
fn a_removed_kubepods_is_reported_and_watched_again_when_it_returns() {
    let (dir, root) = tree();
    let (_handle, rx) = spawn(vec![root]);
    fs::remove_dir(dir.path().join("kubepods")).unwrap();
    assert_eq!(
        next_n(&rx, 2),
        [
            removed("kubepods"),
            TreeEvent::Rescan {
                reason: RescanReason::RootGone
            }
        ]
    );
    fs::create_dir_all(dir.path().join("kubepods/pod1")).unwrap();
    let first = next(&rx);
    assert_eq!(first, created("kubepods"));
    // pod1 is found by the listing or reported by its own event, once either way.
    assert_eq!(next(&rx), created("kubepods/pod1"));
    fs::create_dir(dir.path().join("kubepods/pod1/c1")).unwrap();
    assert_eq!(next(&rx), created("kubepods/pod1/c1"));
}

#[test]
fn a_missing_kubepods_is_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let root = WatchRoot {
        controller_root: dir.path().to_path_buf(),
        kubepods: path("kubepods.slice"),
    };
    let (_handle, rx) = spawn(vec![root]);
    fs::create_dir(dir.path().join("other.slice")).unwrap();
    fs::create_dir(dir.path().join("kubepods.slice")).unwrap();
    assert_eq!(next(&rx), created("kubepods.slice"));
    fs::create_dir(dir.path().join("kubepods.slice/kubepods-besteffort.slice")).unwrap();
    assert_eq!(
        next(&rx),
        created("kubepods.slice/kubepods-besteffort.slice")
    );
}

#[test]
fn both_v1_trees_report_paths_relative_to_their_controller_root() {
    let dir = tempfile::tempdir().unwrap();
    let cpuset = dir.path().join("cpuset");
    let cpu = dir.path().join("cpu,cpuacct");
    fs::create_dir_all(cpuset.join("kubepods")).unwrap();
    fs::create_dir_all(cpu.join("kubepods")).unwrap();
    let roots = vec![
        WatchRoot {
            controller_root: cpuset.clone(),
            kubepods: path("kubepods"),
        },
        WatchRoot {
            controller_root: cpu.clone(),
            kubepods: path("kubepods"),
        },
    ];
    let (_handle, rx) = spawn(roots);
    fs::create_dir(cpuset.join("kubepods/pod1")).unwrap();
    assert_eq!(next(&rx), created("kubepods/pod1"));
    fs::create_dir(cpu.join("kubepods/pod1")).unwrap();
    assert_eq!(next(&rx), created("kubepods/pod1"));
    fs::write(cpu.join("kubepods/pod1/cpu.shares"), "2048\n").unwrap();
    assert_eq!(
        next(&rx),
        modified("kubepods/pod1", InterfaceFile::CpuShares)
    );
}

/// Resident set size of this process, in KiB.
fn vm_rss_kib() -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Not a timed test: prints what watching 10,000 cgroups costs. Other tests run in parallel
/// in this binary; for a clean figure run it alone:
/// `cargo test --release --test tests watcher::footprint -- --nocapture --test-threads=1`.
#[test]
fn footprint_of_watching_10000_cgroups() {
    let (dir, root) = tree();
    // kubelet's shape: 2,500 burstable pods with 3 containers each, real name lengths.
    let burstable = dir.path().join("kubepods/burstable");
    for pod in 0..2_500u32 {
        let pod_dir = burstable.join(format!("pod5e1f0000-0000-4000-8000-{pod:012}"));
        for container in 0..3u32 {
            fs::create_dir_all(pod_dir.join(format!("{:064x}", pod * 4 + container))).unwrap();
        }
    }
    let before = vm_rss_kib();
    let started = Instant::now();
    let watcher = Watcher::new(vec![root]).unwrap();
    let took = started.elapsed();
    let after = vm_rss_kib();
    assert_eq!(watcher.watched_dirs(), 2 + 2_500 * 4);
    println!(
        "watching {} directories: RSS {before} KiB -> {after} KiB (+{} KiB), set up in {took:?}",
        watcher.watched_dirs(),
        after.saturating_sub(before)
    );
}

/// Why the real-kernel watcher test cannot run here, if it cannot.
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

const CPUSET_MOUNT: &str = "/sys/fs/cgroup/cpuset";

/// The v1 mount of the cpu controller, if there is one.
fn cpu_mount() -> Option<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    parse_mountinfo(&mountinfo)
        .into_iter()
        .find(|m| m.fs_type == "cgroup" && m.super_options.iter().any(|o| o == "cpu"))
        .map(|m| m.mount_point)
}

/// Directories made by a test, removed in reverse order whatever happens.
struct Cleanup(Vec<PathBuf>);

impl Cleanup {
    fn mkdir(&mut self, dir: PathBuf) {
        fs::create_dir(&dir).unwrap();
        self.0.push(dir);
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for dir in self.0.iter().rev() {
            match fs::remove_dir(dir) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => eprintln!("cleanup: cannot remove {}: {err}", dir.display()),
            }
        }
    }
}

/// Watches held by the inotify instance that watches `dir`, from `/proc/self/fdinfo`.
fn kernel_watches_of_instance_watching(dir: &Path) -> usize {
    let ino = format!(" ino:{:x} ", fs::metadata(dir).unwrap().ino());
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc/self/fdinfo").unwrap().flatten() {
        let Ok(info) = fs::read_to_string(entry.path()) else {
            continue;
        };
        let watches: Vec<&str> = info
            .lines()
            .filter(|l| l.starts_with("inotify wd:"))
            .collect();
        if watches.iter().any(|l| l.contains(&ino)) {
            found.push(watches.len());
        }
    }
    assert_eq!(
        found.len(),
        1,
        "one inotify instance watches {}",
        dir.display()
    );
    found[0]
}

#[test]
fn real_v1_cgroups_created_written_and_removed() {
    if let Some(reason) = skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "cpusetd-watch-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    );
    let cpuset = PathBuf::from(CPUSET_MOUNT);
    let cpu = cpu_mount().filter(|m| *m != cpuset);
    let mut cleanup = Cleanup(Vec::new());
    let top = cpuset.join(&name);
    cleanup.mkdir(top.clone());
    // A fresh v1 cpuset starts empty: give it its parent's sets.
    let cpus = fs::read_to_string(cpuset.join("cpuset.cpus")).unwrap();
    let mems = fs::read_to_string(cpuset.join("cpuset.mems")).unwrap();
    write_in_place(&top.join("cpuset.cpus"), cpus.trim()).unwrap();
    write_in_place(&top.join("cpuset.mems"), mems.trim()).unwrap();
    let mut roots = vec![WatchRoot {
        controller_root: cpuset.clone(),
        kubepods: path(&name),
    }];
    if let Some(cpu) = &cpu {
        cleanup.mkdir(cpu.join(&name));
        roots.push(WatchRoot {
            controller_root: cpu.clone(),
            kubepods: path(&name),
        });
    } else {
        println!("no separate v1 cpu mount: only the cpuset tree is watched");
    }
    let (handle, rx) = spawn(roots);
    let watches_before = kernel_watches_of_instance_watching(&top);

    let pod = format!("{name}/pod1");
    cleanup.mkdir(cpuset.join(&pod));
    assert_eq!(next(&rx), created(&pod));
    let pod_dir = cpuset.join(&pod);
    write_in_place(&pod_dir.join("cpuset.cpus"), cpus.trim()).unwrap();
    assert_eq!(next(&rx), modified(&pod, InterfaceFile::CpusetCpus));
    // The kernel refuses this write (no such CPU): no event, since nothing changed.
    assert!(write_in_place(&pod_dir.join("cpuset.cpus"), "4095").is_err());
    write_in_place(&pod_dir.join("cpuset.mems"), mems.trim()).unwrap();
    assert_eq!(next(&rx), modified(&pod, InterfaceFile::CpusetMems));
    assert_eq!(
        kernel_watches_of_instance_watching(&top),
        watches_before + 1
    );

    if let Some(cpu) = &cpu {
        let cpu_pod = cpu.join(&pod);
        cleanup.mkdir(cpu_pod.clone());
        assert_eq!(next(&rx), created(&pod));
        write_in_place(&cpu_pod.join("cpu.shares"), "2048").unwrap();
        assert_eq!(next(&rx), modified(&pod, InterfaceFile::CpuShares));
        write_in_place(&cpu_pod.join("cpu.cfs_quota_us"), "200000").unwrap();
        assert_eq!(next(&rx), modified(&pod, InterfaceFile::CpuCfsQuotaUs));
        fs::remove_dir(&cpu_pod).unwrap();
        assert_eq!(next(&rx), removed(&pod));
    }

    // rmdir on cgroupfs sends IN_DELETE to the parent but nothing to the directory's own
    // watch: the watcher must drop that watch itself, or it stays in the kernel.
    fs::remove_dir(&pod_dir).unwrap();
    assert_eq!(next(&rx), removed(&pod));
    assert_eq!(kernel_watches_of_instance_watching(&top), watches_before);

    handle.stop_and_join(Duration::from_secs(5)).unwrap();
}
