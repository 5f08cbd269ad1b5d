//! Debug builds only: make a fake cgroup tree refuse what cgroup v1's cpuset controller refuses,
//! so integration tests of the real binary on a temporary tree fail on any write the kernel
//! would refuse. Enabled by `CPUSETD_FAKE_KERNEL_RULES=1`; each refusal is also appended to the
//! file named by `CPUSETD_FAKE_KERNEL_LOG`, for tests to assert on. Release builds have none of
//! this (the module is compiled only with `debug_assertions`).
//!
//! Rules, for `cpuset.cpus` and `cpuset.mems`: an empty value is refused (EINVAL; cpusetd never
//! writes one), as is a value with a cpu or memory node the root cpuset does not have (EINVAL:
//! offline, `update_cpumask`'s check against `top_cpuset`), a value not within the parent's is
//! refused (EACCES), and a value that drops
//! what a child holds is refused (EBUSY). Empty (uninitialised) parents and children do not
//! constrain, as on a real v1 tree. The root cpuset's `cpuset.cpus` and `cpuset.mems` are the
//! kernel's: a write is refused (EACCES). `cpuset.sched_load_balance` takes a decimal number
//! (the kernel's `kstrtoull`: one trailing newline at most, no sign, no spaces) and refuses
//! anything else (EINVAL); as on the real kernel (6.1, checked in the VM), any order of writes
//! is taken. cgroup v2's remote partitions (Linux 6.7 or newer; the write rules follow the
//! kernel's documentation, what the kernel shows after them is what 6.12 showed in the VM:
//! [`after_write`]):
//! `cpuset.cpus.exclusive` may be empty, must be within the parent's (below the root), must
//! keep every child's (EBUSY) and must not overlap a sibling's (EINVAL);
//! `cpuset.cpus.partition` takes `member`, `root` or `isolated` (EINVAL otherwise). The check
//! and the write happen under a lock on the hierarchy's root ([`lock`]), as the kernel's checks
//! happen under `cgroup_mutex`.

use std::fs::File;
use std::io::{self, Write as _};
use std::sync::OnceLock;

use nix::fcntl::{Flock, FlockArg};

use nix::errno::Errno;

use super::fs::{CgroupFs, FileKind, InterfaceFile};
use super::path::CgroupPath;
use crate::cpuset::CpuSet;

/// The rules are on and `fs` is not a real cgroup filesystem (whose kernel has its own mutex
/// and never truncates): the fake-tree measures apply.
pub(super) fn fake_tree(fs: &CgroupFs) -> bool {
    use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC};
    enabled_for(fs)
        && !statfs(fs.root()).is_ok_and(|st| {
            let kind = st.filesystem_type();
            kind == CGROUP_SUPER_MAGIC || kind == CGROUP2_SUPER_MAGIC
        })
}

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("CPUSETD_FAKE_KERNEL_RULES").is_some_and(|v| v == "1"))
}

