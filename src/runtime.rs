//! The container runtime's view of a container: its OCI `config.json`, found through path
//! templates (`{id}` = the container id) and reduced to what classification needs — the
//! annotations (container name, pod UID, sandbox or not, `cpusetd.io/*` opt-outs),
//! `linux.resources.cpu.{shares,quota,period}`, and the devices it was given (VFIO groups in
//! `linux.devices`, device plugins' PCI addresses in `process.env`; see `devices`), which a
//! lookup with a sysfs root also locates on their NUMA nodes.
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

use crate::classify::ANNOTATION_KEYS as KEPT_KEYS;
use crate::devices::{ContainerDevice, DeviceId, DeviceLocator, MAX_DEVICES};

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

/// Test builds: the keys [`RuntimeInfo::annotation`] was asked for on this thread, so a test
/// can prove that every key classification reads is one [`RuntimeInfo::trimmed`] keeps.
#[cfg(test)]
pub(crate) mod asked {
    use std::cell::RefCell;
    use std::collections::BTreeSet;

    thread_local! {
        static ASKED: RefCell<BTreeSet<String>> = const { RefCell::new(BTreeSet::new()) };
    }

    pub(crate) fn note(key: &str) {
        ASKED.with(|asked| asked.borrow_mut().insert(key.to_string()));
    }

    /// The keys asked for since the last call.
    pub(crate) fn take() -> BTreeSet<String> {
        ASKED.with(|asked| std::mem::take(&mut *asked.borrow_mut()))
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

// KEPT_KEYS: what [`RuntimeInfo::trimmed`] keeps by full name and the lookup cache stores as a
// one-byte index (1 + its index): `classify`'s one list of the keys it reads, so a key
// classification reads is never trimmed away unseen.
const _: () = assert!(
    KEPT_KEYS.len() < u8::MAX as usize,
    "1 + an index fits a byte"
);

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
    /// The devices it was given (at most [`MAX_DEVICES`]), located on their NUMA nodes when
    /// the lookup has a sysfs root.
    pub devices: Vec<ContainerDevice>,
    /// Parts of the config that were ignored, for the log.
    pub ignored: Vec<String>,
}

impl RuntimeInfo {
    /// Only what classification reads: the CPU request and the annotations of [`keys`] and
    /// `cpusetd.io/` (an OCI config carries dozens more; the agent caches one per container).
    pub fn trimmed(mut self) -> RuntimeInfo {
        for map in [
            &mut self.annotations,
            &mut self.crio_annotations,
            &mut self.crio_labels,
        ] {
            map.retain(|key, _| crate::classify::reads_annotation(key));
        }
        self.ignored = Vec::new();
        self
    }

    /// An annotation from the top level, else from CRI-O's encoded annotations, else from its
    /// encoded labels.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        #[cfg(test)]
        asked::note(key);
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
    process: ProcessDocument,
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
                        "process" => document.process = map.next_value()?,
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
    /// `linux.devices`: objects with a `path`; only VFIO group paths are kept.
    #[serde(default, deserialize_with = "lenient")]
    devices: Option<Vec<serde_json::Value>>,
}

/// `process` of an OCI config: only `env` entries of device plugins are kept. `process` holds
/// much the agent does not read (args, capabilities, rlimits): it is skipped without being
/// built, as is anything of the wrong type, so it cannot fail the document or nest deep.
#[derive(Default)]
struct ProcessDocument {
    /// The `PCIDEVICE_*` / `PCI_RESOURCE_*` entries of `env`, at most [`MAX_DEVICES`] of them.
    device_env: Vec<String>,
    /// How many such entries were dropped past the limit.
    dropped: usize,
}

/// A JSON value of the wrong type is skipped without recursing (serde_json ignores values
/// iteratively), and gives `T::default()`.
macro_rules! skip_other_types {
    ($value:ty) => {
        fn visit_bool<E>(self, _: bool) -> Result<$value, E> {
            Ok(Default::default())
        }
        fn visit_i64<E>(self, _: i64) -> Result<$value, E> {
            Ok(Default::default())
        }
        fn visit_u64<E>(self, _: u64) -> Result<$value, E> {
            Ok(Default::default())
        }
        fn visit_f64<E>(self, _: f64) -> Result<$value, E> {
            Ok(Default::default())
        }
        fn visit_unit<E>(self) -> Result<$value, E> {
            Ok(Default::default())
        }
    };
}

/// Drains a sequence or map of the wrong type without building it.
fn skip_seq<'de, A: serde::de::SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
    Ok(())
}

fn skip_map<'de, A: serde::de::MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map
        .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
        .is_some()
    {}
    Ok(())
}

