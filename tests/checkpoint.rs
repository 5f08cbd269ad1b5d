//! The checkpoint on disk, as the agent uses it: atomic saves that survive failures, loads that
//! never fail the agent but say why a file is unusable, quarantine, the state lock, and kubelet's
//! `cpu_manager_state` checked against kubelet's own vectors. As root, a small tmpfs gives the
//! real EROFS and ENOSPC.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use cpusetd::allocator::PolicyOptions;
use cpusetd::checkpoint::kubelet_state::{self, KubeletFormat, KubeletStateError};
use cpusetd::checkpoint::{
    load, load_on_node, quarantine, save, Checkpoint, LoadOutcome, LockError, Policy, StateLock,
    UnusableReason, MAX_FILE_SIZE, QUARANTINE_KEEP,
};
use cpusetd::cpuset::CpuSet;
use cpusetd::logging::error_chain;
use cpusetd::state::{AssignmentKey, Assignments, ExclusiveAssignment};
use serde_json::{json, Value};

const VECTORS: &str = include_str!("../testdata/kubelet_vectors.json");

fn set(text: &str) -> CpuSet {
    CpuSet::parse(text).unwrap()
}

fn key(pod: &str, container: &str) -> AssignmentKey {
    AssignmentKey::Named {
        pod_uid: pod.into(),
        container: container.into(),
    }
}

/// A checkpoint with `n` single-CPU assignments on CPUs 8.. (and one two-CPU one).
fn checkpoint(n: u32) -> Checkpoint {
    let mut assignments = Assignments::new();
    let exclusive = |cpus: CpuSet| ExclusiveAssignment {
        cpus,
        container_id: None,
        adopted: None,
        wanted: None,
    };
    assignments
        .insert(key("pod-a", "app"), exclusive(set("2-3")))
        .unwrap();
    for i in 0..n {
        let pod = format!("pod-{i:04}-0000-0000-0000-000000000000");
        assignments
            .insert(key(&pod, "app"), exclusive(CpuSet::range(8 + i, 8 + i)))
            .unwrap();
    }
    Checkpoint {
        policy: Policy::Static,
        options: PolicyOptions::parse("full-pcpus-only=true").unwrap(),
        reserved: set("0"),
        online: CpuSet::range(0, 7 + n.max(1)),
        shared_pool: set("0-1,4-7"),
        assignments,
        effects: [(
            "quota".to_string(),
            json!([{"cgroup": "kubepods/pod-a/abc", "original": "max 100000"}]),
        )]
        .into(),
        refused: Default::default(),
        last_reconcile_unix_ms: Some(1_700_000_000_000),
    }
}

fn loaded(dir: &Path) -> Checkpoint {
    match load(dir) {
        LoadOutcome::Loaded(c) => c,
        other => panic!("expected a checkpoint in {}: {other:?}", dir.display()),
    }
}

/// The reason and its one log line, for a file that must be unusable.
fn unusable(outcome: LoadOutcome) -> (UnusableReason, String) {
    match outcome {
        LoadOutcome::Unusable { path, reason } => {
            let line = reason.describe(&path);
            (reason, line)
        }
        other => panic!("expected an unusable checkpoint: {other:?}"),
    }
}

/// FNV-1a 64 over sorted compact JSON without `checksum`: the module docs' recipe, written
/// again here so the test checks the documentation, not the code against itself.
fn sign(mut document: Value) -> Vec<u8> {
    fn canonical(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut names: Vec<&String> = map.keys().collect();
                names.sort();
                out.push('{');
                for (i, name) in names.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(name.clone()).to_string());
                    out.push(':');
                    canonical(&map[name], out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    canonical(item, out);
                }
                out.push(']');
            }
            scalar => out.push_str(&scalar.to_string()),
        }
    }
    document.as_object_mut().unwrap().remove("checksum");
    let mut text = String::new();
    canonical(&document, &mut text);
    let mut hash: u64 = 0xcbf29ce484222325;
    for b in text.bytes() {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    document["checksum"] = format!("{hash:016x}").into();
    serde_json::to_vec_pretty(&document).unwrap()
}

