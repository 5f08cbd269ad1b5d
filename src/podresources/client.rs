//! A client of a PodResources v1 socket (cpusetd's or kubelet's), as `cpusetd pod-resources`
//! asks it: one connection, one call, each bounded in time.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Endpoint, Uri};

use super::v1::pod_resources_lister_client::PodResourcesListerClient;
use super::v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, GetPodResourcesRequest,
    GetPodResourcesResponse, ListPodResourcesRequest, ListPodResourcesResponse,
};

/// The largest answer read (kubelet's `podresources.DefaultPodResourcesMaxSize`).
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// Why a call gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("cannot start a runtime for the call")]
    Runtime(#[source] io::Error),
    #[error("cannot connect to {}: {reason}", path.display())]
    Connect { path: PathBuf, reason: String },
    #[error("no answer from {} within {timeout:?}", path.display())]
    Timeout { path: PathBuf, timeout: Duration },
    /// The server's own error (its gRPC status), e.g. kubelet's "pod … not found" for `Get`.
    #[error("{message} (gRPC {code})")]
    Status { code: tonic::Code, message: String },
}

/// One call to ask the socket at a path.
#[derive(Debug, Clone)]
pub enum Ask {
    List,
    Get { namespace: String, pod: String },
    Allocatable,
}

/// An answer of [`ask`].
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    List(ListPodResourcesResponse),
    Get(GetPodResourcesResponse),
    Allocatable(AllocatableResourcesResponse),
}

/// Asks the socket at `path` once, on a runtime of its own (the caller is synchronous),
/// within `timeout` for the connection and the call together.
pub fn ask(path: &Path, what: Ask, timeout: Duration) -> Result<Answer, AskError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(AskError::Runtime)?;
    let call = call(path.to_path_buf(), what);
    runtime.block_on(async {
        tokio::time::timeout(timeout, call)
            .await
            .unwrap_or_else(|_| {
                Err(AskError::Timeout {
                    path: path.to_path_buf(),
                    timeout,
                })
            })
    })
}

async fn call(path: PathBuf, what: Ask) -> Result<Answer, AskError> {
    let target = path.clone();
    let channel = Endpoint::from_static("http://[::]:0")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let target = target.clone();
            async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(target).await?)) }
        }))
        .await
        .map_err(|e| AskError::Connect {
            path,
            reason: root_cause(&e),
        })?;
    let mut client = PodResourcesListerClient::new(channel).max_decoding_message_size(MAX_MESSAGE);
    let status = |s: tonic::Status| AskError::Status {
        code: s.code(),
        message: s.message().to_string(),
    };
    Ok(match what {
        Ask::List => Answer::List(
            client
                .list(ListPodResourcesRequest {})
                .await
                .map_err(status)?
                .into_inner(),
        ),
        Ask::Get { namespace, pod } => {
            let request = GetPodResourcesRequest {
                pod_name: pod,
                pod_namespace: namespace,
            };
            Answer::Get(client.get(request).await.map_err(status)?.into_inner())
        }
        Ask::Allocatable => Answer::Allocatable(
            client
                .get_allocatable_resources(AllocatableResourcesRequest {})
                .await
                .map_err(status)?
                .into_inner(),
        ),
    })
}

/// The innermost error of a chain (tonic's transport error wraps the `io::Error` twice).
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}
