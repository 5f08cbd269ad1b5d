//! The planner: from the scanned tree and the assignments to the desired `cpuset.cpus` /
//! `cpuset.mems` of every cgroup, and from there to an ordered `WritePlan` (DESIGN.md §5).
//! Pure: values in, values out.

pub mod order;

pub use order::{order_writes, NestingChecker, NestingViolation, Phase, SetNode, SetWrite};