/// The tests' fake trees whose writes the rules check (the environment is process-wide).
#[cfg(debug_assertions)]
static TEST_ROOTS: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Turns the rules on for the fake tree at `root` in this process (debug builds: the unit
/// tests, and the integration tests that drive a controller in process on a v2 tree whose
/// effective sets the rules keep).
#[cfg(debug_assertions)]
pub fn enable_for_test(root: &std::path::Path) {
    TEST_ROOTS.lock().unwrap().push(root.to_path_buf());
}

/// The rules are on for `fs`: its v2 effective sets are kept as the kernel keeps them
/// ([`after_write`]).
pub(crate) fn models_effective_sets(fs: &CgroupFs) -> bool {
    enabled_for(fs)
}

fn enabled_for(fs: &CgroupFs) -> bool {
    #[cfg(debug_assertions)]
    if TEST_ROOTS.lock().unwrap().iter().any(|r| r == fs.root()) {
        return true;
    }
    #[cfg(not(debug_assertions))]
    let _ = fs;
    enabled()
}

/// The fake tree's `cgroup_mutex`: an exclusive `flock` on the hierarchy's root directory, held
/// from the check of a cpuset write to the write itself. `kubesim` takes the same lock while it
/// copies a parent's cpuset into a new cgroup, so neither sees the other half done, as in the
/// kernel. `None` when the rules are off (or the root cannot be locked).
pub(super) fn lock(fs: &CgroupFs, file: InterfaceFile) -> Option<Flock<File>> {
    if !fake_tree(fs) || !matches!(file, InterfaceFile::CpusetCpus | InterfaceFile::CpusetMems) {
        return None;
    }
    let dir = File::open(fs.root()).ok()?;
    Flock::lock(dir, FlockArg::LockExclusive).ok()
}

/// Checks a write the way the kernel would; `Err` carries the errno the kernel would return.
pub(super) fn check(
    fs: &CgroupFs,
    cgroup: &CgroupPath,
    file: InterfaceFile,
    value: &str,
) -> Result<(), io::Error> {
    if !enabled_for(fs) {
        return Ok(());
    }
    rules(
        fs,
        cgroup,
        file,
        value,
        std::env::var_os("CPUSETD_FAKE_KERNEL_LOG").as_deref(),
    )
}

fn rules(
    fs: &CgroupFs,
    cgroup: &CgroupPath,
    file: InterfaceFile,
    value: &str,
    log: Option<&std::ffi::OsStr>,
) -> Result<(), io::Error> {
    if !matches!(
        file,
        InterfaceFile::CpusetCpus
            | InterfaceFile::CpusetMems
            | InterfaceFile::CpusetSchedLoadBalance
            | InterfaceFile::CpusetCpusExclusive
            | InterfaceFile::CpusetCpusPartition
    ) {
        return Ok(());
    }
    let refuse = |errno: Errno, why: String| {
        if let Some(log) = log {
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(log)
            {
                let _ = writeln!(f, "{cgroup}/{} = {value:?}: {errno}: {why}", file.name());
            }
        }
        Err(io::Error::from(errno))
    };
    if file == InterfaceFile::CpusetSchedLoadBalance {
        let digits = value.strip_suffix('\n').unwrap_or(value);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return refuse(Errno::EINVAL, "not a number".into());
        }
        return Ok(());
    }
    if file == InterfaceFile::CpusetCpusPartition {
        return match value.strip_suffix('\n').unwrap_or(value) {
            "member" | "root" | "isolated" => Ok(()),
            _ => refuse(Errno::EINVAL, "not a partition type".into()),
        };
    }
    if cgroup.is_root() {
        return refuse(
            Errno::EACCES,
            "the root cpuset's sets are the kernel's".into(),
        );
    }
    let verdict = if file == InterfaceFile::CpusetCpusExclusive {
        exclusive_rules(fs, cgroup, value)
    } else {
        cpus_rules(fs, cgroup, file, value)
    };
    match verdict {
        Ok(()) => Ok(()),
        Err((errno, why)) => refuse(errno, why),
    }
}

/// A rule's verdict on a write; refused: the errno the kernel returns, and why (for the log).
type Verdict = Result<(), (Errno, String)>;

/// `cpuset.cpus.exclusive` (v2): within the parent's, no sibling's, and all of each child's.
fn exclusive_rules(fs: &CgroupFs, cgroup: &CgroupPath, value: &str) -> Verdict {
    let file = InterfaceFile::CpusetCpusExclusive;
    let Ok(new) = CpuSet::parse(value.trim()) else {
        return Err((Errno::EINVAL, "not a cpu list".into()));
    };
    let read = |path: &CgroupPath| {
        fs.read(path, file)
            .ok()
            .and_then(|text| CpuSet::parse(text.trim()).ok())
    };
    if let Some(parent) = cgroup.parent().filter(|p| !p.is_root()) {
        if let Some(held) = read(&parent) {
            if !new.is_subset(&held) {
                return Err((Errno::EINVAL, format!("not within the parent's {held}")));
            }
        }
        for sibling in children(fs, &parent).iter().filter(|s| *s != cgroup) {
            if let Some(theirs) = read(sibling) {
                if !theirs.intersection(&new).is_empty() {
                    return Err((
                        Errno::EINVAL,
                        format!("sibling {sibling} holds {theirs} exclusively"),
                    ));
                }
            }
        }
    }
    for child in children(fs, cgroup) {
        if let Some(held) = read(&child) {
            if !held.is_subset(&new) {
                return Err((Errno::EBUSY, format!("child {child} holds {held}")));
            }
        }
    }
    Ok(())
}

