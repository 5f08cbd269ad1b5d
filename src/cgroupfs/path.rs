//! `CgroupPath`: a cgroup named relative to a controller root, checked so that it can only ever
//! name a directory below that root.
//!
//! A path is a list of plain directory names: no `..`, no `.`, no empty component (`a//b`, a
//! trailing `/`), no leading `/`, no NUL byte, no component longer than the kernel's `NAME_MAX`.
//! Names are bytes, as the kernel allows: a container may create a child cgroup whose name is
//! not UTF-8 or holds a newline, and the agent still has to see (and narrow) it. `Display`
//! escapes such bytes so that a log line stays one line.

use std::cmp::Ordering;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Longest directory name the kernel accepts (`NAME_MAX`).
pub const MAX_NAME_LEN: usize = 255;

/// Why a text is not a valid [`CgroupPath`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("cgroup path {path:?} is absolute: give it relative to the controller root (e.g. kubepods.slice)")]
    Absolute { path: String },
    #[error("cgroup path {path:?} contains a nul byte")]
    Nul { path: String },
    #[error("cgroup path {path:?} has an empty component (a doubled or trailing '/')")]
    EmptyComponent { path: String },
    #[error(
        "cgroup path {path:?} has the component {component:?}, which would leave the directory"
    )]
    DotComponent { path: String, component: String },
    #[error("cgroup path {path:?} has the name {component:?}, which holds a '/'")]
    NotOneName { path: String, component: String },
    #[error("cgroup path {path:?} has a component of {len} bytes, longer than {max}")]
    TooLong {
        path: String,
        len: usize,
        max: usize,
    },
}

/// A cgroup directory relative to a controller root; the empty path is the root itself.
///
/// Invariant: every component is a valid directory name (see the module docs), so joining the
/// path to a root can never name anything outside that root, whatever the names contain.
///
/// Equality, ordering and hashing look at the path's bytes only.
#[derive(Clone, Default)]
pub struct CgroupPath {
    // Components joined with '/', no leading or trailing '/': `whole[start..]`. Shared: the
    // agent's model, its scans and plans hold the same paths many times over, and a clone is
    // a count; a path below a prefix ([`CgroupPath::strip_prefix`], each cgroup's path
    // relative to the kubepods root) shares the whole one's bytes.
    whole: Arc<[u8]>,
    start: u32,
}

impl PartialEq for CgroupPath {
    fn eq(&self, other: &Self) -> bool {
        self.bytes() == other.bytes()
    }
}

impl Eq for CgroupPath {}

impl Hash for CgroupPath {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.bytes().hash(state);
    }
}

impl PartialOrd for CgroupPath {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for CgroupPath {
    fn cmp(&self, other: &Self) -> Ordering {
        self.bytes().cmp(other.bytes())
    }
}

impl CgroupPath {
    /// The controller root itself.
    pub fn root() -> Self {
        CgroupPath::default()
    }

    /// Parses a relative path such as `kubepods/burstable`. The empty string is the root.
    pub fn new(text: &str) -> Result<Self, PathError> {
        Self::from_bytes(text.as_bytes())
    }

    /// As [`CgroupPath::new`] for a path that need not be UTF-8.
    pub fn from_os(text: &OsStr) -> Result<Self, PathError> {
        Self::from_bytes(text.as_bytes())
    }

    fn from_bytes(bytes: &[u8]) -> Result<Self, PathError> {
        let shown = || String::from_utf8_lossy(bytes).into_owned();
        if bytes.is_empty() {
            return Ok(CgroupPath::root());
        }
        if bytes.contains(&0) {
            return Err(PathError::Nul { path: shown() });
        }
        if bytes[0] == b'/' {
            return Err(PathError::Absolute { path: shown() });
        }
        for component in bytes.split(|&b| b == b'/') {
            check_component(component).map_err(|fault| fault.into_error(shown(), component))?;
        }
        Ok(CgroupPath::owning(bytes))
    }