fn saved_document(dir: &Path) -> Value {
    serde_json::from_slice(&fs::read(dir.join("state.json")).unwrap()).unwrap()
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[test]
fn save_then_load_gives_back_the_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("var/lib/cpusetd");
    let original = checkpoint(3);
    save(&dir, &original).unwrap();
    assert_eq!(loaded(&dir), original);
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("state.json")), 0o600);
    assert!(!dir.join("state.json.tmp").exists());
    // A second save replaces the first.
    let mut next = original.clone();
    next.assignments.remove(&key("pod-a", "app"));
    next.last_reconcile_unix_ms = Some(1_700_000_010_000);
    save(&dir, &next).unwrap();
    assert_eq!(loaded(&dir), next);
}

#[test]
fn the_documented_checksum_recipe_matches() {
    let tmp = tempfile::tempdir().unwrap();
    save(tmp.path(), &checkpoint(2)).unwrap();
    let document = saved_document(tmp.path());
    let resigned: Value = serde_json::from_slice(&sign(document.clone())).unwrap();
    assert_eq!(resigned["checksum"], document["checksum"]);

    // The same with Python, as the module docs tell an operator to check it.
    let script = "import json,sys\n\
        d=json.load(open(sys.argv[1]))\n\
        c=d.pop('checksum')\n\
        h=0xcbf29ce484222325\n\
        for b in json.dumps(d,sort_keys=True,separators=(',',':'),ensure_ascii=False).encode():\n\
        \x20   h=((h^b)*0x100000001b3)%2**64\n\
        print('%016x'%h==c)\n";
    match Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(tmp.path().join("state.json"))
        .output()
    {
        Ok(out) if out.status.success() => {
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "True");
        }
        Ok(out) => panic!("python3: {}", String::from_utf8_lossy(&out.stderr)),
        Err(e) => println!("skipped the python check: {e}"),
    }
}

#[test]
fn a_failed_save_keeps_the_previous_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    save(dir, &checkpoint(1)).unwrap();
    let before = fs::read(dir.join("state.json")).unwrap();
    // The temporary file's name is taken by a directory: the open fails.
    fs::create_dir(dir.join("state.json.tmp")).unwrap();
    fs::write(dir.join("state.json.tmp/keep"), "x").unwrap();
    let err = save(dir, &checkpoint(5)).unwrap_err();
    let message = error_chain(&err);
    assert!(
        message.starts_with(&format!(
            "cannot write checkpoint file {}: ",
            dir.join("state.json.tmp").display()
        )),
        "{message}"
    );
    assert!(message.contains("directory"), "{message}");
    assert_eq!(fs::read(dir.join("state.json")).unwrap(), before);
    assert_eq!(loaded(dir), checkpoint(1));
    assert!(
        dir.join("state.json.tmp/keep").exists(),
        "nothing of ours deleted"
    );
}

#[test]
fn a_planted_symlink_is_replaced_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    fs::create_dir(&dir).unwrap();
    let victim = tmp.path().join("victim");
    fs::write(&victim, "precious").unwrap();
    symlink(&victim, dir.join("state.json.tmp")).unwrap();
    save(&dir, &checkpoint(1)).unwrap();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
    assert_eq!(loaded(&dir), checkpoint(1));

    // On load, a symlinked state.json is refused rather than followed.
    fs::remove_file(dir.join("state.json")).unwrap();
    symlink(&victim, dir.join("state.json")).unwrap();
    let (_, line) = unusable(load(&dir));
    assert!(
        line.ends_with("state.json is unusable: it is a symlink, not a regular file"),
        "{line}"
    );
}

#[test]
fn a_fifo_does_not_hang_the_load() {
    let tmp = tempfile::tempdir().unwrap();
    let status = Command::new("mkfifo")
        .arg(tmp.path().join("state.json"))
        .status();
    if !status.map(|s| s.success()).unwrap_or(false) {
        println!("skipped: mkfifo unavailable");
        return;
    }
    let (_, line) = unusable(load(tmp.path()));
    assert!(line.ends_with("it is a fifo, not a regular file"), "{line}");
    quarantine(tmp.path(), &UnusableReason::NotRegular { kind: "a fifo" }).unwrap();
    assert!(matches!(load(tmp.path()), LoadOutcome::Missing));
}

#[test]
fn missing_state_is_a_first_start() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(matches!(
        load(&tmp.path().join("no/such/dir")),
        LoadOutcome::Missing
    ));
    assert!(matches!(load(tmp.path()), LoadOutcome::Missing));
}

