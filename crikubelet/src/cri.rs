//! A blocking CRI client over the runtime's Unix socket (`k8s-cri`'s generated `runtime.v1`
//! client on a current-thread tokio runtime), and the calls kubelet makes for a pod.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerStatusRequest, CreateContainerRequest, ImageSpec,
    LinuxContainerConfig, LinuxContainerResources, LinuxContainerSecurityContext,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, Mount, MountPropagation, NamespaceMode,
    NamespaceOption, PodSandboxConfig, PodSandboxMetadata, RemoveContainerRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest, StopContainerRequest,
    StopPodSandboxRequest, UpdateContainerResourcesRequest, VersionRequest,
};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tower::service_fn;

use crate::resources::{self, Qos};
use crate::{ContainerSpec, NodeCgroups, PodSpec, RunningContainer, RunningPod};

/// The workload image [`crate::image`] builds.
pub const WORKLOAD_IMAGE: &str = "localhost/crikubelet/busybox:1";

/// What a container runs unless its spec says otherwise: prints the CPUs its first
/// instruction may run on (to the CRI log), then sleeps.
pub const DEFAULT_COMMAND: &[&str] = &[
    "/bin/sh",
    "-c",
    "grep Cpus_allowed_list /proc/self/status; exec sleep 100000",
];

/// A CRI call that failed.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("cannot connect to the CRI socket {socket}: {message}")]
    Connect { socket: PathBuf, message: String },
    #[error("CRI {call}: {status}")]
    Call {
        call: &'static str,
        status: Box<tonic::Status>,
    },
    #[error("{0}")]
    Other(String),
}

/// A connection to a runtime's CRI service.
#[derive(Debug)]
pub struct Cri {
    runtime: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
    /// Where CRI container logs go (`log_directory` of each sandbox).
    log_root: PathBuf,
}