/// `cpuset.cpus` and `cpuset.mems` (v1 rules): a non-empty list, online, within the parent's,
/// and holding each child's.
fn cpus_rules(fs: &CgroupFs, cgroup: &CgroupPath, file: InterfaceFile, value: &str) -> Verdict {
    let Ok(new) = CpuSet::parse(value) else {
        return Err((Errno::EINVAL, "not a cpu list".into()));
    };
    if new.is_empty() {
        return Err((Errno::EINVAL, "empty value".into()));
    }
    let read = |path: &CgroupPath| {
        fs.read(path, file)
            .ok()
            .and_then(|text| CpuSet::parse(&text).ok())
            .filter(|set| !set.is_empty())
    };
    // The root's sets are what is online (v1 keeps them so): anything else is EINVAL.
    if let Some(online) = read(&CgroupPath::root()) {
        if !new.is_subset(&online) {
            return Err((Errno::EINVAL, format!("not online (online: {online})")));
        }
    }
    if let Some(parent) = cgroup.parent().filter(|p| !p.is_root()) {
        if let Some(held) = read(&parent) {
            if !new.is_subset(&held) {
                return Err((Errno::EACCES, format!("not within the parent's {held}")));
            }
        }
    }
    if let Ok(entries) = fs.list(cgroup) {
        for entry in entries.iter().filter(|e| e.kind == FileKind::Directory) {
            let Ok(child) = cgroup.join(&entry.name) else {
                continue;
            };
            if let Some(held) = read(&child) {
                if !held.is_subset(&new) {
                    return Err((Errno::EBUSY, format!("child {child} holds {held}")));
                }
            }
        }
    }
    Ok(())
}

/// After a write of `cpuset.cpus.exclusive` or `cpuset.cpus.partition` on a fake tree: what
/// Linux 6.12 then shows (checked in the VM's `sched-v2` scenario). Every cgroup asking for an
/// isolated partition is valid when its exclusive CPUs, within those of each ancestor down from
/// the root's child (the root holds every CPU), are not empty, not another partition's, and not
/// all the root has; it reads `isolated`, else `isolated invalid (<reason>)` with the kernel's
/// words: "Parent is not a partition root" when the chain does not hand its CPUs down,
/// "Invalid cpu list in cpuset.cpus.exclusive" otherwise. The root's `cpuset.cpus.isolated` is
/// then every valid partition's CPUs and those `isolcpus=` isolates (which stay in the root's
/// effective set), and its `cpuset.cpus.effective` loses the partitions' (and gets back those
/// no longer isolated).
///
/// On cgroup v2 (a tree whose cgroups have `cpuset.cpus.effective`), a write of `cpuset.cpus`
/// or `cpuset.mems` then gives the cgroup and everything below it their effective sets
/// ([`settle_effective`]), and a partition's change gives the whole tree theirs.
pub(super) fn after_write(fs: &CgroupFs, cgroup: &CgroupPath, file: InterfaceFile) {
    if !fake_tree(fs) {
        return;
    }
    match file {
        InterfaceFile::CpusetCpusExclusive | InterfaceFile::CpusetCpusPartition => {
            settle_partitions(fs);
            let _cgroup_mutex = lock(fs, InterfaceFile::CpusetCpus);
            settle_effective(fs, &CgroupPath::root(), InterfaceFile::CpusetCpus);
        }
        // v2 only: v1 has no `cpuset.cpus.effective`.
        InterfaceFile::CpusetCpus | InterfaceFile::CpusetMems
            if fs.read(cgroup, InterfaceFile::CpusetCpusEffective).is_ok() =>
        {
            let _cgroup_mutex = lock(fs, file);
            settle_effective(fs, cgroup, file);
        }
        _ => {}
    }
}

