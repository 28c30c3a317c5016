//! The FFI layer: everything that calls ggml or llama.cpp directly, as safe types —
//! [`graph`] (building graphs), [`gguf`] (reading GGUF files), [`device`] (devices and buffer
//! types), [`arena`] (tensors holding data: weights, KV cache), [`sched`] (a session's backends and scheduler), [`types`] (element types), [`llama`] (llama.cpp's own model and
//! context), [`vocab`] (its tokenizer), [`rpc`] (ggml's RPC backend), `openvino` (OpenVINO's devices, with that feature). The crate's `unsafe` is here and in the kernels (`attention`,
//! `gemm`).

pub(crate) mod arena;
pub(crate) mod chunks;
pub(crate) mod device;
pub(crate) mod gguf;
pub mod gguf_check;
pub(crate) mod graph;
pub(crate) mod heap;
pub(crate) mod llama;
#[cfg(feature = "openvino")]
pub(crate) mod openvino;
pub(crate) mod pools;
pub(crate) mod rpc;
pub(crate) mod sched;
pub(crate) mod types;
pub(crate) mod vocab;

use std::ffi::{CStr, c_char, c_void};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

use llama_cpp_sys_2 as sys;

/// Initialise llama.cpp's backends once per process and route ggml's and llama.cpp's logs to
/// `tracing` (they would otherwise print to stderr).
pub(crate) fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        #[cfg(feature = "openvino")]
        openvino::configure();
        // ggml's tiled K-quant matmul takes over from 8 rows, with other arithmetic than the
        // 1-row kernel: verification passes (up to MAX_DRAFT + 1 rows) must compute each row
        // as plain decoding does, so it is off unless the operator asked for it explicitly.
        // ggml reads the variable once, at its first matmul, which comes after this.
        if std::env::var_os("GGML_CPU_TILED_MM").is_none() {
            // SAFETY: set once, at the first use of ggml, before any ggml code runs; Rust
            // code of this process does not read this variable concurrently.
            unsafe { std::env::set_var("GGML_CPU_TILED_MM", "0") };
        }
        return_freed_memory();
        // SAFETY: `log` matches ggml_log_callback and ignores user_data; backend init is
        // called once, before any other llama.cpp use.
        unsafe {
            sys::llama_log_set(Some(log), std::ptr::null_mut());
            sys::ggml_log_set(Some(log), std::ptr::null_mut());
            sys::llama_backend_init();
        }
        STARTED.store(true, Ordering::Release);
    });
}

static STARTED: AtomicBool = AtomicBool::new(false);

/// Whether [`init`] has run (ggml's backends have started and read their settings).
#[cfg_attr(not(feature = "openvino"), allow(dead_code))]
pub(crate) fn started() -> bool {
    STARTED.load(Ordering::Acquire)
}

/// # Safety
/// Only ggml and llama.cpp call it, as their log callback: `text` is null or a
/// NUL-terminated string.
unsafe extern "C" fn log(level: sys::ggml_log_level, text: *const c_char, _user: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: ggml passes a NUL-terminated message valid for the call.
    let msg = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    let msg = msg.trim_end();
    if msg.is_empty() {
        return;
    }
    llama::capture(msg);
    if level == sys::GGML_LOG_LEVEL_ERROR {
        tracing::warn!(target: "ggml", "{msg}");
    } else if level == sys::GGML_LOG_LEVEL_WARN {
        tracing::info!(target: "ggml", "{msg}");
    } else {
        tracing::trace!(target: "ggml", "{msg}");
    }
}

/// Make glibc give large freed blocks back to the system at once. By default its threshold
/// for serving an allocation from its own mapping rises each time such a block is freed, after
/// which sessions' compute buffers and parked KV caches come from the heap and stay resident
/// when freed: the process's memory would exceed what the budget counts by the buffers it
/// once held (≈25 MB after a chat on SmolLM2). A fixed threshold keeps every block of 128 KiB
/// or more in a mapping of its own, unmapped on free.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
        }
        const M_TRIM_THRESHOLD: std::ffi::c_int = -1;
        const M_MMAP_THRESHOLD: std::ffi::c_int = -3;
        // SAFETY: mallopt only changes allocator parameters; called once, from init.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 128 << 10);
            mallopt(M_TRIM_THRESHOLD, 128 << 10);
        }
    }
}
