//! Issue 26, items 2–4: the agent's metrics as a real Prometheus sees them. An agent on a fake
//! node serves `/metrics` (`--metrics-bind-address`) and writes its textfile; Debian's
//! `prometheus` scrapes it, and Debian's `prometheus-node-exporter` reading the textfile; the
//! series and their values are read back through Prometheus's HTTP query API, `promtool check
//! metrics` reads the exposition, and every panel of deploy/grafana-dashboard.json is run.
//! Without those packages (scripts/ci-deps.sh installs them) the test says so and passes.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::kubesim::{ContainerSpec, Qos};
use serde_json::Value;

use crate::agent_util::{best_effort, pod, poll_until, AgentProcess, TestNode, DEADLINE};

/// How long Prometheus may take to start and scrape.
const SCRAPE_DEADLINE: Duration = Duration::from_secs(60);

/// A child process killed (SIGKILL) and reaped when dropped, also when the test fails.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free local port (bound, then let go: the process started next takes it).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` over HTTP/1.0: the status and the body.
fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// Percent-encodes a query parameter.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant query through Prometheus's HTTP API: each result's labels and value.
fn query(prometheus: SocketAddr, expr: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    let (status, body) = http_get(prometheus, &format!("/api/v1/query?query={}", encode(expr)))
        .unwrap_or_else(|| panic!("no answer from Prometheus to {expr}"));
    let doc: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{expr}: {e}: {body}"));
    assert_eq!(status, 200, "{expr}: {body}");
    assert_eq!(doc["status"], "success", "{expr}: {body}");
    let results = match doc["data"]["resultType"].as_str() {
        Some("vector") => doc["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
        Some("scalar") => vec![serde_json::json!({"metric": {}, "value": doc["data"]["result"]})],
        other => panic!("{expr}: result type {other:?}: {body}"),
    };
    results
        .iter()
        .map(|r| {
            let labels = r["metric"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                        .collect()
                })
                .unwrap_or_default();
            let value = r["value"][1].as_str().and_then(|v| v.parse().ok());
            (labels, value.unwrap_or(f64::NAN))
        })
        .collect()
}

/// The single value of `expr`, once Prometheus has one equal to `want` (it scrapes every
/// second), else the last seen.
fn value_becomes(prometheus: SocketAddr, expr: &str, want: f64) -> Option<f64> {
    let mut last = None;
    poll_until(SCRAPE_DEADLINE, || {
        let got = query(prometheus, expr);
        last = (got.len() == 1).then(|| got[0].1);
        (last == Some(want)).then_some(want)
    })
    .or(last)
}

fn missing(binaries: &[&str]) -> Vec<String> {
    binaries
        .iter()
        .filter(|b| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {b}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(|b| b.to_string())
        .collect()
}

fn start_node_exporter(textfile_dir: &Path, port: u16) -> Killed {
    let child = Command::new("prometheus-node-exporter")
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--collector.disable-defaults")
        .arg("--collector.textfile")
        .arg(format!(
            "--collector.textfile.directory={}",
            textfile_dir.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start prometheus-node-exporter");
    Killed(child)
}

fn start_prometheus(dir: &Path, port: u16, agent: SocketAddr, exporter: u16) -> Killed {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n\
             \x20 - job_name: cpusetd\n    static_configs:\n      - targets: ['{agent}']\n\
             \x20 - job_name: node\n    static_configs:\n      - targets: ['127.0.0.1:{exporter}']\n"
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start prometheus");
    Killed(child)
}

/// The agent's `/metrics` as `promtool check metrics` reads it: no parse error, and no lint
/// problem but those of the names kubelet itself has (mirrored on purpose, see DECISIONS).
fn promtool_check(exposition: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("promtool check metrics: {:?}\n{said}", out.status.code());
    // Exit 1 is an error (the text does not parse); 3 lint problems, each checked below.
    assert!(
        out.status.code() == Some(0) || out.status.code() == Some(3),
        "promtool: {:?}\n{said}",
        out.status
    );
    const KUBELETS_NAMES: [&str; 3] = [
        "cpusetd_exclusive_cpu_allocation_count",
        "cpusetd_container_aligned_compute_resources_count",
        "cpusetd_container_aligned_compute_resources_failure_count",
    ];
    for line in said.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            KUBELETS_NAMES
                .iter()
                .any(|name| line.starts_with(&format!("{name} "))),
            "promtool: {line}\n{said}"
        );
    }
}

/// Every panel of the Grafana dashboard, its variables given: each expression returns data.
fn check_dashboard(prometheus: SocketAddr) -> usize {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/grafana-dashboard.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut checked = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap_or_default();
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        assert!(!targets.is_empty(), "panel {title} has no query");
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            let expr = expr
                .replace("$job", "cpusetd")
                .replace("$instance", ".*")
                .replace("$__rate_interval", "1m");
            assert!(!expr.contains('$'), "{title}: a variable left in {expr}");
            let got = poll_until(SCRAPE_DEADLINE, || {
                let got = query(prometheus, &expr);
                (!got.is_empty() && got.iter().all(|(_, v)| v.is_finite())).then_some(got)
            });
            assert!(got.is_some(), "panel {title}: {expr} returns no data");
            checked += 1;
        }
    }
    checked
}

