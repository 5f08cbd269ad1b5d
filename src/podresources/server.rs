//! The gRPC server: one thread (`cpusetd-podres`) with a current-thread tokio runtime, the
//! agent's only async code. It reads [`Published`] snapshots and asks kubelet's socket; it
//! never sends anything to the controller, so a slow or stuck client cannot slow a pin.

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Server, Uri};
use tonic::{Request, Response, Status};

use super::v1::pod_resources_lister_client::PodResourcesListerClient;
use super::v1::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
use super::v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, GetPodResourcesRequest,
    GetPodResourcesResponse, ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};
use super::{cpu_ids, own_list, with_cpusetd_cpus, Published};

/// kubelet's PodResources socket (its `--pod-resources` default under `--root-dir`).
pub const KUBELET_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// How long a request waits for kubelet's answer before cpusetd answers alone.
const KUBELET_TIMEOUT: Duration = Duration::from_secs(2);

/// kubelet's limit on a PodResources message (`podresources.DefaultPodResourcesMaxSize`).
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{path} exists and is not a socket (nothing is removed that is not one)")]
    NotASocket { path: PathBuf },
    #[error("cannot remove the old socket {path}")]
    RemoveStale {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot listen on {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot start the PodResources server's runtime")]
    Runtime(#[source] io::Error),
}

/// The running server; [`PodResourcesServer::stop`] ends it and removes its socket.
#[derive(Debug)]
pub struct PodResourcesServer {
    socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl PodResourcesServer {
    /// Listens on `socket` (an old socket there is replaced: the state lock says no other
    /// agent uses it) and serves from `published`, merging kubelet's answers from
    /// `kubelet` when given.
    pub fn start(
        socket: &Path,
        kubelet: Option<PathBuf>,
        published: Arc<Published>,
    ) -> Result<PodResourcesServer, ServeError> {
        let listener = bind(socket)?;
        // What was bound, seen here and not by the server thread when it gets to run: the
        // path may be gone by then (the state directory removed), and a thread that first
        // looked at an empty path would take the emptiness for its own and never bind again.
        let bound = inode(socket);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(ServeError::Runtime)?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let path = socket.to_path_buf();
        let thread = thread::Builder::new()
            .name("cpusetd-podres".into())
            .spawn(move || {
                serve(
                    runtime,
                    (listener, bound),
                    kubelet,
                    published,
                    stop_rx,
                    &path,
                )
            })
            .map_err(ServeError::Runtime)?;
        log::info!("serving kubelet's PodResources API on {}", socket.display());
        Ok(PodResourcesServer {
            socket: socket.to_path_buf(),
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// Stops serving (open connections are dropped, not drained: a client that never reads
    /// cannot hold the agent's exit) and removes the socket.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
            if let Err(e) = remove_socket(&self.socket) {
                log::debug!("cannot remove {}: {e}", self.socket.display());
            }
        }
    }
}

impl Drop for PodResourcesServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Binds `path`, replacing an old socket (never anything else).
fn bind(path: &Path) -> Result<std::os::unix::net::UnixListener, ServeError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            remove_socket(path).map_err(|source| ServeError::RemoveStale {
                path: path.to_path_buf(),
                source,
            })?
        }
        Ok(_) => {
            return Err(ServeError::NotASocket {
                path: path.to_path_buf(),
            })
        }
        Err(_) => {}
    }
    let bind_error = |source| ServeError::Bind {
        path: path.to_path_buf(),
        source,
    };
    let listener = std::os::unix::net::UnixListener::bind(path).map_err(bind_error)?;
    listener.set_nonblocking(true).map_err(bind_error)?;
    Ok(listener)
}

/// Removes the socket at `path` if it is one.
fn remove_socket(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path),
        _ => Ok(()),
    }
}

/// The server thread: serves until told to stop, then drops the runtime (and every
/// connection's task with it).
fn serve(
    runtime: tokio::runtime::Runtime,
    (listener, mut bound): (std::os::unix::net::UnixListener, Option<u64>),
    kubelet: Option<PathBuf>,
    published: Arc<Published>,
    stop: tokio::sync::oneshot::Receiver<()>,
    path: &Path,
) {
    runtime.block_on(async move {
        let listener = match tokio::net::UnixListener::from_std(listener) {
            Ok(listener) => listener,
            Err(e) => {
                log::error!("PodResources server on {}: {e}", path.display());
                return;
            }
        };
        let lister = Lister {
            published,
            kubelet: kubelet.map(Kubelet::new),
        };
        let service = PodResourcesListerServer::new(lister).max_encoding_message_size(MAX_MESSAGE);
        let mut listener = listener;
        let mut stop = stop;
        loop {
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
            let server = Server::builder().serve_with_incoming(service.clone(), incoming);
            tokio::select! {
                result = server => {
                    if let Err(e) = result {
                        log::error!("PodResources server on {} stopped: {e}", path.display());
                    }
                    return;
                },
                _ = &mut stop => return,
                // Connections already open stay (they are tasks of their own).
                fresh = bound_again_when_gone(path, bound) => {
                    // Bound by this thread just now: its inode is the new socket's.
                    bound = inode(path);
                    listener = fresh;
                }
            }
        }
    });
    drop(runtime);
}

/// How often the socket's path is looked at (a `stat`).
const SOCKET_CHECK: Duration = Duration::from_secs(5);

fn inode(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| m.ino())
}

