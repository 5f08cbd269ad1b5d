//! Projection: what cpusetd tells a workload about its own CPUs (issue 27, item 1).
//!
//! For every container of a pod that asks for it (`cpusetd.io/projection: "enable"`, or
//! `--project-all`), one small JSON file, `<dir>/<pod uid>/<container>.json`: its exclusive
//! CPUs, the shared CPUs it may also run on, the NUMA nodes of each, the isolation in force
//! (read back), a format version and a generation that grows on every change. The pod mounts
//! its own subdirectory read-only and reads (or watches) the file.
//!
//! Every file is replaced atomically: a fresh temporary file in the same directory (`O_EXCL |
//! O_NOFOLLOW`, mode 0644), written, fsynced, renamed over the old one; a reader never sees half
//! a file and inotify sees one `IN_MOVED_TO`. Directories are 0755 and opened without following
//! symlinks. A pod's directory goes when the pod goes: its regular files are unlinked one by
//! one (nothing is followed, nothing below a subdirectory is touched) and the directory removed
//! (a mount point or a directory holding anything else stays, said once). A failure is logged
//! once per kind and never stops the agent.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, renameat, OFlag};
use nix::sys::stat::{fchmod, fstat, mkdirat, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};
use serde::{Deserialize, Serialize};

use crate::cpuset::CpuSet;

mod wanted;
pub(crate) use wanted::{cpu_shared, wanted, Host};

/// The format of a projection file; a change a reader must know of bumps it.
pub const FORMAT_VERSION: u32 = 1;
/// A projection file larger than this is not ours (read back only for its generation).
const MAX_FILE_BYTES: u64 = 64 * 1024;

/// What one container's projection says, but its generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectionBody {
    pub pod_uid: String,
    pub container: String,
    /// Every CPU it may run on now (its `cpuset.cpus` as the agent last wrote or read it).
    pub cpus: String,
    /// Its own CPUs: no other container runs there ("" when it has none).
    pub exclusive_cpus: String,
    pub exclusive_numa_nodes: Vec<u32>,
    /// The shared pool's CPUs it may also run on ("" for an exclusive container without
    /// `cpu-shared.crio.io`).
    pub shared_cpus: String,
    pub shared_numa_nodes: Vec<u32>,
    /// The high-performance annotations in force for it, as read back (`cpu-quota.crio.io`,
    /// `cpu-load-balancing.crio.io`, `irq-load-balancing.crio.io`, `cpu-shared.crio.io`,
    /// `cpu-c-states.crio.io`, `cpu-freq-governor.crio.io`).
    pub isolation: Vec<String>,
}

/// The file as written: the body with its version and generation.
#[derive(Debug, Serialize, Deserialize)]
struct Document {
    version: u32,
    generation: u64,
    #[serde(flatten)]
    body: ProjectionBody,
}

impl ProjectionBody {
    /// The body for a container running on `cpus`, of which `exclusive` are its own; NUMA
    /// nodes from `numa` (a CPU's node, `None` when unknown).
    pub fn new(
        pod_uid: &str,
        container: &str,
        cpus: &CpuSet,
        exclusive: &CpuSet,
        numa: impl Fn(u32) -> Option<u32>,
        isolation: Vec<String>,
    ) -> ProjectionBody {
        let own = exclusive.intersection(cpus);
        let shared = cpus.difference(&own);
        let nodes = |set: &CpuSet| -> Vec<u32> {
            let nodes: BTreeSet<u32> = set.iter().filter_map(&numa).collect();
            nodes.into_iter().collect()
        };
        ProjectionBody {
            pod_uid: pod_uid.to_string(),
            container: container.to_string(),
            cpus: cpus.to_string(),
            exclusive_numa_nodes: nodes(&own),
            exclusive_cpus: own.to_string(),
            shared_numa_nodes: nodes(&shared),
            shared_cpus: shared.to_string(),
            isolation,
        }
    }
}

