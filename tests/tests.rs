//! The integration test binary: one binary with a module per area (ripgrep's layout), sharing
//! helpers from `util`.

mod cgroup_scan;
mod hostile;
mod real_kernel;
mod util;
