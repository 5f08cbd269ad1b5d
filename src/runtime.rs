//! The container runtime's view of a container: its OCI `config.json`, found through path
//! templates (`{id}` = the container id) and reduced to what classification needs — the
//! annotations (container name, pod UID, sandbox or not, `cpusetd.io/*` opt-outs) and
//! `linux.resources.cpu.{shares,quota,period}`.
//!
//! The runtime's files are advisory: a config that is missing, unreadable, larger than
//! [`MAX_CONFIG_BYTES`], not JSON or of the wrong shape is logged (once per container) and
//! ignored, never fatal, and the container is classified from its cgroup alone. Parsing is
//! tolerant field by field (a wrong-typed field is dropped, unknown fields are skipped) and keeps
//! serde_json's recursion limit, so deeply nested input cannot exhaust the stack. The runtimes'
//! state directories are root's, so config paths are opened normally, but anything that is not a
//! regular file (a FIFO would block) is refused. The default
//! templates are constants for `main` and the configuration; everything below takes templates
//! as injected values.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

/// containerd's bundle config of a CRI container (namespace `k8s.io`).
pub const CONTAINERD_CONFIG_TEMPLATE: &str =
    "/run/containerd/io.containerd.runtime.v2.task/k8s.io/{id}/config.json";
/// CRI-O's config of a container.
pub const CRIO_CONFIG_TEMPLATE: &str =
    "/run/containers/storage/overlay-containers/{id}/userdata/config.json";
/// What `--runtime-config-path` defaults to.
pub const DEFAULT_CONFIG_TEMPLATES: [&str; 2] = [CONTAINERD_CONFIG_TEMPLATE, CRIO_CONFIG_TEMPLATE];

/// Largest `config.json` read; a larger one is logged and ignored.
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// The placeholder for the container id in a template.
pub const ID_PLACEHOLDER: &str = "{id}";

/// Annotation keys the runtimes and kubelet write.
pub mod keys {
    /// containerd: `sandbox` or `container`.
    pub const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
    /// containerd: the container's name in the pod spec.
    pub const CRI_CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
    /// containerd: the pod UID.
    pub const CRI_SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";
    /// containerd: the pod's name.
    pub const CRI_SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
    /// containerd: the pod's namespace.
    pub const CRI_SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
    /// CRI-O: `sandbox` or `container`.
    pub const CRIO_CONTAINER_TYPE: &str = "io.kubernetes.cri-o.ContainerType";
    /// CRI-O: the kubelet's annotations, JSON-encoded.
    pub const CRIO_ANNOTATIONS: &str = "io.kubernetes.cri-o.Annotations";
    /// CRI-O: the kubelet's labels, JSON-encoded.
    pub const CRIO_LABELS: &str = "io.kubernetes.cri-o.Labels";
    /// kubelet label (CRI-O copies labels into annotations): the container's name.
    pub const KUBE_CONTAINER_NAME: &str = "io.kubernetes.container.name";
    /// kubelet label: the pod UID.
    pub const KUBE_POD_UID: &str = "io.kubernetes.pod.uid";
    /// kubelet label: the pod's name.
    pub const KUBE_POD_NAME: &str = "io.kubernetes.pod.name";
    /// kubelet label: the pod's namespace.
    pub const KUBE_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
    /// The value of the container-type annotations for a pod sandbox.
    pub const SANDBOX: &str = "sandbox";
    /// The value of the container-type annotations for an application container.
    pub const CONTAINER: &str = "container";
}

/// Why a template or a runtime config was not usable.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("runtime config path template {template:?} has no {{id}} placeholder")]
    TemplateWithoutId { template: String },
    #[error("runtime config path template {template:?} is not an absolute path")]
    TemplateNotAbsolute { template: String },
    #[error("container id {id:?} is not a runtime container id (ASCII letters and digits)")]
    BadContainerId { id: String },
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is {size} bytes, more than the {limit} bytes read")]
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    #[error("{path} is not a regular file")]
    NotRegularFile { path: PathBuf },
    #[error("{path} is not a JSON OCI config")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// A `--runtime-config-path` template, e.g. `/run/.../{id}/config.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigTemplate {
    text: String,
}

