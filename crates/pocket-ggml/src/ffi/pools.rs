//! ggml thread pools, one per thread count, for a CPU backend whose passes change their count.
//!
//! A pool asked to run a graph on fewer threads than it has leaves the rest out of the graph,
//! but ggml wakes them for every graph and they then poll for the next one, spinning on a
//! core that another program (or this one's other passes) wanted: two processes at one thread
//! each ran at 28 tok/s instead of 50 with their idle threads spinning. A pool of exactly the
//! count needed has no idle threads; the one it replaces is paused (its threads sleep), and
//! is resumed when its count comes back.

use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

use crate::error::{Error, Result};

/// Pools by thread count (`1..=max`), made when first needed.
pub(crate) struct Pools {
    pools: Vec<Option<NonNull<sys::ggml_threadpool>>>,
}

// SAFETY: the pools belong to this value alone; ggml's pool threads do not care which thread
// submits a graph, and `&mut self` keeps submissions one at a time.
unsafe impl Send for Pools {}

impl Drop for Pools {
    fn drop(&mut self) {
        for pool in self.pools.iter().flatten() {
            // SAFETY: made in `get`, freed once, after every backend that used it (the owners
            // drop their backends first).
            unsafe { sys::ggml_threadpool_free(pool.as_ptr()) };
        }
    }
}

impl Pools {
    /// Room for pools of up to `max` threads (none made yet).
    pub(crate) fn new(max: usize) -> Self {
        Pools { pools: vec![None; max.max(1)] }
    }

    /// The most threads a pool here may have.
    pub(crate) fn max(&self) -> usize {
        self.pools.len()
    }

    /// The pool of `n` threads (clamped to `1..=max`), made now if it is the first time.
    pub(crate) fn get(&mut self, n: usize) -> Result<NonNull<sys::ggml_threadpool>> {
        let i = n.clamp(1, self.pools.len()) - 1;
        if let Some(pool) = self.pools[i] {
            return Ok(pool);
        }
        // SAFETY: default parameters for i + 1 threads, started paused so that they sleep
        // until the pool's first graph (ggml resumes a paused pool when it kicks one off); the
        // pool is freed in Drop.
        let pool = unsafe {
            let mut params = sys::ggml_threadpool_params_default(i as i32 + 1);
            params.paused = true;
            NonNull::new(sys::ggml_threadpool_new(&mut params))
        }
        .ok_or_else(|| Error::Ggml(format!("cannot start a thread pool of {} threads", i + 1)))?;
        self.pools[i] = Some(pool);
        Ok(pool)
    }
}
