//! The watcher: one thread (`cpusetd-watcher`) that follows the kubepods subtree with inotify
//! and tells the controller what changed, as plain [`TreeEvent`] values on a bounded channel.
//! It reads directories, never writes to cgroupfs, and decides nothing.
//!
//! It watches one or more [`WatchRoot`]s: on cgroup v1 the kubepods cgroup under the cpuset mount
//! and the same cgroup under the cpu controller mount (where the CPU settings live), on v2 the
//! one unified tree. Paths in events are relative to the controller root, like
//! [`ScannedCgroup::path`](crate::cgroupfs::ScannedCgroup::path), so the same relative path may be
//! reported from both v1 trees.
//!
//! Rules it keeps:
//! * **Watch first, then list.** A new directory gets its watch before it is listed, and every
//!   child directory the listing finds is reported and handled the same way, parent first; a
//!   directory created at any moment is therefore either listed or announced by inotify.
//! * **Silent start.** [`Watcher::new`] watches the existing tree and reports nothing about it:
//!   when it returns, every directory is watched, so a full scan made afterwards plus the events
//!   miss nothing.
//! * **Each change once.** A directory is reported `Created` when its watch is first added (a
//!   directory found both by a listing and by its own creation event is reported once);
//!   `Removed` comes from the parent's `IN_DELETE`/`IN_MOVED_FROM`, and from the directory's own
//!   `IN_DELETE_SELF`/`IN_MOVE_SELF` only for a kubepods root.
//! * **Bounded and never following symlinks**: `IN_DONT_FOLLOW | IN_ONLYDIR` on every watch,
//!   symlinks skipped when listing, nothing deeper than [`MAX_WATCH_DEPTH`] below a root (the
//!   scan's bound), at most [`MAX_WATCHED_DIRS`] directories per root.
//! * **Lost events become one rescan request.** `IN_Q_OVERFLOW` (the watches are re-synchronised
//!   with the tree first), a directory that cannot be watched (e.g. `ENOSPC`, the watch limit), a
//!   kubepods root that goes away, or a failed read each yield [`TreeEvent::Rescan`]. When the
//!   channel is full the watcher neither blocks nor drops silently: it keeps its watches up to
//!   date, drops detail events, and delivers a single `Rescan { reason: ChannelFull }` as soon as
//!   there is room.
//!
//! cgroupfs differs from ordinary filesystems: removing a cgroup directory sends `IN_DELETE` to
//! the parent's watch but neither `IN_DELETE_SELF` nor `IN_IGNORED` to the directory's own
//! watch, which would stay in the kernel (and count against `max_user_watches`) for good. So the
//! watcher removes a child's watch itself when its parent reports the deletion, and notices the
//! removal of a kubepods root through a watch on the root's parent directory (its "anchor"), which
//! also brings a re-created root back under watch.

use std::collections::hash_map::{HashMap, RandomState};
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::hash::BuildHasher;
use std::io;
use std::mem;
use std::num::NonZeroI32;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};
use inotify::{Event, EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::cgroupfs::{
    CgroupError, CgroupFs, CgroupLayout, CgroupPath, CgroupVersion, FileKind, InterfaceFile,
    MAX_SCAN_CGROUPS, MAX_SCAN_DEPTH,
};
use crate::logging::error_chain;

/// The watcher thread's name.
pub const THREAD_NAME: &str = "cpusetd-watcher";
/// Deepest directory watched, counted from the kubepods root: the scan's bound.
pub const MAX_WATCH_DEPTH: usize = MAX_SCAN_DEPTH;
/// Most directories watched per root: the scan's bound. Beyond it a directory is reported but
/// not watched, and a rescan is requested (as for the kernel's watch limit).
pub const MAX_WATCHED_DIRS: usize = MAX_SCAN_CGROUPS;
/// The interface files whose modification is reported: the cpuset and the CPU settings.
pub const WATCHED_FILES: [InterfaceFile; 6] = [
    InterfaceFile::CpusetCpus,
    InterfaceFile::CpusetMems,
    InterfaceFile::CpuMax,
    InterfaceFile::CpuCfsQuotaUs,
    InterfaceFile::CpuShares,
    InterfaceFile::CpuWeight,
];

/// Events of a directory below a root: children coming and going, files written.
const DIR_MASK: WatchMask = WatchMask::CREATE
    .union(WatchMask::DELETE)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::MODIFY)
    .union(WatchMask::ONLYDIR)
    .union(WatchMask::DONT_FOLLOW);
/// A kubepods root also reports its own removal or renaming (its parent is not watched).
const ROOT_MASK: WatchMask = DIR_MASK
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::MOVE_SELF);
/// The parent of a kubepods root: only children coming and going (filtered by name).
const ANCHOR_MASK: WatchMask = WatchMask::CREATE
    .union(WatchMask::DELETE)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::ONLYDIR)
    .union(WatchMask::DONT_FOLLOW);

/// Room for ~2,000 events per read: a burst costs few system calls.
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// Reads per wake-up before the stop pipe is looked at again.
const READS_PER_WAKE: usize = 64;
/// Consecutive failed reads after which the thread gives up (the controller sees the channel
/// disconnect and the reconcile tick still runs).
const FATAL_READ_FAILURES: u32 = 3;
/// Retry interval for delivering the pending `ChannelFull` rescan, doubled up to the maximum.
/// Only while the channel is full: an idle watcher sleeps in `poll` without a timeout.
const RETRY_MIN: Duration = Duration::from_millis(1);
const RETRY_MAX: Duration = Duration::from_millis(200);
/// A recurring problem is logged as a warning at most once per this interval.
const WARN_INTERVAL: Duration = Duration::from_secs(60);

/// Something that changed in a watched tree. Paths are relative to the controller root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeEvent {
    /// A cgroup directory appeared (created or moved in), and is now watched unless a
    /// `Rescan { reason: WatchFailed }` follows.
    Created { cgroup: CgroupPath },
    /// A cgroup directory went away (removed or moved out), with everything below it.
    Removed { cgroup: CgroupPath },
    /// One of the [`WATCHED_FILES`] of a cgroup was written (by anyone, the agent included).
    Modified {
        cgroup: CgroupPath,
        file: InterfaceFile,
    },
    /// Events were lost or cannot be trusted: scan the whole tree.
    Rescan { reason: RescanReason },
}

/// Why the watcher asks for a full rescan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RescanReason {
    /// The kernel's event queue overflowed (`IN_Q_OVERFLOW`); the watches were re-synchronised
    /// with the tree before this was sent.
    QueueOverflow,
    /// A directory could not be watched or listed (e.g. `ENOSPC`: the inotify watch limit), so
    /// changes below it are seen by scans only.
    WatchFailed,
    /// A kubepods root was removed, renamed away or unmounted.
    RootGone,
    /// Reading the inotify descriptor failed.
    ReadError,
    /// The channel to the controller was full and detail events were dropped.
    ChannelFull,
}

impl fmt::Display for RescanReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RescanReason::QueueOverflow => "the inotify queue overflowed",
            RescanReason::WatchFailed => "a directory could not be watched",
            RescanReason::RootGone => "a kubepods root went away",
            RescanReason::ReadError => "reading inotify events failed",
            RescanReason::ChannelFull => "the controller fell behind",
        })
    }
}

/// One tree to watch: the kubepods cgroup below a controller root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchRoot {
    /// The controller mount (v1) or the unified root (v2).
    pub controller_root: PathBuf,
    /// The kubepods cgroup, relative to `controller_root`.
    pub kubepods: CgroupPath,
}