impl Cri {
    /// Connects to `socket`, retrying for up to `wait` while the runtime starts; container logs
    /// go under `log_root`.
    pub fn connect(socket: &Path, log_root: &Path, wait: Duration) -> Result<Cri, CriError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| CriError::Other(format!("tokio runtime: {e}")))?;
        let deadline = Instant::now() + wait;
        let connect_error = |message: String| CriError::Connect {
            socket: socket.to_path_buf(),
            message,
        };
        loop {
            let attempt = runtime.block_on(async {
                let path = socket.to_path_buf();
                let channel = Endpoint::try_from("http://[::]:0")
                    .map_err(|e| e.to_string())?
                    .connect_with_connector(service_fn(move |_: Uri| {
                        let path = path.clone();
                        async move {
                            Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                        }
                    }))
                    .await
                    .map_err(|e| format!("{e:?}"))?;
                let mut client = RuntimeServiceClient::new(channel);
                client
                    .version(VersionRequest {
                        version: "v1".to_string(),
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(client)
            });
            match attempt {
                Ok(client) => {
                    return Ok(Cri {
                        runtime,
                        client,
                        log_root: log_root.to_path_buf(),
                    })
                }
                Err(message) if Instant::now() >= deadline => return Err(connect_error(message)),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Makes the pod's cgroup, runs its sandbox and starts its containers, as kubelet's
    /// `SyncPod` does for a new pod.
    pub fn run_pod(&mut self, node: &NodeCgroups, spec: &PodSpec) -> Result<RunningPod, CriError> {
        let cgroup_parent = node
            .create_pod(spec)
            .map_err(|e| CriError::Other(format!("pod cgroup of {}: {e}", spec.name)))?;
        let config = self.sandbox_config(spec, &cgroup_parent);
        let sandbox_id = self
            .call("RunPodSandbox", |mut c| async move {
                c.run_pod_sandbox(RunPodSandboxRequest {
                    config: Some(config),
                    runtime_handler: String::new(),
                })
                .await
            })?
            .pod_sandbox_id;
        let mut pod = RunningPod {
            spec: spec.clone(),
            sandbox_id,
            cgroup_parent,
            containers: Vec::new(),
        };
        for container in &spec.containers {
            let running = self.start_container(node, &pod, container, 0)?;
            pod.containers.push(running);
        }
        Ok(pod)
    }

    /// kubelet's restart of a container that exited: stop and remove it, then create and start
    /// it again as attempt + 1 in the same sandbox.
    pub fn restart(
        &mut self,
        node: &NodeCgroups,
        pod: &mut RunningPod,
        name: &str,
    ) -> Result<RunningContainer, CriError> {
        let at = pod
            .containers
            .iter()
            .position(|c| c.name == name)
            .ok_or_else(|| {
                CriError::Other(format!("pod {} has no container {name}", pod.spec.name))
            })?;
        let old = pod.containers[at].clone();
        self.stop_and_remove_container(&old.id)?;
        let spec = pod
            .spec
            .containers
            .iter()
            .find(|c| c.name == name)
            .cloned()
            .expect("running containers come from the spec");
        let new = self.start_container(node, pod, &spec, old.attempt + 1)?;
        pod.containers[at] = new.clone();
        Ok(new)
    }

    /// Deletes the pod: containers stopped and removed, the sandbox stopped and removed, the pod
    /// cgroup removed (kubelet's pod cleanup).
    pub fn delete_pod(&mut self, node: &NodeCgroups, pod: &RunningPod) -> Result<(), CriError> {
        for container in &pod.containers {
            self.stop_and_remove_container(&container.id)?;
        }
        let id = pod.sandbox_id.clone();
        self.call("StopPodSandbox", |mut c| {
            let id = id.clone();
            async move {
                c.stop_pod_sandbox(StopPodSandboxRequest { pod_sandbox_id: id })
                    .await
            }
        })?;
        self.call("RemovePodSandbox", |mut c| async move {
            c.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id })
                .await
        })?;
        node.remove_pod(&pod.spec)
            .map_err(|e| CriError::Other(format!("pod cgroup of {}: {e}", pod.spec.name)))
    }

    /// kubelet's in-place resize of a container's CPU (`request_milli`/`limit_milli`, 0: none):
    /// the pod cgroup first when the pod's CPU grows, after when it shrinks, and the container
    /// through CRI `UpdateContainerResources` with the resources kubelet computes for it.
    pub fn resize_cpu(
        &mut self,
        node: &NodeCgroups,
        pod: &mut RunningPod,
        name: &str,
        request_milli: u64,
        limit_milli: u64,
    ) -> Result<(), CriError> {
        let before = resources::pod_resources(&pod.spec.containers).cpu_shares;
        let spec = pod
            .spec
            .containers
            .iter_mut()
            .find(|c| c.name == name)
            .ok_or_else(|| {
                CriError::Other(format!("pod {} has no container {name}", pod.spec.name))
            })?;
        spec.cpu_request_milli = request_milli;
        spec.cpu_limit_milli = limit_milli;
        let spec = spec.clone();
        let grows = resources::pod_resources(&pod.spec.containers).cpu_shares >= before;
        let update_pod = |node: &NodeCgroups, pod: &RunningPod| {
            node.update_pod(&pod.spec)
                .map_err(|e| CriError::Other(format!("pod cgroup of {}: {e}", pod.spec.name)))
        };
        if grows {
            update_pod(node, pod)?;
        }
        let id = pod
            .container(name)
            .map(|c| c.id.clone())
            .ok_or_else(|| CriError::Other(format!("container {name} is not running")))?;
        let config = container_config(&spec, pod.spec.qos(), node.node_memory(), 0);
        let linux = config.linux.and_then(|l| l.resources);
        self.call("UpdateContainerResources", |mut c| async move {
            c.update_container_resources(UpdateContainerResourcesRequest {
                container_id: id,
                linux,
                ..Default::default()
            })
            .await
        })?;
        if !grows {
            update_pod(node, pod)?;
        }
        Ok(())
    }

    /// The container's init pid, from the runtime's verbose status (`info.pid`).
    pub fn pid(&mut self, container_id: &str) -> Result<u32, CriError> {
        let id = container_id.to_string();
        let response = self.call("ContainerStatus", |mut c| async move {
            c.container_status(ContainerStatusRequest {
                container_id: id,
                verbose: true,
            })
            .await
        })?;
        let info = response
            .info
            .get("info")
            .ok_or_else(|| CriError::Other(format!("no verbose info for {container_id}")))?;
        let value: serde_json::Value = serde_json::from_str(info)
            .map_err(|e| CriError::Other(format!("verbose info of {container_id}: {e}")))?;
        value
            .get("pid")
            .and_then(serde_json::Value::as_u64)
            .and_then(|pid| u32::try_from(pid).ok())
            .filter(|pid| *pid > 0)
            .ok_or_else(|| CriError::Other(format!("no pid in the status of {container_id}")))
    }

    fn stop_and_remove_container(&mut self, id: &str) -> Result<(), CriError> {
        let stop_id = id.to_string();
        self.call("StopContainer", |mut c| async move {
            c.stop_container(StopContainerRequest {
                container_id: stop_id,
                timeout: 0,
            })
            .await
        })?;
        let remove_id = id.to_string();
        self.call("RemoveContainer", |mut c| async move {
            c.remove_container(RemoveContainerRequest {
                container_id: remove_id,
            })
            .await
        })?;
        Ok(())
    }

    fn start_container(
        &mut self,
        node: &NodeCgroups,
        pod: &RunningPod,
        spec: &ContainerSpec,
        attempt: u32,
    ) -> Result<RunningContainer, CriError> {
        let qos = pod.spec.qos();
        let sandbox_config = self.sandbox_config(&pod.spec, &pod.cgroup_parent);
        let config = container_config(spec, qos, node.node_memory(), attempt);
        let log_path = self
            .log_directory(&pod.spec)
            .join(&config.log_path)
            .display()
            .to_string();
        let sandbox_id = pod.sandbox_id.clone();
        let container_id = self
            .call("CreateContainer", |mut c| async move {
                c.create_container(CreateContainerRequest {
                    pod_sandbox_id: sandbox_id,
                    config: Some(config),
                    sandbox_config: Some(sandbox_config),
                })
                .await
            })?
            .container_id;
        let id = container_id.clone();
        self.call("StartContainer", |mut c| async move {
            c.start_container(StartContainerRequest { container_id: id })
                .await
        })?;
        let pid = self.pid(&container_id)?;
        Ok(RunningContainer {
            name: spec.name.clone(),
            id: container_id,
            pid,
            attempt,
            log_path,
        })
    }

    /// kubelet's sandbox config: metadata, the labels and annotations kubelet adds, host
    /// network (no CNI), the pod cgroup as `cgroup_parent`.
    fn sandbox_config(&self, spec: &PodSpec, cgroup_parent: &str) -> PodSandboxConfig {
        let labels = HashMap::from([
            ("io.kubernetes.pod.name".to_string(), spec.name.clone()),
            (
                "io.kubernetes.pod.namespace".to_string(),
                spec.namespace.clone(),
            ),
            ("io.kubernetes.pod.uid".to_string(), spec.uid.clone()),
        ]);
        let mut annotations = spec.annotations.clone();
        annotations
            .entry("kubernetes.io/config.source".to_string())
            .or_insert_with(|| "api".to_string());
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: spec.name.clone(),
                uid: spec.uid.clone(),
                namespace: spec.namespace.clone(),
                attempt: 0,
            }),
            // The node's network and UTS namespaces: runc refuses to set a hostname in them.
            hostname: String::new(),
            log_directory: self.log_directory(spec).display().to_string(),
            labels,
            annotations,
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: cgroup_parent.to_string(),
                security_context: Some(LinuxSandboxSecurityContext {
                    privileged: spec.containers.iter().any(|c| c.privileged),
                    namespace_options: Some(NamespaceOption {
                        network: NamespaceMode::Node as i32,
                        pid: NamespaceMode::Container as i32,
                        ipc: NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// `/var/log/pods/<namespace>_<name>_<uid>`, under this client's log root.
    fn log_directory(&self, spec: &PodSpec) -> PathBuf {
        self.log_root
            .join(format!("{}_{}_{}", spec.namespace, spec.name, spec.uid))
    }

    /// One CRI call on a clone of the client (tonic clients are cheap handles), blocking.
    fn call<T, F, Fut>(&mut self, name: &'static str, f: F) -> Result<T, CriError>
    where
        F: FnOnce(RuntimeServiceClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let client = self.client.clone();
        self.runtime
            .block_on(f(client))
            .map(tonic::Response::into_inner)
            .map_err(|status| CriError::Call {
                call: name,
                status: Box::new(status),
            })
    }
}

/// kubelet's container config for `spec`: metadata with the attempt, the labels kubelet puts
/// on every container, its resources, a log path `<name>/<attempt>.log`.
fn container_config(
    spec: &ContainerSpec,
    qos: Qos,
    node_memory: u64,
    attempt: u32,
) -> ContainerConfig {
    let r = resources::container_resources(spec, qos, node_memory);
    let command = if spec.command.is_empty() {
        DEFAULT_COMMAND.iter().map(|s| s.to_string()).collect()
    } else {
        spec.command.clone()
    };
    let to_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: spec.name.clone(),
            attempt,
        }),
        image: Some(ImageSpec {
            image: spec
                .image
                .clone()
                .unwrap_or_else(|| WORKLOAD_IMAGE.to_string()),
            ..Default::default()
        }),
        mounts: spec
            .mounts
            .iter()
            .map(|m| Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                readonly: m.readonly,
                // kubelet's default for a hostPath volume without mountPropagation.
                propagation: MountPropagation::PropagationPrivate as i32,
                ..Default::default()
            })
            .collect(),
        command,
        labels: HashMap::from([(
            "io.kubernetes.container.name".to_string(),
            spec.name.clone(),
        )]),
        annotations: HashMap::from([(
            "io.kubernetes.container.restartCount".to_string(),
            attempt.to_string(),
        )]),
        log_path: format!("{}/{attempt}.log", spec.name),
        linux: Some(LinuxContainerConfig {
            resources: Some(LinuxContainerResources {
                cpu_period: to_i64(r.cpu_period),
                cpu_quota: to_i64(r.cpu_quota),
                cpu_shares: to_i64(r.cpu_shares),
                memory_limit_in_bytes: to_i64(r.memory_limit),
                oom_score_adj: r.oom_score_adj,
                cpuset_cpus: spec.cpuset_cpus.clone().unwrap_or_default(),
                ..Default::default()
            }),
            security_context: Some(LinuxContainerSecurityContext {
                privileged: spec.privileged,
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}