impl ConfigTemplate {
    /// Checks that the template is absolute and holds `{id}`.
    pub fn new(text: &str) -> Result<ConfigTemplate, RuntimeError> {
        if !text.contains(ID_PLACEHOLDER) {
            return Err(RuntimeError::TemplateWithoutId {
                template: text.to_string(),
            });
        }
        if !text.starts_with('/') {
            return Err(RuntimeError::TemplateNotAbsolute {
                template: text.to_string(),
            });
        }
        Ok(ConfigTemplate {
            text: text.to_string(),
        })
    }

    /// The config path of a container. Ids are checked first, so an id can never add a path
    /// component.
    pub fn path_for(&self, container_id: &str) -> Result<PathBuf, RuntimeError> {
        let valid = !container_id.is_empty()
            && container_id.len() <= 128
            && container_id.bytes().all(|b| b.is_ascii_alphanumeric());
        if !valid {
            return Err(RuntimeError::BadContainerId {
                id: container_id.to_string(),
            });
        }
        Ok(PathBuf::from(
            self.text.replace(ID_PLACEHOLDER, container_id),
        ))
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for ConfigTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// `linux.resources.cpu` of an OCI config, as the runtime received it from kubelet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OciCpu {
    pub shares: Option<u64>,
    /// Microseconds per period; `None`, zero or negative means no limit.
    pub quota: Option<i64>,
    pub period: Option<u64>,
}

/// What classification needs from a container's OCI config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeInfo {
    /// The top-level OCI annotations with string values.
    pub annotations: BTreeMap<String, String>,
    /// CRI-O's JSON-encoded `io.kubernetes.cri-o.Annotations`, decoded.
    pub crio_annotations: BTreeMap<String, String>,
    /// CRI-O's JSON-encoded `io.kubernetes.cri-o.Labels`, decoded.
    pub crio_labels: BTreeMap<String, String>,
    pub cpu: OciCpu,
    /// Parts of the config that were ignored, for the log.
    pub ignored: Vec<String>,
}

impl RuntimeInfo {
    /// Only what classification reads: the CPU request and the annotations of [`keys`] and
    /// `cpusetd.io/` (an OCI config carries dozens more; the agent caches one per container).
    pub fn trimmed(mut self) -> RuntimeInfo {
        fn wanted(key: &str) -> bool {
            key.starts_with("cpusetd.io/")
                || [
                    keys::CRI_CONTAINER_TYPE,
                    keys::CRI_CONTAINER_NAME,
                    keys::CRI_SANDBOX_UID,
                    keys::CRI_SANDBOX_NAME,
                    keys::CRI_SANDBOX_NAMESPACE,
                    keys::CRIO_CONTAINER_TYPE,
                    keys::KUBE_CONTAINER_NAME,
                    keys::KUBE_POD_UID,
                    keys::KUBE_POD_NAME,
                    keys::KUBE_POD_NAMESPACE,
                ]
                .contains(&key)
        }
        for map in [
            &mut self.annotations,
            &mut self.crio_annotations,
            &mut self.crio_labels,
        ] {
            map.retain(|key, _| wanted(key));
        }
        self.ignored = Vec::new();
        self
    }

