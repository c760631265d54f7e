#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tunneld_fuzz::wire(data));
