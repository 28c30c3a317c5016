//! The models the daemon can serve and the ones it holds in memory.
//!
//! A model is served under its manifest's name (when its files are pulled into the models
//! directory) or, for a bare GGUF or ONNX file dropped into that directory, under its file
//! name (its stem works too). Clients can name nothing else: never a path.
//!
//! Models load on the first request that names them, into the daemon's one budget, and stay
//! while they are used. An idle model is unloaded after `keep_alive_seconds`, or earlier when
//! the budget needs its memory: least recently used first.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pocket_core::memory::Ledger;
use pocket_models::{Catalog, Format};
use pocket_runtime::learn::{self, TuneSettings};
use pocket_runtime::rpc::{RemoteLayers, SplitOptions};
use pocket_runtime::{DeviceChoice, Histories, LoadedModel, OpenOptions, PromptCache};

use super::engines::Engines;
use super::error::ServeError;

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
    /// The manifest it was pulled by (`None`: a file dropped into the directory), whose
    /// sha256 the files are checked against before they are loaded.
    pub manifest: Option<pocket_models::Manifest>,
}

/// A model in memory, open on its engine through the pipeline's [`LoadedModel`] (which also
/// holds what is known about it on this device).
pub struct ServedModel {
    /// The name it is served under.
    pub name: String,
    /// The model.
    pub model: LoadedModel,
    /// Its own part of the budget: the weights.
    pub ledger: Ledger,
}

impl ServedModel {
    /// Bytes its weights hold in the budget.
    pub fn bytes(&self) -> u64 {
        self.ledger.used()
    }
}

struct Slot {
    model: Arc<ServedModel>,
    last_used: Instant,
}

/// Models available and loaded.
pub struct Registry {
    models_dir: PathBuf,
    ledger: Ledger,
    /// The device models are opened on.
    device: DeviceChoice,
    /// RPC peers for the last layers of models too large for the budget (`rpc`).
    rpc: Vec<String>,
    prompt_cache: Option<Arc<PromptCache>>,
    /// Earlier answers, which later requests draft from.
    histories: Option<Arc<Histories>>,
    keep_alive: Duration,
    /// Other names for models (the configuration's `model_aliases`).
    aliases: BTreeMap<String, String>,
    loaded: Mutex<Vec<Slot>>,
    /// The engine of each model file, read once while the file is unchanged.
    engines: Engines,
    /// One load at a time: two requests for the same model wait for one load, and loads
    /// never race each other for the budget.
    loading: tokio::sync::Mutex<()>,
    /// Woken when a model is loaded (what is learned about a model starts then).
    pub loaded_notify: tokio::sync::Notify,
    /// Marked when what D-Bus shows as properties may have changed: models loaded or
    /// unloaded, sessions started or ended, memory reserved or given back.
    pub changes: tokio::sync::watch::Sender<()>,
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
    /// A registry over `models_dir`, loading into `ledger`, its models parking finished
    /// sessions in `prompt_cache`.
    pub fn new(
        models_dir: PathBuf,
        ledger: Ledger,
        device: DeviceChoice,
        keep_alive: Duration,
        prompt_cache: Option<Arc<PromptCache>>,
    ) -> Registry {
        Registry {
            models_dir,
            ledger,
            device,
            rpc: Vec::new(),
            prompt_cache,
            histories: None,
            keep_alive,
            aliases: BTreeMap::new(),
            loaded: Mutex::new(Vec::new()),
            engines: Engines::default(),
            loading: tokio::sync::Mutex::new(()),
            loaded_notify: tokio::sync::Notify::new(),
            changes: tokio::sync::watch::Sender::new(()),
        }
    }

    /// This registry with RPC peers for models too large for its budget.
    pub fn with_rpc(mut self, peers: Vec<String>) -> Registry {
        self.rpc = peers;
        self
    }

    /// This registry with its models keeping their answers in `histories` for later requests
    /// to draft from.
    pub fn with_histories(mut self, histories: Arc<Histories>) -> Registry {
        self.histories = Some(histories);
        self
    }

    /// The answer histories, one per model and key, for `/v1/status`.
    pub fn histories_status(&self) -> Vec<pocket_api::AnswerHistory> {
        let Some(histories) = &self.histories else { return Vec::new() };
        let model_name = self.model_names();
        histories
            .list()
            .into_iter()
            .map(|h| pocket_api::AnswerHistory {
                model: model_name(&h.model),
                key: h.hint,
                answers: h.answers,
                tokens: h.tokens,
                bytes: h.bytes,
            })
            .collect()
    }

    /// This registry with other names for models (alias → a model's name).
    pub fn with_aliases(mut self, aliases: BTreeMap<String, String>) -> Registry {
        self.aliases = aliases;
        self
    }

    /// The aliases whose model is available, each as that model under the alias's name.
    pub fn aliases(&self) -> Result<Vec<Available>, ServeError> {
        Ok(self
            .aliases
            .keys()
            .filter_map(|alias| Some(Available { name: alias.clone(), ..self.find(alias).ok()? }))
            .collect())
    }