#[test]
fn a_vanished_state_dir_is_recreated_by_the_next_save() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cpusetd");
    save(&dir, &checkpoint(1)).unwrap();
    fs::remove_dir_all(&dir).unwrap();
    assert!(matches!(load(&dir), LoadOutcome::Missing));
    save(&dir, &checkpoint(2)).unwrap();
    assert_eq!(loaded(&dir), checkpoint(2));
    assert_eq!(mode(&dir), 0o700);
}

/// Writes `bytes` as the state file, checks that load refuses it with a line containing
/// `expected`, quarantines it and checks the file was moved aside intact.
fn refused_and_quarantined(bytes: &[u8], expected: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    fs::write(dir.join("state.json"), bytes).unwrap();
    let (reason, line) = unusable(load(dir));
    let prefix = format!(
        "checkpoint {} is unusable: ",
        dir.join("state.json").display()
    );
    assert!(line.starts_with(&prefix), "{line}");
    assert!(line.contains(expected), "{line}\n  want: {expected}");
    let moved = quarantine(dir, &reason).unwrap();
    let name = moved.file_name().unwrap().to_str().unwrap();
    assert!(name.starts_with("state.json.corrupt-"), "{name}");
    assert!(
        name["state.json.corrupt-".len()..].parse::<u64>().is_ok(),
        "{name}"
    );
    assert_eq!(fs::read(&moved).unwrap(), bytes);
    let note = fs::read_to_string(format!("{}.reason", moved.display())).unwrap();
    assert_eq!(note.trim_end(), line);
    assert!(matches!(load(dir), LoadOutcome::Missing));
}

#[test]
fn unusable_files_say_why_and_are_moved_aside() {
    let tmp = tempfile::tempdir().unwrap();
    save(tmp.path(), &checkpoint(2)).unwrap();
    let good = fs::read(tmp.path().join("state.json")).unwrap();
    let document = saved_document(tmp.path());

    // Truncated mid-write (as by a full disk under a non-atomic writer).
    refused_and_quarantined(
        &good[..good.len() / 2],
        "it is not JSON or is truncated: EOF while parsing",
    );
    refused_and_quarantined(b"", "it is not JSON or is truncated");
    // Edited by hand: the checksum no longer matches.
    let edited = String::from_utf8(good.clone())
        .unwrap()
        .replace("\"2-3\"", "\"2-4\"");
    refused_and_quarantined(edited.as_bytes(), "wrong checksum: the file says");
    // From a future cpusetd.
    let mut future = document.clone();
    future["version"] = 4.into();
    future["new_thing"] = json!({"x": 1});
    refused_and_quarantined(
        &sign(future),
        "it was written by a newer cpusetd (format version 4; this one reads up to version 3)",
    );
    // Overlapping assignments, with a valid checksum.
    let mut overlapping = document.clone();
    overlapping["assignments"][1]["cpus"] = "3".into();
    refused_and_quarantined(
        &sign(overlapping),
        "invalid assignments: cpus 2-3 of podpod-a/app overlap cpus held by \
         podpod-0001-0000-0000-0000-000000000000/app",
    );
    // A CPU id above the limit.
    let mut huge = document.clone();
    huge["reserved"] = "0,100000".into();
    refused_and_quarantined(
        &sign(huge),
        "invalid cpu list in reserved: invalid cpu list \"0,100000\": cpu id 100000 is larger than 8191",
    );
    // 2 MiB: refused unread.
    let mut big = good.clone();
    big.resize(2 << 20, b' ');
    refused_and_quarantined(
        &big,
        &format!(
            "it is larger than {MAX_FILE_SIZE} bytes ({} bytes or more)",
            2 << 20
        ),
    );
}

#[test]
fn cpus_missing_from_the_node_make_it_unusable_there() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    save(dir, &checkpoint(2)).unwrap(); // assignments on 2-3 and 8-9
    assert!(matches!(
        load_on_node(dir, &set("0-9")),
        LoadOutcome::Loaded(_)
    ));
    let (reason, line) = unusable(load_on_node(dir, &set("0-7")));
    assert!(
        line.ends_with("it names cpus 8-9 that are not online on this node (online: 0-7)"),
        "{line}"
    );
    assert!(matches!(reason, UnusableReason::CpusNotOnline { .. }));
    // `load` leaves the check to the caller.
    assert_eq!(loaded(dir).cpus_outside(&set("0-7")).to_string(), "8-9");
    quarantine(dir, &reason).unwrap();
    assert!(matches!(load(dir), LoadOutcome::Missing));
}

