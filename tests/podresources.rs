//! kubelet's PodResources v1 API as `cpusetd run` serves it, asked with the client generated
//! from the same proto (`proto/podresources/v1/api.proto`) the way NFD's topology-updater and
//! the resource-topology-exporter ask kubelet: on fake nodes with the agent process, alone and
//! with a fake kubelet socket whose devices and memory it merges, and beside a client that
//! connects and never reads.

use std::io::Write;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
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
    /// The socket asked.
    socket: PathBuf,
    runtime: tokio::runtime::Runtime,
}

impl Asker {
    /// Waits for the socket (the agent binds it after its first pass, before `READY=1`).
    pub fn new(socket: PathBuf) -> Asker {
        poll_until(DEADLINE, || socket.exists().then_some(()))
            .unwrap_or_else(|| panic!("{} never appeared", socket.display()));
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
    let mut agent = node.start_agent(&[]);
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
    let mut agent = node.start_agent(&["--cpu-manager-policy", "none"]);
    let asker = Asker::new(socket_of(&node));
    assert!(
        asker.allocatable().cpu_ids.is_empty(),
        "kubelet's none policy"
    );
    node.fake.start_pod(&guaranteed("g", 2000)).unwrap();
    wait_list(&asker, &[("default/g/g", &[])]);
    agent.stop();

    let mut off = node.start_agent(&["--pod-resources-socket", "none"]);
    // Past the point where it would bind: it pins a new pod.
    node.fake.start_pod(&guaranteed("h", 2000)).unwrap();
    poll_until(DEADLINE, || off.log().contains("default/h/h").then_some(())).expect("h is pinned");
    assert!(!off.log().contains("PodResources API on"), "{}", off.log());
    assert!(
        !socket_of(&node).exists(),
        "--pod-resources-socket none serves nothing"
    );
    off.stop();
}

/// kubelet's PodResources socket as a node whose CPU manager runs `none` answers: pods with
/// devices and memory, no cpu ids (here a stale one, which cpusetd must replace).
#[derive(Debug)]
struct FakeKubelet;

fn sriov() -> ContainerDevices {
    ContainerDevices {
        resource_name: "intel.com/sriov_netdevice".into(),
        device_ids: vec!["0000:3b:02.1".into()],
        topology: Some(TopologyInfo {
            nodes: vec![NumaNode { id: 0 }],
        }),
    }
}

fn hugepages() -> ContainerMemory {
    ContainerMemory {
        memory_type: "hugepages-1Gi".into(),
        size: 1 << 30,
        topology: Some(TopologyInfo {
            nodes: vec![NumaNode { id: 0 }],
        }),
    }
}

#[tonic::async_trait]
impl PodResourcesLister for FakeKubelet {
    async fn list(
        &self,
        _request: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        let container = |name: &str, devices: Vec<ContainerDevices>| ContainerResources {
            name: name.into(),
            devices,
            cpu_ids: vec![15],
            memory: vec![hugepages()],
            dynamic_resources: vec![],
        };
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: vec![PodResources {
                name: "cnf".into(),
                namespace: "default".into(),
                containers: vec![
                    container("cnf", vec![sriov()]),
                    // In the pod's spec, not started yet: kubelet lists it.
                    container("later", vec![]),
                ],
            }],
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Ok(Response::new(AllocatableResourcesResponse {
            devices: vec![sriov()],
            cpu_ids: vec![],
            memory: vec![hugepages()],
        }))
    }

    async fn get(
        &self,
        _request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unknown("PodResources API Get method disabled"))
    }
}

