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
    /// Cost curves by device, threads, KV type and weight format.
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
        let data = path
            .as_deref()
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
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

    fn save(&self) {
        let Some(path) = &self.path else { return };
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, serde_json::to_vec_pretty(&self.data)?)?;
            std::fs::rename(&tmp, path)
        };
        if let Err(e) = write() {
            tracing::warn!("cannot write the speculation cache {}: {e}", path.display());
        }
    }

    /// The cost curve of `model` with `config`: cached, or measured now (about a second for
    /// a small model) from `filler` tokens and cached.
    pub fn cost_curve(
        &mut self,
        model: &GgmlModel,
        config: &SessionConfig,
        filler: &[Token],
    ) -> anyhow::Result<Vec<CostPoint>> {
        let key = format!("{}/t{}/{}/{}", model.device_name(), config.threads, config.kv, self.weights);
        if let Some(c) = self.data.cost_curves.get(&key) {
            return Ok(c.clone());
        }
        let mut session = model.new_session(config)?;
        let cc = CostCurveConfig { repetitions: 5, warmup: 1, ..CostCurveConfig::default() };
        let curve = measure_cost_curve(&mut session, model.info().n_layers, filler, &cc)
            .context("measuring the verification cost curve")?;
        self.data.cost_curves.insert(key, curve.clone());
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
}

impl SpecSetup<'_> {
    fn layerskip(&self) -> anyhow::Result<LayerSkipDrafter> {
        let mut config = LayerSkipConfig { max_draft: DEFAULT_MAX_DRAFT, ..LayerSkipConfig::default() };
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
            .map(|d| DraftModelDrafter::new(self.model, d, self.session, max_draft))
            .transpose()
            .map_err(Into::into)
    }

    /// The drafter for `mode`; `None` for [`SpecMode::Off`].
    pub fn build(&self, mode: SpecMode) -> anyhow::Result<Option<BuiltDrafter>> {
        Ok(Some(match mode {
            SpecMode::Off => return Ok(None),
            SpecMode::Suffix => {
                BuiltDrafter::Suffix(SuffixDrafter::with_cost(DEFAULT_MAX_DRAFT, self.cost.clone()))
            }
            SpecMode::LayerSkip => BuiltDrafter::LayerSkip(Box::new(self.layerskip()?)),
            SpecMode::Draft => {
                let d = self
                    .draft_model(DEFAULT_MAX_DRAFT)?
                    .context("--spec draft needs a draft model (--draft-model NAME)")?;
                BuiltDrafter::Draft(d)
            }
            SpecMode::Auto => {
                let mut config = AutoConfig::new(self.cost.clone());
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
