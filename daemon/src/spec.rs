//! Setting up speculative decoding for a model: the device's cost curve and the layer-skip
//! set, both cached per model file, and the drafter a mode asks for.
//!
//! The cache is one JSON file per model under `$POCKET_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/pocketd`, else `~/.cache/pocketd`. A model file is known by a hash of
//! its size and its first and last MiB (hashing all of a large file at every start would
//! cost more than the search it saves). A cache that cannot be read or written is only a
//! warning: the work is then redone next time.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::Context;
use pocket_core::cost::{CostCurveConfig, CostModel, CostPoint, measure_cost_curve};
use pocket_core::memory::Ledger;
use pocket_core::spec::{
    AutoConfig, AutoDrafter, DraftModelDrafter, Drafter, LayerSkipConfig, LayerSkipDrafter, SkipSet,
    SpecMode, SuffixDrafter,
};
use pocket_core::{Model, SessionConfig, Token};
use pocket_ggml::{GgmlModel, WeightFormat};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Longest draft for the fixed drafters (auto chooses its own length up to
/// [`pocket_core::spec::MAX_DRAFT`]).
pub const DEFAULT_MAX_DRAFT: usize = 8;

/// What is remembered about one model file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct CacheData {
    /// The skip sets found for layer-skip drafting, by weight format.
    #[serde(default)]
    skip_sets: BTreeMap<String, SkipSet>,
    /// Cost curves by device, kernels, threads, KV type and weight format.
    #[serde(default)]
    cost_curves: BTreeMap<String, Vec<CostPoint>>,
}