impl WatchRoot {
    /// The trees of a layout: the cpuset one, and on v1 the cpu one when it is a different mount.
    pub fn of_layout(layout: &CgroupLayout) -> Vec<WatchRoot> {
        let mut roots = vec![WatchRoot {
            controller_root: layout.cpuset_root.clone(),
            kubepods: layout.kubepods.clone(),
        }];
        if layout.version == CgroupVersion::V1 && layout.cpu_root != layout.cpuset_root {
            roots.push(WatchRoot {
                controller_root: layout.cpu_root.clone(),
                kubepods: layout.kubepods.clone(),
            });
        }
        roots
    }
}

/// Why the watcher could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("cannot create an inotify instance (see fs.inotify.max_user_instances)")]
    Init {
        #[source]
        source: io::Error,
    },
    #[error("cannot watch {path}")]
    Root {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("the watch roots {inner} and {outer} overlap: give disjoint trees")]
    Overlap { inner: PathBuf, outer: PathBuf },
    #[error("{count} watch roots given, at most {max} are supported")]
    TooManyRoots { count: usize, max: usize },
    #[error("cannot create the watcher's stop pipe")]
    Pipe {
        #[source]
        source: io::Error,
    },
    #[error("cannot start the watcher thread")]
    Spawn {
        #[source]
        source: io::Error,
    },
    #[error("cannot wait for inotify events")]
    Poll {
        #[source]
        source: io::Error,
    },
    #[error("cannot read inotify events")]
    Read {
        #[source]
        source: io::Error,
    },
    #[error("the watcher thread did not stop within {timeout:?}")]
    StopTimeout { timeout: Duration },
    #[error("the watcher thread panicked")]
    Panicked,
}

impl WatchError {
    /// Whether this is inotify running out of a per-user limit (`fs.inotify.max_user_watches`,
    /// `max_user_instances`) or of memory: the node is fine, the agent can work without
    /// events, by scanning.
    pub fn is_limit(&self) -> bool {
        let source = match self {
            WatchError::Init { source } | WatchError::Root { source, .. } => source,
            _ => return false,
        };
        matches!(
            source.raw_os_error().map(Errno::from_raw),
            Some(Errno::ENOSPC | Errno::EMFILE | Errno::ENFILE | Errno::ENOMEM)
        )
    }
}

/// Whether a walk reports the directories it adopts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Report {
    /// Start-up and re-synchronisation: watch everything, report nothing, descend everywhere.
    Silent,
    /// New directories: report each once, skip what is already watched.
    Created,
}

/// A watched directory. Compact on purpose: with 10,000 pods' cgroups in two v1 trees this is
/// kept for tens of thousands of directories. The path is not stored, only the name and the
/// parent's watch, so a rename needs no rewriting of descendants.
struct WatchedDir<W> {
    /// The watch, for `inotify_rm_watch` (the kernel does not always drop it itself).
    handle: W,
    /// The directory's name; empty for a kubepods root.
    name: Box<[u8]>,
    /// The parent's watch descriptor; `None` for a kubepods root.
    parent: Option<NonZeroI32>,
    /// Index of the [`WatchRoot`].
    root: u16,
    /// Depth below the kubepods root (0 for the root).
    depth: u8,
}

impl<W> WatchedDir<W> {
    fn is(&self, parent: i32, name: &[u8]) -> bool {
        self.parent.map(NonZeroI32::get) == Some(parent) && *self.name == *name
    }
}

/// The watched directories by watch descriptor, with an index from (parent, name) to child.
///
/// The index stores a 64-bit hash of (parent, name) instead of the name, so a directory's name
/// is kept once. A lookup checks the name; the rare directory that could not be indexed (a hash
/// collision) is found by a linear search, which only happens while such a directory exists.
struct DirTable<W, S = RandomState> {
    dirs: HashMap<i32, WatchedDir<W>>,
    children: HashMap<u64, i32>,
    /// Live directories with a parent that the index does not point at.
    unindexed: usize,
    hasher: S,
}

impl<W> DirTable<W> {
    fn new() -> Self {
        DirTable::with_hasher(RandomState::new())
    }
}

impl<W, S: BuildHasher> DirTable<W, S> {
    fn with_hasher(hasher: S) -> Self {
        DirTable {
            dirs: HashMap::new(),
            children: HashMap::new(),
            unindexed: 0,
            hasher,
        }
    }

    fn len(&self) -> usize {
        self.dirs.len()
    }

    fn get(&self, wd: i32) -> Option<&WatchedDir<W>> {
        self.dirs.get(&wd)
    }

    fn key(&self, parent: NonZeroI32, name: &[u8]) -> u64 {
        self.hasher.hash_one((parent.get(), name))
    }

    /// Records `dir` under `wd`, replacing what was recorded there; returns the old entry.
    fn insert(&mut self, wd: i32, dir: WatchedDir<W>) -> Option<WatchedDir<W>> {
        let old = self.remove(wd);
        if let Some(parent) = dir.parent {
            let key = self.key(parent, &dir.name);
            match self.children.get(&key).copied() {
                None => {
                    self.children.insert(key, wd);
                }
                Some(holder) => {
                    let same_place = self
                        .dirs
                        .get(&holder)
                        .is_some_and(|h| h.parent == dir.parent && h.name == dir.name);
                    if same_place {
                        // A newer directory of the same name: it takes the index entry.
                        self.children.insert(key, wd);
                    }
                    // Either the old holder or the new directory is now unindexed.
                    self.unindexed += 1;
                }
            }
        }
        self.dirs.insert(wd, dir);
        old
    }

    /// Forgets `wd`; returns what was recorded.
    fn remove(&mut self, wd: i32) -> Option<WatchedDir<W>> {
        let dir = self.dirs.remove(&wd)?;
        if let Some(parent) = dir.parent {
            let key = self.key(parent, &dir.name);
            if self.children.get(&key) == Some(&wd) {
                self.children.remove(&key);
            } else {
                self.unindexed = self.unindexed.saturating_sub(1);
            }
        }
        Some(dir)
    }

    /// The watch of the child `name` of the directory watched by `parent`.
    fn child(&self, parent: i32, name: &[u8]) -> Option<i32> {
        let parent_nz = NonZeroI32::new(parent)?;
        if let Some(&wd) = self.children.get(&self.key(parent_nz, name)) {
            if self.dirs.get(&wd).is_some_and(|d| d.is(parent, name)) {
                return Some(wd);
            }
        }
        if self.unindexed == 0 {
            return None;
        }
        self.dirs
            .iter()
            .find(|(_, d)| d.is(parent, name))
            .map(|(&wd, _)| wd)
    }

    /// `wd` and every directory below it, parents before children. Linear in the table: for
    /// renames, which cgroupfs allows only within one parent and nobody does in practice.
    fn subtree(&self, wd: i32) -> Vec<i32> {
        let mut below: Vec<(u8, i32)> = self
            .dirs
            .iter()
            .filter(|(&id, _)| self.is_below(id, wd))
            .map(|(&id, d)| (d.depth, id))
            .collect();
        below.sort_unstable();
        below.into_iter().map(|(_, id)| id).collect()
    }

    fn is_below(&self, mut id: i32, ancestor: i32) -> bool {
        for _ in 0..=MAX_WATCH_DEPTH + 1 {
            if id == ancestor {
                return true;
            }
            match self.dirs.get(&id).and_then(|d| d.parent) {
                Some(parent) => id = parent.get(),
                None => return false,
            }
        }
        false
    }