    /// A path of its own bytes (checked by the caller).
    fn owning(bytes: &[u8]) -> CgroupPath {
        CgroupPath {
            whole: bytes.into(),
            start: 0,
        }
    }

    /// The path's bytes.
    fn bytes(&self) -> &[u8] {
        &self.whole[self.start as usize..]
    }

    /// This path with one more directory name appended.
    pub fn join(&self, name: &OsStr) -> Result<Self, PathError> {
        let name = name.as_bytes();
        check_component(name).map_err(|fault| {
            let mut whole = self.bytes().to_vec();
            if !whole.is_empty() {
                whole.push(b'/');
            }
            whole.extend_from_slice(name);
            fault.into_error(String::from_utf8_lossy(&whole).into_owned(), name)
        })?;
        let mut bytes = self.bytes().to_vec();
        if !bytes.is_empty() {
            bytes.push(b'/');
        }
        bytes.extend_from_slice(name);
        Ok(CgroupPath::owning(&bytes))
    }

    /// All of `other`'s components after this path's.
    pub fn concat(&self, other: &CgroupPath) -> CgroupPath {
        if self.is_root() {
            return other.clone();
        }
        if other.is_root() {
            return self.clone();
        }
        let mut bytes = self.bytes().to_vec();
        bytes.push(b'/');
        bytes.extend_from_slice(other.bytes());
        CgroupPath::owning(&bytes)
    }

    /// The rest of this path below `prefix`, or `None` when `prefix` is not an ancestor (or the
    /// path itself, which yields the root).
    pub fn strip_prefix(&self, prefix: &CgroupPath) -> Option<CgroupPath> {
        if prefix.is_root() {
            return Some(self.clone());
        }
        if self.bytes() == prefix.bytes() {
            return Some(CgroupPath::root());
        }
        let rest = self.bytes().strip_prefix(prefix.bytes())?;
        if rest.first() != Some(&b'/') {
            return None;
        }
        // `rest` ends where the whole path does: the result shares its bytes. (Paths are far
        // below 4 GiB: the kernel's PATH_MAX is 4 KiB, a scan's depth 32 names.)
        let start = self.start + u32::try_from(prefix.bytes().len() + 1).ok()?;
        Some(CgroupPath {
            whole: self.whole.clone(),
            start,
        })
    }

    /// The path's bytes (`a/b/c`, empty for the root), for system calls.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes()
    }

    pub fn is_root(&self) -> bool {
        self.bytes().is_empty()
    }

    /// Number of components; 0 for the root.
    pub fn depth(&self) -> usize {
        self.components().count()
    }

    /// The directory names from the top down.
    pub fn components(&self) -> impl DoubleEndedIterator<Item = &OsStr> + '_ {
        self.bytes()
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty())
            .map(OsStr::from_bytes)
    }

    /// The last directory name; `None` for the root.
    pub fn name(&self) -> Option<&OsStr> {
        self.components().next_back()
    }

    /// The enclosing cgroup; `None` for the root.
    pub fn parent(&self) -> Option<CgroupPath> {
        self.parent_bytes().map(CgroupPath::owning)
    }

    /// The enclosing cgroup's path bytes (what [`Self::as_bytes`] of [`Self::parent`] is),
    /// without making it; `None` for the root.
    pub fn parent_bytes(&self) -> Option<&[u8]> {
        if self.is_root() {
            return None;
        }
        let bytes = self.bytes();
        Some(match bytes.iter().rposition(|&b| b == b'/') {
            Some(slash) => &bytes[..slash],
            None => &[],
        })
    }

    /// The path as a relative `Path` (empty for the root).
    pub fn as_path(&self) -> &Path {
        Path::new(OsStr::from_bytes(self.bytes()))
    }

    /// The path as text, when it is UTF-8.
    pub fn to_str(&self) -> Option<&str> {
        std::str::from_utf8(self.bytes()).ok()
    }

    /// `root` joined with this path, for messages and for tools (inotify) that take host paths.
    pub fn under(&self, root: &Path) -> PathBuf {
        if self.is_root() {
            root.to_path_buf()
        } else {
            root.join(self.as_path())
        }
    }
}

