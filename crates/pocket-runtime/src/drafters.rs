//! The drafter a speculation mode asks for, built from what the model offers
//! ([`Model::drafters`]) and what is known about it on this device ([`Known`]).
//!
//! `auto` uses only what is known to pay: without a measured cost curve it is plain decoding
//! with no drafter at all, it drafts with layer skipping only with a skip set found earlier
//! (and only where that set's measured agreement pays on the curve), and it never searches
//! inside a request. A mode asked for by name runs even before anything is measured: its
//! drafts are sized with [`unmeasured_cost`], and `layerskip` without a known set searches
//! one on the fly (SWIFT), which is then remembered.

use pocket_core::cost::CostModel;
use pocket_core::memory::Ledger;
use pocket_core::spec::{
    AutoConfig, AutoDrafter, DraftModelDrafter, Drafter, DrafterReport, InputCopyDrafter, LayerSkipConfig,
    LayerSkipDrafter, SkipSet, SpecMode, SuffixDrafter,
};
use pocket_core::spec::{History, Recall};
use pocket_core::{Model, SessionConfig, Token};
use std::sync::Arc;

use crate::{Error, Known, Result};

/// The slope of the cost model drafts are sized with on a device whose curve is not measured
/// yet: a pass of 8 tokens for 2.75 plain steps, as this project's CPU verifies SmolLM2 with
/// our Q4_1 kernel. Only modes asked for by name use it; `auto` waits for the measurement.
pub const UNMEASURED_SLOPE: f64 = 0.25;

/// The cost model for drafters asked for by name before the device is measured.
pub fn unmeasured_cost() -> CostModel {
    CostModel::linear(UNMEASURED_SLOPE)
}

/// Everything a drafter may be built from.
pub struct Setup<'a> {
    /// The target model.
    pub model: &'a dyn Model,
    /// The draft model, for `draft` (required) and `auto` (optional).
    pub draft_model: Option<&'a dyn Model>,
    /// The target's session settings (a draft model's session copies them).
    pub config: &'a SessionConfig,
    /// What is known about the target on this device.
    pub known: &'a Known,
    /// An encoder-decoder model's source text, which its drafters match and copy.
    pub source: Option<&'a [Token]>,
    /// Longest draft.
    pub max_draft: usize,
    /// Seed of an on-the-fly skip-set search.
    pub seed: u64,
    /// The ledger a draft model's session pays for its memory in.
    pub ledger: &'a Ledger,
    /// Earlier answers of the model (to requests with the same hint), and what drafting from
    /// them learned, for `suffix` and `auto`.
    pub history: Option<(Arc<History>, Recall)>,
}

/// A drafter, keeping its concrete type for what is learned from it afterwards.
pub enum Built {
    /// `suffix`.
    Suffix(Box<SuffixDrafter>),
    /// `inputcopy`.
    InputCopy(InputCopyDrafter),
    /// `layerskip`.
    LayerSkip(Box<LayerSkipDrafter>),
    /// `draft`.
    Draft(DraftModelDrafter),
    /// `auto`.
    Auto(Box<AutoDrafter>),
}

impl Built {
    /// The drafter, for the generation loop.
    pub fn as_drafter(&mut self) -> &mut dyn Drafter {
        match self {
            Built::Suffix(d) => d.as_mut(),
            Built::InputCopy(d) => d,
            Built::LayerSkip(d) => d.as_mut(),
            Built::Draft(d) => d,
            Built::Auto(d) => d.as_mut(),
        }
    }

    /// What drafting from earlier answers learned in this request (`suffix` and `auto`).
    pub fn learned(&self) -> Option<Recall> {
        match self {
            Built::Suffix(d) => Some(d.learned()),
            Built::Auto(d) => Some(d.learned()),
            _ => None,
        }
    }

    /// Drafts taken from earlier answers, and the tokens they held.
    pub fn recalled(&self) -> (usize, usize) {
        match self {
            Built::Suffix(d) => d.recalled(),
            Built::Auto(d) => d.recalled(),
            _ => (0, 0),
        }
    }

    /// A skip set a `layerskip` drafter found by searching during the request (not one it was
    /// given), to be remembered.
    pub fn found_skip_set(&self) -> Option<SkipSet> {
        match self {
            Built::LayerSkip(d) if !d.searching() => d.skip_set(),
            _ => None,
        }
    }
}