    /// Every directory of one root.
    fn of_root(&self, root: u16) -> Vec<i32> {
        self.dirs
            .iter()
            .filter(|(_, d)| d.root == root)
            .map(|(&id, _)| id)
            .collect()
    }

    /// The path of `wd` relative to its controller root; `kubepods[i]` is root `i`'s path.
    fn path(&self, wd: i32, kubepods: &[CgroupPath]) -> Option<CgroupPath> {
        let mut names: Vec<&[u8]> = Vec::with_capacity(8);
        let mut dir = self.dirs.get(&wd)?;
        for _ in 0..=MAX_WATCH_DEPTH + 1 {
            match dir.parent {
                Some(parent) => {
                    names.push(&dir.name);
                    dir = self.dirs.get(&parent.get())?;
                }
                None => {
                    let base = kubepods.get(usize::from(dir.root))?;
                    let mut bytes = base.as_path().as_os_str().as_bytes().to_vec();
                    for name in names.iter().rev() {
                        if !bytes.is_empty() {
                            bytes.push(b'/');
                        }
                        bytes.extend_from_slice(name);
                    }
                    return CgroupPath::from_os(OsStr::from_bytes(&bytes)).ok();
                }
            }
        }
        None
    }

    fn take(&mut self) -> HashMap<i32, WatchedDir<W>> {
        self.children.clear();
        self.unindexed = 0;
        mem::take(&mut self.dirs)
    }
}

/// One root as the watcher follows it.
#[derive(Debug)]
struct RootState {
    /// With a canonical controller root, so that `IN_DONT_FOLLOW` never meets a configured
    /// symlink.
    spec: WatchRoot,
    fs: CgroupFs,
    /// The kubepods directory's watch while it exists.
    wd: Option<i32>,
    /// The watch on the kubepods directory's parent; `None` when kubepods is the controller
    /// root itself (or the parent went away).
    anchor: Option<i32>,
    /// Directories of this root in the table.
    dirs: usize,
}

impl RootState {
    fn host_path(&self, cgroup: &CgroupPath) -> PathBuf {
        cgroup.under(&self.spec.controller_root)
    }
}

/// Where events go: the channel, with the channel-full collapse.
#[derive(Debug)]
struct Outbox {
    sender: Option<Sender<TreeEvent>>,
    /// A `Rescan { ChannelFull }` is owed; detail events are dropped until it is delivered.
    full: bool,
    /// The controller dropped its receiver: nobody is listening.
    disconnected: bool,
    /// Told after each event delivered that may need the controller's attention at once (see
    /// [`Watcher::arrivals`]).
    arrivals: Option<Sender<()>>,
}

impl Outbox {
    fn send(&mut self, event: TreeEvent, throttle: &mut Throttle) {
        let Some(sender) = &self.sender else {
            return;
        };
        if self.full || self.disconnected {
            return;
        }
        let arrival = matches!(
            event,
            TreeEvent::Created { .. }
                | TreeEvent::Rescan { .. }
                | TreeEvent::Modified {
                    file: InterfaceFile::CpuShares | InterfaceFile::CpuWeight,
                    ..
                }
        );
        match sender.try_send(event) {
            Ok(()) => {
                // After the event: when the token is seen, the event is queued. A full channel
                // already says so.
                if let (true, Some(arrivals)) = (arrival, &self.arrivals) {
                    let _ = arrivals.try_send(());
                }
            }
            Err(TrySendError::Full(_)) => {
                self.full = true;
                if throttle.allow("channel-full") {
                    log::warn!(
                        "the controller is behind: tree events are dropped until a rescan request gets through"
                    );
                } else {
                    log::debug!("event channel full: dropping tree events");
                }
            }
            Err(TrySendError::Disconnected(_)) => self.disconnected = true,
        }
    }

    /// Tries to deliver the owed rescan; true when nothing is owed any more.
    fn flush(&mut self) -> bool {
        let Some(sender) = &self.sender else {
            return true;
        };
        if !self.full || self.disconnected {
            return true;
        }
        let rescan = TreeEvent::Rescan {
            reason: RescanReason::ChannelFull,
        };
        match sender.try_send(rescan) {
            Ok(()) => {
                self.full = false;
                log::debug!("rescan request delivered after the event channel was full");
                true
            }
            Err(TrySendError::Full(_)) => false,
            Err(TrySendError::Disconnected(_)) => {
                self.disconnected = true;
                true
            }
        }
    }
}

/// Rate limit for recurring warnings: a warning per key and interval, debug lines in between.
#[derive(Debug, Default)]
struct Throttle {
    last: HashMap<&'static str, Instant>,
}

impl Throttle {
    fn allow(&mut self, key: &'static str) -> bool {
        let now = Instant::now();
        match self.last.get(key) {
            Some(at) if now.duration_since(*at) < WARN_INTERVAL => false,
            _ => {
                self.last.insert(key, now);
                true
            }
        }
    }
}

/// Whether an event that should go ahead of a long rewrite has been sent since the controller
/// last looked: a non-empty channel of tokens, one at most, sent by the watcher after the event
/// itself (see [`Watcher::arrivals`]). Echoes of the agent's own writes (`IN_MODIFY` of the
/// cpuset files, thousands in a rewrite of the shared pool) send none, which is why this is
/// not the event channel's own length. Nothing is shared but the channel.
#[derive(Debug, Clone)]
pub struct Arrivals {
    tokens: Receiver<()>,
}

impl Arrivals {
    /// A sender of tokens and the [`Arrivals`] that sees them (the watcher's, or a test's).
    pub fn channel() -> (Sender<()>, Arrivals) {
        let (tx, tokens) = crossbeam_channel::bounded(1);
        (tx, Arrivals { tokens })
    }

    /// Forgets what arrived so far: called just before the event channel is drained, never at
    /// a pass's start (a token sent while the pass is planned is for an event still queued).
    pub fn forget(&self) {
        while self.tokens.try_recv().is_ok() {}
    }

    /// Something arrived since the last [`Arrivals::forget`].
    pub fn arrived(&self) -> bool {
        !self.tokens.is_empty()
    }
}

/// The inotify watches over the roots, set up and not yet running. See the module docs.
pub struct Watcher {
    inotify: Inotify,
    watches: Watches,
    roots: Vec<RootState>,
    /// `roots[i].spec.kubepods`, for building paths.
    kubepods: Vec<CgroupPath>,
    table: DirTable<WatchDescriptor>,
    out: Outbox,
    /// Set by `IN_Q_OVERFLOW`: re-synchronise the watches at the end of the batch.
    resync_needed: bool,
    /// The rescan to request at the end of the batch.
    rescan: Option<RescanReason>,
    read_failures: u32,
    throttle: Throttle,
}

impl fmt::Debug for Watcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watcher")
            .field("roots", &self.roots)
            .field("watched_dirs", &self.table.len())
            .finish_non_exhaustive()
    }
}