/// What is wrong with one directory name.
enum ComponentFault {
    Empty,
    Dot,
    Nul,
    Slash,
    TooLong(usize),
}

impl ComponentFault {
    fn into_error(self, path: String, component: &[u8]) -> PathError {
        match self {
            ComponentFault::Empty => PathError::EmptyComponent { path },
            ComponentFault::Dot => PathError::DotComponent {
                path,
                component: String::from_utf8_lossy(component).into_owned(),
            },
            ComponentFault::Nul => PathError::Nul { path },
            ComponentFault::Slash => PathError::NotOneName {
                path,
                component: String::from_utf8_lossy(component).into_owned(),
            },
            ComponentFault::TooLong(len) => PathError::TooLong {
                path,
                len,
                max: MAX_NAME_LEN,
            },
        }
    }
}

fn check_component(name: &[u8]) -> Result<(), ComponentFault> {
    match name {
        [] => Err(ComponentFault::Empty),
        b"." | b".." => Err(ComponentFault::Dot),
        _ if name.contains(&0) => Err(ComponentFault::Nul),
        // A '/' inside a name given to `join` would smuggle in extra components.
        _ if name.contains(&b'/') => Err(ComponentFault::Slash),
        _ if name.len() > MAX_NAME_LEN => Err(ComponentFault::TooLong(name.len())),
        _ => Ok(()),
    }
}

impl fmt::Display for CgroupPath {
    /// The path with control characters and invalid UTF-8 escaped, so a log line stays one line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_root() {
            return f.write_str(".");
        }
        for chunk in self.bytes().utf8_chunks() {
            for c in chunk.valid().chars() {
                if c.is_control() || c == '\\' {
                    write!(f, "{}", c.escape_default())?;
                } else {
                    write!(f, "{c}")?;
                }
            }
            for b in chunk.invalid() {
                write!(f, "\\x{b:02x}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for CgroupPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CgroupPath({self})")
    }
}

impl std::str::FromStr for CgroupPath {
    type Err = PathError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CgroupPath::new(s)
    }
}

impl From<CgroupPath> for OsString {
    fn from(path: CgroupPath) -> OsString {
        OsString::from_vec(path.bytes().to_vec())
    }
}

impl serde::Serialize for CgroupPath {
    /// UTF-8 paths as they are; others lossily (for display in `status --json` only).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&String::from_utf8_lossy(self.bytes()))
    }
}

