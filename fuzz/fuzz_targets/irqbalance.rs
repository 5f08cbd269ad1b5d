#![no_main]
//! See `cpusetd_fuzz::irqbalance` for the property.

libfuzzer_sys::fuzz_target!(|data: &[u8]| cpusetd_fuzz::irqbalance(data));
