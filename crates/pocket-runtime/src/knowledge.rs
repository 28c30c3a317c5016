//! What is known about a model on this device — its verification cost curves, its layer-skip
//! set and how well it keeps its answers with a quantized KV cache — remembered on disk so
//! that it is learned once, not at every start.
//!
//! The cache is one JSON file per model file under [`cache_dir`], named by the model's
//! fingerprint ([`pocket_core::CacheKey`]). Cost curves are kept per device, kernels, threads,
//! KV type and weight format (a measurement holds only for what it was taken with); skip sets
//! per weight format. A cache that cannot be read or written is only a warning: the work is
//! then redone next time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use pocket_core::cost::{CostModel, CostPoint};
use pocket_core::spec::SkipSet;
use pocket_core::{CacheKey, KvType};
use serde::{Deserialize, Serialize};

/// Where what is learned is kept: [`pocket_core::cache_dir`].
pub fn cache_dir() -> Option<PathBuf> {
    pocket_core::cache_dir()
}

/// What one cache file holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct CacheData {
    /// Skip sets for layer-skip drafting, by weight format.
    #[serde(default)]
    skip_sets: BTreeMap<String, SkipSet>,
    /// Cost curves by device, kernels, threads, KV type and weight format.
    #[serde(default)]
    cost_curves: BTreeMap<String, Vec<CostPoint>>,
    /// Top-1 agreement with an f16 cache, by device, weight format and KV type.
    #[serde(default)]
    kv_agreement: BTreeMap<String, f64>,
}

/// Top-1 agreement with an f16 cache that a KV type must keep for the memory ladder to use it
/// unasked: below it, a user would see the answers change within a sentence or two. Measured
/// on the built-in prose, Qwen2.5-Coder-0.5B keeps 0.93 with q8_0 keys and q4_0 values but
/// 0.36 at q4_0; SmolLM2-135M 0.96 and 0.86.
pub const GOOD_KV_AGREEMENT: f64 = 0.9;

/// What is known for one session's settings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Known {
    /// The verification cost curve measured for these threads and KV type.
    pub curve: Option<Vec<CostPoint>>,
    /// The layer-skip set found for this weight format.
    pub skip_set: Option<SkipSet>,
}

impl Known {
    /// The cost model of the measured curve, if there is one.
    pub fn cost(&self) -> Option<CostModel> {
        self.curve.as_deref().map(CostModel::from_curve)
    }
}

/// What is remembered about one model as loaded (its file, device, kernels and weight format),
/// shared by its requests and by what learns about it.
pub struct Knowledge {
    key: Option<CacheKey>,
    path: Option<PathBuf>,
    data: Mutex<CacheData>,
}

fn read_data(path: &Path) -> CacheData {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            tracing::warn!("ignoring the unreadable speculation cache {}: {e}", path.display());
            CacheData::default()
        }),
        Err(_) => CacheData::default(),
    }
}

impl Knowledge {
    /// The knowledge of the model known by `key`, read from [`cache_dir`]; empty (and never
    /// saved) without a key.
    pub fn open(key: Option<&CacheKey>) -> Self {
        Self::open_in(key, cache_dir().as_deref())
    }

    /// As [`Knowledge::open`], with the cache in `dir` (`None`: nothing is kept on disk).
    pub fn open_in(key: Option<&CacheKey>, dir: Option<&Path>) -> Self {
        let path = key.zip(dir).map(|(k, dir)| dir.join(format!("{}.json", k.fingerprint)));
        let data = path.as_deref().map(read_data).unwrap_or_default();
        Knowledge { key: key.cloned(), path, data: Mutex::new(data) }
    }

    /// The knowledge of the same model file with its weights held in `weights` (another
    /// format is another model to measure), kept in the same cache file.
    pub fn for_weights(&self, weights: &str) -> Knowledge {
        let key = self.key.clone().map(|k| CacheKey { weights: weights.to_owned(), ..k });
        Knowledge { key, path: self.path.clone(), data: Mutex::new(self.lock().clone()) }
    }

