//! Migration from kubelet's static policy: on a first start the agent reads kubelet's
//! `cpu_manager_state` (v2 and the legacy v1 format, checksums as kubelet writes them), adopts
//! the pins it names where the live tree agrees, says where it does not (the live tree wins)
//! and never refuses to start over it; `status` marks adopted pins, across restarts.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::kubesim::{ContainerSpec, PodSpec, Qos};

use crate::agent_util::{pod, TestNode};

/// FNV-1a, 32 bits, as kubelet's checksum package uses it.
fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash, &b| {
        (hash ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// A v2 `cpu_manager_state` as kubelet writes it: entries by pod UID and container name.
pub(crate) fn kubelet_v2(
    default: &str,
    entries: &BTreeMap<String, BTreeMap<String, String>>,
) -> String {
    let rendered: Vec<String> = entries
        .iter()
        .map(|(pod, containers)| {
            let inner: Vec<String> = containers
                .iter()
                .map(|(c, cpus)| format!("{c}:{cpus}"))
                .collect();
            format!("{pod}:map[{}]", inner.join(" "))
        })
        .collect();
    signed(default, entries, "map[string]map[string]string", &rendered)
}

/// The legacy v1 format (kubelet before 1.18): entries by container id.
fn kubelet_v1(default: &str, entries: &BTreeMap<String, String>) -> String {
    let rendered: Vec<String> = entries
        .iter()
        .map(|(id, cpus)| format!("{id}:{cpus}"))
        .collect();
    signed(default, entries, "map[string]string", &rendered)
}

/// The file, with kubelet's checksum over go-spew's `%#v` of the struct (checksum zeroed):
/// `entries_type` and the entries as go-spew renders them (keys sorted, space-separated).
fn signed(
    default: &str,
    entries: &impl serde::Serialize,
    entries_type: &str,
    rendered: &[String],
) -> String {
    let spew = format!(
        "(*state.CPUManagerCheckpoint){{PolicyName:(string)static DefaultCPUSet:(string){default} \
         Entries:({entries_type})map[{}] Checksum:(checksum.Checksum)0}}",
        rendered.join(" ")
    );
    serde_json::json!({
        "policyName": "static",
        "defaultCpuSet": default,
        "entries": entries,
        "checksum": fnv1a32(spew.as_bytes()),
    })
    .to_string()
}

fn guaranteed(name: &str, milli: u64) -> PodSpec {
    pod(
        name,
        Qos::Guaranteed,
        vec![ContainerSpec::guaranteed(name, milli)],
    )
}

/// Starts a pod as kubelet's static policy left it: the container on `cpus`.
fn pinned_by_kubelet(node: &TestNode, pod: &PodSpec, cpus: &str) -> String {
    let id = node.fake.start_pod(pod).unwrap().remove(0);
    node.write(pod, &id, "cpuset.cpus", cpus);
    id
}

fn note<'a>(status: &'a crate::agent_util::Status, id: &str) -> &'a str {
    &status.by_id(id).unwrap().note
}

#[test]
fn kubelet_pins_are_adopted_where_the_live_tree_agrees() {
    let node = TestNode::new(CgroupVersion::V1);
    let db = guaranteed("db", 2000);
    let web = guaranteed("web", 1000);
    let db_id = pinned_by_kubelet(&node, &db, "1,9");
    let web_id = pinned_by_kubelet(&node, &web, "2");
    let gone_uid = "0badc0de-0000-4000-8000-000000000001";
    let entries = BTreeMap::from([
        (
            db.uid.clone(),
            BTreeMap::from([("db".to_string(), "1,9".to_string())]),
        ),
        // kubelet's file and the live tree disagree: the live tree wins.
        (
            web.uid.clone(),
            BTreeMap::from([("web".to_string(), "3".to_string())]),
        ),
        (
            gone_uid.to_string(),
            BTreeMap::from([("app".to_string(), "4-5".to_string())]),
        ),
    ]);
    let file = node.state_dir().with_file_name("cpu_manager_state");
    fs::write(&file, kubelet_v2("0,2-8,10-15", &entries)).unwrap();
    let flag = file.display().to_string();

    let mut agent = node.start_agent(&["--kubelet-state", &flag]);
    let status = node.wait_status("converged", |s| s.converged() && s.exclusive_cpu_count == 3);
    assert!(status.has(&db_id, "1,9"), "{status:#?}");
    assert!(status.has(&web_id, "2"), "{status:#?}");
    assert_eq!(
        note(&status, &db_id),
        "exclusive, adopted from kubelet's cpu_manager_state"
    );
    assert_eq!(
        note(&status, &web_id),
        "exclusive, adopted from the live tree"
    );
    let log = agent.log();
    assert!(
        log.contains("adopted 1 of kubelet's 3 pin(s) (format V2)"),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            "kubelet's cpu_manager_state gives default/web/web (pod{}/web) cpus 3, but it runs on 2: the live tree wins",
            web.uid
        )),
        "{log}"
    );
    assert!(
        log.contains(&format!("pod{gone_uid}/app (cpus 4-5) is not running")),
        "{log}"
    );
    assert!(agent.stop().success());

    // A restart reads its own checkpoint, not kubelet's again; the marks stay.
    fs::write(&file, "garbage").unwrap();
    let mut again = node.start_agent(&["--kubelet-state", &flag]);
    let status = node.wait_status("converged again", |s| s.converged());
    assert_eq!(
        note(&status, &db_id),
        "exclusive, adopted from kubelet's cpu_manager_state"
    );
    assert!(
        !again.log().contains("kubelet's checkpoint"),
        "{}",
        again.log()
    );
    assert!(again.stop().success());
    node.assert_clean();
}