/// The roots to watch, each resolved (its controller root canonicalised) and opened, once
/// each. Two roots of which one holds the other, or more than `u16::MAX` of them, are errors.
fn root_states(roots: Vec<WatchRoot>) -> Result<Vec<RootState>, WatchError> {
    let mut states: Vec<RootState> = Vec::new();
    for root in roots {
        let controller_root =
            std::fs::canonicalize(&root.controller_root).map_err(|source| WatchError::Root {
                path: root.controller_root.clone(),
                source,
            })?;
        let spec = WatchRoot {
            controller_root,
            kubepods: root.kubepods,
        };
        if states.iter().any(|s| s.spec == spec) {
            continue;
        }
        for other in &states {
            if other.spec.controller_root != spec.controller_root {
                continue;
            }
            let (a, b) = (&spec.kubepods, &other.spec.kubepods);
            if a.strip_prefix(b).is_some() || b.strip_prefix(a).is_some() {
                let (inner, outer) = if a.depth() >= b.depth() {
                    (a, b)
                } else {
                    (b, a)
                };
                return Err(WatchError::Overlap {
                    inner: inner.under(&spec.controller_root),
                    outer: outer.under(&spec.controller_root),
                });
            }
        }
        let fs = CgroupFs::open(&spec.controller_root)?;
        states.push(RootState {
            spec,
            fs,
            wd: None,
            anchor: None,
            dirs: 0,
        });
    }
    if states.len() > usize::from(u16::MAX) {
        return Err(WatchError::TooManyRoots {
            count: states.len(),
            max: usize::from(u16::MAX),
        });
    }
    Ok(states)
}

impl Watcher {
    /// Watches every directory of the roots (silently: nothing is reported about what exists).
    /// When this returns, a full scan plus the events of [`Watcher::start`] miss nothing.
    ///
    /// A missing kubepods directory is waited for (its parent is watched) and reported as
    /// created when it appears; a root whose parent cannot be watched either is an error.
    pub fn new(roots: Vec<WatchRoot>) -> Result<Watcher, WatchError> {
        let inotify = Inotify::init().map_err(|source| WatchError::Init { source })?;
        let watches = inotify.watches();
        let states = root_states(roots)?;
        let kubepods = states.iter().map(|s| s.spec.kubepods.clone()).collect();
        let mut watcher = Watcher {
            inotify,
            watches,
            roots: states,
            kubepods,
            table: DirTable::new(),
            out: Outbox {
                sender: None,
                full: false,
                disconnected: false,
                arrivals: None,
            },
            resync_needed: false,
            rescan: None,
            read_failures: 0,
            throttle: Throttle::default(),
        };
        for index in 0..watcher.roots.len() {
            let index = u16::try_from(index).expect("checked above");
            watcher.set_up_root(index)?;
        }
        // The controller's first scan follows; nothing is owed for what failed at start.
        watcher.rescan = None;
        log::info!(
            "watching {} directories under {}",
            watcher.table.len(),
            watcher
                .roots
                .iter()
                .map(|r| r.host_path(&r.spec.kubepods).display().to_string())
                .collect::<Vec<_>>()
                .join(" and ")
        );
        Ok(watcher)
    }

    /// [`Watcher::new`], then [`Watcher::start`].
    pub fn spawn(
        roots: Vec<WatchRoot>,
        events: Sender<TreeEvent>,
    ) -> Result<WatcherHandle, WatchError> {
        Watcher::new(roots)?.start(events)
    }

    /// Number of directories watched (anchors not counted).
    pub fn watched_dirs(&self) -> usize {
        self.table.len()
    }

    /// The events sent from now on that may need the controller at once: a new cgroup, a
    /// rescan request, or new CPU settings (`cpu.shares`, `cpu.weight`: written by runtimes,
    /// never by the agent, so never an echo of its own writes). The controller looks between
    /// writes, to let a new container go ahead of a long rewrite of the shared pool. (One
    /// [`Arrivals`] per watcher: a second call replaces the first.)
    pub fn arrivals(&mut self) -> Arrivals {
        let (tx, arrivals) = Arrivals::channel();
        self.out.arrivals = Some(tx);
        arrivals
    }

    /// Starts the thread, which sends events on `events` until stopped, until the receiver is
    /// dropped, or until inotify fails for good.
    pub fn start(mut self, events: Sender<TreeEvent>) -> Result<WatcherHandle, WatchError> {
        let (stop_rx, stop_tx) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(|errno| {
                WatchError::Pipe {
                    source: io::Error::from(errno),
                }
            })?;
        let (finished_tx, finished_rx) = crossbeam_channel::bounded::<()>(0);
        self.out.sender = Some(events);
        let thread = thread::Builder::new()
            .name(THREAD_NAME.to_string())
            .spawn(move || {
                // Dropped when the thread ends, however it ends: `join` waits for that.
                let _finished = finished_tx;
                let result = self.run(&stop_rx);
                if let Err(err) = &result {
                    log::error!("the watcher stopped: {}", error_chain(err));
                }
                result
            })
            .map_err(|source| WatchError::Spawn { source })?;
        Ok(WatcherHandle {
            stop: Some(stop_tx),
            finished: finished_rx,
            thread: Some(thread),
        })
    }

    /// Watches the kubepods directory of root `index` and everything below it, or its parent
    /// when it does not exist yet. Start-up only.
    fn set_up_root(&mut self, index: u16) -> Result<(), WatchError> {
        let state = &self.roots[usize::from(index)];
        #[cfg(debug_assertions)]
        if let Some(source) = crate::faults::start_watch() {
            return Err(WatchError::Root {
                path: state.host_path(&state.spec.kubepods),
                source,
            });
        }
        if let Some(parent) = state.spec.kubepods.parent() {
            let path = state.host_path(&parent);
            let anchor = self
                .watches
                .add(&path, ANCHOR_MASK)
                .map_err(|source| WatchError::Root { path, source })?;
            self.roots[usize::from(index)].anchor = Some(anchor.get_watch_descriptor_id());
        }
        let state = &self.roots[usize::from(index)];
        let path = state.host_path(&state.spec.kubepods);
        let anchored = state.anchor.is_some();
        match self.attach_root(index, Report::Silent) {
            Ok(()) => Ok(()),
            Err(err) if is_gone(&err) && anchored => {
                log::warn!(
                    "{} does not exist (yet): watching for it to appear",
                    path.display()
                );
                Ok(())
            }
            Err(source) => Err(WatchError::Root { path, source }),
        }
    }

    /// Watches a kubepods root and walks it. Fails only when the root itself cannot be watched.
    fn attach_root(&mut self, index: u16, report: Report) -> io::Result<()> {
        let state = &self.roots[usize::from(index)];
        let host = state.host_path(&state.spec.kubepods);
        let handle = self.watches.add(&host, ROOT_MASK)?;
        let id = handle.get_watch_descriptor_id();
        match self.roots[usize::from(index)].wd {
            Some(current) if current == id => return Ok(()),
            Some(_) => self.detach_root(index),
            None => {}
        }
        let Some(id_nz) = NonZeroI32::new(id) else {
            return Err(io::Error::other("inotify returned watch descriptor 0"));
        };
        self.record(
            id,
            WatchedDir {
                handle,
                name: Box::default(),
                parent: None,
                root: index,
                depth: 0,
            },
        );
        self.roots[usize::from(index)].wd = Some(id);
        let kubepods = self.kubepods[usize::from(index)].clone();
        if report == Report::Created {
            log::info!("cg={kubepods} appeared: watching it again");
            self.out.send(
                TreeEvent::Created {
                    cgroup: kubepods.clone(),
                },
                &mut self.throttle,
            );
        }
        let mut pending = Vec::new();
        self.push_children(index, id_nz, &kubepods, &mut pending);
        self.walk(pending, report);
        Ok(())
    }

    /// Stops watching root `index` (gone, renamed or unmounted): reports it removed and asks for
    /// a rescan.
    fn detach_root(&mut self, index: u16) {
        let Some(wd) = self.roots[usize::from(index)].wd.take() else {
            return;
        };
        for id in self.table.of_root(index) {
            self.forget(id, true);
        }
        let kubepods = self.kubepods[usize::from(index)].clone();
        log::warn!(
            "cg={kubepods} under {} went away (watch {wd}): waiting for it to come back",
            self.roots[usize::from(index)]
                .spec
                .controller_root
                .display()
        );
        self.out
            .send(TreeEvent::Removed { cgroup: kubepods }, &mut self.throttle);
        self.request_rescan(RescanReason::RootGone);
    }

