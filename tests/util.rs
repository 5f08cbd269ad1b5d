//! Helpers shared by the integration tests: fixture paths, tree copies, scanning and
//! classifying a tree in one call, short names for fixture UIDs and container ids, and a
//! logger that captures log lines so tests can assert what an operator would read.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Mutex, Once};

use cpusetd::cgroupfs::{detect_layout, CgroupLayout, Hierarchy, LayoutConfig, Scan, Scanner};
use cpusetd::classify::{classify_scan, CgroupNaming, Classification, Exclusivity};
use cpusetd::runtime::{ConfigTemplate, RuntimeLookup};

/// The repository root.
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub use crate::agent_process::testdata;

/// `testdata/cgroup/<rel>` in the source tree.
pub fn cgroup_testdata(rel: &str) -> PathBuf {
    testdata("cgroup").join(rel)
}

/// Runs the `cpusetd` binary built for this test run.
pub fn cpusetd(args: &[&str]) -> Output {
    crate::agent_process::cpusetd_command()
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run cpusetd")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runtime config templates pointing at the fixture configs under `runtime_dir`.
pub fn templates(runtime_dir: &Path) -> Vec<ConfigTemplate> {
    [
        format!("{}/containerd/{{id}}/config.json", runtime_dir.display()),
        format!("{}/crio/{{id}}/userdata/config.json", runtime_dir.display()),
    ]
    .iter()
    .map(|t| ConfigTemplate::new(t).unwrap())
    .collect()
}

/// Copies a directory tree (files and directories only).
pub fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The layout of a fake tree given as `--cgroup-root`, with nothing else configured.
pub fn layout_of(root: &Path) -> CgroupLayout {
    detect_layout(&LayoutConfig {
        proc_root: PathBuf::from("/nonexistent-proc"),
        cgroup_root: Some(root.to_path_buf()),
        driver: None,
        kubepods: None,
    })
    .unwrap()
}

/// A scanner over a layout.
pub fn scanner(layout: &CgroupLayout) -> Scanner {
    Scanner::new(Hierarchy::open(layout).unwrap(), layout.kubepods.clone())
}

/// Scans and classifies a tree the way the agent does.
pub fn scan_and_classify(layout: &CgroupLayout, runtime_dir: &Path) -> (Scan, Vec<Classification>) {
    let scan = scanner(layout).scan().unwrap();
    let mut lookup = RuntimeLookup::new(templates(runtime_dir));
    let naming = CgroupNaming::new(layout.driver, &layout.kubepods);
    let classes = classify_scan(&naming, &scan, |id| lookup.lookup(id));
    (scan, classes)
}

/// Fixture names made short: pod UIDs `1a2b3c4d-0000-4000-8000-0000000000NN` (or with `_`)
/// become `<NN>`, container ids `TXYTXY…` become `<XY>`.
pub fn short(text: &str) -> String {
    let mut text = text.to_string();
    for sep in ["-", "_"] {
        let prefix = ["1a2b3c4d", "0000", "4000", "8000", "0000000000"].join(sep);
        while let Some(at) = text.find(&prefix) {
            let end = at + prefix.len() + 2;
            let tag = text[at + prefix.len()..end].to_string();
            text.replace_range(at..end, &format!("<{tag}>"));
        }
    }
    let mut i = 0;
    while i + 64 <= text.len() {
        if text.is_char_boundary(i)
            && text.is_char_boundary(i + 64)
            && is_fixture_id(&text[i..i + 64])
        {
            let tag = text[i + 1..i + 3].to_string();
            text.replace_range(i..i + 64, &format!("<{tag}>"));
        }
        i += 1;
    }
    text
}

fn is_fixture_id(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_hexdigit()) && text[..3].repeat(22)[..64] == *text
}

/// One row of a classification table: `kind qos exclusivity name`.
pub fn summary(c: &Classification) -> String {
    let qos = c.qos.map_or("-".to_string(), |q| q.to_string());
    let exclusivity = match &c.exclusivity {
        Exclusivity::NotApplicable => "-".to_string(),
        Exclusivity::Exclusive { cpus } => format!("exclusive:{cpus}"),
        Exclusivity::Shared { reason } => format!("shared({reason})"),
    };
    let name = c.container_name.as_deref().unwrap_or("-");
    format!("{} | {qos} | {exclusivity} | {name}", c.kind)
}

static LOGS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static INIT: Once = Once::new();

struct CaptureLogger;

impl log::Log for CaptureLogger {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        let line = format!("{} {}", record.level(), record.args());
        LOGS.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }
    fn flush(&self) {}
}

/// Starts capturing log lines (idempotent).
pub fn capture_logs() {
    INIT.call_once(|| {
        log::set_logger(&CaptureLogger).unwrap();
        log::set_max_level(log::LevelFilter::Debug);
    });
}

/// Captured lines containing `needle` (tests run in parallel: filter by something unique, such
/// as a temporary directory's path).
pub fn logged(needle: &str) -> Vec<String> {
    LOGS.lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|line| line.contains(needle))
        .cloned()
        .collect()
}