/// [`FakeKubelet`] served on `path` by a thread of its own until dropped.
struct FakeKubeletSocket {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeKubeletSocket {
    fn start(path: &Path) -> FakeKubeletSocket {
        let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            runtime().block_on(async move {
                let listener = tokio::net::UnixListener::from_std(listener).unwrap();
                let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
                let server = tonic::transport::Server::builder()
                    .serve_with_incoming(PodResourcesListerServer::new(FakeKubelet), incoming);
                tokio::select! {
                    _ = server => {},
                    _ = stopped => {},
                }
            })
        });
        FakeKubeletSocket {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for FakeKubeletSocket {
    fn drop(&mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
        let _ = self.thread.take().map(|t| t.join());
    }
}

#[test]
fn kubelets_devices_and_memory_with_cpusetds_cpus() {
    let node = TestNode::new(CgroupVersion::V1);
    let kubelet_socket = node.base.join("kubelet.sock");
    let kubelet = FakeKubeletSocket::start(&kubelet_socket);
    let kubelet_flag = kubelet_socket.display().to_string();
    let mut agent = node.start_agent(&["--kubelet-pod-resources-socket", &kubelet_flag]);
    let asker = Asker::new(socket_of(&node));
    let cnf = guaranteed("cnf", 2000);
    let other = guaranteed("other", 2000);
    node.fake.start_pod(&cnf).unwrap();
    node.fake.start_pod(&other).unwrap();
    node.wait_cpus(
        &node.fake.start_pod(&best_effort("be")).unwrap()[0],
        "0,3-8,11-15",
    );

    // kubelet's pods and containers, its devices and memory, cpusetd's cpus; a pod kubelet
    // does not list is not listed.
    let pods = wait_list(
        &asker,
        &[("default/cnf/cnf", &[1, 9]), ("default/cnf/later", &[])],
    );
    let cnf_container = &pods[0].containers[0];
    assert_eq!(cnf_container.devices, vec![sriov()]);
    assert_eq!(cnf_container.memory, vec![hugepages()]);
    // Get is List for one pod: kubelet's Get being off refuses nothing here.
    let got = asker.get("default", "cnf").unwrap();
    assert_eq!(got.containers[0].devices, vec![sriov()]);
    assert_eq!(cpus_by_container(&[got])[0].1, vec![1, 9]);
    let allocatable = asker.allocatable();
    assert_eq!(allocatable.devices, vec![sriov()]);
    assert_eq!(allocatable.memory, vec![hugepages()]);
    assert_eq!(allocatable.cpu_ids, (1..16).collect::<Vec<i64>>());

    // kubelet gone: cpusetd answers alone, with every pod it sees.
    drop(kubelet);
    let _ = std::fs::remove_file(&kubelet_socket);
    let pods = wait_list(
        &asker,
        &[
            ("default/be/be", &[]),
            ("default/cnf/cnf", &[1, 9]),
            ("default/other/other", &[2, 10]),
        ],
    );
    assert!(pods.iter().all(|p| p.containers[0].devices.is_empty()));
    agent.wait_for_log("did not answer List");
    agent.stop();
}

/// `cpusetd pod-resources …` on this node's agent socket, as an operator runs it: its JSON
/// answer, or its exit status and stderr.
fn cli(args: &[&str]) -> Result<serde_json::Value, (Option<i32>, String)> {
    let out = crate::util::cpusetd(&[&["pod-resources"], args].concat());
    if !out.status.success() {
        return Err((
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    Ok(serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout))))
}

/// `cpusetd pod-resources list|get|allocatable`, with the client generated from the same
/// proto, reads what the agent serves: each container's cpu_ids (its cpuset.cpus on the fake
/// tree), kubelet's devices with their NUMA nodes under the proto's field names, kubelet's
/// error for a pod it does not know, and a clear error where nothing listens.
#[test]
fn the_pod_resources_command_prints_what_the_agent_serves() {
    let node = TestNode::new(CgroupVersion::V1);
    let kubelet_socket = node.base.join("kubelet.sock");
    let _kubelet = FakeKubeletSocket::start(&kubelet_socket);
    let kubelet_flag = kubelet_socket.display().to_string();
    let mut agent = node.start_agent(&["--kubelet-pod-resources-socket", &kubelet_flag]);
    let _ = Asker::new(socket_of(&node));
    let cnf = guaranteed("cnf", 2000);
    let id = node.fake.start_pod(&cnf).unwrap().remove(0);
    node.wait_cpus(&id, "1,9");
    // The agent's socket by default, found through --state-dir.
    let state_dir = node.state_dir().display().to_string();
    let list = poll_until(DEADLINE, || {
        let list = cli(&["list", "--state-dir", &state_dir]).unwrap();
        (list["pod_resources"][0]["containers"][0]["cpu_ids"] == serde_json::json!([1, 9]))
            .then_some(list)
    })
    .expect("list gives cnf its cpus");
    let pod = &list["pod_resources"][0];
    assert_eq!(
        (&pod["namespace"], &pod["name"]),
        (&"default".into(), &"cnf".into())
    );
    let container = &pod["containers"][0];
    assert_eq!(container["name"], "cnf");
    assert_eq!(
        node.cpus_of(&cnf, &id),
        "1,9",
        "cpu_ids are its cpuset.cpus"
    );
    assert_eq!(
        container["devices"][0],
        serde_json::json!({
            "resource_name": "intel.com/sriov_netdevice",
            "device_ids": ["0000:3b:02.1"],
            "topology": {"nodes": [{"ID": 0}]},
        })
    );
    assert_eq!(container["memory"][0]["memory_type"], "hugepages-1Gi");

    let socket = socket_of(&node).display().to_string();
    let got = cli(&["get", "default", "cnf", "--socket", &socket]).unwrap();
    assert_eq!(
        got["pod_resources"]["containers"][0]["cpu_ids"],
        serde_json::json!([1, 9])
    );
    let (code, stderr) = cli(&["get", "default", "nope", "--socket", &socket]).unwrap_err();
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("pod nope in namespace default not found"),
        "{stderr}"
    );
    let allocatable = cli(&["allocatable", "--socket", &socket]).unwrap();
    assert_eq!(
        allocatable["cpu_ids"],
        serde_json::json!((1..16).collect::<Vec<i64>>())
    );

    // Nothing there: said, with what to do.
    let missing = node.base.join("missing.sock").display().to_string();
    let (code, stderr) = cli(&["list", "--socket", &missing]).unwrap_err();
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains(&missing) && stderr.contains("nothing listens there"),
        "{stderr}"
    );
    let (code, stderr) = cli(&["list", "--timeout", "soon"]).unwrap_err();
    assert_eq!(code, Some(2), "{stderr}");
    agent.stop();
}