    /// Adds a directory to the table and the per-root count.
    fn record(&mut self, id: i32, dir: WatchedDir<WatchDescriptor>) {
        let root = usize::from(dir.root);
        self.roots[root].dirs += 1;
        if let Some(old) = self.table.insert(id, dir) {
            let old_root = usize::from(old.root);
            self.roots[old_root].dirs = self.roots[old_root].dirs.saturating_sub(1);
        }
    }

    /// Drops a directory from the table, and its kernel watch too when `unwatch`.
    fn forget(&mut self, id: i32, unwatch: bool) {
        if let Some(dir) = self.table.remove(id) {
            let root = usize::from(dir.root);
            self.roots[root].dirs = self.roots[root].dirs.saturating_sub(1);
            if dir.parent.is_none() && self.roots[root].wd == Some(id) {
                self.roots[root].wd = None;
            }
            if unwatch {
                // EINVAL when the kernel already dropped it: nothing to do either way.
                let _ = self.watches.remove(dir.handle);
            }
        }
    }

    /// Adopts new directories, depth first so that parents are reported before children:
    /// watch first, then list, then the same for every child directory found.
    fn walk(&mut self, mut pending: Vec<(NonZeroI32, OsString)>, report: Report) {
        while let Some((parent, name)) = pending.pop() {
            let Some(parent_dir) = self.table.get(parent.get()) else {
                continue;
            };
            let (root, depth) = (parent_dir.root, usize::from(parent_dir.depth) + 1);
            if depth > MAX_WATCH_DEPTH {
                continue;
            }
            let Some(path) = self
                .table
                .path(parent.get(), &self.kubepods)
                .and_then(|p| p.join(&name).ok())
            else {
                continue;
            };
            let state = &self.roots[usize::from(root)];
            if state.dirs >= MAX_WATCHED_DIRS {
                if self.throttle.allow("too-many-dirs") {
                    log::warn!(
                        "cg={path} not watched: {MAX_WATCHED_DIRS} directories are watched under {} already",
                        state.host_path(&state.spec.kubepods).display()
                    );
                }
                self.report_created(report, path);
                self.request_rescan(RescanReason::WatchFailed);
                continue;
            }
            let host = state.host_path(&path);
            let Some(handle) = self.add_dir_watch(report, &path, &host) else {
                continue;
            };
            let id = handle.get_watch_descriptor_id();
            let Some(id_nz) = NonZeroI32::new(id) else {
                continue;
            };
            let known = self
                .table
                .get(id)
                .is_some_and(|d| d.is(parent.get(), name.as_bytes()));
            if known && report == Report::Created {
                // Already adopted (found by a listing before its creation event was read).
                continue;
            }
            self.record(
                id,
                WatchedDir {
                    handle,
                    name: name.into_vec().into_boxed_slice(),
                    parent: Some(parent),
                    root,
                    depth: u8::try_from(depth).unwrap_or(u8::MAX),
                },
            );
            self.report_created(report, path.clone());
            self.push_children(root, id_nz, &path, &mut pending);
        }
    }

    /// Adds the watch of one directory (`host`, cgroup `path`). `None` where there is nothing
    /// to watch (gone) or the watch failed (logged, reported as created, a rescan asked for).
    fn add_dir_watch(
        &mut self,
        report: Report,
        path: &CgroupPath,
        host: &std::path::Path,
    ) -> Option<WatchDescriptor> {
        #[cfg(debug_assertions)]
        let injected = match report {
            Report::Created => crate::faults::add_watch(),
            Report::Silent => None,
        };
        #[cfg(debug_assertions)]
        let added = match injected {
            Some(injected) => Err(injected),
            None => self.watches.add(host, DIR_MASK),
        };
        #[cfg(not(debug_assertions))]
        let added = self.watches.add(host, DIR_MASK);
        match added {
            Ok(handle) => Some(handle),
            // Removed again, or replaced by a file or a symlink: nothing to watch.
            Err(err) if is_gone(&err) => None,
            Err(err) => {
                if self.throttle.allow("watch-failed") {
                    log::warn!(
                        "cg={path} not watched, changes below it are seen by scans only: inotify_add_watch: {err}{}",
                        if err.raw_os_error() == Some(Errno::ENOSPC as i32) {
                            " (raise fs.inotify.max_user_watches)"
                        } else {
                            ""
                        }
                    );
                } else {
                    log::debug!("cg={path} not watched: {err}");
                }
                self.report_created(report, path.clone());
                self.request_rescan(RescanReason::WatchFailed);
                None
            }
        }
    }

    fn report_created(&mut self, report: Report, cgroup: CgroupPath) {
        if report == Report::Created {
            log::trace!("cg={cgroup} created");
            self.out
                .send(TreeEvent::Created { cgroup }, &mut self.throttle);
        }
    }

    /// Lists `path` (watched as `wd`) and queues its child directories, so that they pop in
    /// name order.
    fn push_children(
        &mut self,
        root: u16,
        wd: NonZeroI32,
        path: &CgroupPath,
        pending: &mut Vec<(NonZeroI32, OsString)>,
    ) {
        let entries = match self.roots[usize::from(root)].fs.list(path) {
            Ok(entries) => entries,
            Err(err) if err.is_gone() => return,
            Err(err) => {
                if self.throttle.allow("list-failed") {
                    log::warn!("cg={path} cannot be listed: {}", error_chain(&err));
                }
                self.request_rescan(RescanReason::WatchFailed);
                return;
            }
        };
        pending.extend(
            entries
                .into_iter()
                .rev()
                .filter(|e| e.kind == FileKind::Directory)
                .map(|e| (wd, e.name)),
        );
    }

    fn request_rescan(&mut self, reason: RescanReason) {
        self.rescan.get_or_insert(reason);
    }