/// A pod UID as a directory name: a UUID's characters only.
fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 64
        && uid
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'-' || b == b'_')
}

/// A container name as a file name: a DNS label (what Kubernetes allows).
fn valid_container(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// What each pod's projection files should say now: pod UID → container → body.
pub type Wanted = BTreeMap<String, BTreeMap<String, ProjectionBody>>;

/// Keeps the projection files of one directory (the agent's, on its controller thread).
#[derive(Debug)]
pub struct Projector {
    dir: PathBuf,
    /// The directory, opened once it is needed (made then, 0755, parents too).
    root: Option<OwnedFd>,
    /// What each file says now, with its generation.
    written: HashMap<String, HashMap<String, (u64, ProjectionBody)>>,
    /// Pod directories found at start that no pod wants are removed at the first sync.
    swept: bool,
    /// Failures said, by kind (said once each).
    said: HashSet<String>,
    /// `<uid>/<container>` whose name is no file name (counted once each).
    refused: HashSet<String>,
    temp_counter: u64,
    /// Files replaced and failures, for the metrics.
    pub writes: u64,
    pub failures: u64,
}

impl Projector {
    pub fn new(dir: PathBuf) -> Projector {
        Projector {
            dir,
            root: None,
            written: HashMap::new(),
            swept: false,
            said: HashSet::new(),
            refused: HashSet::new(),
            temp_counter: 0,
            writes: 0,
            failures: 0,
        }
    }

    /// Whether [`Self::sync`] needs the live pods with `wanted`: for its first sweep, or to
    /// tell a gone pod from a live one among those it wrote for and `wanted` leaves out.
    pub fn needs_live(&self, wanted: &Wanted) -> bool {
        !self.swept || self.written.keys().any(|uid| !wanted.contains_key(uid))
    }

    /// Makes the files say `wanted`: changed bodies replaced (generation + 1), the directories
    /// of pods gone (not in `live`, the pods whose cgroup is there) removed; on the first call,
    /// also what an earlier run left for pods that are gone. A live pod's directory is never
    /// removed (its containers' bind mounts would keep the removed one), nor a file of it (a
    /// restarting container's file says what it holds until it is back). Failures are logged
    /// once each and retried at the next call.
    ///
    /// `stop` is asked before each file written or directory removed: when it says so, the
    /// rest is left for the next call (the agent stops when an event waits, so a pin waits for
    /// one file at most). Returns whether everything was done.
    pub fn sync(
        &mut self,
        wanted: &Wanted,
        live: &HashSet<String>,
        mut stop: impl FnMut() -> bool,
    ) -> bool {
        if !self.swept {
            self.sweep(wanted, live);
        }
        let gone: Vec<String> = self
            .written
            .keys()
            .filter(|uid| !wanted.contains_key(*uid) && !live.contains(*uid))
            .cloned()
            .collect();
        for uid in gone {
            if stop() {
                return false;
            }
            if self.remove_pod(&uid) {
                self.written.remove(&uid);
            }
        }
        for (uid, containers) in wanted {
            if !self.sync_pod(uid, containers, &mut stop) {
                return false;
            }
        }
        true
    }

    /// One pod's files (see [`Self::sync`]); whether all were done.
    fn sync_pod(
        &mut self,
        uid: &str,
        containers: &BTreeMap<String, ProjectionBody>,
        stop: &mut impl FnMut() -> bool,
    ) -> bool {
        if !valid_uid(uid) {
            self.say(
                "uid",
                &format!("pod uid {uid:?} is not a directory name: no projection"),
            );
            return true;
        }
        for (container, body) in containers {
            let known = self.written.get(uid).and_then(|w| w.get(container));
            if known.is_some_and(|(_, b)| b == body) {
                continue;
            }
            if !valid_container(container) {
                // Said and counted once per container, not at every pass.
                if self.refused.insert(format!("{uid}/{container}")) {
                    self.say(
                        "name",
                        &format!("container name {container:?} is not a file name: no projection"),
                    );
                }
                continue;
            }
            let previous = match known {
                Some((generation, _)) => Some(*generation),
                None => self.read_generation(uid, container, body),
            };
            let generation = match previous {
                // An earlier run's file says this already: left as it is.
                Some(g) if g & ADOPTED != 0 => {
                    self.remember(uid, container, g & !ADOPTED, body);
                    continue;
                }
                Some(g) => g + 1,
                None => 1,
            };
            if stop() {
                return false;
            }
            if self.write(uid, container, generation, body) {
                self.remember(uid, container, generation, body);
            }
        }
        true
    }

    fn remember(&mut self, uid: &str, container: &str, generation: u64, body: &ProjectionBody) {
        self.written
            .entry(uid.to_string())
            .or_default()
            .insert(container.to_string(), (generation, body.clone()));
    }

    /// Says a failure once per kind (the first of each at WARN), counts every one.
    fn say(&mut self, kind: &str, message: &str) {
        self.failures += 1;
        if self.said.insert(kind.to_string()) {
            log::warn!(
                "projection (--projection-dir {}): {message}",
                self.dir.display()
            );
        } else {
            log::debug!("projection: {message}");
        }
    }

    /// The projection directory, made (0755) and opened without following a symlink.
    fn root(&mut self) -> Option<&OwnedFd> {
        if self.root.is_none() {
            let opened = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&self.dir)
                .and_then(|()| open_dir_at(None, &self.dir).map_err(io::Error::from));
            match opened {
                Ok(fd) => self.root = Some(fd),
                Err(e) => {
                    let message = format!("cannot make or open the directory: {e}");
                    self.say("root", &message);
                    return None;
                }
            }
        }
        self.root.as_ref()
    }

    /// The pod's directory (made 0755 when missing), opened without following a symlink.
    fn pod_dir(&mut self, uid: &str) -> Result<OwnedFd, String> {
        let root = self.root().ok_or("no projection directory")?;
        match mkdirat(root, uid, Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(format!("cannot make {uid}/: {e}")),
        }
        let fd = open_dir_at(Some(root), Path::new(uid))
            .map_err(|e| format!("cannot open {uid}/: {e}"))?;
        // The agent's umask (the unit's 0077) must not hide it from the pod.
        fchmod(&fd, Mode::from_bits_truncate(0o755))
            .map_err(|e| format!("cannot chmod {uid}/: {e}"))?;
        Ok(fd)
    }

    /// Replaces `<uid>/<container>.json` with the body at `generation`; whether it was.
    fn write(
        &mut self,
        uid: &str,
        container: &str,
        generation: u64,
        body: &ProjectionBody,
    ) -> bool {
        let document = Document {
            version: FORMAT_VERSION,
            generation,
            body: body.clone(),
        };
        let mut bytes = match serde_json::to_vec_pretty(&document) {
            Ok(bytes) => bytes,
            Err(e) => {
                self.say("serialise", &format!("cannot serialise: {e}"));
                return false;
            }
        };
        bytes.push(b'\n');
        self.temp_counter += 1;
        let temp = format!(
            ".{container}.json.tmp-{}-{}",
            std::process::id(),
            self.temp_counter
        );
        let done = self.pod_dir(uid).and_then(|dir| {
            replace_file(&dir, &temp, &format!("{container}.json"), &bytes)
                .map_err(|e| format!("cannot replace {uid}/{container}.json: {e}"))
        });
        match done {
            Ok(()) => {
                self.writes += 1;
                true
            }
            Err(e) => {
                self.say("write", &e);
                false
            }
        }
    }

    /// The generation of an existing `<uid>/<container>.json` from an earlier run, marked
    /// [`ADOPTED`] when it already says `body`.
    fn read_generation(
        &mut self,
        uid: &str,
        container: &str,
        body: &ProjectionBody,
    ) -> Option<u64> {
        let root = self.root()?;
        let dir = open_dir_at(Some(root), Path::new(uid)).ok()?;
        let fd = openat(
            &dir,
            format!("{container}.json").as_str(),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let stat = fstat(&fd).ok()?;
        if stat.st_mode & libc_s_ifmt() != libc_s_ifreg() {
            return None;
        }
        let mut text = Vec::new();
        File::from(fd)
            .take(MAX_FILE_BYTES)
            .read_to_end(&mut text)
            .ok()?;
        let document: Document = serde_json::from_slice(&text).ok()?;
        if document.generation >= ADOPTED {
            return None;
        }
        Some(
            if document.body == *body && document.version == FORMAT_VERSION {
                document.generation | ADOPTED
            } else {
                document.generation
            },
        )
    }

    /// Removes the pod's directory (see [`remove_pod_dir`]); whether it is gone.
    fn remove_pod(&mut self, uid: &str) -> bool {
        let Some(root) = self.root() else {
            return false;
        };
        match remove_pod_dir(root, uid) {
            Ok(()) => true,
            Err(e) => {
                self.say("remove", &format!("cannot remove {uid}/: {e}"));
                false
            }
        }
    }

    /// At the first sync: the pod directories an earlier run left for pods that are gone are
    /// removed; in a wanted pod's, the files of containers not wanted (and temporary files).
    /// Nothing is made when the directory does not exist.
    fn sweep(&mut self, wanted: &Wanted, live: &HashSet<String>) {
        self.swept = true;
        if !self.dir.exists() && wanted.is_empty() {
            return;
        }
        let Some(root) = self.root() else {
            return;
        };
        let entries = match list(root) {
            Ok(entries) => entries,
            Err(e) => {
                self.say("list", &format!("cannot list the directory: {e}"));
                return;
            }
        };
        let mut removed = 0;
        for (name, is_dir) in entries {
            if !is_dir || !valid_uid(&name) {
                continue;
            }
            let root = self.root.as_ref().expect("opened above");
            let result = match wanted.get(&name) {
                None if live.contains(&name) => Ok(()),
                None => remove_pod_dir(root, &name).map(|()| removed += 1),
                Some(containers) => remove_unwanted_files(root, &name, containers),
            };
            if let Err(e) = result {
                self.say("remove", &format!("cannot clean {name}/: {e}"));
            }
        }
        if removed > 0 {
            log::info!(
                "projection: removed {removed} pod director{} left by an earlier run in {}",
                if removed == 1 { "y" } else { "ies" },
                self.dir.display()
            );
        }
    }
}

/// The high bit of a generation read back: the file already says what is wanted.
const ADOPTED: u64 = 1 << 63;

fn libc_s_ifmt() -> nix::libc::mode_t {
    nix::libc::S_IFMT
}

fn libc_s_ifreg() -> nix::libc::mode_t {
    nix::libc::S_IFREG
}

fn libc_s_ifdir() -> nix::libc::mode_t {
    nix::libc::S_IFDIR
}

/// Opens a directory (relative to `at`, else the path as given) without following a symlink
/// in its last component.
fn open_dir_at(at: Option<&OwnedFd>, path: &Path) -> Result<OwnedFd, Errno> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match at {
        Some(dir) => openat(dir, path, flags, Mode::empty()),
        None => openat(nix::fcntl::AT_FDCWD, path, flags, Mode::empty()),
    }
}