/// An HTTP/2 frame: length, type, flags, stream, payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// A client that asks `List` on `streams` streams of one connection, having told the server it
/// may send it nothing (a flow-control window of 0), and then never reads its socket.
fn never_reading_client(socket: &Path, streams: u32) -> StdUnixStream {
    let mut conn = StdUnixStream::connect(socket).unwrap();
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    // SETTINGS_INITIAL_WINDOW_SIZE = 0.
    bytes.extend(frame(0x4, 0, 0, &[0, 4, 0, 0, 0, 0]));
    let mut headers = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/v1.PodResourcesLister/List"),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        // HPACK: a literal field without indexing, new name, no Huffman coding.
        headers.push(0);
        headers.push(name.len() as u8);
        headers.extend(name.as_bytes());
        headers.push(value.len() as u8);
        headers.extend(value.as_bytes());
    }
    for n in 0..streams {
        let stream = 2 * n + 1;
        bytes.extend(frame(0x1, 0x4, stream, &headers)); // HEADERS, END_HEADERS
        bytes.extend(frame(0x0, 0x1, stream, &[0, 0, 0, 0, 0])); // DATA, END_STREAM
    }
    conn.write_all(&bytes).unwrap();
    conn
}

#[test]
fn a_client_that_never_reads_stalls_no_one() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let socket = socket_of(&node);
    let asker = Asker::new(socket.clone());
    let db = guaranteed("db", 2000);
    node.fake.start_pod(&db).unwrap();
    wait_list(&asker, &[("default/db/db", &[1, 9])]);

    // Connections that say nothing, and one whose answers can never be sent.
    let idle: Vec<StdUnixStream> = (0..32)
        .map(|_| StdUnixStream::connect(&socket).unwrap())
        .collect();
    let stuck = never_reading_client(&socket, 100);
    std::thread::sleep(Duration::from_millis(300));

    // Others are answered in time, and the agent still pins.
    for _ in 0..5 {
        assert_eq!(cpus_by_container(&asker.list())[0].1, vec![1, 9]);
        assert!(asker.get("default", "db").is_ok());
        assert_eq!(asker.allocatable().cpu_ids.len(), 15);
    }
    let next = guaranteed("next", 2000);
    let id = node.fake.start_pod(&next).unwrap();
    node.wait_cpus(&id[0], "2,10");
    wait_list(
        &asker,
        &[("default/db/db", &[1, 9]), ("default/next/next", &[2, 10])],
    );
    // The stuck client's requests were taken: their answers' headers wait in its socket,
    // their messages (DATA) never sent.
    let kinds = frames_waiting(&stuck);
    assert!(
        kinds.contains(&(0x1, 1)),
        "no HEADERS for stream 1: {kinds:?}"
    );
    assert!(
        !kinds.iter().any(|(kind, _)| *kind == 0x0),
        "DATA sent: {kinds:?}"
    );
    // Nor do they hold the agent's stop.
    let started = Instant::now();
    assert!(agent.stop().success());
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    drop((idle, stuck));
}