/// cgroup v2's effective sets (cgroup-v2.rst, "cpuset.cpus" and "cpuset.cpus.effective";
/// `update_cpumasks_hier` since Linux 3.16, commit 554b0d1c845e "cpuset: inherit ancestor's
/// masks if effective_{cpus,mems} becomes empty", on the default hierarchy only): a cgroup
/// whose `cpuset.cpus` is empty has its parent's effective set;
/// one with cpus of its own has those of them its parent has, or its parent's whole set when
/// it has none of them. A valid isolated partition has its exclusive cpus. Done for `top` and
/// every cgroup below it (the children of the root for the root, whose sets are the
/// kernel's), parents first; a file is rewritten only when its value changes. Nothing on v1
/// (no `cpuset.cpus.effective`: an empty v1 cpuset is one not set up yet).
pub(crate) fn settle_effective(fs: &CgroupFs, top: &CgroupPath, file: InterfaceFile) {
    let effective = match file {
        InterfaceFile::CpusetCpus => InterfaceFile::CpusetCpusEffective,
        InterfaceFile::CpusetMems => InterfaceFile::CpusetMemsEffective,
        _ => return,
    };
    let mut stack: Vec<(CgroupPath, CpuSet)> = Vec::new();
    let push_children = |stack: &mut Vec<(CgroupPath, CpuSet)>, of: &CgroupPath, set: &CpuSet| {
        for child in children(fs, of) {
            stack.push((child, set.clone()));
        }
    };
    if top.is_root() {
        let Some(root) = read_set(fs, top, effective) else {
            return;
        };
        push_children(&mut stack, top, &root);
    } else {
        let parent = top.parent().unwrap_or_else(CgroupPath::root);
        let Some(from_parent) = read_set(fs, &parent, effective) else {
            return;
        };
        stack.push((top.clone(), from_parent));
    }
    while let Some((path, from_parent)) = stack.pop() {
        let Ok(now) = fs.read(&path, effective) else {
            continue;
        };
        let mine = own_effective(fs, &path, file, &from_parent);
        if now.trim() != mine.to_string() {
            let _ = std::fs::write(
                fs.host_path(&path).join(effective.name()),
                format!("{mine}\n"),
            );
        }
        push_children(&mut stack, &path, &mine);
    }
}

/// A v2 cgroup's effective set given its parent's (see [`settle_effective`]).
fn own_effective(fs: &CgroupFs, path: &CgroupPath, file: InterfaceFile, parent: &CpuSet) -> CpuSet {
    if file == InterfaceFile::CpusetCpus
        && fs
            .read(path, InterfaceFile::CpusetCpusPartition)
            .is_ok_and(|state| state.trim() == "isolated")
    {
        if let Some(held) = read_set(fs, path, InterfaceFile::CpusetCpusExclusive) {
            if !held.is_empty() {
                return held;
            }
        }
    }
    let own = read_set(fs, path, file).unwrap_or_default();
    let within = own.intersection(parent);
    if within.is_empty() {
        parent.clone()
    } else {
        within
    }
}

/// The child cgroups of `of` on the fake tree.
fn children(fs: &CgroupFs, of: &CgroupPath) -> Vec<CgroupPath> {
    fs.list(of)
        .map(|entries| {
            entries
                .iter()
                .filter(|e| e.kind == FileKind::Directory)
                .filter_map(|e| of.join(&e.name).ok())
                .collect()
        })
        .unwrap_or_default()
}

fn read_set(fs: &CgroupFs, path: &CgroupPath, file: InterfaceFile) -> Option<CpuSet> {
    fs.read(path, file)
        .ok()
        .and_then(|text| CpuSet::parse(text.trim()).ok())
}

