//! The checkpoint format without a disk: round trip, checksum, and each reason a file's content
//! is refused.

use super::*;
use crate::state::ExclusiveAssignment;

fn set(text: &str) -> CpuSet {
    CpuSet::parse(text).unwrap()
}

fn named(pod: &str, container: &str) -> AssignmentKey {
    AssignmentKey::Named {
        pod_uid: pod.into(),
        container: container.into(),
    }
}

fn sample() -> Checkpoint {
    let mut assignments = Assignments::new();
    assignments
        .insert(
            named("11111111-2222-3333-4444-555555555555", "app"),
            ExclusiveAssignment {
                cpus: set("2-3"),
                container_id: Some("abc".into()),
                adopted: None,
                wanted: None,
            },
        )
        .unwrap();
    assignments
        .insert(
            AssignmentKey::Id {
                pod_uid: "66666666-7777-8888-9999-000000000000".into(),
                container_id: "def".into(),
            },
            ExclusiveAssignment {
                cpus: set("6"),
                container_id: None,
                adopted: None,
                // Short of a cpu that went offline.
                wanted: Some(2),
            },
        )
        .unwrap();
    // Grown in place from 2 to 2-3.
    assignments.set_grown(
        &named("11111111-2222-3333-4444-555555555555", "app"),
        vec![set("3")],
    );
    assignments.reject(
        "aaaaaaaa-2222-3333-4444-555555555555",
        crate::state::PodRejection {
            reason: crate::state::AdmissionReason::SmtAlignment,
            container: "odd".into(),
            message: "SMT Alignment Error: requested 1 cpus not multiple cpus per core = 2".into(),
            permanent: true,
        },
    );
    Checkpoint {
        policy: Policy::Static,
        options: PolicyOptions::parse("full-pcpus-only=true").unwrap(),
        reserved: set("0"),
        online: set("0-7"),
        shared_pool: set("0-1,4-5,7"),
        assignments,
        effects: [(
            "quota".to_string(),
            serde_json::json!([{
                "cgroup": "kubepods/pod11111111-2222-3333-4444-555555555555/abc",
                "original": "200000 100000"
            }]),
        )]
        .into(),
        refused: [(
            AssignmentKey::Named {
                pod_uid: "big".into(),
                container: "app".into(),
            },
            Refusal {
                reason: "not enough cpus available to satisfy request: requested=8, available=5"
                    .into(),
                requested: 8,
                available: Some(5),
            },
        )]
        .into_iter()
        .collect(),
        last_reconcile_unix_ms: Some(1_700_000_000_123),
    }
}

/// `document` (a JSON object without `checksum`) with its checksum added.
fn signed(mut document: Value) -> Vec<u8> {
    let sum = checksum_hex(&document);
    document["checksum"] = Value::String(sum);
    serde_json::to_vec_pretty(&document).unwrap()
}

fn unsigned_sample() -> Value {
    let mut value: Value = serde_json::from_slice(&sample().to_json().unwrap()).unwrap();
    value.as_object_mut().unwrap().remove("checksum");
    value
}

fn refusal(bytes: &[u8]) -> String {
    let err = Checkpoint::from_json(bytes).unwrap_err();
    crate::logging::error_chain(&err)
}

#[test]
fn round_trip_keeps_every_field() {
    let checkpoint = sample();
    let bytes = checkpoint.to_json().unwrap();
    assert_eq!(Checkpoint::from_json(&bytes).unwrap(), checkpoint);
    let none = Checkpoint {
        policy: Policy::None,
        options: PolicyOptions::default(),
        reserved: CpuSet::new(),
        online: set("0-3"),
        shared_pool: set("0-3"),
        assignments: Assignments::new(),
        effects: Default::default(),
        refused: Default::default(),
        last_reconcile_unix_ms: None,
    };
    let bytes = none.to_json().unwrap();
    assert!(!String::from_utf8_lossy(&bytes).contains("last_reconcile"));
    assert_eq!(Checkpoint::from_json(&bytes).unwrap(), none);
}

/// Issue 23, items 24 and 26: the cpus resizes added (in order) and the pods kubelet would
/// reject are kept; a version 1 file, from before them, still loads, without them.
#[test]
fn grown_cpus_and_rejected_pods_are_kept_and_version_1_still_loads() {
    let text = String::from_utf8(sample().to_json().unwrap()).unwrap();
    assert!(
        text.contains("\"grown\": [\n        \"3\"\n      ]"),
        "{text}"
    );
    assert!(text.contains("\"reason\": \"SMTAlignmentError\""), "{text}");
    let back = Checkpoint::from_json(text.as_bytes()).unwrap();
    let app = named("11111111-2222-3333-4444-555555555555", "app");
    assert_eq!(back.assignments.original(&app).unwrap(), set("2"));
    assert_eq!(
        back.assignments
            .rejection("aaaaaaaa-2222-3333-4444-555555555555")
            .map(|r| r.container.as_str()),
        Some("odd")
    );

    let mut old = unsigned_sample();
    old["version"] = 1.into();
    old.as_object_mut().unwrap().remove("rejected_pods");
    old["assignments"][0]
        .as_object_mut()
        .unwrap()
        .remove("grown");
    let loaded = Checkpoint::from_json(&signed(old)).unwrap();
    assert_eq!(loaded.assignments.get(&app).unwrap().cpus, set("2-3"));
    assert!(loaded.assignments.grown(&app).is_empty());
    assert_eq!(loaded.assignments.rejected().count(), 0);
}