#[test]
fn quarantine_keeps_the_newest_few() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let reason = UnusableReason::MissingChecksum;
    let mut moved = Vec::new();
    for i in 0..QUARANTINE_KEEP + 3 {
        fs::write(dir.join("state.json"), format!("{i}")).unwrap();
        moved.push(quarantine(dir, &reason).unwrap());
    }
    let mut left: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.ends_with(".reason"))
        .collect();
    left.sort();
    let mut newest: Vec<String> = moved[3..]
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_string())
        .collect();
    newest.sort();
    assert_eq!(left, newest);
    let notes = fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".reason")
        })
        .count();
    assert_eq!(notes, QUARANTINE_KEEP);
}

#[test]
fn a_second_lock_is_refused_naming_the_holder_until_the_first_is_dropped() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let first = StateLock::acquire(&dir).unwrap();
    assert_eq!(first.path(), dir.join("lock"));
    assert_eq!(
        fs::read_to_string(dir.join("lock")).unwrap(),
        format!("{}\n", std::process::id())
    );
    // flock belongs to the open file description: a second open in this process conflicts.
    let err = StateLock::acquire(&dir).unwrap_err();
    assert!(matches!(err, LockError::Held { pid: Some(pid), .. } if pid == std::process::id()));
    assert_eq!(
        err.to_string(),
        format!(
            "another cpusetd (pid {}) holds {}; stop it first",
            std::process::id(),
            dir.join("lock").display()
        )
    );
    drop(first);
    let again = StateLock::acquire(&dir).unwrap();
    drop(again);
}

#[test]
fn a_lock_held_by_another_process_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let lock = tmp.path().join("lock");
    fs::write(&lock, "").unwrap();
    // flock(1) holds the lock while `sleep` runs, with no pid in the file; it says when.
    let child = Command::new("flock")
        .arg("--exclusive")
        .arg(&lock)
        .args(["sh", "-c", "echo locked; exec sleep 30"])
        .stdout(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        println!("skipped: flock(1) unavailable");
        return;
    };
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line, "locked\n");
    let err = StateLock::acquire(tmp.path()).unwrap_err();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        err.to_string(),
        format!("another cpusetd holds {}; stop it first", lock.display())
    );
}

/// Whether this process runs as root.
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX)
        == 0
}