/// Every cgroup of the fake tree below the root, parents before children.
fn cgroups(fs: &CgroupFs) -> Vec<CgroupPath> {
    let mut out = Vec::new();
    let mut stack = vec![CgroupPath::root()];
    while let Some(at) = stack.pop() {
        if let Ok(entries) = fs.list(&at) {
            for entry in entries.iter().filter(|e| e.kind == FileKind::Directory) {
                if let Ok(child) = at.join(&entry.name) {
                    stack.push(child.clone());
                    out.push(child);
                }
            }
        }
    }
    out.sort_by_key(|p| p.depth());
    out
}

/// See [`after_write`].
pub(crate) fn settle_partitions(fs: &CgroupFs) {
    let root = CgroupPath::root();
    let (exclusive, partition) = (
        InterfaceFile::CpusetCpusExclusive,
        InterfaceFile::CpusetCpusPartition,
    );
    let old_isolated = read_set(fs, &root, InterfaceFile::CpusetCpusIsolated).unwrap_or_default();
    let effective = read_set(fs, &root, InterfaceFile::CpusetCpusEffective);
    let all = effective.clone().unwrap_or_default().union(&old_isolated);
    // `isolcpus=` cpus are listed too, and stay in the root's effective set (6.12 in the VM:
    // isolated `2-3,7`, effective `0-1,4-7` with isolcpus=7 and a partition of 2-3).
    let boot_isolated = match &effective {
        Some(effective) => old_isolated.intersection(effective),
        None => CpuSet::new(),
    };
    let mut handed: std::collections::HashMap<CgroupPath, CpuSet> = Default::default();
    let mut isolated = CpuSet::new();
    for path in cgroups(fs) {
        let own = read_set(fs, &path, exclusive).unwrap_or_default();
        // The root holds every cpu (all of its own where the tree does not say which).
        let parent_held = match path.parent().filter(|p| !p.is_root()) {
            Some(parent) => handed.get(&parent).cloned().unwrap_or_default(),
            None if effective.is_some() => all.clone(),
            None => own.clone(),
        };
        let held = own.intersection(&parent_held);
        handed.insert(path.clone(), held.clone());
        let Ok(state) = fs.read(&path, partition) else {
            continue;
        };
        if !state.trim().starts_with("isolated") {
            continue;
        }
        let verdict = if held.is_empty() {
            "isolated invalid (Parent is not a partition root)".to_string()
        } else if !held.intersection(&isolated).is_empty()
            || (!all.is_empty() && all.is_subset(&held))
        {
            "isolated invalid (Invalid cpu list in cpuset.cpus.exclusive)".to_string()
        } else {
            isolated.extend_from(&held);
            "isolated".to_string()
        };
        if state.trim() != verdict {
            let _ = std::fs::write(fs.host_path(&path).join(partition.name()), verdict + "\n");
        }
    }
    let _ = std::fs::write(
        fs.host_path(&root)
            .join(InterfaceFile::CpusetCpusIsolated.name()),
        format!("{}\n", isolated.union(&boot_isolated)),
    );
    if effective.is_some() {
        let _ = std::fs::write(
            fs.host_path(&root)
                .join(InterfaceFile::CpusetCpusEffective.name()),
            format!("{}\n", all.difference(&isolated)),
        );
    }
}