    /// An annotation from the top level, else from CRI-O's encoded annotations, else from its
    /// encoded labels.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations
            .get(key)
            .or_else(|| self.crio_annotations.get(key))
            .or_else(|| self.crio_labels.get(key))
            .map(String::as_str)
    }

    /// The container's name in the pod spec.
    pub fn container_name(&self) -> Option<&str> {
        self.annotation(keys::CRI_CONTAINER_NAME)
            .or_else(|| self.annotation(keys::KUBE_CONTAINER_NAME))
            .filter(|name| !name.is_empty())
    }

    /// The pod UID as the runtime knows it.
    pub fn pod_uid(&self) -> Option<&str> {
        self.annotation(keys::CRI_SANDBOX_UID)
            .or_else(|| self.annotation(keys::KUBE_POD_UID))
            .filter(|uid| !uid.is_empty())
    }

    /// The pod's name (containerd's sandbox annotation, else kubelet's label as CRI-O keeps it).
    pub fn pod_name(&self) -> Option<&str> {
        self.annotation(keys::CRI_SANDBOX_NAME)
            .or_else(|| self.annotation(keys::KUBE_POD_NAME))
            .filter(|name| !name.is_empty())
    }

    /// The pod's namespace, from the same places as [`RuntimeInfo::pod_name`].
    pub fn pod_namespace(&self) -> Option<&str> {
        self.annotation(keys::CRI_SANDBOX_NAMESPACE)
            .or_else(|| self.annotation(keys::KUBE_POD_NAMESPACE))
            .filter(|namespace| !namespace.is_empty())
    }

    /// `Some(true)` for a pod sandbox, `Some(false)` for an application container, `None` when
    /// the runtime did not say.
    pub fn is_sandbox(&self) -> Option<bool> {
        let kind = self
            .annotation(keys::CRI_CONTAINER_TYPE)
            .or_else(|| self.annotation(keys::CRIO_CONTAINER_TYPE))?;
        match kind {
            keys::SANDBOX => Some(true),
            keys::CONTAINER => Some(false),
            _ => None,
        }
    }
}

/// Deserialises a field, dropping it (as `None`) when it has the wrong type instead of failing
/// the whole document. Depth stays bounded by the outer deserializer.
fn lenient<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let value = serde_json::Value::deserialize(deserializer)?;
    Ok(T::deserialize(value).ok())
}

/// The top level of an OCI config. A member given twice counts once, the last time (as Go's
/// `encoding/json`, which the runtimes use, reads such a file), instead of failing the whole
/// document as serde's derived code would; members the agent does not read are skipped without
/// being built.
#[derive(Default)]
struct SpecDocument {
    annotations: Option<BTreeMap<String, serde_json::Value>>,
    linux: Option<LinuxDocument>,
}

/// A member read with [`lenient`].
struct Lenient<T>(Option<T>);

impl<'de, T: DeserializeOwned> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        lenient(deserializer).map(Lenient)
    }
}

impl<'de> Deserialize<'de> for SpecDocument {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = SpecDocument;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an OCI config object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<SpecDocument, A::Error> {
                let mut document = SpecDocument::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "annotations" => document.annotations = map.next_value::<Lenient<_>>()?.0,
                        "linux" => document.linux = map.next_value::<Lenient<_>>()?.0,
                        _ => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(document)
            }
        }
        deserializer.deserialize_map(Members)
    }
}

#[derive(Deserialize, Default)]
struct LinuxDocument {
    #[serde(default, deserialize_with = "lenient")]
    resources: Option<ResourcesDocument>,
}

#[derive(Deserialize, Default)]
struct ResourcesDocument {
    #[serde(default, deserialize_with = "lenient")]
    cpu: Option<CpuDocument>,
}

#[derive(Deserialize, Default)]
struct CpuDocument {
    #[serde(default, deserialize_with = "lenient")]
    shares: Option<u64>,
    #[serde(default, deserialize_with = "lenient")]
    quota: Option<i64>,
    #[serde(default, deserialize_with = "lenient")]
    period: Option<u64>,
}

/// Keeps the string values of a JSON object; notes the others in `ignored`.
fn string_values(
    map: BTreeMap<String, serde_json::Value>,
    what: &str,
    ignored: &mut Vec<String>,
) -> BTreeMap<String, String> {
    let mut strings = BTreeMap::new();
    for (key, value) in map {
        match value {
            serde_json::Value::String(text) => {
                strings.insert(key, text);
            }
            _ => ignored.push(format!("{what} {key:?} is not a string")),
        }
    }
    strings
}

