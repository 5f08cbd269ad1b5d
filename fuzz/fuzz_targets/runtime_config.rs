#![no_main]
//! See `cpusetd_fuzz::runtime_config` for the property.

libfuzzer_sys::fuzz_target!(|data: &[u8]| cpusetd_fuzz::runtime_config(data));