/// A tmpfs mounted on a fresh directory, unmounted on drop.
struct Tmpfs {
    _parent: tempfile::TempDir,
    dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs with `options`, or says why it cannot.
    fn mount(options: &str) -> Result<Tmpfs, String> {
        if !is_root() {
            return Err("not running as root".into());
        }
        let parent = tempfile::tempdir().map_err(|e| e.to_string())?;
        let dir = parent.path().join("mnt");
        fs::create_dir(&dir).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(&dir)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs {
            _parent: parent,
            dir,
        })
    }

    fn remount(&self, options: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(&self.dir)
            .status()
            .unwrap();
        assert!(status.success(), "remount {options}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

#[test]
fn a_read_only_filesystem_fails_the_save_clearly_and_keeps_the_old_file() {
    let fs_ = match Tmpfs::mount("ro,size=1m,mode=0700") {
        Ok(fs_) => fs_,
        Err(reason) => {
            println!("skipped: {reason}");
            return;
        }
    };
    let err = save(&fs_.dir, &checkpoint(1)).unwrap_err();
    assert_eq!(
        error_chain(&err),
        format!(
            "cannot write checkpoint file {}: Read-only file system (os error 30)",
            fs_.dir.join("state.json.tmp").display()
        )
    );
    // A state dir to create on it.
    let err = save(&fs_.dir.join("state"), &checkpoint(1)).unwrap_err();
    let message = error_chain(&err);
    assert!(
        message.starts_with(&format!(
            "cannot create state directory {}",
            fs_.dir.join("state").display()
        )) && message.ends_with("Read-only file system (os error 30)"),
        "{message}"
    );
    // Saved while writable, then remounted read-only: the old checkpoint stays readable.
    fs_.remount("rw");
    save(&fs_.dir, &checkpoint(1)).unwrap();
    fs_.remount("ro");
    let err = save(&fs_.dir, &checkpoint(2)).unwrap_err();
    assert!(error_chain(&err).contains("Read-only file system"), "{err}");
    assert_eq!(loaded(&fs_.dir), checkpoint(1));
}

#[test]
fn a_full_filesystem_fails_the_save_and_keeps_the_old_file() {
    let fs_ = match Tmpfs::mount("size=64k,mode=0700") {
        Ok(fs_) => fs_,
        Err(reason) => {
            println!("skipped: {reason}");
            return;
        }
    };
    save(&fs_.dir, &checkpoint(1)).unwrap();
    // Over 1000 assignments: more than 64 KiB.
    let big = checkpoint(1200);
    assert!(big.to_json().unwrap().len() > 64 << 10);
    let err = save(&fs_.dir, &big).unwrap_err();
    assert_eq!(
        error_chain(&err),
        format!(
            "cannot write checkpoint file {}: No space left on device (os error 28)",
            fs_.dir.join("state.json.tmp").display()
        )
    );
    assert!(
        !fs_.dir.join("state.json.tmp").exists(),
        "the partial file is removed"
    );
    assert_eq!(loaded(&fs_.dir), checkpoint(1));
}

// kubelet's cpu_manager_state.

/// A kubelet checkpoint file from a vector, with `defaultCPUSet` spelt as kubelet's tests do.
fn kubelet_file(vector: &Value) -> String {
    json!({
        "policyName": vector["policyName"],
        "defaultCPUSet": vector["defaultCpuSet"],
        "entries": vector["entries"],
        "checksum": vector["checksum"],
    })
    .to_string()
}

#[test]
fn kubelet_vectors_verify_and_parse_as_kubelet_restores_them() {
    let vectors: Value = serde_json::from_str(VECTORS).unwrap();
    let list = vectors["checkpoint_checksums"]["vectors"]
        .as_array()
        .unwrap();
    assert_eq!(list.len(), 7);
    for vector in list {
        let file = kubelet_file(vector);
        let format = match vector["format"].as_str().unwrap() {
            "v1" => KubeletFormat::V1,
            _ => KubeletFormat::V2,
        };
        let default = vector["defaultCpuSet"].as_str().unwrap();
        let has_bad_cpus = CpuSet::parse(default).is_err() || file.contains("\"asd\"");
        match kubelet_state::parse(file.as_bytes()) {
            Ok(state) => {
                assert!(!has_bad_cpus, "{file}");
                assert_eq!(state.format, format, "{file}");
                assert!(state.checksum_verified, "{file}");
                assert_eq!(state.policy_name, vector["policyName"].as_str().unwrap());
                assert_eq!(state.default_cpu_set.to_string(), default);
                let entries = vector["entries"].as_object().unwrap();
                match format {
                    KubeletFormat::V1 => assert_eq!(state.legacy_entries.len(), entries.len()),
                    KubeletFormat::V2 | KubeletFormat::V3 | KubeletFormat::V4 => {
                        let count: usize =
                            entries.values().map(|c| c.as_object().unwrap().len()).sum();
                        assert_eq!(state.entries.len(), count);
                    }
                }
            }
            // The checksum matched; the cpuset is what kubelet refuses too.
            Err(
                err @ (KubeletStateError::DefaultCpuSet { .. }
                | KubeletStateError::EntryCpuSet { .. }),
            ) => assert!(has_bad_cpus, "{file}: {err}"),
            Err(err) => panic!("{file}: {}", error_chain(&err)),
        }
        // One off the checksum: corrupted.
        let wrong = file.replace(
            &format!("\"checksum\":{}", vector["checksum"]),
            &format!("\"checksum\":{}", vector["checksum"].as_u64().unwrap() + 1),
        );
        assert!(
            matches!(
                kubelet_state::parse(wrong.as_bytes()),
                Err(KubeletStateError::Corrupt { .. })
            ),
            "{wrong}"
        );
    }
}

#[test]
fn kubelet_reference_examples_and_a_file_on_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("cpu_manager_state");
    assert!(kubelet_state::read(&path).unwrap().is_none());

    let a = r#"{"policyName":"static","defaultCpuSet":"0,2-12,14-23","entries":{"235148fe-393f-47a8-a17d-bd55bc1a836b":{"cgroup1-0":"1,13"}},"checksum":1552716370}"#;
    fs::write(&path, a).unwrap();
    let state = kubelet_state::read(&path).unwrap().unwrap();
    assert_eq!(state.format, KubeletFormat::V2);
    let adopted = state.assignments(|_| true);
    let key = key("235148fe-393f-47a8-a17d-bd55bc1a836b", "cgroup1-0");
    assert_eq!(
        adopted.assignments.get(&key).unwrap().cpus.to_string(),
        "1,13"
    );

    let b = r#"{"policyName":"none","defaultCpuSet":"","checksum":3242152201}"#;
    fs::write(&path, b).unwrap();
    let state = kubelet_state::read(&path).unwrap().unwrap();
    assert_eq!(state.format, KubeletFormat::V1);
    assert!(state.checksum_verified && state.default_cpu_set.is_empty());

    // Corruption: a truncated file, a flipped digit, a huge file.
    fs::write(&path, &a[..a.len() - 10]).unwrap();
    let err = kubelet_state::read(&path).unwrap_err();
    assert!(
        error_chain(&err).starts_with("not a cpu manager checkpoint: EOF"),
        "{err}"
    );
    fs::write(&path, a.replace("1,13", "1,12")).unwrap();
    let err = kubelet_state::read(&path).unwrap_err();
    assert!(
        err.to_string().starts_with("checkpoint is corrupted"),
        "{err}"
    );
    fs::write(&path, vec![b' '; 2 << 20]).unwrap();
    let err = kubelet_state::read(&path).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{} is larger than {MAX_FILE_SIZE} bytes ({} bytes or more)",
            path.display(),
            2 << 20
        )
    );
}