#[allow(clippy::too_many_lines)]
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_cgroup_v1_refuses() {
        let dir = tempfile::tempdir().unwrap();
        for (rel, cpus) in [
            ("kp", "0-3"),
            ("kp/pod", "0-3"),
            ("kp/pod/c", "2-3"),
            ("kp/new", ""),
        ] {
            std::fs::create_dir_all(dir.path().join(rel)).unwrap();
            std::fs::write(
                dir.path().join(rel).join("cpuset.cpus"),
                format!("{cpus}\n"),
            )
            .unwrap();
        }
        let fs = CgroupFs::open(dir.path()).unwrap();
        let path = |p: &str| CgroupPath::new(p).unwrap();
        let cpus = InterfaceFile::CpusetCpus;
        let log = dir.path().join("refused.log");
        let errno = |r: Result<(), io::Error>| r.unwrap_err().raw_os_error();
        // A parent shrunk under a child: EBUSY.
        assert_eq!(
            errno(rules(
                &fs,
                &path("kp/pod"),
                cpus,
                "0-1",
                Some(log.as_os_str())
            )),
            Some(Errno::EBUSY as i32)
        );
        // A child outside its parent: EACCES.
        assert_eq!(
            errno(rules(&fs, &path("kp/pod/c"), cpus, "4", None)),
            Some(Errno::EACCES as i32)
        );
        // Empty: EINVAL.
        assert_eq!(
            errno(rules(&fs, &path("kp/pod/c"), cpus, "", None)),
            Some(Errno::EINVAL as i32)
        );
        // Fine: narrowing a leaf, widening a parent, an uninitialised child, other files.
        rules(&fs, &path("kp/pod/c"), cpus, "3", None).unwrap();
        rules(&fs, &path("kp/pod"), cpus, "0-3", None).unwrap();
        rules(&fs, &path("kp/new"), cpus, "1", None).unwrap();
        rules(&fs, &path("kp/pod"), InterfaceFile::CpuShares, "2", None).unwrap();
        // The root's sets are the kernel's: EACCES.
        assert_eq!(
            errno(rules(&fs, &CgroupPath::root(), cpus, "0-1", None)),
            Some(Errno::EACCES as i32)
        );
        // The load balancing flag takes a number, and nothing else: EINVAL (as 6.1 does).
        let flag = InterfaceFile::CpusetSchedLoadBalance;
        for good in ["0", "1", "2", "0\n"] {
            rules(&fs, &path("kp/pod"), flag, good, None).unwrap();
        }
        for bad in ["x", "-1", "", " 1", "1 "] {
            assert_eq!(
                errno(rules(&fs, &path("kp/pod"), flag, bad, None)),
                Some(Errno::EINVAL as i32),
                "{bad:?}"
            );
        }
        // Remote partitions (v2, 6.7+): within the parent's exclusive cpus, keeping the
        // children's, never a sibling's; three partition types.
        let excl = InterfaceFile::CpusetCpusExclusive;
        for (rel, cpus) in [("kp", "2-3"), ("kp/pod", "2"), ("kp/new", "")] {
            std::fs::write(dir.path().join(rel).join(excl.name()), format!("{cpus}\n")).unwrap();
        }
        rules(&fs, &path("kp/pod/c"), excl, "2", None).unwrap();
        rules(&fs, &path("kp/pod"), excl, "", None).unwrap();
        assert_eq!(
            errno(rules(&fs, &path("kp"), excl, "3", None)),
            Some(Errno::EBUSY as i32),
            "a child's"
        );
        assert_eq!(
            errno(rules(&fs, &path("kp/pod/c"), excl, "3", None)),
            Some(Errno::EINVAL as i32),
            "outside the parent's"
        );
        assert_eq!(
            errno(rules(&fs, &path("kp/new"), excl, "2", None)),
            Some(Errno::EINVAL as i32),
            "a sibling's"
        );
        let part = InterfaceFile::CpusetCpusPartition;
        for good in ["member", "root", "isolated\n"] {
            rules(&fs, &path("kp/pod"), part, good, None).unwrap();
        }
        assert_eq!(
            errno(rules(&fs, &path("kp/pod"), part, "isolated invalid", None)),
            Some(Errno::EINVAL as i32)
        );
        let logged = std::fs::read_to_string(&log).unwrap();
        assert!(
            logged.contains("kp/pod/cpuset.cpus = \"0-1\": EBUSY"),
            "{logged}"
        );
    }

    /// cgroup v2's effective sets after a write: an empty `cpuset.cpus` follows the parent's
    /// effective set, cpus of its own are taken within it (all of the parent's where none
    /// are), down the whole subtree; v1 trees (no `cpuset.cpus.effective`) are left alone.
    #[test]
    fn v2_effective_sets_follow_the_kernels_rule() {
        let dir = tempfile::tempdir().unwrap();
        let put = |rel: &str, file: &str, value: &str| {
            std::fs::create_dir_all(dir.path().join(rel)).unwrap();
            std::fs::write(dir.path().join(rel).join(file), format!("{value}\n")).unwrap();
        };
        put("", "cpuset.cpus.effective", "0-7");
        for (rel, cpus) in [
            ("kp", ""),
            ("kp/qos", ""),
            ("kp/qos/pod", ""),
            ("kp/qos/pod/c", ""),
            ("kp/qos/pod/own", "6-9"),
            ("kp/qos/pod/away", "9"),
        ] {
            put(rel, "cpuset.cpus", cpus);
            put(rel, "cpuset.cpus.effective", "0-7");
        }
        let fs = CgroupFs::open(dir.path()).unwrap();
        let path = |p: &str| CgroupPath::new(p).unwrap();
        let effective = |p: &str| {
            read_set(&fs, &path(p), InterfaceFile::CpusetCpusEffective)
                .unwrap()
                .to_string()
        };
        put("kp/qos", "cpuset.cpus", "1-6");
        settle_effective(&fs, &path("kp/qos"), InterfaceFile::CpusetCpus);
        assert_eq!(effective("kp"), "0-7", "above the write: unchanged");
        assert_eq!(effective("kp/qos"), "1-6");
        assert_eq!(effective("kp/qos/pod"), "1-6", "empty: the parent's");
        assert_eq!(effective("kp/qos/pod/c"), "1-6", "empty below empty");
        assert_eq!(
            effective("kp/qos/pod/own"),
            "6",
            "its own within the parent's"
        );
        assert_eq!(
            effective("kp/qos/pod/away"),
            "1-6",
            "none of its own: the parent's"
        );
        // Widened again: the followers widen with it.
        put("kp/qos", "cpuset.cpus", "0-7");
        settle_effective(&fs, &path("kp/qos"), InterfaceFile::CpusetCpus);
        assert_eq!(effective("kp/qos/pod/c"), "0-7");
        assert_eq!(effective("kp/qos/pod/own"), "6-7");

        // v1: no `cpuset.cpus.effective`, nothing is made.
        let v1 = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(v1.path().join("kp")).unwrap();
        std::fs::write(v1.path().join("kp/cpuset.cpus"), "1\n").unwrap();
        let fs = CgroupFs::open(v1.path()).unwrap();
        settle_effective(&fs, &path("kp"), InterfaceFile::CpusetCpus);
        assert!(!v1.path().join("kp/cpuset.cpus.effective").exists());
    }

    /// v1's `update_cpumask`/`update_nodemask`: a cpu (memory node) the root cpuset does not
    /// have, i.e. one that is offline, is refused with EINVAL, before any other check.
    #[test]
    fn refuses_offline_cpus_and_memory_nodes() {
        let dir = tempfile::tempdir().unwrap();
        for (rel, cpus) in [("", "0-4,6-7"), ("system.slice", "0"), ("kp", "0-4,6-7")] {
            std::fs::create_dir_all(dir.path().join(rel)).unwrap();
            std::fs::write(
                dir.path().join(rel).join("cpuset.cpus"),
                format!("{cpus}\n"),
            )
            .unwrap();
            std::fs::write(dir.path().join(rel).join("cpuset.mems"), "0\n").unwrap();
        }
        let fs = CgroupFs::open(dir.path()).unwrap();
        let path = |p: &str| CgroupPath::new(p).unwrap();
        let errno = |r: Result<(), io::Error>| r.unwrap_err().raw_os_error();
        let cpus = InterfaceFile::CpusetCpus;
        assert_eq!(
            errno(rules(&fs, &path("system.slice"), cpus, "0-7", None)),
            Some(Errno::EINVAL as i32)
        );
        rules(&fs, &path("system.slice"), cpus, "0-4,6-7", None).unwrap();
        assert_eq!(
            errno(rules(
                &fs,
                &path("kp"),
                InterfaceFile::CpusetMems,
                "0-1",
                None
            )),
            Some(Errno::EINVAL as i32)
        );
    }
}
