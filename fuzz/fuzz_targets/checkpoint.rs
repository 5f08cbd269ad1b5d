#![no_main]
//! See `cpusetd_fuzz::checkpoint` for the property.

libfuzzer_sys::fuzz_target!(|data: &[u8]| cpusetd_fuzz::checkpoint(data));