    /// Tell those watching [`Registry::changes`].
    pub fn changed(&self) {
        self.changes.send_replace(());
    }

    /// A model was dropped: give its freed heap back to the system, and tell the watchers.
    fn unloaded(&self) {
        pocket_runtime::process::release_free_heap();
        self.changed();
    }

    /// The engine that runs the model at `path`, decided once while its file is unchanged.
    pub fn engine(&self, path: &Path) -> pocket_runtime::Engine {
        self.engines.of(path)
    }

    /// The models directory.
    pub fn models_dir(&self) -> &Path {
        &self.models_dir
    }

    fn catalog(&self) -> Result<Catalog, ServeError> {
        Catalog::load(&self.models_dir).map_err(|e| ServeError::internal(None, e))
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
                    manifest: Some(m.clone()),
                });
            }
        }
        let loose =
            pocket_models::loose_files(&self.models_dir).map_err(|e| ServeError::internal(None, e))?;
        for path in loose.into_iter().filter(|p| !claimed.contains(p)) {
            let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else { continue };
            out.push(Available {
                name,
                created: mtime_seconds(&path),
                format: format_of(&path),
                path,
                manifest: None,
            });
        }
        Ok(out)
    }

    /// The model served as `name`: an alias's model, a pulled manifest's name, or a loose
    /// file's name or stem.
    pub fn find(&self, name: &str) -> Result<Available, ServeError> {
        let name = self.aliases.get(name).map_or(name, String::as_str);
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
    pub fn loaded(&self) -> Vec<(Arc<ServedModel>, Duration)> {
        let slots = lock(&self.loaded);
        let mut v: Vec<_> = slots.iter().map(|s| (s.model.clone(), s.last_used.elapsed())).collect();
        v.sort_by_key(|(_, idle)| *idle);
        v
    }

    /// The loaded models as `/v1/status` shows them; `tuned` says whether what speculation
    /// needs is known for `settings`.
    pub fn loaded_status(&self, settings: &TuneSettings) -> Vec<pocket_api::LoadedModel> {
        let keep_alive = Some(self.keep_alive.as_secs_f64());
        self.loaded()
            .into_iter()
            .map(|(m, idle)| pocket_api::LoadedModel {
                name: m.name.clone(),
                engine: Some(m.model.engine().name().to_owned()),
                bytes: m.bytes(),
                sessions: Registry::users(&m),
                idle_seconds: idle.as_secs_f64(),
                keep_alive_seconds: keep_alive,
                tuned: Some(!learn::needs_tuning(&m.model, settings)),
                cost_curve: m.model.knowledge().cost_curve(settings.threads, settings.kv).unwrap_or_default(),
                shared_passes: m.model.model().shared_passes(),
                device: Some(m.model.device().to_string()),
                exact_passes: m.model.model().info().exact_passes.clone(),
                placement: m.model.model().info().placement.clone(),
            })
            .collect()
    }

    /// The name of the loaded model whose fingerprint starts with the digits given (what the
    /// prompt cache and the answer histories list), else those digits.
    fn model_names(&self) -> impl Fn(&str) -> String {
        let loaded = self.loaded();
        move |fingerprint: &str| {
            loaded
                .iter()
                .find(|(m, _)| {
                    m.model.model().cache_key().is_some_and(|k| k.fingerprint.starts_with(fingerprint))
                })
                .map_or_else(|| fingerprint.to_owned(), |(m, _)| m.name.clone())
        }
    }

    /// The conversations `cache` holds, as `/v1/status` shows them: each under its loaded
    /// model's name (else the fingerprint it was parked under).
    pub fn parked_status(&self, cache: &PromptCache) -> Vec<pocket_api::ParkedPrefix> {
        let model_name = self.model_names();
        cache
            .parked()
            .into_iter()
            .map(|p| pocket_api::ParkedPrefix {
                model: model_name(&p.model),
                tokens: p.tokens,
                bytes: p.bytes,
                kv: p.kv.name().to_owned(),
                key: p.hint,
                idle_seconds: p.idle_seconds,
            })
            .collect()
    }

    /// Seconds of idleness after which models are unloaded.
    pub fn keep_alive(&self) -> Duration {
        self.keep_alive
    }

    /// Sessions using `model` now (the registry's own reference not counted).
    pub fn users(model: &Arc<ServedModel>) -> usize {
        Arc::strong_count(model).saturating_sub(2)
    }

    fn touch(&self, name: &str) -> Option<Arc<ServedModel>> {
        let mut slots = lock(&self.loaded);
        let i = slots.iter().position(|s| s.model.name == name)?;
        // A model whose peer was lost cannot compute again: it is unloaded here (requests still
        // holding it fail at their next pass), and loaded anew, peer and all, by the caller.
        if let Some(why) = slots[i].model.model.model().unavailable() {
            let slot = slots.remove(i);
            drop((slots, slot));
            tracing::warn!(model = %name, "unloaded: {why}");
            self.unloaded();
            return None;
        }
        let slot = &mut slots[i];
        slot.last_used = Instant::now();
        Some(slot.model.clone())
    }

    /// Mark `name` as just used (a session of it ended).
    pub fn release(&self, name: &str) {
        self.touch(name);
    }

    /// The model served as `name`, loading it if needed; when the budget is full, idle
    /// models are unloaded (least recently used first) to make room.
    pub async fn get(&self, name: &str) -> Result<Arc<ServedModel>, ServeError> {
        self.load(self.find(name)?).await
    }

    /// [`Registry::get`] for a model already [found](Registry::find).
    pub async fn load(&self, found: Available) -> Result<Arc<ServedModel>, ServeError> {
        if let Some(m) = self.touch(&found.name) {
            return Ok(m);
        }
        let _one_at_a_time = self.loading.lock().await;
        if let Some(m) = self.touch(&found.name) {
            return Ok(m);
        }
        if let Some(manifest) = found.manifest.clone() {
            // A file damaged or replaced since `pocket pull` is refused, not loaded.
            let dir = self.models_dir.clone();
            tokio::task::spawn_blocking(move || pocket_models::verify_pulled(&manifest, &dir))
                .await
                .map_err(|e| ServeError::internal(None, format!("verifying {} panicked: {e}", found.name)))?
                .map_err(|e| {
                    // The full error goes to the log; the client is not told where models are kept.
                    tracing::warn!("cannot serve {}: {e}", found.name);
                    let text = e.to_string().replace(&format!("{}/", self.models_dir.display()), "");
                    ServeError::invalid("model", format!("cannot serve {}: {text}", found.name))
                })?;
        }
        // Layers on peers, once the model alone proved too large for the budget.
        let mut split: Option<SplitOptions> = None;
        loop {
            let ledger = self.ledger.sub();
            let (path, l, cache) = (found.path.clone(), ledger.clone(), self.prompt_cache.clone());
            let histories = self.histories.clone();
            let (device, split_now) = (self.device.clone(), split.clone());
            let loaded = tokio::task::spawn_blocking(move || {
                let options = OpenOptions {
                    device,
                    ledger: Some(l),
                    prompt_cache: cache,
                    histories,
                    split: split_now,
                    ..OpenOptions::default()
                };
                LoadedModel::open(&path, &options)
            })
            .await
            .map_err(|e| ServeError::internal(None, format!("loading {} panicked: {e}", found.name)))?;
            match loaded {
                Ok(model) => {
                    let m = Arc::new(ServedModel { name: found.name.clone(), model, ledger });
                    tracing::info!(
                        model = %found.name,
                        bytes = m.bytes(),
                        used = self.ledger.used(),
                        budget = self.ledger.budget(),
                        "loaded"
                    );
                    lock(&self.loaded).push(Slot { model: m.clone(), last_used: Instant::now() });
                    self.loaded_notify.notify_waiters();
                    self.changed();
                    return Ok(m);
                }
                Err(e) => {
                    let e = ServeError::from_model(&found.name, e);
                    if e.is_over_budget() && (self.evict_parked() || self.evict_idle(&[])) {
                        continue;
                    }
                    if e.is_over_budget() && split.is_none() && !self.rpc.is_empty() {
                        // A quarter of what is left stays for the sessions' KV cache and
                        // compute buffers of the layers kept here.
                        let available = self.ledger.available();
                        let local_bytes = available - available / 4;
                        tracing::info!(
                            model = %found.name,
                            local_bytes,
                            peers = %self.rpc.join(" "),
                            "too large for the budget alone: placing its last layers on the RPC peers"
                        );
                        split = Some(SplitOptions {
                            peers: self.rpc.clone(),
                            layers: RemoteLayers::Fit { local_bytes },
                        });
                        continue;
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Give up what goes first when memory is needed: earlier answers kept for drafting (half
    /// of the least recently used history), then the least recently used parked
    /// conversation. Returns whether anything was.
    pub fn evict_parked(&self) -> bool {
        let evicted = self.histories.as_ref().is_some_and(|h| h.shrink())
            || self.prompt_cache.as_ref().is_some_and(|c| c.evict_lru(None));
        if evicted {
            self.changed();
        }
        evicted
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
        drop(slot);
        self.unloaded();
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
        if !gone.is_empty() {
            self.unloaded();
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
        let slot = slots.remove(i);
        drop((slots, slot));
        tracing::info!(model = %found.name, "unloaded on request");
        self.unloaded();
        Ok(found.name)
    }

    /// Unload everything (at shutdown).
    pub fn clear(&self) {
        let slots = std::mem::take(&mut *lock(&self.loaded));
        drop(slots);
        self.unloaded();
    }
}

/// Seconds since the epoch now.
pub fn now_seconds() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
