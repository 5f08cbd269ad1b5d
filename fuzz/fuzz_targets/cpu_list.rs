#![no_main]
//! See `cpusetd_fuzz::cpu_list` for the property.

libfuzzer_sys::fuzz_target!(|data: &[u8]| cpusetd_fuzz::cpu_list(data));