impl<'de> Deserialize<'de> for ProcessDocument {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = ProcessDocument;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an OCI process object")
            }

            skip_other_types!(ProcessDocument);

            fn visit_str<E>(self, _: &str) -> Result<ProcessDocument, E> {
                Ok(ProcessDocument::default())
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                seq: A,
            ) -> Result<ProcessDocument, A::Error> {
                skip_seq(seq).map(|()| ProcessDocument::default())
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ProcessDocument, A::Error> {
                let mut document = ProcessDocument::default();
                while let Some(key) = map.next_key::<String>()? {
                    if key == "env" {
                        // Given twice, the last counts (as for the top level).
                        document = map.next_value_seed(DeviceEnv)?;
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(document)
            }
        }
        deserializer.deserialize_any(Members)
    }
}

/// `process.env` read as a [`ProcessDocument`] (only its device-plugin entries).
struct DeviceEnv;

impl<'de> serde::de::DeserializeSeed<'de> for DeviceEnv {
    type Value = ProcessDocument;

    fn deserialize<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<ProcessDocument, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = ProcessDocument;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of environment variables")
            }

            skip_other_types!(ProcessDocument);

            fn visit_str<E>(self, _: &str) -> Result<ProcessDocument, E> {
                Ok(ProcessDocument::default())
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<ProcessDocument, A::Error> {
                skip_map(map).map(|()| ProcessDocument::default())
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<ProcessDocument, A::Error> {
                let mut document = ProcessDocument::default();
                while let Some(entry) = seq.next_element::<EnvEntry>()? {
                    let Some(entry) = entry.0 else { continue };
                    if document.device_env.len() < MAX_DEVICES {
                        document.device_env.push(entry);
                    } else {
                        document.dropped += 1;
                    }
                }
                Ok(document)
            }
        }
        deserializer.deserialize_any(Entries)
    }
}

/// One `env` entry: kept only when it is a string naming a device plugin's variable.
#[derive(Default)]
struct EnvEntry(Option<String>);

impl<'de> Deserialize<'de> for EnvEntry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entry;
        impl<'de> serde::de::Visitor<'de> for Entry {
            type Value = EnvEntry;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an environment variable")
            }

            skip_other_types!(EnvEntry);

            fn visit_str<E>(self, text: &str) -> Result<EnvEntry, E> {
                let wanted = crate::devices::PCI_ENV_PREFIXES
                    .iter()
                    .any(|prefix| text.starts_with(prefix));
                Ok(EnvEntry(wanted.then(|| text.to_string())))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<EnvEntry, A::Error> {
                skip_seq(seq).map(|()| EnvEntry(None))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<EnvEntry, A::Error> {
                skip_map(map).map(|()| EnvEntry(None))
            }
        }
        deserializer.deserialize_any(Entry)
    }
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
    let mut not_strings = 0usize;
    let mut first = None;
    for (key, value) in map {
        match value {
            serde_json::Value::String(text) => {
                strings.insert(key, text);
            }
            _ => {
                not_strings += 1;
                first.get_or_insert(key);
            }
        }
    }
    // Counted, not listed: a config may hold many thousands.
    if let Some(first) = first {
        ignored.push(format!(
            "{not_strings} {what} values are not strings (the first: {:?})",
            crate::logging::excerpt(&first)
        ));
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
    let linux = document.linux.unwrap_or_default();
    let devices = container_devices(
        linux.devices.as_deref().unwrap_or_default(),
        &document.process,
        &mut ignored,
    );
    let cpu = linux.resources.and_then(|r| r.cpu).unwrap_or_default();
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
        devices,
        ignored,
    })
}