/// The speculation cache of one model file, as loaded in one weight format (converted
/// weights are a slightly different model with another cost curve).
pub struct SpecCache {
    path: Option<PathBuf>,
    weights: WeightFormat,
    data: CacheData,
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("POCKET_CACHE_DIR") {
        return Some(d.into());
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("pocketd"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/pocketd"))
}

/// The cache file at `path`; empty if it is missing or unreadable.
fn read_data(path: &Path) -> CacheData {
    std::fs::read(path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
}

/// sha256 over the size, the first MiB and the last MiB of `path`.
fn fingerprint(path: &Path) -> std::io::Result<String> {
    const MIB: u64 = 1 << 20;
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    let mut h = Sha256::new();
    h.update(len.to_le_bytes());
    let mut buf = Vec::with_capacity(MIB as usize);
    f.by_ref().take(MIB).read_to_end(&mut buf)?;
    h.update(&buf);
    buf.clear();
    f.seek(SeekFrom::Start(len.saturating_sub(MIB)))?;
    f.take(MIB).read_to_end(&mut buf)?;
    h.update(&buf);
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

impl SpecCache {
    /// The cache of the model at `model_path` loaded with `weights` (empty if there is none
    /// yet).
    pub fn open(model_path: &Path, weights: WeightFormat) -> Self {
        let path = cache_dir().and_then(|dir| match fingerprint(model_path) {
            Ok(fp) => Some(dir.join(format!("{fp}.json"))),
            Err(e) => {
                tracing::warn!("cannot fingerprint {} for the cache: {e}", model_path.display());
                None
            }
        });
        let data = path.as_deref().map(read_data).unwrap_or_default();
        SpecCache { path, weights, data }
    }

    /// The skip set found earlier, if any.
    pub fn skip_set(&self) -> Option<&SkipSet> {
        self.data.skip_sets.get(self.weights.name())
    }

    /// Remember `set` and save.
    pub fn set_skip_set(&mut self, set: SkipSet) {
        self.data.skip_sets.insert(self.weights.name().to_owned(), set);
        self.save();
    }

    /// Write this cache's entries into the file, over what it holds now: another `SpecCache`
    /// of the same model (another weight format, another process) may have saved since this
    /// one was opened, and its entries must survive.
    fn save(&self) {
        let Some(path) = &self.path else { return };
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let mut merged = read_data(path);
            merged.skip_sets.extend(self.data.skip_sets.iter().map(|(k, v)| (k.clone(), v.clone())));
            merged.cost_curves.extend(self.data.cost_curves.iter().map(|(k, v)| (k.clone(), v.clone())));
            let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
            std::fs::write(&tmp, serde_json::to_vec_pretty(&merged)?)?;
            std::fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            tracing::warn!("cannot write the speculation cache {}: {e}", path.display());
        }
    }

    fn curve_key(&self, model: &GgmlModel, config: &SessionConfig) -> String {
        format!(
            "{}/{}/t{}/{}/{}",
            model.device_name(),
            model.kernels(),
            config.threads,
            config.kv,
            self.weights
        )
    }

    /// The cached cost curve for `model`'s device with `config`, if any.
    pub fn cached_cost_curve(&self, model: &GgmlModel, config: &SessionConfig) -> Option<Vec<CostPoint>> {
        self.data.cost_curves.get(&self.curve_key(model, config)).cloned()
    }

    /// The cost curve of `model` with `config`: cached, or measured now (about a second for
    /// a small model) from `filler` tokens and cached.
    pub fn cost_curve(
        &mut self,
        model: &GgmlModel,
        config: &SessionConfig,
        filler: &[Token],
        ledger: &Ledger,
    ) -> anyhow::Result<Vec<CostPoint>> {
        match self.cached_cost_curve(model, config) {
            Some(c) => Ok(c),
            None => self.measure_cost_curve(model, config, filler, ledger),
        }
    }

    /// Measure the cost curve of `model` with `config` now (its session paying in `ledger`)
    /// and cache it.
    pub fn measure_cost_curve(
        &mut self,
        model: &GgmlModel,
        config: &SessionConfig,
        filler: &[Token],
        ledger: &Ledger,
    ) -> anyhow::Result<Vec<CostPoint>> {
        let mut session = model.new_session_in(config, ledger)?;
        let cc = CostCurveConfig { repetitions: 7, warmup: 2, ..CostCurveConfig::default() };
        let curve = measure_cost_curve(&mut session, model.info().n_layers, filler, &cc)
            .context("measuring the verification cost curve")?;
        self.data.cost_curves.insert(self.curve_key(model, config), curve.clone());
        self.save();
        Ok(curve)
    }
}

/// A drafter built for a mode, keeping its concrete type for what is saved afterwards.
pub enum BuiltDrafter {
    /// `suffix`.
    Suffix(SuffixDrafter),
    /// `layerskip`.
    LayerSkip(Box<LayerSkipDrafter>),
    /// `draft`.
    Draft(DraftModelDrafter),
    /// `auto`.
    Auto(Box<AutoDrafter>),
}

impl BuiltDrafter {
    /// The drafter, for the generation loop.
    pub fn as_drafter(&mut self) -> &mut dyn Drafter {
        match self {
            BuiltDrafter::Suffix(d) => d,
            BuiltDrafter::LayerSkip(d) => d.as_mut(),
            BuiltDrafter::Draft(d) => d,
            BuiltDrafter::Auto(d) => d.as_mut(),
        }
    }

    /// A skip set the drafter found by searching (not one it was given).
    pub fn found_skip_set(&self) -> Option<SkipSet> {
        let ls = match self {
            BuiltDrafter::LayerSkip(d) => d.as_ref(),
            BuiltDrafter::Auto(a) => a.layerskip()?,
            _ => return None,
        };
        if ls.searching() { None } else { ls.skip_set() }
    }
}

/// Everything a drafter may need.
pub struct SpecSetup<'a> {
    /// The target model.
    pub model: &'a GgmlModel,
    /// The target's session configuration (the draft model's session copies it).
    pub session: &'a SessionConfig,
    /// The device's cost model for the target.
    pub cost: CostModel,
    /// A skip set found earlier for the target.
    pub skip_set: Option<SkipSet>,
    /// The draft model, for `draft` (required) and `auto` (optional).
    pub draft_model: Option<&'a GgmlModel>,
    /// Seed of the skip-set search.
    pub seed: u64,
    /// Longest draft.
    pub max_draft: usize,
    /// The ledger the draft model's session pays for its memory in.
    pub ledger: Ledger,
}

impl SpecSetup<'_> {
    fn layerskip(&self) -> anyhow::Result<LayerSkipDrafter> {
        let mut config = LayerSkipConfig { max_draft: self.max_draft, ..LayerSkipConfig::default() };
        config.search.seed = self.seed;
        Ok(LayerSkipDrafter::new(
            self.model.info().n_layers,
            config,
            self.skip_set.as_ref(),
            self.cost.clone(),
        )?)
    }

    fn draft_model(&self, max_draft: usize) -> anyhow::Result<Option<DraftModelDrafter>> {
        self.draft_model
            .map(|d| DraftModelDrafter::new_in(self.model, d, self.session, max_draft, &self.ledger))
            .transpose()
            .map_err(Into::into)
    }

    /// The drafter for `mode`; `None` for [`SpecMode::Off`].
    pub fn build(&self, mode: SpecMode) -> anyhow::Result<Option<BuiltDrafter>> {
        Ok(Some(match mode {
            SpecMode::Off => return Ok(None),
            SpecMode::Suffix => {
                BuiltDrafter::Suffix(SuffixDrafter::with_cost(self.max_draft, self.cost.clone()))
            }
            SpecMode::InputCopy => anyhow::bail!(
                "--spec inputcopy drafts from an encoder-decoder model's source text; for \
                 decoder-only models use suffix, which also matches the prompt"
            ),
            SpecMode::LayerSkip => BuiltDrafter::LayerSkip(Box::new(self.layerskip()?)),
            SpecMode::Draft => {
                let d = self
                    .draft_model(self.max_draft)?
                    .context("--spec draft needs a draft model (--draft-model NAME)")?;
                BuiltDrafter::Draft(d)
            }
            SpecMode::Auto => {
                let mut config = AutoConfig::new(self.cost.clone());
                config.max_draft = self.max_draft;
                if let Some(d) = self.draft_model {
                    config.draft_model_cost =
                        d.info().weights_bytes as f64 / self.model.info().weights_bytes.max(1) as f64;
                }
                let layerskip = Some(self.layerskip()?);
                let draft = self.draft_model(config.max_draft)?;
                BuiltDrafter::Auto(Box::new(AutoDrafter::new(config, layerskip, draft)))
            }
        }))
    }
}

/// Plan a session of `tokens` tokens asking for `config`'s KV type, pass size and `spec` under
/// what `ledger` has free (see [`pocket_core::memory::plan`]). The draft model is already loaded and paid
/// for, so only its session counts; the plan may still drop it.
pub fn plan_session(
    model: &dyn Model,
    draft_model: Option<&GgmlModel>,
    config: &SessionConfig,
    ledger: &Ledger,
    tokens: usize,
    spec: SpecMode,
) -> anyhow::Result<pocket_core::memory::Plan> {
    let request = pocket_core::memory::PlanRequest {
        tokens,
        kv: config.kv,
        spec,
        max_draft: DEFAULT_MAX_DRAFT,
        n_batch: config.n_batch,
    };
    let mut costs = pocket_core::memory::ModelCosts {
        target: model,
        draft: draft_model.map(|d| d as &dyn pocket_core::Model),
        config: config.clone(),
    };
    Ok(pocket_core::memory::plan(ledger, &request, &mut costs)?)
}

/// Search a skip set for `model` now, generating greedily from `prompt` (repeatedly, up to a
/// bound) until the search ends; what `pocket bench` does before its runs when no set is
/// cached, so that every `layerskip` run drafts with the same set.
pub fn search_skip_set(
    model: &GgmlModel,
    config: &SessionConfig,
    cost: CostModel,
    prompt: &[Token],
    seed: u64,
) -> anyhow::Result<SkipSet> {
    use pocket_core::{GenerateRequest, SamplingConfig, Session, StopConfig, generate_speculative};
    let mut ls_config = LayerSkipConfig::default();
    ls_config.search.seed = seed;
    let window = ls_config.search.window;
    anyhow::ensure!(
        prompt.len() > window,
        "the skip-set search scores over {window} tokens; the prompt has only {}",
        prompt.len()
    );
    let mut drafter = LayerSkipDrafter::new(model.info().n_layers, ls_config, None, cost)?;
    let mut session = model.new_session(config)?;
    let request = GenerateRequest {
        prompt: prompt.to_vec(),
        sampling: SamplingConfig::default(),
        stop: StopConfig {
            max_tokens: 128.min(config.n_ctx.saturating_sub(prompt.len() + 1)),
            stop: Vec::new(),
        },
    };
    for _ in 0..8 {
        session.truncate(0)?;
        generate_speculative(
            model.info(),
            &mut session,
            model.tokenizer(),
            &request,
            Some(&mut drafter),
            &mut |_| std::ops::ControlFlow::Continue(()),
        )?;
        if !drafter.searching() {
            break;
        }
    }
    drafter.skip_set().context("the skip-set search scored no candidate")
}

/// Acceptance assumed when comparing weight formats: drafts are only made where a drafter
/// expects them to be accepted, and this is about what the suffix drafter's accepted drafts
/// reach on the sample workload (85–95%), rounded down.
pub const WEIGHTS_REFERENCE_ACCEPTANCE: f64 = 0.8;

/// How a weight format would serve speculation on this device, from its cost curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WeightsEstimate {
    /// The format.
    #[serde(serialize_with = "format_name")]
    pub weights: WeightFormat,
    /// Seconds of a plain decode step.
    pub step_seconds: f64,
    /// Tokens per second while drafting at [`WEIGHTS_REFERENCE_ACCEPTANCE`] with the best
    /// draft length of its curve.
    pub drafting_tok_per_s: f64,
}