    /// The key it is kept under.
    pub fn key(&self) -> Option<&CacheKey> {
        self.key.as_ref()
    }

    fn lock(&self) -> MutexGuard<'_, CacheData> {
        // Plain inserts and reads: a panic elsewhere cannot leave the map half-changed.
        self.data.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn curve_key(&self, threads: usize, kv: KvType) -> Option<String> {
        self.key.as_ref().map(|k| format!("{}/{}/t{threads}/{kv}/{}", k.device, k.kernels, k.weights))
    }

    /// What is known for sessions with `threads` threads and a `kv` cache.
    pub fn known(&self, threads: usize, kv: KvType) -> Known {
        Known { curve: self.cost_curve(threads, kv), skip_set: self.skip_set() }
    }

    /// The cost curve measured for `threads` and `kv`, if any.
    pub fn cost_curve(&self, threads: usize, kv: KvType) -> Option<Vec<CostPoint>> {
        let key = self.curve_key(threads, kv)?;
        self.lock().cost_curves.get(&key).cloned()
    }

    /// Remember a cost curve measured for `threads` and `kv`.
    pub fn remember_cost_curve(&self, threads: usize, kv: KvType, curve: Vec<CostPoint>) {
        let Some(key) = self.curve_key(threads, kv) else { return };
        self.lock().cost_curves.insert(key, curve);
        self.save();
    }

    fn agreement_key(&self, kv: KvType) -> Option<String> {
        self.key.as_ref().map(|k| format!("{}/{}/{kv}", k.device, k.weights))
    }

    /// The top-1 agreement with an f16 cache measured for `kv`, if any.
    pub fn kv_agreement(&self, kv: KvType) -> Option<f64> {
        let key = self.agreement_key(kv)?;
        self.lock().kv_agreement.get(&key).copied()
    }

    /// Remember the top-1 agreement with an f16 cache measured for `kv`.
    pub fn remember_kv_agreement(&self, kv: KvType, agreement: f64) {
        let Some(key) = self.agreement_key(kv) else { return };
        self.lock().kv_agreement.insert(key, agreement);
        self.save();
    }

    /// The lowest KV type the memory ladder may give a session of this model unasked: a type
    /// whose measured agreement is below [`GOOD_KV_AGREEMENT`] is not used, and until one is
    /// measured, keys stay at 8 bits (4-bit keys are what loses agreement; 4-bit values lose
    /// little on the models measured).
    pub fn lowest_kv(&self) -> KvType {
        let good = |kv| self.kv_agreement(kv).map(|a| a >= GOOD_KV_AGREEMENT);
        match (good(KvType::Q4_0), good(KvType::Q8_0_Q4_0)) {
            (Some(true), _) => KvType::Q4_0,
            (_, Some(false)) => KvType::Q8_0,
            _ => KvType::Q8_0_Q4_0,
        }
    }

    /// The skip set found for this weight format, if any.
    pub fn skip_set(&self) -> Option<SkipSet> {
        let weights = &self.key.as_ref()?.weights;
        self.lock().skip_sets.get(weights).cloned()
    }

    /// Remember a skip set found for this weight format.
    pub fn remember_skip_set(&self, set: SkipSet) {
        let Some(weights) = self.key.as_ref().map(|k| k.weights.clone()) else { return };
        self.lock().skip_sets.insert(weights, set);
        self.save();
    }

