//! The KV cache's memory is real: the process's resident anonymous memory grows by what
//! `kv_bytes()` says when a session grows, and falls back when it is truncated.
//!
//! One test in its own file, so its process runs nothing else while it reads its own memory
//! figures (`RssAnon` in /proc/self/status: the KV cache is an anonymous mapping, the weights
//! are a file mapping and do not count there). It compares deltas on one session whose compute
//! buffers were used to the full beforehand, so that only the KV cache changes between the
//! measurements.

mod common;

use common::*;
use pocket_core::{Rows, Session};

const MIB: f64 = 1024.0 * 1024.0;

#[test]
fn resident_memory_grows_with_the_kv_cache_and_falls_back_after_truncate() {
    let model = smol();
    let plan = full(&model);
    let config = config(4096);
    let text = prose(&model, 1024);
    let mut s = session(&model, &config);

    // Warm up: the same passes as measured below, so the compute buffers, the mask and the
    // logits have all been touched and allocated before the first measurement.
    s.decode(&text[..64], &plan, Rows::Last).unwrap();
    s.decode(&text[64..], &plan, Rows::Last).unwrap();
    s.truncate(64).unwrap();

    let at_64 = rss_anon();
    let kv_64 = s.kv_bytes() as u64;
    s.decode(&text[64..], &plan, Rows::Last).unwrap();
    let at_1024 = rss_anon();
    let kv_1024 = s.kv_bytes() as u64;
    s.truncate(64).unwrap();
    let back_at_64 = rss_anon();

    assert_eq!(kv_1024, 16 * kv_64, "1024 tokens hold 16 blocks of 64");
    let predicted = (kv_1024 - kv_64) as f64;
    let grew = at_1024 as f64 - at_64 as f64;
    let fell = at_1024 as f64 - back_at_64 as f64;
    eprintln!(
        "KV {:.1} → {:.1} MiB; RssAnon {:.1} → {:.1} → {:.1} MiB",
        kv_64 as f64 / MIB,
        kv_1024 as f64 / MIB,
        at_64 as f64 / MIB,
        at_1024 as f64 / MIB,
        back_at_64 as f64 / MIB
    );
    // At least 80% of the predicted growth is really resident (a shortfall means KV pages were
    // never written or the accounting overstates); at most the prediction plus 8 MiB of other
    // allocations (more means the cache took more than it says).
    assert!(
        grew >= 0.8 * predicted,
        "RssAnon grew by {:.1} MiB, the KV cache by {:.1} MiB",
        grew / MIB,
        predicted / MIB
    );
    assert!(
        grew <= predicted + 8.0 * MIB,
        "RssAnon grew by {:.1} MiB, more than the KV cache's {:.1} MiB",
        grew / MIB,
        predicted / MIB
    );
    assert!(
        fell >= 0.8 * predicted,
        "truncating back to 64 tokens released {:.1} MiB of {:.1} MiB",
        fell / MIB,
        predicted / MIB
    );
}
