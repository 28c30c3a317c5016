//! Giving freed heap memory back to the system.
//!
//! glibc's malloc keeps what is freed in its arenas for reuse, and once a large block has
//! been freed it raises its mmap threshold, so later blocks of that size come from the arenas
//! too. A daemon that loads and unloads models (tract copies an ONNX model's weights to the
//! heap) would keep the largest footprint it ever had as resident memory, and the budget's
//! numbers would stop matching what the board sees. `malloc_trim` returns the free pages.

/// Return the heap's free pages to the system (glibc); a no-op elsewhere. Takes a few
/// milliseconds on a large heap: call it after unloading a model, not per token.
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas; it takes their locks, so it is safe
    // to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
