//! The fuzz targets' properties (`fuzz/src/lib.rs`, included here) replayed over the committed
//! corpus (`fuzz/corpus/<target>/`) and every kept crash input (`fuzz/regressions/<target>/`),
//! so CI checks them without a fuzzing toolchain. `scripts/fuzz.sh` runs the fuzzer itself.
//! `CPUSETD_FUZZ_REPLAY=<file>` replays one file through every target (to debug a finding).

use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use crate::util::repo;

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code, unused_qualifications)]
mod props;

/// A fuzz target's property: panics on a violation.
type Property = fn(&[u8]);

/// (target, property) for every fuzz target.
const TARGETS: [(&str, Property); 7] = [
    ("cpu_list", props::cpu_list),
    ("classify", props::classify),
    ("runtime_config", props::runtime_config),
    ("checkpoint", props::checkpoint),
    ("planner", props::planner),
    ("irqbalance", props::irqbalance),
    ("proc_irq", props::proc_irq),
];

fn inputs(target: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in ["corpus", "regressions"] {
        let dir = repo().join("fuzz").join(dir).join(target);
        if let Ok(entries) = fs::read_dir(&dir) {
            files.extend(entries.map(|e| e.unwrap().path()).filter(|p| p.is_file()));
        }
    }
    files.sort();
    files
}

/// Runs `property` on each file; returns the files that failed, with the panic message.
fn replay(property: Property, files: &[PathBuf]) -> Vec<String> {
    let mut failed = Vec::new();
    for file in files {
        let data = fs::read(file).unwrap();
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| property(&data))) {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failed.push(format!("{}: {message}", file.display()));
        }
    }
    failed
}

#[test]
fn the_fuzz_corpus_and_regressions_pass_every_property() {
    if let Some(one) = std::env::var_os("CPUSETD_FUZZ_REPLAY") {
        for (target, property) in TARGETS {
            println!("{target}:");
            property(&fs::read(Path::new(&one)).unwrap());
        }
        return;
    }
    let mut failed = Vec::new();
    let mut counts = Vec::new();
    for (target, property) in TARGETS {
        let files = inputs(target);
        assert!(!files.is_empty(), "no corpus for {target}");
        counts.push(format!("{target} {}", files.len()));
        failed.extend(replay(property, &files));
    }
    println!("fuzz replay: {}", counts.join(", "));
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