    /// The thread: waits for inotify events or the stop pipe, and nothing else (no timeout,
    /// except while a rescan request waits for room in the channel).
    fn run(mut self, stop: &OwnedFd) -> Result<(), WatchError> {
        let mut buffer = vec![0u8; READ_BUFFER_BYTES];
        let mut retry = RETRY_MIN;
        loop {
            let timeout = if self.out.full {
                PollTimeout::try_from(retry).unwrap_or(PollTimeout::MAX)
            } else {
                PollTimeout::NONE
            };
            let (events_ready, stop_ready) = {
                let mut fds = [
                    PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN),
                    PollFd::new(stop.as_fd(), PollFlags::POLLIN),
                ];
                match poll(&mut fds, timeout) {
                    Ok(_) => {}
                    Err(Errno::EINTR) => continue,
                    Err(errno) => {
                        return Err(WatchError::Poll {
                            source: io::Error::from(errno),
                        })
                    }
                }
                let ready = |fd: &PollFd| fd.revents().is_none_or(|r| !r.is_empty());
                (ready(&fds[0]), ready(&fds[1]))
            };
            if stop_ready {
                log::debug!("the watcher stops on request");
                return Ok(());
            }
            if events_ready {
                self.drain(&mut buffer)?;
            }
            if self.out.full {
                if self.out.flush() {
                    retry = RETRY_MIN;
                } else {
                    retry = (retry * 2).min(RETRY_MAX);
                }
            }
            if self.out.disconnected {
                log::debug!("the watcher stops: nobody receives its events");
                return Ok(());
            }
        }
    }

    /// Reads and handles what the kernel has queued, a bounded number of reads at a time.
    fn drain(&mut self, buffer: &mut [u8]) -> Result<(), WatchError> {
        for _ in 0..READS_PER_WAKE {
            match self.inotify.read_events(buffer) {
                Ok(events) => {
                    self.read_failures = 0;
                    #[cfg(debug_assertions)]
                    if crate::faults::queue_overflow() {
                        self.overflowed();
                    }
                    for event in events {
                        self.handle(&event);
                    }
                    self.end_batch();
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    self.read_failures += 1;
                    log::warn!("cannot read inotify events: {source}");
                    self.request_rescan(RescanReason::ReadError);
                    self.end_batch();
                    if self.read_failures >= FATAL_READ_FAILURES {
                        return Err(WatchError::Read { source });
                    }
                }
            }
        }
        Ok(())
    }

    /// After a batch of events: re-synchronise after an overflow, then ask for the rescan.
    fn end_batch(&mut self) {
        if mem::take(&mut self.resync_needed) {
            self.resync();
        }
        if let Some(reason) = self.rescan.take() {
            log::debug!("asking for a rescan: {reason}");
            self.out
                .send(TreeEvent::Rescan { reason }, &mut self.throttle);
        }
    }

    /// Brings the table back in line with the tree after events were lost: watches everything
    /// again (existing watches are returned as they are), and removes the watches of directories
    /// that are gone or moved out.
    fn resync(&mut self) {
        let started = Instant::now();
        let old = self.table.take();
        for state in &mut self.roots {
            state.dirs = 0;
        }
        let previous: Vec<Option<i32>> = self.roots.iter_mut().map(|r| r.wd.take()).collect();
        for index in 0..self.roots.len() {
            let index = u16::try_from(index).expect("checked in new");
            if let Err(err) = self.attach_root(index, Report::Silent) {
                if previous[usize::from(index)].is_some() {
                    // Gone while events were lost.
                    self.out.send(
                        TreeEvent::Removed {
                            cgroup: self.kubepods[usize::from(index)].clone(),
                        },
                        &mut self.throttle,
                    );
                }
                if !is_gone(&err) {
                    log::warn!(
                        "cannot watch {} again: {err}",
                        self.roots[usize::from(index)]
                            .host_path(&self.kubepods[usize::from(index)])
                            .display()
                    );
                }
            }
        }
        let mut dropped = 0usize;
        for (id, dir) in old {
            if self.table.get(id).is_none() {
                let _ = self.watches.remove(dir.handle);
                dropped += 1;
            }
        }
        log::info!(
            "re-synchronised the watches after lost events in {:?}: {} directories watched, {dropped} dropped",
            started.elapsed(),
            self.table.len()
        );
    }

    /// Events were lost: re-synchronise at the end of the batch and ask for a rescan.
    fn overflowed(&mut self) {
        if self.throttle.allow("overflow") {
            log::warn!(
                "the inotify queue overflowed (fs.inotify.max_queued_events): re-synchronising and asking for a rescan"
            );
        }
        self.resync_needed = true;
        self.request_rescan(RescanReason::QueueOverflow);
    }

    /// Turns one inotify event into bookkeeping and at most a few tree events.
    fn handle(&mut self, event: &Event<&OsStr>) {
        let mask = event.mask;
        let wd = event.wd.get_watch_descriptor_id();
        if mask.contains(EventMask::Q_OVERFLOW) {
            self.overflowed();
            return;
        }
        if let Some(index) = self.roots.iter().position(|r| r.anchor == Some(wd)) {
            let index = u16::try_from(index).expect("checked in new");
            self.handle_anchor(index, event);
            return;
        }
        let Some(dir) = self.table.get(wd) else {
            // A watch dropped already (its directory removed or moved out).
            return;
        };
        let is_root = dir.parent.is_none();
        if mask.contains(EventMask::IGNORED) {
            if is_root {
                self.detach_root(dir.root);
            } else {
                self.forget(wd, false);
            }
            return;
        }
        if mask.intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::UNMOUNT) {
            if is_root {
                self.detach_root(dir.root);
            }
            return;
        }
        let Some(name) = event.name else {
            return;
        };
        if mask.contains(EventMask::ISDIR) {
            if mask.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
                if let Some(parent) = NonZeroI32::new(wd) {
                    self.walk(vec![(parent, name.to_os_string())], Report::Created);
                }
            } else if mask.intersects(EventMask::DELETE | EventMask::MOVED_FROM) {
                let moved = mask.contains(EventMask::MOVED_FROM);
                self.child_gone(wd, name, moved);
            }
        } else if mask.contains(EventMask::MODIFY) {
            let Some(file) = watched_file(name) else {
                return;
            };
            if let Some(cgroup) = self.table.path(wd, &self.kubepods) {
                log::trace!("cg={cgroup} {file} modified");
                self.out
                    .send(TreeEvent::Modified { cgroup, file }, &mut self.throttle);
            }
        }
    }

    /// The child `name` of the directory watched by `parent` was removed or moved away.
    fn child_gone(&mut self, parent: i32, name: &OsStr, moved: bool) {
        let Some(parent_dir) = self.table.get(parent) else {
            return;
        };
        if usize::from(parent_dir.depth) + 1 > MAX_WATCH_DEPTH {
            return;
        }
        let Some(cgroup) = self
            .table
            .path(parent, &self.kubepods)
            .and_then(|p| p.join(name).ok())
        else {
            return;
        };
        // cgroupfs never drops the watch of a removed directory by itself.
        if let Some(child) = self.table.child(parent, name.as_bytes()) {
            if moved {
                for id in self.table.subtree(child).into_iter().rev() {
                    self.forget(id, true);
                }
            } else {
                self.forget(child, true);
            }
        }
        log::trace!("cg={cgroup} removed");
        self.out
            .send(TreeEvent::Removed { cgroup }, &mut self.throttle);
    }

    /// An event on the parent of root `index`: only the kubepods name matters.
    fn handle_anchor(&mut self, index: u16, event: &Event<&OsStr>) {
        let mask = event.mask;
        if mask.intersects(EventMask::IGNORED | EventMask::UNMOUNT) {
            let state = &mut self.roots[usize::from(index)];
            if state.anchor.take().is_some() {
                log::warn!(
                    "the parent of {} went away: a re-created kubepods cgroup will not be noticed",
                    state.host_path(&state.spec.kubepods).display()
                );
            }
            return;
        }
        let kubepods = self.kubepods[usize::from(index)].clone();
        if !mask.contains(EventMask::ISDIR) || event.name != kubepods.name() {
            return;
        }
        if mask.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
            match self.attach_root(index, Report::Created) {
                Ok(()) => {}
                Err(err) if is_gone(&err) => {}
                Err(err) => {
                    log::warn!("cg={kubepods} appeared but cannot be watched: {err}");
                    self.request_rescan(RescanReason::WatchFailed);
                }
            }
        } else if mask.intersects(EventMask::DELETE | EventMask::MOVED_FROM) {
            self.detach_root(index);
        }
    }
}

/// The directory is not there (any more), or is not a directory: nothing to watch.
fn is_gone(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error().map(Errno::from_raw),
        Some(Errno::ENOENT | Errno::ENOTDIR)
    )
}

/// The watched interface file of this name, if it is one.
fn watched_file(name: &OsStr) -> Option<InterfaceFile> {
    let name = name.to_str()?;
    WATCHED_FILES.into_iter().find(|f| f.name() == name)
}

