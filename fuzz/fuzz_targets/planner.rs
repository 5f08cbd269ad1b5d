#![no_main]
//! See `cpusetd_fuzz::planner` for the property.

libfuzzer_sys::fuzz_target!(|data: &[u8]| cpusetd_fuzz::planner(data));