/// The adoption line counts and names what was adopted; each other entry is said with its
/// real reason (issue 23, item 20): a Burstable container, a 1500m one and a running sandbox
/// are not adopted (none is entitled to exclusive cpus), and the sandbox is running.
#[test]
fn kubelet_adoption_names_what_it_adopted_and_why_not_the_rest() {
    let node = TestNode::new(CgroupVersion::V1);
    let db = guaranteed("db", 2000);
    let frac = guaranteed("frac", 1500);
    let burst = pod(
        "burst",
        Qos::Burstable,
        vec![ContainerSpec::burstable("burst", 1000, Some(2000))],
    );
    let db_id = pinned_by_kubelet(&node, &db, "1,9");
    let frac_id = pinned_by_kubelet(&node, &frac, "2,10");
    let burst_id = pinned_by_kubelet(&node, &burst, "3");
    let entries = BTreeMap::from([
        (
            db.uid.clone(),
            BTreeMap::from([
                ("db".to_string(), "1,9".to_string()),
                ("POD".to_string(), "4".to_string()),
            ]),
        ),
        (
            frac.uid.clone(),
            BTreeMap::from([("frac".to_string(), "2,10".to_string())]),
        ),
        (
            burst.uid.clone(),
            BTreeMap::from([("burst".to_string(), "3".to_string())]),
        ),
    ]);
    let file = node.state_dir().with_file_name("cpu_manager_state");
    fs::write(&file, kubelet_v2("0,5-8,11-15", &entries)).unwrap();
    let flag = file.display().to_string();

    let mut agent = node.start_agent(&["--kubelet-state", &flag]);
    let status = node.wait_status("converged", |s| s.converged() && s.exclusive_cpu_count == 2);
    assert!(status.has(&db_id, "1,9"), "{status:#?}");
    assert!(
        !status.has(&frac_id, "2,10") && !status.has(&burst_id, "3"),
        "{status:#?}"
    );
    let log = agent.log();
    let adoption = crate::agent_process::lines_with(&log, "adopted");
    assert!(
        log.contains(&format!(
            "adopted 1 of kubelet's 4 pin(s) (format V2): default/db/db (pod{}/db) cpus 1,9",
            db.uid
        )),
        "{adoption:#?}"
    );
    for (who, why) in [
        (
            format!("default/burst/burst (pod{}/burst) (cpus 3)", burst.uid),
            "Burstable pod",
        ),
        (
            format!("default/frac/frac (pod{}/frac) (cpus 2,10)", frac.uid),
            "cpu request 1500m is not a whole number of cpus",
        ),
        (
            format!("default/db/POD (pod{}/POD) (cpus 4)", db.uid),
            "pod sandbox",
        ),
    ] {
        let said = format!("kubelet's cpu_manager_state: {who} not adopted: {why}");
        assert!(log.contains(&said), "{said}\n{adoption:#?}");
    }
    assert!(!log.contains("is not running"), "{adoption:#?}");
    assert!(agent.stop().success());
}