/// The address the agent's log says it serves the metrics at.
fn served_address(agent: &AgentProcess) -> SocketAddr {
    agent
        .log_lines("metrics served at http://")
        .first()
        .and_then(|l| l.split("http://").nth(1))
        .and_then(|rest| rest.strip_suffix("/metrics"))
        .and_then(|a| a.trim().parse().ok())
        .unwrap_or_else(|| panic!("no address in the log: {}", agent.log()))
}

/// On the agent's node: one pinned container (`db/server`, 2 CPUs), one pod kubelet would
/// reject (`odd/half`: 1 CPU is half a core under full-pcpus-only), one shared, and a drift
/// repair of the pinned one. Returns the agent's `/metrics` once it shows all that.
fn pin_refuse_and_drift(node: &TestNode, agent: &mut AgentProcess, addr: SocketAddr) -> String {
    let server = ContainerSpec::guaranteed("server", 2000);
    let db = pod("db", Qos::Guaranteed, vec![server]);
    let db_id = node.fake.start_pod(&db).unwrap().remove(0);
    let half = ContainerSpec::guaranteed("half", 1000);
    node.fake
        .start_pod(&pod("odd", Qos::Guaranteed, vec![half]))
        .unwrap();
    node.fake.start_pod(&best_effort("be")).unwrap();
    agent.wait_for_log("SMT Alignment Error");
    node.wait_status("db pinned", |s| {
        s.by_id(&db_id).is_some_and(|r| r.exclusive) && s.converged()
    });
    let pinned = node.cpus_of(&db, &db_id);
    node.write(&db, &db_id, "cpuset.cpus", "0-15");
    let repaired = poll_until(DEADLINE, || {
        (node.cpus_of(&db, &db_id) == pinned).then_some(())
    });
    assert!(repaired.is_some(), "{}", agent.log());
    poll_until(DEADLINE, || {
        let (status, body) = http_get(addr, "/metrics")?;
        let repaired = !body.contains("\ncpusetd_drift_repairs_total 0\n");
        (status == 200 && repaired).then_some(body)
    })
    .unwrap_or_else(|| panic!("/metrics at {addr}: {:?}", http_get(addr, "/metrics")))
}

/// What Prometheus must hold for `job` after [`pin_refuse_and_drift`]: expression, value.
fn expected_series(job: &str) -> Vec<(String, f64)> {
    let with = |name: &str, labels: &str| format!("{name}{{job=\"{job}\"{labels}}}");
    let aligned = |boundary: &str| format!(",scope=\"container\",boundary=\"{boundary}\"");
    vec![
        (
            with(
                "cpusetd_container_exclusive_cpus",
                ",namespace=\"default\",pod=\"db\",container=\"server\"",
            ),
            2.0,
        ),
        (
            with(
                "cpusetd_pod_rejected",
                ",namespace=\"default\",pod=\"odd\",container=\"half\",reason=\"SMTAlignmentError\"",
            ),
            1.0,
        ),
        (with("cpusetd_pods_rejected", ",reason=\"SMTAlignmentError\""), 1.0),
        (with("cpusetd_pinning_requests_total", ""), 2.0),
        (with("cpusetd_pinning_errors_total", ""), 1.0),
        (with("cpusetd_exclusive_cpu_allocation_count", ""), 2.0),
        // 16 CPUs, CPU 0 reserved, 2 exclusive: kubelet's shared pool, 13 CPUs.
        (with("cpusetd_shared_pool_size_millicores", ""), 13000.0),
        (format!("sum({})", with("cpusetd_allocation_per_numa", "")), 2.0),
        (format!("count({})", with("cpusetd_allocation_per_numa", "")), 2.0),
        (
            with("cpusetd_container_aligned_compute_resources_count", &aligned("physical_cpu")),
            1.0,
        ),
        (
            with(
                "cpusetd_container_aligned_compute_resources_failure_count",
                &aligned("physical_cpu"),
            ),
            1.0,
        ),
        // CPUs 1 and 9, one core: one uncore cache.
        (
            with("cpusetd_container_aligned_compute_resources_count", &aligned("uncore_cache")),
            1.0,
        ),
        // At least the one repair (the pod's cgroup may be repaired too, later).
        (
            format!("clamp_max({}, 1)", with("cpusetd_drift_repairs_total", "")),
            1.0,
        ),
        (with("cpusetd_cgroup_write_errors_total", ",errno=\"EBUSY\""), 0.0),
    ]
}

/// Every metric of `text` (the agent's exposition) is stored for `job`.
fn assert_every_name_stored(prometheus: SocketAddr, job: &str, text: &str) -> usize {
    let names: std::collections::BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let all = format!("count by (__name__) ({{job=\"{job}\",__name__=~\"cpusetd_.+\"}})");
    let stored: std::collections::BTreeSet<String> = query(prometheus, &all)
        .into_iter()
        .filter_map(|(labels, _)| labels.get("__name__").cloned())
        .collect();
    for name in &names {
        // A summary is stored as its samples (its quantiles come with the first sample).
        let found = stored.contains(*name) || stored.contains(&format!("{name}_count"));
        assert!(found, "{job}: {name} not in Prometheus: {stored:?}");
    }
    names.len()
}