/// Issue 24: a version 2 checkpoint, as the agent wrote it with a member per host effect
/// (`irq`, `sched`, `power`), loads with each one in the effects map under the same name (no
/// original lost on an upgrade); written again it is version 3, with the map alone.
#[test]
fn a_version_2_checkpoint_with_a_member_per_effect_loads_into_the_effects_map() {
    let mut old = unsigned_sample();
    old["version"] = 2.into();
    let document = old.as_object_mut().unwrap();
    document.remove("effects");
    document.insert(
        "irq".into(),
        serde_json::json!({"banned": "2-3", "in_force": "2-3", "default_affinity": "ff",
                           "irqs": {"24": "0-7"}}),
    );
    document.insert(
        "sched".into(),
        serde_json::json!({"isolated": "4", "flags": {"": "1"}, "host": {"system.slice": "0-7"}}),
    );
    document.insert(
        "power".into(),
        serde_json::json!({"latency": {"3": "0"}, "latency_in_force": "3"}),
    );
    document.insert(
        "quota_lifted".into(),
        serde_json::json!([{"cgroup": "kubepods/podu/c", "original": "200000"}]),
    );
    let loaded = Checkpoint::from_json(&signed(old.clone())).unwrap();
    for name in ["irq", "sched", "power"] {
        assert_eq!(loaded.effects[name], old[name], "{name}");
    }
    assert_eq!(loaded.effects["quota"], old["quota_lifted"]);
    assert_eq!(loaded.effects.len(), 4);
    let text = String::from_utf8(loaded.to_json().unwrap()).unwrap();
    assert!(text.contains("\"version\": 3"), "{text}");
    assert!(text.contains("\"effects\": {"), "{text}");
    assert!(!text.contains("\n  \"irq\""), "{text}");
    assert_eq!(Checkpoint::from_json(text.as_bytes()).unwrap(), loaded);
}

/// A version 3 checkpoint written before the CFS quota lift was an effect keeps its originals
/// in `quota_lifted`: they load into the map under the effect's name (none lost), an empty
/// list is nothing to restore, and the file written next has them in `effects` only.
#[test]
fn a_version_3_checkpoint_with_quota_lifted_loads_into_the_effects_map() {
    let mut old = unsigned_sample();
    let lifted = old["effects"]["quota"].clone();
    let document = old.as_object_mut().unwrap();
    document.remove("effects");
    document.insert("quota_lifted".into(), lifted.clone());
    let loaded = Checkpoint::from_json(&signed(old.clone())).unwrap();
    assert_eq!(loaded, sample());
    assert_eq!(loaded.effects[crate::effects::quota::NAME], lifted);
    let text = String::from_utf8(loaded.to_json().unwrap()).unwrap();
    assert!(!text.contains("quota_lifted"), "{text}");
    old["quota_lifted"] = serde_json::json!([]);
    let loaded = Checkpoint::from_json(&signed(old)).unwrap();
    assert!(loaded.effects.is_empty(), "{:?}", loaded.effects);
}