#[test]
fn legacy_v1_entries_are_matched_by_container_id() {
    let node = TestNode::new(CgroupVersion::V2);
    let db = guaranteed("db", 2000);
    let db_id = pinned_by_kubelet(&node, &db, "4,12");
    let entries = BTreeMap::from([(db_id.clone(), "4,12".to_string())]);
    let file = node.state_dir().with_file_name("cpu_manager_state");
    fs::write(&file, kubelet_v1("0-3,5-11,13-15", &entries)).unwrap();

    let mut agent = node.start_agent(&["--kubelet-state", &file.display().to_string()]);
    let status = node.wait_status("converged", |s| s.converged() && s.exclusive_cpu_count == 2);
    assert!(status.has(&db_id, "4,12"), "{status:#?}");
    assert_eq!(
        note(&status, &db_id),
        "exclusive, adopted from kubelet's cpu_manager_state"
    );
    assert!(
        agent
            .log()
            .contains("adopted 1 of kubelet's 1 pin(s) (format V1)"),
        "{}",
        agent.log()
    );
    assert!(agent.stop().success());
    node.assert_clean();
}

/// A corrupt, oversized or special file is said once and the live tree is adopted as usual.
#[test]
fn a_bad_kubelet_checkpoint_never_stops_the_agent() {
    for (what, write) in [
        (
            "edited",
            &(|p: &Path| {
                let mut text = kubelet_v2(
                    "0-15",
                    &BTreeMap::from([(
                        "u".to_string(),
                        BTreeMap::from([("c".to_string(), "1".to_string())]),
                    )]),
                );
                text = text.replace("\"c\":\"1\"", "\"c\":\"2\"");
                fs::write(p, text).unwrap();
            }) as &dyn Fn(&Path),
        ),
        ("a directory", &|p: &Path| fs::create_dir(p).unwrap()),
        ("not json", &|p: &Path| fs::write(p, "{").unwrap()),
    ] {
        let node = TestNode::new(CgroupVersion::V1);
        let db = guaranteed("db", 1000);
        let db_id = pinned_by_kubelet(&node, &db, "3");
        let file = node.state_dir().with_file_name("cpu_manager_state");
        write(&file);
        let mut agent = node.start_agent(&["--kubelet-state", &file.display().to_string()]);
        let status = node.wait_status("converged", |s| s.converged());
        assert!(status.has(&db_id, "3"), "{what}: {status:#?}");
        assert_eq!(
            note(&status, &db_id),
            "exclusive, adopted from the live tree",
            "{what}"
        );
        assert_eq!(
            agent.log_lines("kubelet's checkpoint not used").len(),
            1,
            "{what}: {}",
            agent.log()
        );
        assert!(agent.stop().success());
        node.assert_clean();
    }
}

/// go-spew's rendering of v3 `PodEntries` values (`PodEntry{CPUSet}`, a `cpuset.CPUSet` being
/// a struct over `elems map[int]struct{}`), as kubelet 1.36 hashes them.
fn spew_pod_entries(pods: &BTreeMap<String, String>) -> String {
    let rendered: Vec<String> = pods
        .iter()
        .map(|(uid, list)| {
            let set: Vec<String> = cpusetd::cpuset::CpuSet::parse(list)
                .unwrap()
                .iter()
                .map(|c| format!("{c}:{{}}"))
                .collect();
            format!(
                "{uid}:{{CPUSet:(cpuset.CPUSet){{elems:(map[int]struct {{}})map[{}]}}}}",
                set.join(" ")
            )
        })
        .collect();
    format!("map[{}]", rendered.join(" "))
}

/// kubelet 1.36's v3 `cpu_manager_state` (pod-level resource managers on): the v2 fields plus
/// `podEntries`, checksummed with them.
fn kubelet_v3(
    default: &str,
    entries: &BTreeMap<String, BTreeMap<String, String>>,
    pods: &BTreeMap<String, String>,
) -> String {
    let rendered: Vec<String> = entries
        .iter()
        .map(|(pod, containers)| {
            let inner: Vec<String> = containers
                .iter()
                .map(|(c, cpus)| format!("{c}:{cpus}"))
                .collect();
            format!("{pod}:map[{}]", inner.join(" "))
        })
        .collect();
    let spew = format!(
        "(*state.CPUManagerCheckpoint){{PolicyName:(string)static DefaultCPUSet:(string){default} \
         Entries:(map[string]map[string]string)map[{}] PodEntries:(state.PodCPUAssignments){} \
         Checksum:(checksum.Checksum)0}}",
        rendered.join(" "),
        spew_pod_entries(pods)
    );
    let mut doc = v3_fields(default, entries, pods);
    doc["checksum"] = fnv1a32(spew.as_bytes()).into();
    doc.to_string()
}