/// A hard link planted at the lock file's name (issue 17, item 17) is unlinked, never written
/// through: the file it points at keeps its bytes, and the lock works.
#[test]
fn a_hard_link_planted_at_the_lock_file_is_never_written_through() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    fs::create_dir(&dir).unwrap();
    let victim = tmp.path().join("victim");
    fs::write(&victim, "precious\n").unwrap();
    fs::hard_link(&victim, dir.join("lock")).unwrap();
    let lock = StateLock::acquire(&dir).unwrap();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
    assert!(
        StateLock::acquire(&dir).is_err(),
        "a second lock was granted"
    );
    drop(lock);
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
    // And a symlink is replaced the same way.
    fs::remove_file(dir.join("lock")).unwrap();
    symlink(&victim, dir.join("lock")).unwrap();
    let lock = StateLock::acquire(&dir).unwrap();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
    assert!(!fs::symlink_metadata(dir.join("lock"))
        .unwrap()
        .file_type()
        .is_symlink());
    drop(lock);
}

/// A read-only or full state directory does not stop the agent at its lock (issue 17, item
/// 12): the directory itself is locked, and a second agent is still refused.
#[test]
fn a_read_only_or_full_state_directory_still_takes_the_lock() {
    let fs_ro = match Tmpfs::mount("size=1m") {
        Ok(t) => t,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let dir = fs_ro.dir.join("state");
    fs::create_dir(&dir).unwrap();
    fs_ro.remount("ro");
    let lock = StateLock::acquire(&dir).unwrap();
    assert_eq!(lock.path(), dir.as_path());
    let err = StateLock::acquire(&dir).unwrap_err();
    assert!(err.to_string().contains("another cpusetd"), "{err}");
    drop(lock);
    assert!(StateLock::acquire(&dir).is_ok());

    // Full: the lock file exists but its pid cannot be written.
    let full = Tmpfs::mount("size=64k").unwrap();
    let dir = full.dir.join("state");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("lock"), "").unwrap();
    let filler = fs::File::create(full.dir.join("filler")).unwrap();
    use std::io::Write;
    let mut filler = std::io::BufWriter::new(filler);
    while filler
        .write_all(&[0u8; 4096])
        .and_then(|()| filler.flush())
        .is_ok()
    {}
    let lock = StateLock::acquire(&dir).unwrap();
    assert!(StateLock::acquire(&dir).is_err());
    drop(lock);
}
