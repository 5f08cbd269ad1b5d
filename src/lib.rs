//! cpusetd: exclusive, topology-aligned CPUs for latency-critical Kubernetes containers, written
//! straight into cgroupfs.
//!
//! The pure core (`cpuset`, `topology` values, the allocator, classification, the planner) takes
//! values and returns values; the edges (`topology::discover`, cgroupfs, the runtime config
//! lookup, the watcher, the checkpoint) do the I/O. See docs/ARCHITECTURE.md for the pipeline and where each part lives.

// Functions of at most 60 lines (clippy.toml), tests aside (their modules allow longer ones).
#![deny(clippy::too_many_lines)]

pub mod agent;
pub mod allocator;
pub(crate) mod bounded;
pub mod cgroupfs;
pub mod checkpoint;
pub mod classify;
pub mod cli;
pub(crate) mod cpu_power;
pub mod cpuset;
pub mod devices;
pub(crate) mod effects;
#[cfg(debug_assertions)]
mod faults;
pub mod irq;
pub mod irqbalance;
pub mod kubesim;
pub mod logging;
pub mod planner;
pub mod podresources;
pub(crate) mod projection;
pub(crate) mod report;
pub mod runtime;
pub mod sched_balance;
pub mod state;
pub mod systemd_slices;
pub mod topology;
pub mod watcher;
pub(crate) mod writer;