/// Decodes a JSON-encoded map held in an annotation (CRI-O's way).
fn decode_nested(
    annotations: &BTreeMap<String, String>,
    key: &str,
    ignored: &mut Vec<String>,
) -> BTreeMap<String, String> {
    let Some(text) = annotations.get(key) else {
        return BTreeMap::new();
    };
    match serde_json::from_str::<BTreeMap<String, serde_json::Value>>(text) {
        Ok(map) => string_values(map, key, ignored),
        Err(err) => {
            ignored.push(format!("annotation {key} is not a JSON object: {err}"));
            BTreeMap::new()
        }
    }
}

/// Extracts [`RuntimeInfo`] from the bytes of an OCI config. Fails only when the bytes are not
/// a JSON object (or nest deeper than serde_json's limit); wrong-typed fields are dropped.
pub fn parse_config(bytes: &[u8]) -> Result<RuntimeInfo, serde_json::Error> {
    // serde would also accept a JSON array for a struct; an OCI config is an object.
    if bytes.trim_ascii_start().first() != Some(&b'{') {
        return Err(serde::de::Error::custom(
            "an OCI config must be a JSON object",
        ));
    }
    let document: SpecDocument = serde_json::from_slice(bytes)?;
    let mut ignored = Vec::new();
    let annotations = match document.annotations {
        Some(map) => string_values(map, "annotation", &mut ignored),
        None => BTreeMap::new(),
    };
    let cpu = document
        .linux
        .and_then(|l| l.resources)
        .and_then(|r| r.cpu)
        .unwrap_or_default();
    let crio_annotations = decode_nested(&annotations, keys::CRIO_ANNOTATIONS, &mut ignored);
    let crio_labels = decode_nested(&annotations, keys::CRIO_LABELS, &mut ignored);
    Ok(RuntimeInfo {
        annotations,
        crio_annotations,
        crio_labels,
        cpu: OciCpu {
            shares: cpu.shares,
            quota: cpu.quota,
            period: cpu.period,
        },
        ignored,
    })
}

/// Reads and parses one config file. `Ok(None)` when it does not exist.
pub fn load_config(path: &Path) -> Result<Option<RuntimeInfo>, RuntimeError> {
    let read_error = |source| RuntimeError::Read {
        path: path.to_path_buf(),
        source,
    };
    // O_NONBLOCK: a FIFO in the file's place must not hang the agent.
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).bits())
        .open(path)
    {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(read_error(err)),
    };
    let metadata = file.metadata().map_err(read_error)?;
    if !metadata.is_file() {
        return Err(RuntimeError::NotRegularFile {
            path: path.to_path_buf(),
        });
    }
    let too_large = |size| RuntimeError::TooLarge {
        path: path.to_path_buf(),
        size,
        limit: MAX_CONFIG_BYTES,
    };
    if metadata.len() > MAX_CONFIG_BYTES {
        return Err(too_large(metadata.len()));
    }
    let mut bytes = Vec::new();
    File::take(file, MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    parse_config(&bytes)
        .map(Some)
        .map_err(|source| RuntimeError::Json {
            path: path.to_path_buf(),
            source,
        })
}

/// A cached runtime config: [`RuntimeInfo::trimmed`], held in flat lists (a B-tree map's
/// first node alone takes about half a KiB, and the agent keeps one per container).
#[derive(Debug, Clone)]
struct CachedInfo {
    annotations: Box<[(String, String)]>,
    crio_annotations: Box<[(String, String)]>,
    crio_labels: Box<[(String, String)]>,
    cpu: OciCpu,
}

impl CachedInfo {
    fn of(info: &RuntimeInfo) -> CachedInfo {
        let flat = |map: &BTreeMap<String, String>| {
            map.iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Box<[_]>>()
        };
        CachedInfo {
            annotations: flat(&info.annotations),
            crio_annotations: flat(&info.crio_annotations),
            crio_labels: flat(&info.crio_labels),
            cpu: info.cpu,
        }
    }