/// The VFIO groups of `linux.devices` and the PCI addresses of device plugins' variables, each
/// once, in the config's order, at most [`MAX_DEVICES`]; what is not usable goes to `ignored`.
fn container_devices(
    linux_devices: &[serde_json::Value],
    process: &ProcessDocument,
    ignored: &mut Vec<String>,
) -> Vec<ContainerDevice> {
    let mut ids: Vec<DeviceId> = Vec::new();
    let mut dropped = process.dropped;
    let mut add = |id: DeviceId, ids: &mut Vec<DeviceId>| {
        if ids.contains(&id) {
            return;
        }
        if ids.len() < MAX_DEVICES {
            ids.push(id);
        } else {
            dropped += 1;
        }
    };
    for device in linux_devices {
        let Some(path) = device.get("path").and_then(serde_json::Value::as_str) else {
            continue;
        };
        if let Some(group) = crate::devices::vfio_group_of_path(path) {
            add(DeviceId::VfioGroup(group), &mut ids);
        }
    }
    // Bad entries are counted over every variable and said once, with the first of them:
    // a pod author writes the environment, and one variable may hold millions.
    let (mut bad, mut bad_variables, mut first_bad) = (0usize, 0usize, None);
    for entry in &process.device_env {
        let Some(found) = crate::devices::pci_addresses_of_env(entry) else {
            continue;
        };
        if found.bad > 0 {
            bad += found.bad;
            bad_variables += 1;
            first_bad = first_bad.or(found.first_bad);
        }
        for address in found.addresses {
            add(DeviceId::Pci(address), &mut ids);
        }
    }
    if let Some(first) = first_bad {
        ignored.push(format!(
            "{bad} entries of {bad_variables} device plugin variable(s) are not PCI addresses \
             (the first: {first})"
        ));
    }
    if dropped > 0 {
        ignored.push(format!(
            "{dropped} more devices past the first {MAX_DEVICES} are not located"
        ));
    }
    ids.into_iter().map(ContainerDevice::unlocated).collect()
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

/// A cached runtime config: [`RuntimeInfo::trimmed`], its annotations packed into one
/// allocation (the agent keeps one per container: as maps, or even as lists of strings, they
/// took about 750 bytes in a dozen allocations; packed, about 110 in one).
#[derive(Debug, Clone)]
struct CachedInfo {
    /// Each annotation of the three maps as: the map (0 top level, 1 CRI-O's annotations,
    /// 2 its labels); the key, as 1 + its index in [`KEPT_KEYS`], or 0 and the key spelt out;
    /// the value. Texts are a `u32` length (little-endian) and the bytes.
    annotations: Box<[u8]>,
    cpu: OciCpu,
    devices: Box<[ContainerDevice]>,
}

impl CachedInfo {
    fn of(info: &RuntimeInfo) -> CachedInfo {
        fn text(packed: &mut Vec<u8>, text: &str) {
            // A config is at most MAX_CONFIG_BYTES (4 MiB), so every length fits.
            packed.extend_from_slice(&(text.len() as u32).to_le_bytes());
            packed.extend_from_slice(text.as_bytes());
        }
        let mut packed = Vec::new();
        let maps = [&info.annotations, &info.crio_annotations, &info.crio_labels];
        for (map, annotations) in (0u8..).zip(maps) {
            for (key, value) in annotations {
                packed.push(map);
                match KEPT_KEYS.iter().position(|kept| kept == key) {
                    Some(index) => packed.push(index as u8 + 1),
                    None => {
                        packed.push(0);
                        text(&mut packed, key);
                    }
                }
                text(&mut packed, value);
            }
        }
        CachedInfo {
            annotations: packed.into_boxed_slice(),
            cpu: info.cpu,
            devices: info.devices.iter().cloned().collect(),
        }
    }

    fn info(&self) -> RuntimeInfo {
        fn text<'a>(packed: &mut &'a [u8]) -> &'a str {
            let (len, rest) = packed.split_at(4);
            let len = u32::from_le_bytes(len.try_into().expect("four bytes")) as usize;
            let (text, rest) = rest.split_at(len);
            *packed = rest;
            std::str::from_utf8(text).expect("packed from a str")
        }
        let mut info = RuntimeInfo {
            cpu: self.cpu,
            devices: self.devices.to_vec(),
            ..RuntimeInfo::default()
        };
        let mut packed = &self.annotations[..];
        while let [map, key, rest @ ..] = packed {
            packed = rest;
            let key = match key {
                0 => text(&mut packed),
                index => KEPT_KEYS[usize::from(*index) - 1],
            };
            let value = text(&mut packed).to_string();
            let annotations = match map {
                0 => &mut info.annotations,
                1 => &mut info.crio_annotations,
                _ => &mut info.crio_labels,
            };
            annotations.insert(key.to_string(), value);
        }
        info
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
    /// Boxed: most of a table's slots are empty, and a `None` (an unusable config) needs no
    /// more than its slot.
    cache: HashMap<Box<str>, Option<Box<CachedInfo>>>,
    /// Where containers' devices are located; `None`: their NUMA nodes stay unknown.
    locator: Option<DeviceLocator>,
}

impl RuntimeLookup {
    pub fn new(templates: Vec<ConfigTemplate>) -> RuntimeLookup {
        RuntimeLookup {
            templates,
            cache: HashMap::new(),
            locator: None,
        }
    }

    /// Locates containers' devices through this sysfs root (once per container, when its
    /// config is first read: a device does not move while the container runs).
    pub fn with_sysfs(mut self, sysfs: &Path) -> RuntimeLookup {
        self.locator = Some(DeviceLocator::new(sysfs));
        self
    }