/// The drafter for `mode`; `None` for plain decoding (`off`, and `auto` where nothing is
/// measured yet).
///
/// Errors: a mode the model does not offer, `draft` without a draft model, or a draft model
/// whose vocabulary differs from the target's.
pub fn build(mode: SpecMode, setup: &Setup<'_>) -> Result<Option<Built>> {
    let info = setup.model.info();
    if !setup.model.drafters().contains(&mode) {
        return Err(Error::invalid("spec", not_offered(mode, setup.model)));
    }
    let cost = || setup.known.cost().unwrap_or_else(unmeasured_cost);
    let max_draft = setup.max_draft.max(1);
    // `suffix` and `auto` also draft from the model's earlier answers, where it has some.
    let remembering = |auto: AutoDrafter| match &setup.history {
        Some((history, learned)) => auto.with_history(history.clone(), learned),
        None => auto,
    };
    let draft_model = |max_draft: usize| {
        setup
            .draft_model
            .map(|d| DraftModelDrafter::new_in(setup.model, d, setup.config, max_draft, setup.ledger))
            .transpose()
            .map_err(|e| match e {
                pocket_core::Error::InvalidArgument { param, message } => {
                    Error::Invalid { param: param.or(Some("draft_model")), message }
                }
                other => other.into(),
            })
    };
    Ok(Some(match mode {
        SpecMode::Off => return Ok(None),
        SpecMode::Suffix => {
            let d = match setup.source {
                Some(source) => SuffixDrafter::with_source(source, max_draft, cost()),
                None => SuffixDrafter::with_cost(max_draft, cost()),
            };
            Built::Suffix(Box::new(match &setup.history {
                Some((history, learned)) => d.with_history(history.clone(), learned),
                None => d,
            }))
        }
        SpecMode::InputCopy => {
            let source =
                setup.source.ok_or_else(|| Error::invalid("spec", not_offered(mode, setup.model)))?;
            Built::InputCopy(InputCopyDrafter::new(source, max_draft, cost()))
        }
        SpecMode::LayerSkip => {
            let mut config = LayerSkipConfig { max_draft, ..LayerSkipConfig::default() };
            config.search.seed = setup.seed;
            let known = setup.known.skip_set.as_ref();
            Built::LayerSkip(Box::new(LayerSkipDrafter::new(info.n_layers, config, known, cost())?))
        }
        SpecMode::Draft => match draft_model(max_draft)? {
            Some(d) => Built::Draft(d),
            None => return Err(Error::invalid("draft_model", "spec = draft needs a draft model")),
        },
        SpecMode::Auto => {
            // Auto uses only what was measured on this device.
            let Some(cost) = setup.known.cost() else { return Ok(None) };
            let config = AutoConfig { max_draft, ..AutoConfig::new(cost.clone()) };
            if let Some(source) = setup.source {
                return Ok(Some(Built::Auto(Box::new(remembering(AutoDrafter::for_seq2seq(
                    config, source,
                ))))));
            }
            let layerskip = match &setup.known.skip_set {
                Some(set) if setup.model.drafters().contains(&SpecMode::LayerSkip) => {
                    let ls = LayerSkipConfig { max_draft, ..LayerSkipConfig::default() };
                    Some(LayerSkipDrafter::new(info.n_layers, ls, Some(set), cost)?)
                }
                _ => None,
            };
            let mut config = config;
            if let Some(d) = setup.draft_model {
                config.draft_model_cost = d.info().weights_bytes as f64 / info.weights_bytes.max(1) as f64;
            }
            let draft = draft_model(config.max_draft)?;
            Built::Auto(Box::new(remembering(AutoDrafter::new(config, layerskip, draft))))
        }
    }))
}

/// What a finished request's drafter did: `None` for plain decoding asked for (`off`).
pub fn report(mode: SpecMode, built: Option<&mut Built>) -> Option<DrafterReport> {
    match (mode, built) {
        (_, Some(b)) => Some(b.as_drafter().report()),
        (SpecMode::Auto, None) => Some(DrafterReport::AutoUnmeasured),
        _ => None,
    }
}

/// Why models on `engine` cannot speculate with `mode`, and what they can do instead (said
/// before a model is opened).
pub fn not_offered_by(mode: SpecMode, engine: crate::Engine) -> String {
    if mode == SpecMode::InputCopy && engine.kind() == pocket_core::ModelKind::Decoder {
        return inputcopy_on_a_decoder();
    }
    let offered: Vec<&str> = engine.drafters().iter().map(|m| m.name()).collect();
    let models = match engine {
        crate::Engine::Ggml => "decoder (GGUF) models",
        crate::Engine::LlamaCpp => "models on llama.cpp's graph (GGUF files ours does not build)",
        crate::Engine::Tract => "encoder-decoder (ONNX) models",
        crate::Engine::Embedding => "embedding models (they generate nothing)",
    };
    format!("spec = {mode} is not available for {models}; they offer {}", offered.join(", "))
}

fn inputcopy_on_a_decoder() -> String {
    "spec = inputcopy drafts from an encoder-decoder model's source text; for decoder-only models use suffix, \
     which also matches the prompt"
        .to_owned()
}

/// Why `model` cannot speculate with `mode`, and what it can do instead.
pub fn not_offered(mode: SpecMode, model: &dyn Model) -> String {
    let info = model.info();
    if mode == SpecMode::InputCopy && info.kind == pocket_core::ModelKind::Decoder {
        return inputcopy_on_a_decoder();
    }
    let offered: Vec<&str> = model.drafters().iter().map(|m| m.name()).collect();
    let kind = match info.kind {
        pocket_core::ModelKind::Decoder => "a decoder",
        pocket_core::ModelKind::EncoderDecoder => "an encoder-decoder",
        pocket_core::ModelKind::Embedding => "an embedding",
    };
    format!(
        "spec = {mode} is not available for {}, {kind} model; it offers {}",
        info.name,
        offered.join(", ")
    )
}