impl<'de> serde::Deserialize<'de> for CgroupPath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        CgroupPath::new(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_relative_paths() {
        let path = CgroupPath::new("kubepods/burstable/pod1").unwrap();
        assert_eq!(path.depth(), 3);
        assert_eq!(path.name(), Some(OsStr::new("pod1")));
        assert_eq!(path.parent().unwrap().to_str(), Some("kubepods/burstable"));
        assert_eq!(path.to_string(), "kubepods/burstable/pod1");
        assert!(CgroupPath::new("").unwrap().is_root());
        assert_eq!(CgroupPath::root().parent(), None);
        assert_eq!(
            CgroupPath::new("kubepods").unwrap().parent(),
            Some(CgroupPath::root())
        );
    }

    #[test]
    fn rejects_escapes_and_malformed_paths() {
        let cases = [
            ("/kubepods", "is absolute"),
            ("../etc", "would leave the directory"),
            ("kubepods/..", "would leave the directory"),
            ("kubepods/./x", "would leave the directory"),
            (".", "would leave the directory"),
            ("kubepods//pod", "empty component"),
            ("kubepods/", "empty component"),
            ("kube\0pods", "nul byte"),
        ];
        for (text, why) in cases {
            let err = CgroupPath::new(text).unwrap_err();
            assert!(err.to_string().contains(why), "{text:?}: {err}");
            assert!(err.to_string().contains("cgroup path"), "{err}");
        }
        let long = "x".repeat(256);
        let err = CgroupPath::new(&format!("kubepods/{long}")).unwrap_err();
        assert!(matches!(err, PathError::TooLong { len: 256, .. }), "{err}");
        assert!(CgroupPath::new(&"x".repeat(255)).is_ok());
    }

    #[test]
    fn join_refuses_names_that_are_not_one_directory() {
        let base = CgroupPath::new("kubepods").unwrap();
        for bad in ["..", ".", "", "a/b", "a/../b", "x\0y"] {
            assert!(base.join(OsStr::new(bad)).is_err(), "{bad:?}");
        }
        let joined = base.join(OsStr::new("pod1")).unwrap();
        assert_eq!(joined.to_str(), Some("kubepods/pod1"));
        assert_eq!(
            CgroupPath::root().join(OsStr::new("a")).unwrap().to_str(),
            Some("a")
        );
    }

    #[test]
    fn strip_prefix_and_concat_are_inverse() {
        let kubepods = CgroupPath::new("kubepods.slice").unwrap();
        let full = CgroupPath::new("kubepods.slice/kubepods-besteffort.slice/x").unwrap();
        let rest = full.strip_prefix(&kubepods).unwrap();
        assert_eq!(rest.to_str(), Some("kubepods-besteffort.slice/x"));
        assert_eq!(kubepods.concat(&rest), full);
        assert_eq!(kubepods.strip_prefix(&kubepods), Some(CgroupPath::root()));
        // A sibling sharing a textual prefix is not a descendant.
        let sibling = CgroupPath::new("kubepods.slice2/x").unwrap();
        assert_eq!(sibling.strip_prefix(&kubepods), None);
    }

    #[test]
    fn a_stripped_path_shares_its_bytes_and_is_any_other_path_of_them() {
        use std::collections::hash_map::RandomState;
        use std::hash::BuildHasher;
        let kubepods = CgroupPath::new("kubepods").unwrap();
        let full = CgroupPath::new("kubepods/burstable/pod1/c1").unwrap();
        let rest = full.strip_prefix(&kubepods).unwrap();
        assert!(Arc::ptr_eq(&rest.whole, &full.whole));
        let fresh = CgroupPath::new("burstable/pod1/c1").unwrap();
        assert_eq!(rest, fresh);
        let hasher = RandomState::new();
        assert_eq!(hasher.hash_one(&rest), hasher.hash_one(&fresh));
        assert_eq!(rest.cmp(&fresh), Ordering::Equal);
        assert!(rest < CgroupPath::new("burstable/pod2").unwrap());
        assert_eq!(rest.parent().unwrap().to_str(), Some("burstable/pod1"));
        assert_eq!(rest.name(), Some(OsStr::new("c1")));
        let deeper = rest
            .strip_prefix(&CgroupPath::new("burstable").unwrap())
            .unwrap();
        assert_eq!(deeper.to_str(), Some("pod1/c1"));
        assert_eq!(
            deeper.join(OsStr::new("x")).unwrap().to_str(),
            Some("pod1/c1/x")
        );
    }

    #[test]
    fn odd_names_are_kept_and_displayed_on_one_line() {
        let base = CgroupPath::new("kubepods").unwrap();
        let newline = base.join(OsStr::new("a\nb")).unwrap();
        assert_eq!(newline.to_string(), "kubepods/a\\nb");
        let bytes = base.join(OsStr::from_bytes(b"\xffq")).unwrap();
        assert_eq!(bytes.to_string(), "kubepods/\\xffq");
        assert_eq!(bytes.to_str(), None);
        let unicode = base.join(OsStr::new("pöd ✓")).unwrap();
        assert_eq!(unicode.to_string(), "kubepods/pöd ✓");
    }

    #[test]
    fn serde_round_trips_utf8_paths() {
        let path = CgroupPath::new("kubepods/pod1").unwrap();
        let json = serde_json::to_string(&path).unwrap();
        assert_eq!(json, "\"kubepods/pod1\"");
        assert_eq!(serde_json::from_str::<CgroupPath>(&json).unwrap(), path);
        assert!(serde_json::from_str::<CgroupPath>("\"../x\"").is_err());
    }
}
