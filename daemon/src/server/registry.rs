//! The models the daemon can serve and the ones it holds in memory.
//!
//! A model is served under its manifest's name (when its files are pulled into the models
//! directory) or, for a bare GGUF or ONNX file dropped into that directory, under its file
//! name (its stem works too). Clients can name nothing else: never a path.
//!
//! Models load on the first request that names them, into the daemon's one budget, and stay
//! while they are used. An idle model is unloaded after `keep_alive_seconds`, or earlier when
//! the budget needs its memory: least recently used first.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use std::collections::HashMap;

use pocket_core::Model;
use pocket_core::cost::CostModel;
use pocket_core::memory::Ledger;
use pocket_core::spec::SpecMode;
use pocket_core::{SessionConfig, Token};
use pocket_ggml::{GgmlModel, LoadOptions, WeightFormat};
use pocket_models::{Catalog, Format};
use pocket_tract::TractModel;

use super::error::ServeError;
use crate::spec::SpecCache;

/// The context a cost curve is measured in (what `pocket run` uses by default).
const MEASURING_CTX: usize = 4096;

/// A model the daemon could serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Available {
    /// The name clients use.
    pub name: String,
    /// What to open.
    pub path: PathBuf,
    /// GGUF (ggml) or ONNX (tract).
    pub format: Format,
    /// Seconds since the epoch when its file was last modified (OpenAI's `created`).
    pub created: u64,
}

/// A loaded model, on the engine that runs it.
pub enum Engine {
    /// A decoder-only GGUF model on ggml.
    Ggml(GgmlModel),
    /// An encoder-decoder ONNX model on tract.
    Tract(TractModel),
}

/// A model in memory.
pub struct LoadedModel {
    /// The name it is served under.
    pub name: String,
    /// The engine's model.
    pub engine: Engine,
    /// Its own part of the budget: the weights (and what was measured with it).
    pub ledger: Ledger,
    /// Its speculation cache (cost curves, layer-skip sets), shared by its sessions (ggml
    /// models only: they are known by their file).
    spec: Mutex<Option<SpecCache>>,
    /// Cost curves of an encoder-decoder model, by KV type and threads, measured once per
    /// load (they take about a second).
    seq2seq_costs: Mutex<HashMap<(pocket_core::KvType, usize), CostModel>>,
}

impl LoadedModel {
    /// The device's cost model for drafting with `config`: cached on disk per model,
    /// device, threads and KV type, measured once (about a second for a small model) when
    /// missing. Plain decoding needs none.
    pub fn cost_model(
        &self,
        mode: SpecMode,
        config: &SessionConfig,
        filler: &[Token],
        ledger: &Ledger,
    ) -> anyhow::Result<CostModel> {
        if mode == SpecMode::Off {
            return Ok(CostModel::linear(1.0));
        }
        let model = match &self.engine {
            Engine::Ggml(m) => m,
            Engine::Tract(m) => {
                let key = (config.kv, config.threads);
                if let Some(cost) = lock(&self.seq2seq_costs).get(&key) {
                    return Ok(cost.clone());
                }
                let cost = crate::seq2seq::measure_cost(m, config, filler, ledger)?;
                lock(&self.seq2seq_costs).insert(key, cost.clone());
                return Ok(cost);
            }
        };
        // Measured over a context longer than a small plan may give the session, as
        // `pocket run` measures it (the curve is cached per model, threads and KV type, not
        // per context).
        let n_ctx = model.info().n_ctx_train.clamp(config.n_ctx, MEASURING_CTX.max(config.n_ctx));
        let measuring = SessionConfig { max_rows: pocket_core::DEFAULT_MAX_ROWS, n_ctx, ..config.clone() };
        let mut cache = lock(&self.spec);
        let cache = cache.get_or_insert_with(|| SpecCache::open(model.path(), model.weight_format()));
        let curve = cache.cost_curve(model, &measuring, filler, ledger)?;
        Ok(CostModel::from_curve(&curve))
    }

    /// The model, whichever engine runs it.
    pub fn model(&self) -> &dyn Model {
        match &self.engine {
            Engine::Ggml(m) => m,
            Engine::Tract(m) => m,
        }
    }

    /// The model if ggml runs it.
    pub fn ggml(&self) -> Option<&GgmlModel> {
        match &self.engine {
            Engine::Ggml(m) => Some(m),
            Engine::Tract(_) => None,
        }
    }

    /// The layer-skip set found earlier, if any.
    pub fn skip_set(&self) -> Option<pocket_core::spec::SkipSet> {
        lock(&self.spec).as_ref().and_then(|c| c.skip_set().cloned())
    }