fn format_name<S: serde::Serializer>(w: &WeightFormat, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(w.name())
}

impl WeightsEstimate {
    /// The estimate from a measured curve (`None` if it has no `n = 1` point).
    pub fn from_curve(weights: WeightFormat, curve: &[CostPoint]) -> Option<Self> {
        let step_seconds = curve.iter().find(|p| p.n == 1).map(|p| p.seconds).filter(|s| *s > 0.0)?;
        let cost = CostModel::from_curve(curve);
        let (_, speedup) = cost.best_k(WEIGHTS_REFERENCE_ACCEPTANCE, 0.0, pocket_core::spec::MAX_DRAFT);
        Some(WeightsEstimate { weights, step_seconds, drafting_tok_per_s: speedup / step_seconds })
    }
}

/// The weight format speculation should run on: the one whose measured curve serves drafted
/// steps fastest, as long as that beats the stored format by more than its slower plain
/// steps lose.
///
/// Widened weights make plain steps slower where decoding is bound by memory bandwidth (on
/// this project's CPU, SmolLM2 took 7.3 ms in Q8_0 against 7.1 in Q4_1, and the 1.5B 50 ms
/// against 37) but verification passes cheaper (8 tokens of SmolLM2 for 3.0 steps against
/// 4.1); where no drafts are made the stored format is faster, so it must win by the
/// plain-step ratio to be chosen.
pub fn choose_weights(estimates: &[WeightsEstimate]) -> WeightFormat {
    let stored = estimates.iter().find(|e| e.weights == WeightFormat::AsStored);
    let Some(stored) = stored else { return WeightFormat::AsStored };
    estimates
        .iter()
        .filter(|e| e.weights != WeightFormat::AsStored)
        .filter(|e| {
            let plain_loss = e.step_seconds / stored.step_seconds;
            e.drafting_tok_per_s > stored.drafting_tok_per_s * plain_loss.max(1.0)
        })
        .max_by(|a, b| a.drafting_tok_per_s.total_cmp(&b.drafting_tok_per_s))
        .map_or(WeightFormat::AsStored, |e| e.weights)
}