/// `bytes` into a fresh `temp` in `dir` (0644, synced), renamed over `name`.
fn replace_file(dir: &OwnedFd, temp: &str, name: &str, bytes: &[u8]) -> io::Result<()> {
    let fd = openat(
        dir,
        temp,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )?;
    let written = (|| {
        fchmod(&fd, Mode::from_bits_truncate(0o644))?;
        let mut file = File::from(fd);
        file.write_all(bytes)?;
        file.sync_all()?;
        renameat(dir, temp, dir, name)?;
        Ok(())
    })();
    if written.is_err() {
        let _ = unlinkat(dir, temp, UnlinkatFlags::NoRemoveDir);
    }
    written
}

/// The entries of a directory: name and whether it is a directory (not following symlinks).
fn list(dir: &OwnedFd) -> Result<Vec<(String, bool)>, Errno> {
    let fd = openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut listing = nix::dir::Dir::from_fd(fd)?;
    let mut out = Vec::new();
    for entry in listing.iter() {
        let entry = entry?;
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if name == "." || name == ".." {
            continue;
        }
        let is_dir =
            match nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(stat) => stat.st_mode & libc_s_ifmt() == libc_s_ifdir(),
                Err(Errno::ENOENT) => continue,
                Err(e) => return Err(e),
            };
        out.push((name.to_string(), is_dir));
    }
    Ok(out)
}

