//! Any bytes as a GGUF file: the walk answers (a summary or what is wrong) without a panic,
//! an overflow, or an allocation the file's size does not justify.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = pocket_ggml::gguf_check::check(data, data.len() as u64, &pocket_ggml::ggml_type_layout);
});