    pub fn templates(&self) -> &[ConfigTemplate] {
        &self.templates
    }

    /// The runtime info of a container, from the first template whose file exists and parses.
    pub fn lookup(&mut self, container_id: &str) -> Option<RuntimeInfo> {
        if let Some(cached) = self.cache.get(container_id) {
            return cached.as_deref().map(CachedInfo::info);
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
                Ok(Some(mut info)) => {
                    if !info.ignored.is_empty() {
                        log::warn!(
                            "{}: ignored: {}",
                            path.display(),
                            crate::logging::summary(&info.ignored)
                        );
                    }
                    if let (Some(locator), false) = (&self.locator, info.devices.is_empty()) {
                        let problems = locator.locate(&mut info.devices);
                        if !problems.is_empty() {
                            log::warn!(
                                "container {container_id}: device numa node unknown: {}",
                                crate::logging::summary(&problems)
                            );
                        }
                        log::debug!(
                            "container {container_id}: devices {}",
                            crate::devices::describe_all(&info.devices)
                        );
                    }
                    let info = info.trimmed();
                    self.cache
                        .insert(container_id.into(), Some(Box::new(CachedInfo::of(&info))));
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
            self.cache.insert(container_id.into(), None);
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
        assert_eq!(
            info.ignored,
            ["1 annotation values are not strings (the first: \"weird\")"]
        );
    }

    #[test]
    fn trimming_and_the_cache_keep_cpu_shared_keys() {
        let json = br#"{"annotations": {
            "io.kubernetes.cri.container-name": "app",
            "cpu-shared.crio.io/app": "enable",
            "cpusetd.io/projection": "enable",
            "unrelated.example.com/x": "y",
            "io.kubernetes.cri-o.Annotations": "{\"cpu-shared.crio.io/side\":\"enable\"}"
        }}"#;
        let info = parse_config(json).unwrap().trimmed();
        assert_eq!(info.annotation("cpu-shared.crio.io/app"), Some("enable"));
        assert_eq!(info.annotation("cpu-shared.crio.io/side"), Some("enable"));
        assert_eq!(info.annotation("cpusetd.io/projection"), Some("enable"));
        assert_eq!(info.annotation("unrelated.example.com/x"), None);
        assert_eq!(CachedInfo::of(&info).info(), info);
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

    fn fixture(name: &str) -> RuntimeInfo {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/runtime")
            .join(name);
        load_config(&path).unwrap().unwrap()
    }

    fn device_ids(info: &RuntimeInfo) -> Vec<String> {
        info.devices.iter().map(|d| d.id.to_string()).collect()
    }

    #[test]
    fn a_kubevirt_launcher_gives_its_vfio_group_and_host_device() {
        let info = fixture("kubevirt-vfio.json");
        assert_eq!(info.container_name(), Some("compute"));
        assert_eq!(info.cpu.shares, Some(4096));
        // /dev/vfio/vfio, /dev/kvm and the JSON-valued `_INFO` variable are not devices.
        assert_eq!(device_ids(&info), ["vfio/166", "0000:d8:02.1"]);
        assert!(info.ignored.is_empty(), "{:?}", info.ignored);
        assert!(info.devices.iter().all(|d| d.numa.is_empty()));
    }

    #[test]
    fn an_sriov_pod_gives_the_addresses_of_its_device_plugins() {
        let info = fixture("sriov-netdevice-crio.json");
        assert_eq!(info.container_name(), Some("fwd"));
        assert_eq!(info.pod_namespace(), Some("cnf"));
        // The good address of a variable with a bad one is kept; the bad ones are said.
        assert_eq!(
            device_ids(&info),
            ["0000:3b:02.0", "0000:3b:02.1", "0000:86:00.2"]
        );
        // Counted once for the container, with the first (issue 23, item 12).
        assert_eq!(info.ignored.len(), 1, "{:?}", info.ignored);
        assert!(
            info.ignored[0].starts_with("2 entries of 1 device plugin variable(s)")
                && info.ignored[0].contains("0000:3b:2.0"),
            "{:?}",
            info.ignored
        );
    }

    #[test]
    fn device_fields_of_the_wrong_shape_are_dropped_not_fatal() {
        let json = br#"{"process": {"env": ["PCIDEVICE_A=0000:3b:02.0", 7, null, ["x"], {"a": 1},
                                            "PCIDEVICE_A=0000:3b:02.0", "PCIDEVICE_B"]},
                        "linux": {"devices": [{"path": 5}, "x", {"path": "/dev/vfio/3"},
                                              {"path": "/dev/vfio/3"}, {"nopath": 1}]}}"#;
        let info = parse_config(json).unwrap();
        assert_eq!(device_ids(&info), ["vfio/3", "0000:3b:02.0"]);
        for json in [
            &br#"{"process": "sh"}"#[..],
            br#"{"process": {"env": "PCIDEVICE_A=0000:3b:02.0"}}"#,
            br#"{"process": {"env": {"PCIDEVICE_A": "0000:3b:02.0"}}}"#,
            br#"{"process": [1, 2]}"#,
            br#"{"linux": {"devices": {"path": "/dev/vfio/3"}}}"#,
        ] {
            let info = parse_config(json).unwrap();
            assert!(info.devices.is_empty(), "{}", String::from_utf8_lossy(json));
        }
        // Deep nesting in process.env is skipped like any other unread part.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let json = format!(r#"{{"process": {{"env": ["PCIDEVICE_A=0000:3b:02.0", {deep}]}}}}"#);
        let info = parse_config(json.as_bytes()).unwrap();
        assert_eq!(device_ids(&info), ["0000:3b:02.0"]);
    }

    #[test]
    fn devices_are_bounded() {
        let env: Vec<String> = (0..200)
            .map(|i| format!("\"PCIDEVICE_R{i}=0000:{:02x}:00.0\"", i))
            .collect();
        let json = format!(r#"{{"process": {{"env": [{}]}}}}"#, env.join(","));
        let info = parse_config(json.as_bytes()).unwrap();
        assert_eq!(info.devices.len(), MAX_DEVICES);
        assert!(
            info.ignored.iter().any(|i| i.contains("more devices")),
            "{:?}",
            info.ignored
        );
    }

    #[test]
    fn a_lookup_with_sysfs_locates_the_devices_once_and_caches_them() {
        let dir = tempfile::tempdir().unwrap();
        let sysfs = dir.path().join("sys");
        let node_of = |address: &str, node: &str| {
            let device = sysfs.join("bus/pci/devices").join(address);
            std::fs::create_dir_all(&device).unwrap();
            std::fs::write(device.join("numa_node"), format!("{node}\n")).unwrap();
        };
        node_of("0000:d8:02.1", "1");
        std::fs::create_dir_all(sysfs.join("kernel/iommu_groups/166/devices/0000:d8:02.1"))
            .unwrap();
        std::fs::create_dir_all(dir.path().join("c1")).unwrap();
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/runtime/kubevirt-vfio.json"),
            dir.path().join("c1/config.json"),
        )
        .unwrap();
        let template = format!("{}/{{id}}/config.json", dir.path().display());
        let mut lookup =
            RuntimeLookup::new(vec![ConfigTemplate::new(&template).unwrap()]).with_sysfs(&sysfs);
        let info = lookup.lookup("c1").unwrap();
        let shown: Vec<String> = info.devices.iter().map(|d| d.describe()).collect();
        assert_eq!(
            shown,
            ["vfio/166 (0000:d8:02.1) numa 1", "0000:d8:02.1 numa 1"]
        );
        // Cached with the container: sysfs is not read again.
        std::fs::remove_dir_all(&sysfs).unwrap();
        assert_eq!(lookup.lookup("c1").unwrap().devices, info.devices);
        // Without a sysfs root the devices are known, their nodes are not.
        let mut plain = RuntimeLookup::new(vec![ConfigTemplate::new(&template).unwrap()]);
        let info = plain.lookup("c1").unwrap();
        assert_eq!(info.devices.len(), 2);
        assert!(crate::devices::numa_nodes(&info.devices).is_empty());
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
    fn the_packed_cache_gives_back_every_map_as_it_was() {
        let map = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        let info = RuntimeInfo {
            annotations: map(&[
                (keys::CRI_CONTAINER_NAME, "app"),
                ("cpusetd.io/exclusive.app", "false"),
                ("cpusetd.io/empty", ""),
            ]),
            crio_annotations: map(&[("irq-load-balancing.crio.io", "disable")]),
            crio_labels: map(&[(keys::KUBE_POD_UID, "u1"), (keys::KUBE_POD_NAME, "ü-0")]),
            cpu: OciCpu {
                shares: Some(2048),
                quota: Some(-1),
                period: None,
            },
            devices: Vec::new(),
            ignored: Vec::new(),
        };
        assert_eq!(CachedInfo::of(&info).info(), info);
        assert_eq!(
            CachedInfo::of(&RuntimeInfo::default()).info(),
            RuntimeInfo::default()
        );
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