fn v3_fields(
    default: &str,
    entries: &BTreeMap<String, BTreeMap<String, String>>,
    pods: &BTreeMap<String, String>,
) -> serde_json::Value {
    let pod_entries: BTreeMap<&String, serde_json::Value> = pods
        .iter()
        .map(|(uid, list)| (uid, serde_json::json!({ "cpuSet": list })))
        .collect();
    serde_json::json!({
        "policyName": "static",
        "defaultCpuSet": default,
        "entries": entries,
        "podEntries": pod_entries,
    })
}

/// kubelet 1.37's v4: the v3 fields inline with checksum 0, `data` (the same fields as JSON)
/// and `dataChecksum` (FNV-1a 32 of go-spew's `(string)` rendering of `data`).
fn kubelet_v4(
    default: &str,
    entries: &BTreeMap<String, BTreeMap<String, String>>,
    pods: &BTreeMap<String, String>,
) -> String {
    let data = v3_fields(default, entries, pods).to_string();
    let mut doc = v3_fields(default, entries, pods);
    doc["checksum"] = 0.into();
    doc["dataChecksum"] = fnv1a32(format!("(string){data}").as_bytes()).into();
    doc["data"] = data.into();
    doc.to_string()
}

/// Issue 28 item 4: kubelet's newer checkpoints are adopted like v2, their pod-level sets said
/// and left; a v4 file whose data does not match its checksum adopts nothing, is said once,
/// and the agent runs on (the live tree's pins adopted as usual).
#[test]
fn kubelet_v3_and_v4_checkpoints_are_adopted_and_a_bad_data_checksum_adopts_nothing() {
    for format in ["V3", "V4", "corrupt V4"] {
        let node = TestNode::new(CgroupVersion::V2);
        let db = guaranteed("db", 2000);
        let db_id = pinned_by_kubelet(&node, &db, "1,9");
        let entries = BTreeMap::from([(
            db.uid.clone(),
            BTreeMap::from([("db".to_string(), "1,9".to_string())]),
        )]);
        let pod_level = "0badc0de-0000-4000-8000-00000000000b";
        let pods = BTreeMap::from([(pod_level.to_string(), "4-5".to_string())]);
        let text = match format {
            "V3" => kubelet_v3("0,2-8,10-15", &entries, &pods),
            "V4" => kubelet_v4("0,2-8,10-15", &entries, &pods),
            // The data says 1,10; its checksum was taken over 1,9.
            _ => {
                let good = kubelet_v4("0,2-8,10-15", &entries, &pods);
                let doc: serde_json::Value = serde_json::from_str(&good).unwrap();
                let mut doc = doc;
                let data = doc["data"].as_str().unwrap().replace("1,9", "1,10");
                doc["data"] = data.into();
                doc.to_string()
            }
        };
        let file = node.state_dir().with_file_name("cpu_manager_state");
        fs::write(&file, text).unwrap();
        let mut agent = node.start_agent(&["--kubelet-state", &file.display().to_string()]);
        let status = node.wait_status("converged", |s| s.converged() && s.exclusive_cpu_count == 2);
        assert!(status.has(&db_id, "1,9"), "{format}: {status:#?}");
        let log = agent.log();
        if format == "corrupt V4" {
            assert_eq!(
                note(&status, &db_id),
                "exclusive, adopted from the live tree"
            );
            let said = agent.log_lines("kubelet's checkpoint not used");
            assert_eq!(said.len(), 1, "{log}");
            assert!(
                said[0].contains("checkpoint is corrupted: dataChecksum"),
                "{}",
                said[0]
            );
            assert!(!log.contains("adopted 1 of kubelet's"), "{log}");
            assert!(!log.contains("pod-level cpu sets"), "{log}");
        } else {
            assert_eq!(
                note(&status, &db_id),
                "exclusive, adopted from kubelet's cpu_manager_state",
                "{format}"
            );
            assert!(
                log.contains(&format!(
                    "adopted 1 of kubelet's 1 pin(s) (format {format})"
                )),
                "{log}"
            );
            assert!(
                log.contains(&format!(
                    "kubelet's pod-level cpu sets not adopted (pod{pod_level} cpus 4-5)"
                )),
                "{log}"
            );
        }
        // The agent runs on: a new pod is pinned after the start.
        let web = guaranteed("web", 1000);
        let web_id = node.fake.start_pod(&web).unwrap().remove(0);
        node.wait_status("web pinned", |s| {
            s.converged() && s.by_id(&web_id).is_some_and(|r| r.exclusive)
        });
        assert!(agent.stop().success(), "{format}");
        node.assert_clean();
    }
}