/// For `--weights auto`: given the model loaded as stored, measure (or read from the cache)
/// the cost curves of the stored and the Q8_0-widened weights and return the model in the
/// format [`choose_weights`] picks, with both estimates. Plain decoding, and devices other
/// than the CPU (whose curves are flat and whose memory is scarcer), keep the stored format.
/// `on_measure` is called before curves are measured (seconds for a small model, a minute for
/// a 1.5B one on two cores), for a progress message.
pub fn resolve_auto_weights(
    stored: GgmlModel,
    spec: SpecMode,
    config: &SessionConfig,
    filler: &[Token],
    load: &dyn Fn(WeightFormat) -> anyhow::Result<GgmlModel>,
    on_measure: &mut dyn FnMut(),
) -> anyhow::Result<(GgmlModel, Vec<WeightsEstimate>)> {
    if spec == SpecMode::Off || stored.device_name() != "CPU" {
        return Ok((stored, Vec::new()));
    }
    let mut stored_cache = SpecCache::open(stored.path(), WeightFormat::AsStored);
    let mut wide_cache = SpecCache::open(stored.path(), WeightFormat::Q8_0);
    // The two curves' step times are compared, so they are measured together (a curve
    // cached on its own may come from a busier moment of the machine).
    let mut wide = None;
    let (curve, wide_curve) = match (
        stored_cache.cached_cost_curve(&stored, config),
        wide_cache.cached_cost_curve(&stored, config),
    ) {
        (Some(a), Some(b)) => (a, b),
        _ => {
            tracing::info!("measuring the cost curves of the stored and Q8_0-widened weights (once)");
            on_measure();
            let unlimited = Ledger::unlimited();
            let a = stored_cache.measure_cost_curve(&stored, config, filler, &unlimited)?;
            let m = load(WeightFormat::Q8_0)?;
            let b = wide_cache.measure_cost_curve(&m, config, filler, &unlimited)?;
            wide = Some(m);
            (a, b)
        }
    };
    let estimates: Vec<WeightsEstimate> = [(WeightFormat::AsStored, curve), (WeightFormat::Q8_0, wide_curve)]
        .iter()
        .filter_map(|(w, c)| WeightsEstimate::from_curve(*w, c))
        .collect();
    let chosen = choose_weights(&estimates);
    tracing::info!(?estimates, %chosen, "chose the weight format for speculation");
    let model = match (chosen, wide) {
        (WeightFormat::AsStored, _) => stored,
        (_, Some(m)) => {
            drop(stored);
            m
        }
        (w, None) => {
            drop(stored);
            load(w)?
        }
    };
    Ok((model, estimates))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn estimate(weights: WeightFormat, step_ms: f64, relative: &[(usize, f64)]) -> WeightsEstimate {
        let curve: Vec<CostPoint> = relative
            .iter()
            .map(|&(n, r)| CostPoint { n, seconds: step_ms * 1e-3 * r, relative: r })
            .collect();
        WeightsEstimate::from_curve(weights, &curve).unwrap()
    }

    #[test]
    fn widened_weights_are_chosen_only_when_their_flatter_curve_outweighs_slower_steps() {
        // This project's CPU: Q4_1 steep, Q8_0 flat from 4 to 8 rows, steps 8% slower.
        let stored = estimate(WeightFormat::AsStored, 6.5, &[(1, 1.0), (2, 2.1), (4, 2.9), (8, 4.4)]);
        let wide = estimate(WeightFormat::Q8_0, 7.1, &[(1, 1.0), (2, 2.6), (4, 3.1), (8, 3.3)]);
        assert_eq!(choose_weights(&[stored, wide]), WeightFormat::Q8_0);
        // A GPU: both flat, the stored format's steps faster.
        let stored = estimate(WeightFormat::AsStored, 2.0, &[(1, 1.0), (8, 1.1)]);
        let wide = estimate(WeightFormat::Q8_0, 2.4, &[(1, 1.0), (8, 1.05)]);
        assert_eq!(choose_weights(&[stored, wide]), WeightFormat::AsStored);
        // Nothing to compare with: stored.
        assert_eq!(choose_weights(&[wide]), WeightFormat::AsStored);
        assert_eq!(choose_weights(&[]), WeightFormat::AsStored);
    }
}
