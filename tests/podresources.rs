//! kubelet's PodResources v1 API as `cpusetd run` serves it, asked with the client generated
//! from the same proto (`proto/podresources/v1/api.proto`) the way NFD's topology-updater and
//! the resource-topology-exporter ask kubelet: on fake nodes with the agent process, alone and
//! with a fake kubelet socket whose devices and memory it merges, and beside a client that
//! connects and never reads.

use std::io::Write;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Request, Response, Status};

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::kubesim::{ContainerSpec, Qos};
use cpusetd::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use cpusetd::podresources::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use cpusetd::podresources::v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices, ContainerMemory,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, NumaNode, PodResources, TopologyInfo,
};

use crate::agent_util::{best_effort, guaranteed, pod, poll_until, TestNode, DEADLINE};

/// How long an answer may take on a fake node, busy or not.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A client of the socket at `path`, as kubelet's readers make one.
pub async fn connect(path: &Path) -> Result<PodResourcesListerClient<Channel>, String> {
    let path = path.to_path_buf();
    let channel = Endpoint::from_static("http://[::]:0")
        .connect_timeout(ANSWER_WITHIN)
        .timeout(ANSWER_WITHIN)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(PodResourcesListerClient::new(channel))
}

/// `List`, `Get` and `GetAllocatableResources` on the socket at `path`, each on a new
/// connection, each timed.
pub struct Asker {
    socket: PathBuf,
    runtime: tokio::runtime::Runtime,
}

impl Asker {
    pub fn new(socket: PathBuf) -> Asker {
        Asker {
            socket,
            runtime: runtime(),
        }
    }

    fn timed<T>(&self, what: &str, answer: impl std::future::Future<Output = T>) -> T {
        let started = Instant::now();
        let answer = self.runtime.block_on(answer);
        let took = started.elapsed();
        assert!(took < ANSWER_WITHIN, "{what} took {took:?}");
        answer
    }

    pub fn list(&self) -> Vec<PodResources> {
        self.timed("List", async {
            let mut client = connect(&self.socket).await.unwrap();
            let answer = client.list(ListPodResourcesRequest {}).await.unwrap();
            answer.into_inner().pod_resources
        })
    }

    pub fn get(&self, namespace: &str, name: &str) -> Result<PodResources, Status> {
        self.timed("Get", async {
            let mut client = connect(&self.socket).await.unwrap();
            let request = GetPodResourcesRequest {
                pod_name: name.into(),
                pod_namespace: namespace.into(),
            };
            let answer = client.get(request).await?;
            Ok(answer.into_inner().pod_resources.unwrap())
        })
    }

    pub fn allocatable(&self) -> AllocatableResourcesResponse {
        self.timed("GetAllocatableResources", async {
            let mut client = connect(&self.socket).await.unwrap();
            let request = AllocatableResourcesRequest {};
            let answer = client.get_allocatable_resources(request).await.unwrap();
            answer.into_inner()
        })
    }
}

/// Each container of `pods` as `namespace/pod/container` → cpu ids.
fn cpus_by_container(pods: &[PodResources]) -> Vec<(String, Vec<i64>)> {
    let mut rows: Vec<(String, Vec<i64>)> = pods
        .iter()
        .flat_map(|p| {
            p.containers.iter().map(move |c| {
                let mut ids = c.cpu_ids.clone();
                ids.sort_unstable();
                (format!("{}/{}/{}", p.namespace, p.name, c.name), ids)
            })
        })
        .collect();
    rows.sort();
    rows
}

fn socket_of(node: &TestNode) -> PathBuf {
    node.state_dir().join("pod-resources.sock")
}

/// Polls `List` until it gives `expected` (containers by `namespace/pod/container`).
fn wait_list(asker: &Asker, expected: &[(&str, &[i64])]) -> Vec<PodResources> {
    let expected: Vec<(String, Vec<i64>)> = expected
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_vec()))
        .collect();
    let mut last = Vec::new();
    poll_until(DEADLINE, || {
        last = asker.list();
        (cpus_by_container(&last) == expected).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "List never gave {expected:?}: {:?}",
            cpus_by_container(&last)
        )
    });
    last
}

#[test]
fn list_get_and_allocatable_give_kubelets_cpu_ids_alone() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&["--kubelet-pod-resources-socket", "none"]);
    let asker = Asker::new(socket_of(&node));
    // The fixture: 16 cpus, cores {n, n+8}, cpu 0 reserved.
    let all_but_0: Vec<i64> = (1..16).collect();
    assert_eq!(asker.allocatable().cpu_ids, all_but_0);
    assert!(asker.list().is_empty(), "no pods yet");

    let db = pod(
        "db",
        Qos::Guaranteed,
        vec![
            ContainerSpec::guaranteed("db", 2000),
            ContainerSpec::guaranteed("sidecar", 500),
        ],
    );
    let burst = pod(
        "burst",
        Qos::Burstable,
        vec![ContainerSpec::burstable("burst", 250, Some(2000))],
    );
    let be = best_effort("be");
    for p in [&db, &burst, &be] {
        node.fake.start_pod(p).unwrap();
    }
    wait_list(
        &asker,
        &[
            ("default/be/be", &[]),
            ("default/burst/burst", &[]),
            ("default/db/db", &[1, 9]),
            ("default/db/sidecar", &[]),
        ],
    );
    let got = asker.get("default", "db").unwrap();
    assert_eq!(
        (got.name.as_str(), got.namespace.as_str()),
        ("db", "default")
    );
    assert_eq!(cpus_by_container(&[got])[0].1, vec![1, 9]);
    // kubelet's error, word for word, for a pod it does not know.
    let missing = asker.get("default", "nope").unwrap_err();
    assert_eq!(missing.code(), Code::Unknown);
    assert_eq!(missing.message(), "pod nope in namespace default not found");
    assert!(
        asker.get("other", "db").is_err(),
        "namespaces are told apart"
    );

    // Released: the pod is gone from the answers, its cpus go to the next pod.
    node.fake.remove_pod(&db).unwrap();
    wait_list(
        &asker,
        &[("default/be/be", &[]), ("default/burst/burst", &[])],
    );
    assert!(asker.get("default", "db").is_err());
    let next = guaranteed("next", 4000);
    node.fake.start_pod(&next).unwrap();
    wait_list(
        &asker,
        &[
            ("default/be/be", &[]),
            ("default/burst/burst", &[]),
            ("default/next/next", &[1, 2, 9, 10]),
        ],
    );
    assert_eq!(
        asker.allocatable().cpu_ids,
        all_but_0,
        "allocatable is not free"
    );
    agent.stop();
    assert!(!socket_of(&node).exists(), "the socket is removed at stop");
}

#[test]
fn none_policy_reports_no_cpus_and_the_socket_can_be_turned_off() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[
        "--cpu-manager-policy",
        "none",
        "--kubelet-pod-resources-socket",
        "none",
    ]);
    let asker = Asker::new(socket_of(&node));
    assert!(
        asker.allocatable().cpu_ids.is_empty(),
        "kubelet's none policy"
    );
    node.fake.start_pod(&guaranteed("g", 2000)).unwrap();
    wait_list(&asker, &[("default/g/g", &[])]);
    agent.stop();

    let mut off = node.start_agent(&["--pod-resources-socket", "none"]);
    assert!(
        !socket_of(&node).exists(),
        "--pod-resources-socket none serves nothing"
    );
    off.stop();
}
