#![no_main]
//! See `cpusetd_fuzz::proc_irq` for the property.

libfuzzer_sys::fuzz_target!(|data: &[u8]| cpusetd_fuzz::proc_irq(data));