    /// Remember a skip set a request's drafter found.
    pub fn set_skip_set(&self, set: pocket_core::spec::SkipSet) {
        let mut cache = lock(&self.spec);
        let Some(cache) = cache.as_mut() else { return };
        if cache.skip_set() != Some(&set) {
            tracing::info!(model = %self.name, skip = ?set.skip, "found a layer-skip set");
            cache.set_skip_set(set);
        }
    }

    /// Bytes its weights hold in the budget.
    pub fn bytes(&self) -> u64 {
        self.ledger.used()
    }
}

struct Slot {
    model: Arc<LoadedModel>,
    last_used: Instant,
}

/// Models available and loaded.
pub struct Registry {
    models_dir: PathBuf,
    ledger: Ledger,
    keep_alive: Duration,
    loaded: Mutex<Vec<Slot>>,
    /// One load at a time: two requests for the same model wait for one load, and loads
    /// never race each other for the budget.
    loading: tokio::sync::Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks cannot leave them inconsistent (plain inserts and
    // removals), so a poisoned lock is used as it is.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn mtime_seconds(path: &Path) -> u64 {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs())
}

fn format_of(path: &Path) -> Format {
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("onnx")) || path.is_dir() {
        Format::Onnx
    } else {
        Format::Gguf
    }
}

impl Registry {
    /// A registry over `models_dir`, loading into `ledger`.
    pub fn new(models_dir: PathBuf, ledger: Ledger, keep_alive: Duration) -> Registry {
        Registry {
            models_dir,
            ledger,
            keep_alive,
            loaded: Mutex::new(Vec::new()),
            loading: tokio::sync::Mutex::new(()),
        }
    }

    /// The models directory.
    pub fn models_dir(&self) -> &Path {
        &self.models_dir
    }

    fn catalog(&self) -> Result<Catalog, ServeError> {
        Catalog::load(&self.models_dir).map_err(|e| ServeError::Internal(e.to_string()))
    }

    /// Every model that could be served now: pulled manifests, then loose files, by name.
    pub fn available(&self) -> Result<Vec<Available>, ServeError> {
        self.available_in(&self.catalog()?)
    }

    fn available_in(&self, catalog: &Catalog) -> Result<Vec<Available>, ServeError> {
        let mut out = Vec::new();
        let mut claimed = Vec::new();
        for m in catalog.manifests() {
            if m.is_pulled(&self.models_dir) {
                let path = m.path(&self.models_dir);
                claimed.extend(m.files.iter().map(|f| f.path(&self.models_dir)));
                out.push(Available {
                    name: m.name.clone(),
                    created: mtime_seconds(&path),
                    format: m.format,
                    path,
                });
            }
        }
        let loose =
            pocket_models::loose_files(&self.models_dir).map_err(|e| ServeError::Internal(e.to_string()))?;
        for path in loose.into_iter().filter(|p| !claimed.contains(p)) {
            let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else { continue };
            out.push(Available { name, created: mtime_seconds(&path), format: format_of(&path), path });
        }
        Ok(out)
    }