/// The (type, stream) of each whole frame the server has sent on `conn` so far.
fn frames_waiting(conn: &StdUnixStream) -> Vec<(u8, u32)> {
    use std::io::Read;
    conn.set_nonblocking(true).unwrap();
    let mut bytes = Vec::new();
    let mut buf = [0u8; 65536];
    let mut reader = conn;
    while let Ok(n) = reader.read(&mut buf) {
        if n == 0 {
            break;
        }
        bytes.extend_from_slice(&buf[..n]);
    }
    let mut kinds = Vec::new();
    let mut at = 0;
    while at + 9 <= bytes.len() {
        let len = u32::from_be_bytes([0, bytes[at], bytes[at + 1], bytes[at + 2]]) as usize;
        let stream = u32::from_be_bytes(bytes[at + 5..at + 9].try_into().unwrap()) & 0x7fff_ffff;
        kinds.push((bytes[at + 3], stream));
        at += 9 + len;
    }
    kinds
}

#[test]
fn an_unusable_socket_path_is_a_configuration_error() {
    let node = TestNode::new(CgroupVersion::V1);
    let file = node.base.join("not-a-socket");
    std::fs::write(&file, "keep me").unwrap();
    let long = format!("{}/{}.sock", node.base.display(), "x".repeat(120));
    for (path, says) in [
        (file.display().to_string(), "exists and is not a socket"),
        (long, "longer than a Unix socket path may be"),
    ] {
        let out = node
            .agent_command(&["--pod-resources-socket", &path])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{stderr}");
        assert!(stderr.contains("--pod-resources-socket"), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
        assert!(stderr.contains("none"), "the way out is named: {stderr}");
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
    // Asking itself would answer nothing but its own timeouts.
    let own = socket_of(&node).display().to_string();
    let out = node
        .agent_command(&["--kubelet-pod-resources-socket", &own])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("is cpusetd's own"), "{stderr}");
}

#[test]
fn answers_in_bounded_time_while_the_agent_is_busy() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let asker = Asker::new(socket_of(&node));
    // 300 pods at once (a guaranteed one in every ten): passes, shared-pool rewrites and
    // their echoes keep the controller busy while `List` is asked, each answer timed.
    let pods: Vec<_> = (0..300)
        .map(|n| {
            if n % 10 == 0 {
                guaranteed(&format!("g{n}"), 1000)
            } else {
                best_effort(&format!("be{n}"))
            }
        })
        .collect();
    std::thread::scope(|scope| {
        let starter = scope.spawn(|| node.fake.start_pods_at_rate(&pods, None).unwrap());
        let mut answers = 0;
        while !starter.is_finished() || answers < 10 {
            asker.list(); // asserts it took less than ANSWER_WITHIN
            answers += 1;
        }
        starter.join().unwrap();
    });
    let mut last = 0;
    let every = poll_until(DEADLINE, || {
        let listed = asker.list();
        last = listed.len();
        (listed.len() == 300).then_some(listed)
    })
    .unwrap_or_else(|| panic!("{last} of 300 pods listed\n{}", agent.log()));
    // Fifteen 1-cpu pins fit beside cpu 0 (cores {n, n+8}); the rest stay shared, as kubelet.
    let pinned = every
        .iter()
        .filter(|p| !p.containers[0].cpu_ids.is_empty())
        .count();
    assert_eq!(pinned, 15);
    agent.assert_running();
    agent.stop();
}