/// Owns the running watcher thread. Dropping it stops the thread without waiting.
#[derive(Debug)]
pub struct WatcherHandle {
    /// Write end of the stop pipe: closing it (or writing to it) wakes the thread.
    stop: Option<OwnedFd>,
    /// Disconnected when the thread has ended, whichever way.
    finished: Receiver<()>,
    thread: Option<JoinHandle<Result<(), WatchError>>>,
}

impl WatcherHandle {
    /// Asks the thread to stop; returns at once. Idempotent.
    pub fn stop(&mut self) {
        if let Some(fd) = self.stop.take() {
            // The byte wakes the thread even if a forked child still holds the write end.
            let _ = nix::unistd::write(&fd, b"s");
        }
    }

    /// Whether the thread has ended (stopped, or failed).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Waits up to `timeout` for the thread to end and returns how it ended. On timeout the
    /// thread is left running detached.
    pub fn join(mut self, timeout: Duration) -> Result<(), WatchError> {
        match self.finished.recv_timeout(timeout) {
            Err(RecvTimeoutError::Timeout) => return Err(WatchError::StopTimeout { timeout }),
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {}
        }
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(WatchError::Panicked),
            None => Ok(()),
        }
    }

    /// [`WatcherHandle::stop`], then [`WatcherHandle::join`].
    pub fn stop_and_join(mut self, timeout: Duration) -> Result<(), WatchError> {
        self.stop();
        self.join(timeout)
    }
}