#[test]
fn prometheus_scrapes_the_agent_and_the_textfile_and_the_dashboard_has_data() {
    let missing = missing(&["prometheus", "promtool", "prometheus-node-exporter"]);
    if !missing.is_empty() {
        eprintln!(
            "skipped: {} not installed (scripts/ci-deps.sh installs prometheus and \
             prometheus-node-exporter)",
            missing.join(", ")
        );
        return;
    }
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&[
        "--cpu-manager-policy-options",
        "full-pcpus-only=true",
        "--metrics-bind-address",
        "127.0.0.1:0",
    ]);
    let addr = served_address(&agent);
    let text = pin_refuse_and_drift(&node, &mut agent, addr);
    promtool_check(&text);

    let dir = tempfile::tempdir().unwrap();
    let exporter_port = free_port();
    let _exporter = start_node_exporter(node.metrics_file().parent().unwrap(), exporter_port);
    let prometheus: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let _prometheus = start_prometheus(dir.path(), prometheus.port(), addr, exporter_port);
    let log = || std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();
    let ready = poll_until(SCRAPE_DEADLINE, || {
        http_get(prometheus, "/-/ready").filter(|(status, _)| *status == 200)
    });
    assert!(ready.is_some(), "Prometheus is not ready: {}", log());
    // The agent's /metrics, and node_exporter reading its textfile: the same series.
    for job in ["cpusetd", "node"] {
        let up = value_becomes(prometheus, &format!("up{{job=\"{job}\"}}"), 1.0);
        assert_eq!(up, Some(1.0), "{job}: {}", log());
        for (expr, want) in expected_series(job) {
            let got = value_becomes(prometheus, &expr, want);
            assert_eq!(got, Some(want), "{expr}\n{text}");
        }
        assert_every_name_stored(prometheus, job, &text);
    }
    let panels = check_dashboard(prometheus);
    eprintln!("prometheus: both jobs hold every series, {panels} dashboard queries with data");
    assert!(agent.stop().success());
}

/// `--metrics-bind-address` that cannot be served: a configuration error (78) naming the flag,
/// the address and the fix; a value that is no address is refused before anything starts.
#[test]
fn a_metrics_address_that_cannot_be_served_is_a_configuration_error() {
    let node = TestNode::new(CgroupVersion::V1);
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut agent = node.spawn_agent(&["--metrics-bind-address", &addr]);
    let exit = agent.wait_exit(DEADLINE);
    assert_eq!(exit.and_then(|e| e.code()), Some(78), "{}", agent.log());
    let said = agent.log();
    assert!(
        said.contains(&format!(
            "--metrics-bind-address {addr}: Address already in use"
        )) && said.contains("leave the flag out"),
        "{said}"
    );
    assert!(!said.contains("first pass"), "{said}");
    for bad in ["9617", "example.com:9617", ":9617"] {
        let out = node
            .agent_command(&["--metrics-bind-address", bad])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad}: {stderr}");
        assert!(
            stderr.contains("--metrics-bind-address") && stderr.contains("is not IP:PORT"),
            "{bad}: {stderr}"
        );
    }
}

/// Clients that connect to the metrics port and never send, or never read, stall neither the
/// agent (a pod is pinned meanwhile) nor the next scrape beyond the server's bounds.
#[test]
fn clients_that_hold_the_metrics_port_do_not_stall_the_agent() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut agent = node.start_agent(&["--metrics-bind-address", "127.0.0.1:0"]);
    let addr = served_address(&agent);
    // More than the queue and the workers hold: silent ones, and askers that never read.
    let mut held: Vec<TcpStream> = (0..24).map(|_| TcpStream::connect(addr).unwrap()).collect();
    for _ in 0..4 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        held.push(s);
    }
    let started = std::time::Instant::now();
    let p = crate::agent_util::guaranteed("pinned", 2000);
    let id = node.fake.start_pod(&p).unwrap().remove(0);
    node.wait_status("pinned while the port is held", |s| {
        s.by_id(&id).is_some_and(|r| r.exclusive) && s.converged()
    });
    let pinned_after = started.elapsed();
    // The server answers again within its bound: 12 held connections (4 serving, 8 queued)
    // given 2 s each to send a request, four at a time.
    let answered = poll_until(Duration::from_secs(15), || {
        http_get(addr, "/metrics").filter(|(status, body)| {
            *status == 200 && body.contains("cpusetd_container_exclusive_cpus{")
        })
    });
    assert!(answered.is_some(), "{}", agent.log());
    eprintln!(
        "metrics port held by {} clients: pinned after {pinned_after:?}, scraped after {:?}",
        held.len(),
        started.elapsed()
    );
    drop(held);
    assert!(agent.stop().success());
}
