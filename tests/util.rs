//! Shared helpers for the integration tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root (where `testdata/` lives).
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub fn testdata(rel: &str) -> PathBuf {
    repo().join("testdata").join(rel)
}

/// Runs the `cpusetd` binary built for this test run.
pub fn cpusetd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cpusetd"))
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