impl Drop for WatcherHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_small_the_agent_queues_16384_of_them() {
        assert!(size_of::<TreeEvent>() <= 32, "{}", size_of::<TreeEvent>());
    }
    use std::fs;
    use std::hash::{BuildHasherDefault, Hasher};

    fn path(text: &str) -> CgroupPath {
        CgroupPath::new(text).unwrap()
    }

    fn dir(name: &str, parent: i32, root: u16, depth: u8) -> WatchedDir<()> {
        WatchedDir {
            handle: (),
            name: name.as_bytes().into(),
            parent: NonZeroI32::new(parent),
            root,
            depth,
        }
    }

    /// Every key collides: exercises the linear fallback of the child index.
    #[derive(Default)]
    struct Colliding;
    impl Hasher for Colliding {
        fn finish(&self) -> u64 {
            7
        }
        fn write(&mut self, _: &[u8]) {}
    }

    #[test]
    fn watched_files_are_the_cpu_and_cpuset_settings_only() {
        for name in [
            "cpuset.cpus",
            "cpuset.mems",
            "cpu.max",
            "cpu.cfs_quota_us",
            "cpu.shares",
            "cpu.weight",
        ] {
            let file = watched_file(OsStr::new(name)).unwrap();
            assert_eq!(file.name(), name);
        }
        for name in [
            "cgroup.procs",
            "tasks",
            "cpu.cfs_period_us",
            "cpuset.effective_cpus",
            "cpuset.cpus.effective",
            "memory.events",
            "cpuset.cpus.bak",
        ] {
            assert_eq!(watched_file(OsStr::new(name)), None, "{name}");
        }
    }

    #[test]
    fn a_watched_directory_stays_small() {
        // Handle (16) + name (16) + parent (4) + root (2) + depth (1), padded.
        assert!(size_of::<WatchedDir<WatchDescriptor>>() <= 40);
    }

    #[test]
    fn paths_are_built_from_names_below_each_root() {
        let kubepods = [path("kubepods"), path("kubepods.slice")];
        let mut table = DirTable::new();
        table.insert(1, dir("", 0, 0, 0));
        table.insert(2, dir("burstable", 1, 0, 1));
        table.insert(3, dir("pod1", 2, 0, 2));
        table.insert(4, dir("", 0, 1, 0));
        table.insert(5, dir("kubepods-pod2.slice", 4, 1, 1));
        assert_eq!(table.path(1, &kubepods), Some(path("kubepods")));
        assert_eq!(
            table.path(3, &kubepods),
            Some(path("kubepods/burstable/pod1"))
        );
        assert_eq!(
            table.path(5, &kubepods),
            Some(path("kubepods.slice/kubepods-pod2.slice"))
        );
        assert_eq!(table.path(9, &kubepods), None);
        // A root at the controller root itself.
        let mut table = DirTable::new();
        table.insert(1, dir("", 0, 0, 0));
        table.insert(2, dir("pod1", 1, 0, 1));
        assert_eq!(table.path(2, &[CgroupPath::root()]), Some(path("pod1")));
        assert_eq!(
            table.path(1, &[CgroupPath::root()]),
            Some(CgroupPath::root())
        );
    }

    #[test]
    fn children_are_found_by_parent_and_name() {
        let mut table = DirTable::new();
        table.insert(1, dir("", 0, 0, 0));
        table.insert(2, dir("a", 1, 0, 1));
        table.insert(3, dir("b", 1, 0, 1));
        table.insert(4, dir("a", 2, 0, 2));
        assert_eq!(table.child(1, b"a"), Some(2));
        assert_eq!(table.child(1, b"b"), Some(3));
        assert_eq!(table.child(2, b"a"), Some(4));
        assert_eq!(table.child(3, b"a"), None);
        assert_eq!(table.subtree(2), vec![2, 4]);
        table.remove(2);
        assert_eq!(table.child(1, b"a"), None);
        assert_eq!(table.unindexed, 0);
        // Re-recording a watch under a new place moves its index entry.
        table.insert(3, dir("c", 1, 0, 1));
        assert_eq!(table.child(1, b"b"), None);
        assert_eq!(table.child(1, b"c"), Some(3));
    }

    #[test]
    fn hash_collisions_fall_back_to_a_search() {
        let mut table: DirTable<(), BuildHasherDefault<Colliding>> =
            DirTable::with_hasher(BuildHasherDefault::default());
        table.insert(1, dir("", 0, 0, 0));
        for (wd, name) in [(2, "a"), (3, "b"), (4, "c")] {
            table.insert(wd, dir(name, 1, 0, 1));
        }
        assert_eq!(table.unindexed, 2);
        assert_eq!(table.child(1, b"a"), Some(2));
        assert_eq!(table.child(1, b"b"), Some(3));
        assert_eq!(table.child(1, b"c"), Some(4));
        assert_eq!(table.child(1, b"d"), None);
        table.remove(2);
        table.remove(3);
        assert_eq!(table.child(1, b"c"), Some(4));
        table.remove(4);
        assert_eq!(table.unindexed, 0);
        assert!(table.children.is_empty());
    }

    #[test]
    fn a_newer_directory_of_the_same_name_takes_the_index() {
        let mut table = DirTable::new();
        table.insert(1, dir("", 0, 0, 0));
        table.insert(2, dir("a", 1, 0, 1));
        table.insert(5, dir("a", 1, 0, 1));
        assert_eq!(table.child(1, b"a"), Some(5));
        table.remove(5);
        // The older one is still found while it is recorded.
        assert_eq!(table.child(1, b"a"), Some(2));
        table.remove(2);
        assert_eq!(table.child(1, b"a"), None);
        assert_eq!(table.unindexed, 0);
    }

    fn kubepods_tree() -> (tempfile::TempDir, WatchRoot) {
        let tree = tempfile::tempdir().unwrap();
        fs::create_dir(tree.path().join("kubepods")).unwrap();
        let root = WatchRoot {
            controller_root: tree.path().to_path_buf(),
            kubepods: path("kubepods"),
        };
        (tree, root)
    }

    /// Runs the watcher's loop body by hand until the kernel has nothing more queued.
    fn pump(watcher: &mut Watcher) {
        let mut buffer = vec![0u8; READ_BUFFER_BYTES];
        watcher.drain(&mut buffer).unwrap();
    }

    #[test]
    fn a_full_channel_collapses_into_one_rescan_request() {
        let (tree, root) = kubepods_tree();
        let mut watcher = Watcher::new(vec![root]).unwrap();
        let (tx, rx) = crossbeam_channel::bounded(2);
        watcher.out.sender = Some(tx);
        for i in 0..10 {
            fs::create_dir(tree.path().join(format!("kubepods/p{i}"))).unwrap();
        }
        pump(&mut watcher);
        assert!(watcher.out.full);
        assert_eq!(watcher.watched_dirs(), 11, "watches kept up while dropping");
        let got: Vec<TreeEvent> = rx.try_iter().collect();
        assert_eq!(
            got,
            [
                TreeEvent::Created {
                    cgroup: path("kubepods/p0")
                },
                TreeEvent::Created {
                    cgroup: path("kubepods/p1")
                },
            ]
        );
        // More changes while the rescan is owed are dropped, not queued behind it.
        fs::write(tree.path().join("kubepods/p3/cpuset.cpus"), "1\n").unwrap();
        pump(&mut watcher);
        assert!(rx.is_empty());
        assert!(watcher.out.flush());
        assert_eq!(
            rx.try_recv().unwrap(),
            TreeEvent::Rescan {
                reason: RescanReason::ChannelFull
            }
        );
        fs::create_dir(tree.path().join("kubepods/p3/c")).unwrap();
        pump(&mut watcher);
        assert_eq!(
            rx.try_iter().collect::<Vec<_>>(),
            [TreeEvent::Created {
                cgroup: path("kubepods/p3/c")
            }]
        );
    }

    /// The arrivals channel is told of a new cgroup and of new CPU settings, never of a cpuset
    /// write (the echo of the agent's own writes), while every event still goes to the
    /// controller in order.
    #[test]
    fn arrivals_are_told_of_new_cgroups_and_cpu_settings_not_of_cpuset_writes() {
        let (tree, root) = kubepods_tree();
        fs::create_dir(tree.path().join("kubepods/p0")).unwrap();
        fs::write(tree.path().join("kubepods/p0/cpuset.cpus"), "0-3\n").unwrap();
        fs::write(tree.path().join("kubepods/p0/cpu.shares"), "2\n").unwrap();
        let mut watcher = Watcher::new(vec![root]).unwrap();
        let (tx, rx) = crossbeam_channel::bounded(64);
        watcher.out.sender = Some(tx);
        let arrivals = watcher.arrivals();
        assert!(!arrivals.arrived());
        // An echo: the agent narrowing a cgroup.
        fs::write(tree.path().join("kubepods/p0/cpuset.cpus"), "1\n").unwrap();
        pump(&mut watcher);
        assert_eq!(
            rx.try_iter().collect::<Vec<_>>(),
            [TreeEvent::Modified {
                cgroup: path("kubepods/p0"),
                file: InterfaceFile::CpusetCpus
            }]
        );
        assert!(
            !arrivals.arrived(),
            "an echo of a cpuset write is no arrival"
        );
        fs::create_dir(tree.path().join("kubepods/p1")).unwrap();
        pump(&mut watcher);
        assert_eq!(rx.try_iter().count(), 1);
        assert!(arrivals.arrived(), "a new cgroup is an arrival");
        arrivals.forget();
        assert!(!arrivals.arrived());
        fs::write(tree.path().join("kubepods/p0/cpu.shares"), "2048\n").unwrap();
        pump(&mut watcher);
        assert_eq!(rx.try_iter().count(), 1);
        assert!(arrivals.arrived(), "new CPU settings are an arrival");
    }

    /// Watches held by the watcher's inotify instance, as the kernel lists them.
    fn kernel_watches(watcher: &Watcher) -> usize {
        use std::os::fd::AsRawFd;
        let fd = watcher.inotify.as_fd().as_raw_fd();
        fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("inotify wd:"))
            .count()
    }

    #[test]
    fn removed_directories_leave_the_table_and_the_kernel() {
        let (tree, root) = kubepods_tree();
        let mut watcher = Watcher::new(vec![root]).unwrap();
        let (tx, rx) = crossbeam_channel::unbounded();
        watcher.out.sender = Some(tx);
        // kubepods and its parent (the anchor).
        assert_eq!(kernel_watches(&watcher), 2);
        fs::create_dir_all(tree.path().join("kubepods/a/b")).unwrap();
        pump(&mut watcher);
        assert_eq!(watcher.watched_dirs(), 3);
        assert_eq!(kernel_watches(&watcher), 4);
        fs::remove_dir(tree.path().join("kubepods/a/b")).unwrap();
        fs::remove_dir(tree.path().join("kubepods/a")).unwrap();
        pump(&mut watcher);
        assert_eq!(watcher.watched_dirs(), 1);
        assert_eq!(watcher.roots[0].dirs, 1);
        assert_eq!(kernel_watches(&watcher), 2);
        let removed: Vec<TreeEvent> = rx
            .try_iter()
            .filter(|e| matches!(e, TreeEvent::Removed { .. }))
            .collect();
        assert_eq!(
            removed,
            [
                TreeEvent::Removed {
                    cgroup: path("kubepods/a/b")
                },
                TreeEvent::Removed {
                    cgroup: path("kubepods/a")
                },
            ]
        );
    }

    #[test]
    fn a_resync_drops_the_watches_of_directories_gone_meanwhile() {
        let (tree, root) = kubepods_tree();
        fs::create_dir_all(tree.path().join("kubepods/a/b")).unwrap();
        let mut watcher = Watcher::new(vec![root]).unwrap();
        fs::create_dir(tree.path().join("kubepods/c")).unwrap();
        // As if the events of this move were lost: the table still has a and b.
        let outside = tempfile::tempdir().unwrap();
        fs::rename(tree.path().join("kubepods/a"), outside.path().join("a")).unwrap();
        assert_eq!(kernel_watches(&watcher), 4);
        watcher.resync();
        assert_eq!(watcher.watched_dirs(), 2, "kubepods and c");
        assert_eq!(kernel_watches(&watcher), 3, "anchor, kubepods and c");
        assert_eq!(watcher.roots[0].dirs, 2);
    }

    #[test]
    fn overlapping_roots_are_refused() {
        let (tree, root) = kubepods_tree();
        fs::create_dir(tree.path().join("kubepods/inner")).unwrap();
        let inner = WatchRoot {
            controller_root: tree.path().to_path_buf(),
            kubepods: path("kubepods/inner"),
        };
        let err = Watcher::new(vec![root.clone(), inner]).unwrap_err();
        assert!(matches!(err, WatchError::Overlap { .. }), "{err}");
        assert!(err.to_string().contains("overlap"), "{err}");
        // The same root twice is one root.
        let watcher = Watcher::new(vec![root.clone(), root]).unwrap();
        assert_eq!(watcher.roots.len(), 1);
    }

    #[test]
    fn a_missing_parent_of_kubepods_is_an_error() {
        let tree = tempfile::tempdir().unwrap();
        let root = WatchRoot {
            controller_root: tree.path().to_path_buf(),
            kubepods: path("kubelet.slice/kubepods.slice"),
        };
        let err = Watcher::new(vec![root]).unwrap_err();
        assert!(
            err.to_string().starts_with("cannot watch ")
                && err.to_string().contains("kubelet.slice"),
            "{err}"
        );
    }
}