/// Resolves once the socket at `path` was removed (the state directory with it, say) and a new
/// one is bound there. Something else put in its place is left alone, and said once.
async fn bound_again_when_gone(path: &Path, bound: Option<u64>) -> tokio::net::UnixListener {
    let mut said = false;
    loop {
        tokio::time::sleep(SOCKET_CHECK).await;
        match inode(path) {
            now if now == bound => continue,
            Some(_) => {
                if !said {
                    log::warn!(
                        "{} is no longer this agent's socket: the PodResources API is not \
                         reachable there until it is removed (cpusetd then binds it again)",
                        path.display()
                    );
                    said = true;
                }
                continue;
            }
            None => {}
        }
        // Gone: bound again once its directory is back (the persist thread makes the state
        // directory again with the next checkpoint).
        let fresh = bind(path).and_then(|l| {
            tokio::net::UnixListener::from_std(l).map_err(|source| ServeError::Bind {
                path: path.to_path_buf(),
                source,
            })
        });
        if let Ok(listener) = fresh {
            log::warn!(
                "{} was removed: serving the PodResources API on it again",
                path.display()
            );
            return listener;
        }
    }
}

/// kubelet's own PodResources socket, asked for everything but the cpus.
#[derive(Debug)]
struct Kubelet {
    path: PathBuf,
    client: PodResourcesListerClient<Channel>,
    /// The last call failed (said once, and again when it answers).
    failing: AtomicBool,
}

impl Kubelet {
    /// A lazy channel: connected on the first call, again after kubelet restarts.
    fn new(path: PathBuf) -> Kubelet {
        let target = path.clone();
        let channel = Endpoint::from_static("http://[::]:0")
            .connect_timeout(KUBELET_TIMEOUT)
            .timeout(KUBELET_TIMEOUT)
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let target = target.clone();
                async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(target).await?)) }
            }));
        let client = PodResourcesListerClient::new(channel).max_decoding_message_size(MAX_MESSAGE);
        Kubelet {
            path,
            client,
            failing: AtomicBool::new(false),
        }
    }

    /// kubelet's answer, or `None` (said when it starts and stops failing).
    fn answered<T>(
        &self,
        what: &str,
        answer: Result<Result<Response<T>, Status>, ()>,
    ) -> Option<T> {
        let failure = match answer {
            Ok(Ok(response)) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    log::info!(
                        "kubelet's PodResources socket {} answers again: devices and memory are kubelet's again",
                        self.path.display()
                    );
                }
                return Some(response.into_inner());
            }
            Ok(Err(status)) => format!("{}: {}", status.code(), status.message()),
            Err(()) => format!("no answer within {KUBELET_TIMEOUT:?}"),
        };
        if !self.failing.swap(true, Ordering::Relaxed) {
            log::warn!(
                "kubelet's PodResources socket {} did not answer {what} ({failure}): cpusetd answers \
                 with cpus alone, and the pods it sees, until it does (--kubelet-pod-resources-socket \
                 names it; none: never ask)",
                self.path.display()
            );
        }
        None
    }

    async fn list(&self) -> Option<Vec<PodResources>> {
        let mut client = self.client.clone();
        let call = client.list(ListPodResourcesRequest {});
        let answer = tokio::time::timeout(KUBELET_TIMEOUT, call)
            .await
            .map_err(|_| ());
        self.answered("List", answer).map(|r| r.pod_resources)
    }

    async fn allocatable(&self) -> Option<AllocatableResourcesResponse> {
        let mut client = self.client.clone();
        let call = client.get_allocatable_resources(AllocatableResourcesRequest {});
        let answer = tokio::time::timeout(KUBELET_TIMEOUT, call)
            .await
            .map_err(|_| ());
        self.answered("GetAllocatableResources", answer)
    }
}

/// The service.
#[derive(Debug)]
struct Lister {
    published: Arc<Published>,
    kubelet: Option<Kubelet>,
}

impl Lister {
    /// kubelet's pods with cpusetd's cpus, or cpusetd's own.
    async fn pods(&self) -> Vec<PodResources> {
        let snapshot = self.published.current();
        let from_kubelet = match &self.kubelet {
            Some(kubelet) => kubelet.list().await,
            None => None,
        };
        match from_kubelet {
            Some(pods) => with_cpusetd_cpus(pods, &snapshot),
            None => own_list(&snapshot),
        }
    }
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _request: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: self.pods().await,
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        let snapshot = self.published.current();
        let from_kubelet = match &self.kubelet {
            Some(kubelet) => kubelet.allocatable().await,
            None => None,
        };
        let mut answer = from_kubelet.unwrap_or_default();
        answer.cpu_ids = cpu_ids(&snapshot.allocatable);
        Ok(Response::new(answer))
    }

    /// kubelet's `Get` is its `List` for one pod; a pod it does not know is an error with
    /// kubelet's text (gRPC `Unknown`, as Go's `fmt.Errorf` from a handler is).
    async fn get(
        &self,
        request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        let request = request.into_inner();
        let found = self
            .pods()
            .await
            .into_iter()
            .find(|pod| pod.name == request.pod_name && pod.namespace == request.pod_namespace);
        match found {
            Some(pod) => Ok(Response::new(GetPodResourcesResponse {
                pod_resources: Some(pod),
            })),
            None => Err(Status::unknown(format!(
                "pod {} in namespace {} not found",
                request.pod_name, request.pod_namespace
            ))),
        }
    }
}