#[test]
fn the_socket_comes_back_after_the_state_directory_is_removed() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[]);
    let socket = socket_of(&node);
    Asker::new(socket.clone());
    std::fs::remove_dir_all(node.state_dir()).unwrap();
    // The next checkpoint makes the directory again; the socket follows within its check.
    node.fake.start_pod(&guaranteed("db", 2000)).unwrap();
    poll_until(Duration::from_secs(20), || socket.exists().then_some(()))
        .unwrap_or_else(|| panic!("no socket again\n{}", agent.log()));
    let asker = Asker::new(socket);
    wait_list(&asker, &[("default/db/db", &[1, 9])]);
    agent.wait_for_log("serving the PodResources API on it again");
    agent.stop();
}

/// Resident memory of `cpusetd run` binaries (`CPUSETD_BINS`, space-separated; default this
/// build's) on a fake node of `PODS` pods (default 1000, one in ten Guaranteed): with the
/// PodResources server off, on and idle, and after ten `List`s. For DECISIONS' figures:
/// `CPUSETD_BINS="/tmp/cpusetd-base /tmp/cpusetd-new" cargo test --test tests
/// podresources::footprint -- --ignored --nocapture` (release binaries; one whose name ends in
/// `base` was built before the server existed and is run with the server's flags left out).
#[test]
#[ignore]
fn footprint() {
    let pods: usize = std::env::var("PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let bins =
        std::env::var("CPUSETD_BINS").unwrap_or_else(|_| env!("CARGO_BIN_EXE_cpusetd").to_string());
    let node = TestNode::new(CgroupVersion::V1);
    for n in 0..pods {
        let spec = if n % 10 == 0 {
            guaranteed(&format!("g{n}"), 1000)
        } else {
            best_effort(&format!("be{n}"))
        };
        node.fake.start_pod(&spec).unwrap();
    }
    let rss_kib = |pid: u32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap()
    };
    println!(
        "{:<24} {:<28} {:>9} {:>8}",
        "binary", "server", "RSS MiB", "threads"
    );
    for bin in bins.split_whitespace() {
        let rows: [(&str, &[&str], usize); 3] = [
            ("off (none)", &["--pod-resources-socket", "none"], 0),
            ("on, idle", &[], 0),
            ("on, after 10 List", &[], 10),
        ];
        for (what, extra, lists) in rows {
            let template = node.agent_command(extra);
            let mut command = std::process::Command::new(bin);
            let mut args: Vec<String> = template
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            if bin.ends_with("base") {
                // Built before the flag existed.
                if let Some(at) = args
                    .iter()
                    .position(|a| a == "--kubelet-pod-resources-socket")
                {
                    args.drain(at..at + 2);
                }
            }
            command.args(&args);
            command.env("RUST_LOG", "warn");
            let before = bin.ends_with("base");
            if before && (!extra.is_empty() || lists > 0) {
                continue; // it has no server
            }
            let what = if before {
                "none (built before it)"
            } else {
                what
            };
            let mut child = command
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            // Settled: the metrics file says every container is known.
            let metrics = node.metrics_file();
            poll_until(Duration::from_secs(120), || {
                let text = std::fs::read_to_string(&metrics).ok()?;
                let known = text
                    .lines()
                    .find_map(|l| l.strip_prefix("cpusetd_containers "))?
                    .trim()
                    .parse::<f64>()
                    .ok()?;
                (known as usize >= pods).then_some(())
            })
            .expect("settled");
            std::thread::sleep(Duration::from_secs(3));
            let socket = socket_of(&node);
            let mut listed = 0;
            if lists > 0 && socket.exists() {
                let asker = Asker::new(socket);
                for _ in 0..lists {
                    listed = asker.list().len();
                }
            }
            let threads = std::fs::read_dir(format!("/proc/{}/task", child.id()))
                .unwrap()
                .count();
            let label = if lists > 0 {
                format!("{what} ({listed} pods)")
            } else {
                what.to_string()
            };
            println!(
                "{:<24} {:<28} {:>9.1} {:>8}",
                bin,
                label,
                rss_kib(child.id()) as f64 / 1024.0,
                threads
            );
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            child.wait().unwrap();
            let _ = std::fs::remove_file(&metrics);
        }
    }
}