#[test]
fn the_file_is_pretty_versioned_and_ends_with_its_checksum() {
    let text = String::from_utf8(sample().to_json().unwrap()).unwrap();
    assert!(
        text.starts_with("{\n  \"version\": 3,\n  \"policy\": \"static\",\n"),
        "{text}"
    );
    assert!(text.contains("\"options\": \"full-pcpus-only=true\""));
    assert!(text.contains("\"shared_pool\": \"0-1,4-5,7\""));
    assert!(text.ends_with("}\n"));
    let value: Value = serde_json::from_str(&text).unwrap();
    let checksum = value["checksum"].as_str().unwrap();
    assert_eq!(checksum.len(), 16);
    assert!(checksum
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
}

#[test]
fn assignments_are_written_in_their_own_json_form() {
    let checkpoint = sample();
    let value: Value = serde_json::from_slice(&checkpoint.to_json().unwrap()).unwrap();
    assert_eq!(
        value["assignments"],
        serde_json::to_value(&checkpoint.assignments).unwrap()
    );
}

#[test]
fn checksum_is_fnv1a64_of_the_sorted_compact_form() {
    // FNV-1a 64 check values.
    assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    let document = serde_json::json!({"b": [1, {"d": "x\ny", "c": null}], "a": "é"});
    let mut canonical = Vec::new();
    write_canonical(&document, &mut canonical);
    assert_eq!(
        String::from_utf8(canonical.clone()).unwrap(),
        r#"{"a":"é","b":[1,{"c":null,"d":"x\ny"}]}"#
    );
    assert_eq!(
        checksum_hex(&document),
        format!("{:016x}", fnv1a64(&canonical))
    );
}

#[test]
fn layout_changes_keep_the_checksum_valid_and_value_changes_do_not() {
    let bytes = sample().to_json().unwrap();
    let value: Value = serde_json::from_slice(&bytes).unwrap();
    // Compact, and members in another order (longest name first).
    let mut members: Vec<(String, Value)> =
        value.as_object().unwrap().clone().into_iter().collect();
    members.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    let reordered = format!(
        "{{{}}}",
        members
            .iter()
            .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), v))
            .collect::<Vec<_>>()
            .join(",")
    );
    assert!(
        reordered.starts_with("{\"last_reconcile_unix_ms\":"),
        "{reordered}"
    );
    assert_eq!(
        Checkpoint::from_json(reordered.as_bytes()).unwrap(),
        sample()
    );
    let edited = String::from_utf8(bytes)
        .unwrap()
        .replace("\"2-3\"", "\"2-4\"");
    assert!(
        refusal(edited.as_bytes()).starts_with("wrong checksum: the file says"),
        "{}",
        refusal(edited.as_bytes())
    );
}

#[test]
fn each_refusal_names_its_reason() {
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut document = unsigned_sample();
        edit(&mut document);
        signed(document)
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"{\"version\": 1, \"pol".to_vec(), "it is not JSON or is truncated: EOF while parsing"),
        (b"".to_vec(), "it is not JSON or is truncated"),
        (b"[1]".to_vec(), "it is not a version 3 checkpoint: expected a JSON object"),
        (b"{}".to_vec(), "it is not a version 3 checkpoint: missing field `version`"),
        (
            b"{\"version\": \"1\"}".to_vec(),
            "it is not a version 3 checkpoint: `version` is not a whole number",
        ),
        (
            // A newer format is reported as such whatever else it holds.
            b"{\"version\": 4, \"anything\": [\"else\"]}".to_vec(),
            "it was written by a newer cpusetd (format version 4; this one reads up to version 3)",
        ),
        (b"{\"version\": 0}".to_vec(), "format version 0 is not one cpusetd writes"),
        (
            serde_json::to_vec(&unsigned_sample()).unwrap(),
            "it has no checksum",
        ),
        (
            with(&|d| d["surprise"] = Value::Bool(true)),
            "it is not a version 3 checkpoint: unknown field `surprise`",
        ),
        (
            with(&|d| d["policy"] = "dynamic".into()),
            "it is not a version 3 checkpoint: unknown variant `dynamic`",
        ),
        (
            with(&|d| d["options"] = "fast=true".into()),
            "invalid policy options: unknown cpu manager policy option \"fast\"",
        ),
        (
            with(&|d| d["shared_pool"] = "0-9000".into()),
            "invalid cpu list in shared_pool: invalid cpu list \"0-9000\": cpu id 9000 is larger than 8191",
        ),
        (
            with(&|d| d["assignments"][1]["cpus"] = "2".into()),
            "invalid assignments: cpus 2 of pod66666666-7777-8888-9999-000000000000/id:def overlap cpus held by pod11111111-2222-3333-4444-555555555555/app",
        ),
        (
            with(&|d| d["assignments"][1]["cpus"] = "".into()),
            "invalid assignments: pod66666666-7777-8888-9999-000000000000/id:def has an empty cpu set",
        ),
        (
            with(&|d| {
                let first = d["assignments"][0].clone();
                d["assignments"].as_array_mut().unwrap().push(first);
            }),
            "pod11111111-2222-3333-4444-555555555555/app is listed twice",
        ),
        (
            with(&|d| d["assignments"][0]["cpus"] = "8192".into()),
            "invalid cpu list in the cpus of pod11111111-2222-3333-4444-555555555555/app",
        ),
    ];
    for (bytes, expected) in cases {
        let message = refusal(&bytes);
        assert!(
            message.starts_with(expected),
            "{}\n  gave: {message}\n  want: {expected}",
            String::from_utf8_lossy(&bytes)
        );
    }
}

#[test]
fn cpus_outside_covers_every_set_given_out() {
    let checkpoint = sample();
    assert!(checkpoint.cpus_outside(&set("0-7")).is_empty());
    assert_eq!(checkpoint.cpus_outside(&set("0-5")).to_string(), "6-7");
    assert_eq!(checkpoint.cpus_outside(&set("1-7")).to_string(), "0");
    assert_eq!(checkpoint.cpus_outside(&set("0-1,4-7")).to_string(), "2-3");
}