/// Removes `<root>/<uid>`: its entries that are not directories are unlinked (a symlink
/// itself, never what it names), then the directory. A mount point (another device) is left
/// alone, and so is a directory that still holds a subdirectory (ENOTEMPTY).
fn remove_pod_dir(root: &OwnedFd, uid: &str) -> Result<(), Errno> {
    let dir = match open_dir_at(Some(root), Path::new(uid)) {
        Ok(dir) => dir,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(e),
    };
    if fstat(&dir)?.st_dev != fstat(root)?.st_dev {
        return Err(Errno::EBUSY);
    }
    for (name, is_dir) in list(&dir)? {
        if !is_dir {
            match unlinkat(&dir, name.as_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
    }
    match unlinkat(root, uid, UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e),
    }
}

/// In a wanted pod's directory: removes the `.json` and temporary files of containers not
/// wanted.
fn remove_unwanted_files(
    root: &OwnedFd,
    uid: &str,
    containers: &BTreeMap<String, ProjectionBody>,
) -> Result<(), Errno> {
    let dir = open_dir_at(Some(root), Path::new(uid))?;
    for (name, is_dir) in list(&dir)? {
        let ours = name.starts_with('.') && name.contains(".json.tmp-");
        let unwanted = name
            .strip_suffix(".json")
            .is_some_and(|c| !name.starts_with('.') && !containers.contains_key(c));
        if !is_dir && (ours || unwanted) {
            match unlinkat(&dir, name.as_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// `cpusetd reset`: removes every pod directory under `dir` (as [`remove_pod_dir`]); returns
/// how many. A missing directory is nothing to do.
pub fn remove_all(dir: &Path) -> io::Result<usize> {
    let root = match open_dir_at(None, dir) {
        Ok(root) => root,
        Err(Errno::ENOENT) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let mut removed = 0;
    for (name, is_dir) in list(&root)? {
        if is_dir && valid_uid(&name) {
            remove_pod_dir(&root, &name)?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// The generation of a projection file (`status`), `None` when it is missing or not one
/// (never through a symlink, at most [`MAX_FILE_BYTES`] read).
pub fn generation_of(path: &Path) -> Option<u64> {
    let fd = openat(
        nix::fcntl::AT_FDCWD,
        path,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    if fstat(&fd).ok()?.st_mode & libc_s_ifmt() != libc_s_ifreg() {
        return None;
    }
    let mut text = Vec::new();
    File::from(fd)
        .take(MAX_FILE_BYTES)
        .read_to_end(&mut text)
        .ok()?;
    serde_json::from_slice::<Document>(&text)
        .ok()
        .map(|d| d.generation)
}

/// The projection file of one container, as a reader sees it (tests, `status`).
pub fn file_path(dir: &Path, uid: &str, container: &str) -> PathBuf {
    dir.join(uid).join(format!("{container}.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(cpus: &str, exclusive: &str) -> ProjectionBody {
        ProjectionBody::new(
            "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
            "app",
            &CpuSet::parse(cpus).unwrap(),
            &CpuSet::parse(exclusive).unwrap(),
            |cpu| Some(cpu / 8),
            vec!["cpu-quota.crio.io".into()],
        )
    }

    fn wanted(bodies: &[ProjectionBody]) -> Wanted {
        let mut wanted = Wanted::new();
        for b in bodies {
            wanted
                .entry(b.pod_uid.clone())
                .or_default()
                .insert(b.container.clone(), b.clone());
        }
        wanted
    }

    fn never() -> bool {
        false
    }

    fn none() -> HashSet<String> {
        HashSet::new()
    }

    fn read(dir: &Path, b: &ProjectionBody) -> serde_json::Value {
        let text = std::fs::read_to_string(file_path(dir, &b.pod_uid, &b.container)).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    #[test]
    fn a_body_says_which_cpus_are_whose_and_their_nodes() {
        let b = body("3,8-15", "3");
        assert_eq!(b.exclusive_cpus, "3");
        assert_eq!(b.exclusive_numa_nodes, [0]);
        assert_eq!(b.shared_cpus, "8-15");
        assert_eq!(b.shared_numa_nodes, [1]);
        let own = body("3", "3");
        assert_eq!(own.shared_cpus, "");
        assert!(own.shared_numa_nodes.is_empty());
    }

    #[test]
    fn files_are_replaced_with_a_growing_generation_and_removed_with_the_pod() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("projection");
        let mut projector = Projector::new(dir.clone());
        let first = body("3", "3");
        projector.sync(&wanted(std::slice::from_ref(&first)), &none(), never);
        let doc = read(&dir, &first);
        assert_eq!(doc["version"], FORMAT_VERSION);
        assert_eq!(doc["generation"], 1);
        assert_eq!(doc["exclusive_cpus"], "3");
        let file = file_path(&dir, &first.pod_uid, "app");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&file), 0o644);
        assert_eq!(mode(file.parent().unwrap()), 0o755);
        let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        let before = inode(&file);
        // The same body again: nothing written.
        projector.sync(&wanted(std::slice::from_ref(&first)), &none(), never);
        assert_eq!(projector.writes, 1);
        assert_eq!(inode(&file), before);
        // A change: a new file (renamed over), generation 2, no temporary file left.
        let resized = body("3-4", "3-4");
        projector.sync(&wanted(std::slice::from_ref(&resized)), &none(), never);
        assert_eq!(read(&dir, &resized)["generation"], 2);
        assert_ne!(
            inode(&file),
            before,
            "replaced by rename, not rewritten in place"
        );
        let names: Vec<_> = std::fs::read_dir(file.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["app.json"]);
        // The pod goes: its directory goes.
        projector.sync(&Wanted::new(), &none(), never);
        assert!(!file.parent().unwrap().exists());
        assert!(dir.exists());
    }

    #[test]
    fn a_restart_keeps_the_generation_and_sweeps_what_is_gone() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let kept = body("3", "3");
        let mut gone = body("5", "5");
        gone.pod_uid = "11111111-2222-3333-4444-555555555555".into();
        let mut first = Projector::new(dir.clone());
        first.sync(&wanted(&[kept.clone(), gone.clone()]), &none(), never);
        first.sync(&wanted(&[body("3-4", "3-4"), gone.clone()]), &none(), never);
        // A planted symlink in a gone pod's directory is unlinked, not followed.
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, "keep").unwrap();
        std::os::unix::fs::symlink(&outside, dir.join(&gone.pod_uid).join("x.json")).unwrap();
        // A restart: the same body is adopted as it is, the gone pod swept.
        let mut second = Projector::new(dir.clone());
        second.sync(&wanted(&[body("3-4", "3-4")]), &none(), never);
        assert_eq!(second.writes, 0);
        assert_eq!(read(&dir, &kept)["generation"], 2);
        assert!(!dir.join(&gone.pod_uid).exists());
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
        // A restart seeing another body goes on from the generation it found.
        let mut third = Projector::new(dir.clone());
        third.sync(&wanted(std::slice::from_ref(&kept)), &none(), never);
        assert_eq!(read(&dir, &kept)["generation"], 3);
        assert_eq!(remove_all(&dir).unwrap(), 1);
        assert!(!dir.join(&kept.pod_uid).exists());
        assert_eq!(remove_all(&tmp.path().join("missing")).unwrap(), 0);
    }

    #[test]
    fn a_live_pods_directory_is_never_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let b = body("3", "3");
        let live: HashSet<String> = [b.pod_uid.clone()].into();
        // Left by an earlier run, the pod still there but its containers not classified yet.
        std::fs::create_dir_all(dir.join(&b.pod_uid)).unwrap();
        std::fs::write(file_path(&dir, &b.pod_uid, "app"), "{}").unwrap();
        let mut projector = Projector::new(dir.clone());
        projector.sync(&Wanted::new(), &live, never);
        assert!(file_path(&dir, &b.pod_uid, "app").exists());
        projector.sync(&wanted(std::slice::from_ref(&b)), &live, never);
        // Its container restarts: the file stays; the pod goes: so does its directory.
        projector.sync(&Wanted::new(), &live, never);
        assert_eq!(read(&dir, &b)["generation"], 1);
        projector.sync(&Wanted::new(), &none(), never);
        assert!(!dir.join(&b.pod_uid).exists());
    }

    #[test]
    fn a_sync_stops_when_asked_and_the_next_goes_on() {
        let tmp = tempfile::tempdir().unwrap();
        let bodies: Vec<ProjectionBody> = (0..3)
            .map(|i| {
                let mut b = body("3", "3");
                b.pod_uid = format!("{i:08x}-0000-4000-8000-000000000000");
                b
            })
            .collect();
        let all = wanted(&bodies);
        let mut projector = Projector::new(tmp.path().to_path_buf());
        let mut asked = 0;
        let done = projector.sync(&all, &none(), || {
            asked += 1;
            asked > 1
        });
        assert!(!done);
        assert_eq!(projector.writes, 1, "one file, then an event waits");
        assert!(projector.sync(&all, &none(), never));
        assert_eq!(projector.writes, 3);
    }

    /// What a sync costs (printed): 500 containers written, then synced unchanged, then one
    /// changed.
    #[test]
    fn sync_cost() {
        // /dev/shm is a tmpfs, as /run is: an fsync there costs nothing.
        let tmp = tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .unwrap();
        let bodies: Vec<ProjectionBody> = (0..500)
            .map(|i| {
                let mut b = body("3,8-15", "3");
                b.pod_uid = format!("{i:08x}-0000-4000-8000-000000000000");
                b
            })
            .collect();
        let mut all = wanted(&bodies);
        let mut projector = Projector::new(tmp.path().to_path_buf());
        let timed = |projector: &mut Projector, all: &Wanted| {
            let started = std::time::Instant::now();
            projector.sync(all, &none(), never);
            started.elapsed()
        };
        let first = timed(&mut projector, &all);
        let unchanged = timed(&mut projector, &all);
        let uid = bodies[0].pod_uid.clone();
        all.get_mut(&uid).unwrap().get_mut("app").unwrap().cpus = "3-4".into();
        let one = timed(&mut projector, &all);
        assert_eq!(projector.writes, 501);
        println!(
            "projection sync of 500 containers in {}: {first:?} writing all, {unchanged:?} unchanged, {one:?} with one changed",
            tmp.path().display()
        );
    }

    #[test]
    fn bad_names_and_an_unusable_directory_are_said_never_fatal() {
        let tmp = tempfile::tempdir().unwrap();
        let mut b = body("3", "3");
        b.container = "../escape".into();
        let mut projector = Projector::new(tmp.path().to_path_buf());
        let b = wanted(&[b]);
        projector.sync(&b, &none(), never);
        projector.sync(&b, &none(), never);
        assert_eq!(projector.writes, 0);
        assert_eq!(projector.failures, 1, "counted once");
        // A symlink where the directory should be is not followed.
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(tmp.path(), &link).unwrap();
        let mut projector = Projector::new(link);
        projector.sync(&wanted(&[body("3", "3")]), &none(), never);
        assert_eq!(projector.writes, 0);
        assert!(projector.failures >= 1);
    }
}