    /// The model served as `name`: a pulled manifest's name, or a loose file's name or stem.
    pub fn find(&self, name: &str) -> Result<Available, ServeError> {
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(ServeError::invalid(
                "model",
                format!("{name:?} is not a model name: use a name from /v1/models (paths are not accepted)"),
            ));
        }
        let catalog = self.catalog()?;
        let available = self.available_in(&catalog)?;
        if let Some(a) = available.iter().find(|a| a.name == name) {
            return Ok(a.clone());
        }
        if let Some(a) = available.iter().find(|a| a.path.file_stem().is_some_and(|s| s == name)) {
            return Ok(a.clone());
        }
        if catalog.get(name).is_some() {
            return Err(ServeError::UnknownModel(format!(
                "model {name:?} is known but not in {}; fetch it with `pocket pull {name} --models-dir {}`",
                self.models_dir.display(),
                self.models_dir.display()
            )));
        }
        let names: Vec<&str> = available.iter().map(|a| a.name.as_str()).collect();
        Err(ServeError::UnknownModel(format!(
            "unknown model {name:?}; available: {}",
            if names.is_empty() {
                "none (the models directory is empty)".to_owned()
            } else {
                names.join(", ")
            }
        )))
    }

    /// The loaded models, most recently used first, with their idle time.
    pub fn loaded(&self) -> Vec<(Arc<LoadedModel>, Duration)> {
        let slots = lock(&self.loaded);
        let mut v: Vec<_> = slots.iter().map(|s| (s.model.clone(), s.last_used.elapsed())).collect();
        v.sort_by_key(|(_, idle)| *idle);
        v
    }

    /// Seconds of idleness after which models are unloaded.
    pub fn keep_alive(&self) -> Duration {
        self.keep_alive
    }

    /// Sessions using `model` now (the registry's own reference not counted).
    pub fn users(model: &Arc<LoadedModel>) -> usize {
        Arc::strong_count(model).saturating_sub(2)
    }

    fn touch(&self, name: &str) -> Option<Arc<LoadedModel>> {
        let mut slots = lock(&self.loaded);
        let slot = slots.iter_mut().find(|s| s.model.name == name)?;
        slot.last_used = Instant::now();
        Some(slot.model.clone())
    }

    /// Mark `name` as just used (a session of it ended).
    pub fn release(&self, name: &str) {
        self.touch(name);
    }

    /// The model served as `name`, loading it if needed; when the budget is full, idle
    /// models are unloaded (least recently used first) to make room.
    pub async fn get(&self, name: &str) -> Result<Arc<LoadedModel>, ServeError> {
        self.load(self.find(name)?).await
    }

    /// [`Registry::get`] for a model already [found](Registry::find).
    pub async fn load(&self, found: Available) -> Result<Arc<LoadedModel>, ServeError> {
        if let Some(m) = self.touch(&found.name) {
            return Ok(m);
        }
        let _one_at_a_time = self.loading.lock().await;
        if let Some(m) = self.touch(&found.name) {
            return Ok(m);
        }
        loop {
            let ledger = self.ledger.sub();
            let (path, l) = (found.path.clone(), ledger.clone());
            let format = found.format;
            let loaded = tokio::task::spawn_blocking(move || -> anyhow::Result<Engine> {
                if format == Format::Onnx {
                    return Ok(Engine::Tract(crate::seq2seq::load(&path, &l)?));
                }
                let options = LoadOptions {
                    ledger: Some(l),
                    weights: WeightFormat::AsStored,
                    ..LoadOptions::default()
                };
                Ok(Engine::Ggml(GgmlModel::load(&path, &options)?))
            })
            .await
            .map_err(|e| ServeError::Internal(format!("loading {} panicked: {e}", found.name)))?;
            match loaded {
                Ok(engine) => {
                    let m = Arc::new(LoadedModel {
                        name: found.name.clone(),
                        engine,
                        ledger,
                        spec: Mutex::new(None),
                        seq2seq_costs: Mutex::new(HashMap::new()),
                    });
                    tracing::info!(
                        model = %found.name,
                        bytes = m.bytes(),
                        used = self.ledger.used(),
                        budget = self.ledger.budget(),
                        "loaded"
                    );
                    lock(&self.loaded).push(Slot { model: m.clone(), last_used: Instant::now() });
                    return Ok(m);
                }
                Err(e) => {
                    let e = ServeError::from_engine(&e.context(format!("loading {}", found.name)));
                    if e.is_over_budget() && self.evict_idle(&[]) {
                        continue;
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Unload the least recently used model that no session uses, other than `keep`.
    /// Returns whether one was unloaded.
    pub fn evict_idle(&self, keep: &[&str]) -> bool {
        let mut slots = lock(&self.loaded);
        let victim = slots
            .iter()
            .enumerate()
            .filter(|(_, s)| Arc::strong_count(&s.model) == 1 && !keep.contains(&s.model.name.as_str()))
            .max_by_key(|(_, s)| s.last_used.elapsed())
            .map(|(i, _)| i);
        let Some(i) = victim else { return false };
        let slot = slots.remove(i);
        drop(slots);
        tracing::info!(model = %slot.model.name, bytes = slot.model.bytes(), "unloaded to make room");
        true
    }

    /// Unload idle models past their keep-alive. Returns the names unloaded.
    pub fn expire(&self) -> Vec<String> {
        let mut slots = lock(&self.loaded);
        let mut gone = Vec::new();
        slots.retain(|s| {
            let expired = Arc::strong_count(&s.model) == 1 && s.last_used.elapsed() >= self.keep_alive;
            if expired {
                gone.push(s.model.name.clone());
            }
            !expired
        });
        drop(slots);
        for name in &gone {
            tracing::info!(model = %name, keep_alive_s = self.keep_alive.as_secs(), "unloaded after its keep-alive");
        }
        gone
    }

    /// Unload `name` now (nothing to do if it is not loaded); returns the name it is served
    /// under. A model that sessions are using cannot be unloaded.
    pub fn unload(&self, name: &str) -> Result<String, ServeError> {
        let found = self.find(name)?;
        let mut slots = lock(&self.loaded);
        let Some(i) = slots.iter().position(|s| s.model.name == found.name) else { return Ok(found.name) };
        let users = Arc::strong_count(&slots[i].model) - 1;
        if users > 0 {
            return Err(ServeError::Busy(format!(
                "{} is generating for {users} request(s); unload it when they finish",
                found.name
            )));
        }
        slots.remove(i);
        tracing::info!(model = %found.name, "unloaded on request");
        Ok(found.name)
    }

    /// Unload everything (at shutdown).
    pub fn clear(&self) {
        lock(&self.loaded).clear();
    }
}

/// Seconds since the epoch now.
pub fn now_seconds() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
