//! The checks every entry point (the daemon's admission, `pocket run`, the benchmark and the
//! pipeline itself) makes of a request's settings before its model is loaded, so that each
//! refuses the same things with the same words and names the same field.

use pocket_core::spec::SpecMode;
use pocket_core::{SamplingConfig, StopConfig};

use crate::drafters::not_offered_by;
use crate::{Engine, Error, Result};

/// The settings of a request that can be checked without its model.
#[derive(Debug, Clone, Copy)]
pub struct Settings<'a> {
    /// The speculation mode asked for.
    pub spec: SpecMode,
    /// Whether a draft model is named.
    pub draft_model: bool,
    /// Sampling.
    pub sampling: &'a SamplingConfig,
    /// Stop strings and the token limit.
    pub stop: &'a StopConfig,
}

/// Refuse `settings` where they are out of range or, given the model's `engine`, where a model
/// on it cannot honour them (without one, only what holds for every model is checked); the
/// error's `param` is the request field at fault.
pub fn validate(settings: &Settings<'_>, engine: Option<Engine>) -> Result<()> {
    if let Some(engine) = engine {
        let offers = |mode: SpecMode| engine.drafters().contains(&mode);
        if !offers(settings.spec) {
            return Err(Error::invalid("spec", not_offered_by(settings.spec, engine)));
        }
        if settings.draft_model && !offers(SpecMode::Draft) {
            return Err(Error::invalid("draft_model", not_offered_by(SpecMode::Draft, engine)));
        }
    }
    if settings.spec == SpecMode::Draft && !settings.draft_model {
        return Err(Error::invalid("draft_model", "spec = draft needs a draft model"));
    }
    settings.sampling.validate()?;
    settings.stop.validate()?;
    if settings.stop.max_tokens == 0 {
        return Err(Error::invalid("max_tokens", "max_tokens must be at least 1"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings<'a>(sampling: &'a SamplingConfig, stop: &'a StopConfig) -> Settings<'a> {
        Settings { spec: SpecMode::Off, draft_model: false, sampling, stop }
    }

    #[test]
    fn each_refusal_names_its_field() {
        let (sampling, stop) = (SamplingConfig::default(), StopConfig::default());
        let ok = settings(&sampling, &stop);
        assert!(validate(&ok, Some(Engine::Ggml)).is_ok());
        let param = |s: Settings<'_>, engine| validate(&s, Some(engine)).unwrap_err().param();
        assert_eq!(param(Settings { spec: SpecMode::LayerSkip, ..ok }, Engine::Tract), Some("spec"));
        assert_eq!(param(Settings { draft_model: true, ..ok }, Engine::Tract), Some("draft_model"));
        // Without the engine, what depends on it is left for later.
        assert!(validate(&Settings { spec: SpecMode::LayerSkip, ..ok }, None).is_ok());
        assert_eq!(param(Settings { spec: SpecMode::Draft, ..ok }, Engine::Ggml), Some("draft_model"));
        let hot = SamplingConfig { min_p: 2.0, ..SamplingConfig::default() };
        assert_eq!(param(Settings { sampling: &hot, ..ok }, Engine::Ggml), Some("min_p"));
        let empty = StopConfig { stop: vec![String::new()], ..StopConfig::default() };
        assert_eq!(param(Settings { stop: &empty, ..ok }, Engine::Ggml), Some("stop"));
        let none = StopConfig { max_tokens: 0, ..StopConfig::default() };
        assert_eq!(param(Settings { stop: &none, ..ok }, Engine::Ggml), Some("max_tokens"));
    }
}
