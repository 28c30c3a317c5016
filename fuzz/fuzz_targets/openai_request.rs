//! Any bytes as a chat or completion request body: parsed or refused, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = serde_json::from_slice::<pocket_api::ChatCompletionRequest>(data) {
        let _ = serde_json::to_vec(&r);
    }
    if let Ok(r) = serde_json::from_slice::<pocket_api::CompletionRequest>(data) {
        let _ = serde_json::to_vec(&r);
    }
});