    fn info(&self) -> RuntimeInfo {
        let map = |flat: &[(String, String)]| flat.iter().cloned().collect();
        RuntimeInfo {
            annotations: map(&self.annotations),
            crio_annotations: map(&self.crio_annotations),
            crio_labels: map(&self.crio_labels),
            cpu: self.cpu,
            ignored: Vec::new(),
        }
    }
}

/// Finds and caches containers' runtime info through the configured templates.
///
/// A container's config does not change while it runs, so a parsed config is cached by id, and
/// so is a config that exists but is unusable (logged once). A container whose config is not
/// found is looked up again next time: its runtime may not have written it yet.
#[derive(Debug)]
pub struct RuntimeLookup {
    templates: Vec<ConfigTemplate>,
    cache: HashMap<String, Option<CachedInfo>>,
}

impl RuntimeLookup {
    pub fn new(templates: Vec<ConfigTemplate>) -> RuntimeLookup {
        RuntimeLookup {
            templates,
            cache: HashMap::new(),
        }
    }

    pub fn templates(&self) -> &[ConfigTemplate] {
        &self.templates
    }

    /// The runtime info of a container, from the first template whose file exists and parses.
    pub fn lookup(&mut self, container_id: &str) -> Option<RuntimeInfo> {
        if let Some(cached) = self.cache.get(container_id) {
            return cached.as_ref().map(CachedInfo::info);
        }
        let mut found_unusable = false;
        for template in &self.templates {
            let path = match template.path_for(container_id) {
                Ok(path) => path,
                Err(err) => {
                    log::warn!("runtime config lookup skipped: {err}");
                    return None;
                }
            };
            match load_config(&path) {
                Ok(Some(info)) => {
                    for what in &info.ignored {
                        log::warn!("{}: ignored: {what}", path.display());
                    }
                    let info = info.trimmed();
                    self.cache
                        .insert(container_id.to_string(), Some(CachedInfo::of(&info)));
                    return Some(info);
                }
                Ok(None) => {}
                Err(err) => {
                    found_unusable = true;
                    log::warn!(
                        "runtime config ignored, container classified from its cgroup: {}",
                        crate::logging::error_chain(&err)
                    );
                }
            }
        }
        if found_unusable {
            self.cache.insert(container_id.to_string(), None);
        } else {
            log::debug!("no runtime config for container {container_id}");
        }
        None
    }

    /// How many containers' lookups are cached.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// Drops what is cached for a container (it is gone).
    pub fn forget(&mut self, container_id: &str) {
        self.cache.remove(container_id);
    }