    /// Write this knowledge's entries into its file, over what the file holds now: another
    /// process, or the same model in another weight format, may have saved since it was read,
    /// and those entries must survive.
    fn save(&self) {
        let Some(path) = &self.path else { return };
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let mut merged = read_data(path);
            let data = self.lock().clone();
            merged.skip_sets.extend(data.skip_sets);
            merged.cost_curves.extend(data.cost_curves);
            merged.kv_agreement.extend(data.kv_agreement);
            let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
            std::fs::write(&tmp, serde_json::to_vec_pretty(&merged)?)?;
            std::fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            tracing::warn!("cannot write the speculation cache {}: {e}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(weights: &str) -> CacheKey {
        CacheKey {
            fingerprint: "f00d".into(),
            device: "CPU".into(),
            kernels: "ggml".into(),
            weights: weights.into(),
        }
    }

    fn curve(relative: f64) -> Vec<CostPoint> {
        vec![CostPoint { n: 1, seconds: 0.01, relative: 1.0 }, CostPoint { n: 8, seconds: 0.03, relative }]
    }

    #[test]
    fn curves_are_kept_per_threads_kv_and_weights_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let stored = Knowledge::open_in(Some(&key("stored")), Some(dir.path()));
        assert_eq!(stored.known(2, KvType::F16), Known::default());
        stored.remember_cost_curve(2, KvType::F16, curve(3.0));
        let wide = stored.for_weights("q8_0");
        wide.remember_cost_curve(2, KvType::F16, curve(2.0));
        wide.remember_skip_set(SkipSet { n_layers: 4, skip: vec![1], agreement: 0.9 });

        let again = Knowledge::open_in(Some(&key("stored")), Some(dir.path()));
        assert_eq!(again.cost_curve(2, KvType::F16), Some(curve(3.0)));
        assert_eq!(again.cost_curve(1, KvType::F16), None);
        assert_eq!(again.cost_curve(2, KvType::Q8_0), None);
        assert_eq!(again.skip_set(), None, "the skip set was found for q8_0 weights");
        let wide = again.for_weights("q8_0");
        assert_eq!(wide.cost_curve(2, KvType::F16), Some(curve(2.0)));
        assert_eq!(wide.skip_set().map(|s| s.skip), Some(vec![1]));
        assert!(wide.known(2, KvType::F16).cost().is_some());
    }

    #[test]
    fn the_ladder_keeps_eight_bit_keys_until_four_bit_keys_are_measured_to_keep_the_answers() {
        let dir = tempfile::tempdir().unwrap();
        let k = Knowledge::open_in(Some(&key("stored")), Some(dir.path()));
        assert_eq!(k.lowest_kv(), KvType::Q8_0_Q4_0, "unmeasured");
        k.remember_kv_agreement(KvType::Q4_0, 0.56);
        assert_eq!(k.lowest_kv(), KvType::Q8_0_Q4_0);
        k.remember_kv_agreement(KvType::Q8_0_Q4_0, 0.7);
        assert_eq!(k.lowest_kv(), KvType::Q8_0);
        let other = k.for_weights("q8_0");
        assert_eq!(other.kv_agreement(KvType::Q4_0), None, "measured per weight format");
        other.remember_kv_agreement(KvType::Q4_0, 0.95);
        assert_eq!(other.lowest_kv(), KvType::Q4_0);
        let again = Knowledge::open_in(Some(&key("stored")), Some(dir.path()));
        assert_eq!(again.kv_agreement(KvType::Q4_0), Some(0.56));
        assert_eq!(again.for_weights("q8_0").lowest_kv(), KvType::Q4_0);
    }

    #[test]
    fn without_a_key_or_a_directory_nothing_is_kept_and_a_bad_file_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let none = Knowledge::open_in(None, Some(dir.path()));
        none.remember_cost_curve(2, KvType::F16, curve(3.0));
        assert_eq!(none.cost_curve(2, KvType::F16), None);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        std::fs::write(dir.path().join("f00d.json"), "{not json").unwrap();
        let k = Knowledge::open_in(Some(&key("stored")), Some(dir.path()));
        assert_eq!(k.known(2, KvType::F16), Known::default());
        k.remember_cost_curve(2, KvType::F16, curve(3.0));
        let again = Knowledge::open_in(Some(&key("stored")), Some(dir.path()));
        assert_eq!(again.cost_curve(2, KvType::F16), Some(curve(3.0)));
    }
}