    /// Forgets containers for which `live` is false (they are gone).
    pub fn retain(&mut self, mut live: impl FnMut(&str) -> bool) {
        self.cache.retain(|id, _| live(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_need_an_absolute_path_and_an_id() {
        assert!(ConfigTemplate::new("/run/x/config.json").is_err());
        assert!(ConfigTemplate::new("run/{id}/config.json").is_err());
        let template = ConfigTemplate::new("/run/x/{id}/config.json").unwrap();
        assert_eq!(
            template.path_for("abc123").unwrap(),
            Path::new("/run/x/abc123/config.json")
        );
        for bad in ["", "../../etc", "a/b", "a b", "ü"] {
            assert!(template.path_for(bad).is_err(), "{bad:?}");
        }
        for default in DEFAULT_CONFIG_TEMPLATES {
            assert!(ConfigTemplate::new(default).is_ok());
        }
    }

    #[test]
    fn extracts_annotations_and_cpu() {
        let json = br#"{
            "ociVersion": "1.1.0",
            "process": {"args": ["sleep"]},
            "annotations": {
                "io.kubernetes.cri.container-type": "container",
                "io.kubernetes.cri.container-name": "app",
                "io.kubernetes.cri.sandbox-uid": "0a1b",
                "weird": 5
            },
            "linux": {"resources": {"cpu": {"shares": 2048, "quota": 200000, "period": 100000}}}
        }"#;
        let info = parse_config(json).unwrap();
        assert_eq!(info.container_name(), Some("app"));
        assert_eq!(info.pod_uid(), Some("0a1b"));
        assert_eq!(info.is_sandbox(), Some(false));
        assert_eq!(
            info.cpu,
            OciCpu {
                shares: Some(2048),
                quota: Some(200_000),
                period: Some(100_000)
            }
        );
        assert_eq!(info.ignored, ["annotation \"weird\" is not a string"]);
    }

    #[test]
    fn wrong_types_are_dropped_not_fatal() {
        let json = br#"{"annotations": ["not", "a", "map"],
                        "linux": {"resources": {"cpu": {"shares": "lots", "quota": -1, "period": 1.5}}}}"#;
        let info = parse_config(json).unwrap();
        assert!(info.annotations.is_empty());
        assert_eq!(
            info.cpu,
            OciCpu {
                shares: None,
                quota: Some(-1),
                period: None
            }
        );
        let info = parse_config(br#"{"linux": "nope"}"#).unwrap();
        assert_eq!(info.cpu, OciCpu::default());
        assert!(parse_config(b"[1,2]").is_err());
        assert!(parse_config(b"not json").is_err());
    }

    #[test]
    fn crio_encoded_annotations_and_labels_are_decoded() {
        let json = br#"{"annotations": {
            "io.kubernetes.cri-o.ContainerType": "sandbox",
            "io.kubernetes.cri-o.Annotations": "{\"cpusetd.io/exclusive\":\"false\",\"n\":1}",
            "io.kubernetes.cri-o.Labels": "{\"io.kubernetes.pod.uid\":\"u-1\",\"io.kubernetes.container.name\":\"POD\",\"io.kubernetes.pod.name\":\"web-0\",\"io.kubernetes.pod.namespace\":\"shop\"}"
        }}"#;
        let info = parse_config(json).unwrap();
        assert_eq!(info.is_sandbox(), Some(true));
        assert_eq!(info.annotation("cpusetd.io/exclusive"), Some("false"));
        assert_eq!(info.pod_uid(), Some("u-1"));
        assert_eq!(info.container_name(), Some("POD"));
        assert_eq!(info.pod_name(), Some("web-0"));
        assert_eq!(info.pod_namespace(), Some("shop"));
        assert_eq!(info.ignored.len(), 1, "{:?}", info.ignored);

        let broken = br#"{"annotations": {"io.kubernetes.cri-o.Annotations": "{oops"}}"#;
        let info = parse_config(broken).unwrap();
        assert!(info.crio_annotations.is_empty());
        assert!(
            info.ignored[0].contains("not a JSON object"),
            "{:?}",
            info.ignored
        );
    }

    #[test]
    fn a_member_given_twice_counts_the_last_time() {
        // Found by fuzzing: serde's derived code refused the whole document.
        let json = br#"{"annotations": {"a": "1"}, "linux": 3,
            "annotations": {"io.kubernetes.cri.container-name": "app"},
            "linux": {"resources": {"cpu": {"shares": 2048}}}}"#;
        let info = parse_config(json).unwrap();
        assert_eq!(info.container_name(), Some("app"));
        assert_eq!(info.annotation("a"), None);
        assert_eq!(info.cpu.shares, Some(2048));
    }

    #[test]
    fn deep_nesting_never_exhausts_the_stack() {
        let depth = 100_000;
        let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        // In a field the agent does not read, serde_json skips it without recursing.
        let info = parse_config(format!(r#"{{"process": {deep}}}"#).as_bytes()).unwrap();
        assert_eq!(info, RuntimeInfo::default());
        // In a field it reads, the recursion limit stops it.
        let nested = format!(r#"{{"linux": {{"resources": {{"cpu": {deep}}}}}}}"#);
        let err = parse_config(nested.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("recursion limit"), "{err}");
        let nested = format!(r#"{{"annotations": {{"a": {deep}}}}}"#);
        assert!(parse_config(nested.as_bytes()).is_err());
    }

    #[test]
    fn load_reports_missing_large_and_special_files() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load_config(&dir.path().join("none.json"))
            .unwrap()
            .is_none());

        let big = dir.path().join("big.json");
        std::fs::write(&big, vec![b' '; MAX_CONFIG_BYTES as usize + 1]).unwrap();
        let err = load_config(&big).unwrap_err();
        assert!(matches!(err, RuntimeError::TooLarge { .. }), "{err}");

        let fifo = dir.path().join("fifo.json");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let err = load_config(&fifo).unwrap_err();
        assert!(matches!(err, RuntimeError::NotRegularFile { .. }), "{err}");

        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "{").unwrap();
        let err = load_config(&bad).unwrap_err();
        assert!(
            err.to_string()
                .ends_with("bad.json is not a JSON OCI config"),
            "{err}"
        );
    }

    #[test]
    fn the_cache_keeps_what_classification_reads_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let template = format!("{}/{{id}}.json", dir.path().display());
        std::fs::write(
            dir.path().join("c1.json"),
            r#"{"annotations": {
                "io.kubernetes.cri.container-type": "container",
                "io.kubernetes.cri.container-name": "app",
                "io.kubernetes.cri.sandbox-uid": "u1",
                "io.kubernetes.cri.image-name": "registry.example/app:1",
                "io.kubernetes.cri.sandbox-namespace": "default",
                "io.kubernetes.cri.sandbox-name": "web-0",
                "io.kubernetes.cri.sandbox-log-directory": "/var/log/pods/default_web-0_u1",
                "cpusetd.io/exclusive.app": "false"
            },
            "linux": {"resources": {"cpu": {"shares": 2048, "quota": 200000, "period": 100000}}}}"#,
        )
        .unwrap();
        let mut lookup = RuntimeLookup::new(vec![ConfigTemplate::new(&template).unwrap()]);
        let first = lookup.lookup("c1").unwrap();
        let keys: Vec<&str> = first.annotations.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "cpusetd.io/exclusive.app",
                "io.kubernetes.cri.container-name",
                "io.kubernetes.cri.container-type",
                "io.kubernetes.cri.sandbox-name",
                "io.kubernetes.cri.sandbox-namespace",
                "io.kubernetes.cri.sandbox-uid",
            ]
        );
        let cached = lookup.lookup("c1").unwrap();
        assert_eq!(cached.annotations, first.annotations);
        assert_eq!(cached.cpu, first.cpu);
        assert_eq!(cached.container_name(), Some("app"));
        assert_eq!(cached.pod_name(), Some("web-0"));
        assert_eq!(cached.pod_namespace(), Some("default"));
        assert_eq!(cached.annotation("cpusetd.io/exclusive.app"), Some("false"));
    }

    #[test]
    fn lookup_tries_templates_in_order_and_caches() {
        let dir = tempfile::tempdir().unwrap();
        let first = format!("{}/a/{{id}}.json", dir.path().display());
        let second = format!("{}/b/{{id}}.json", dir.path().display());
        std::fs::create_dir_all(dir.path().join("a")).unwrap();
        std::fs::create_dir_all(dir.path().join("b")).unwrap();
        std::fs::write(dir.path().join("a/c1.json"), "garbage").unwrap();
        std::fs::write(
            dir.path().join("b/c1.json"),
            r#"{"annotations": {"io.kubernetes.container.name": "b"}}"#,
        )
        .unwrap();
        let mut lookup = RuntimeLookup::new(vec![
            ConfigTemplate::new(&first).unwrap(),
            ConfigTemplate::new(&second).unwrap(),
        ]);
        let info = lookup.lookup("c1").unwrap();
        assert_eq!(info.container_name(), Some("b"));
        assert!(lookup.lookup("c2").is_none());

        // Cached: a changed file is not re-read while the container lives.
        std::fs::remove_file(dir.path().join("b/c1.json")).unwrap();
        assert!(lookup.lookup("c1").is_some());
        lookup.retain(|id| id != "c1");
        assert!(lookup.lookup("c1").is_none());

        // Not found is not cached: the file may appear later.
        std::fs::write(dir.path().join("b/c2.json"), "{}").unwrap();
        assert!(lookup.lookup("c2").is_some());
    }
}
