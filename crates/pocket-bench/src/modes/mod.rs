//! Benchmark modes: each one a small [`Runner`] that generates greedily from a prompt and
//! reports its timing the same way, so the only thing that differs between modes is the
//! engine, the drafter or the path a request takes.
//!
//! Adding a mode is a [`Mode`] variant, a runner type in its own module, and one arm in
//! [`open`].

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use pocket_core::memory::Ledger;
use pocket_core::spec::SpecMode;
use pocket_core::{SessionConfig, Token};
use pocket_runtime::LoadedModel;
use pocket_runtime::WeightFormat;

use super::Error;
use super::workload::PromptInput;

mod llama_cpp;
mod pipeline;
pub(crate) mod socket;

pub use llama_cpp::LlamaCppRunner;
pub use pipeline::PipelineRunner;
pub use socket::{DaemonCheck, SocketRunner};

/// How a prompt is run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// llama.cpp itself (llama.h) on the same file, with a greedy loop: the baseline.
    LlamaCpp,
    /// Our engine without speculation.
    Vanilla,
    /// Suffix-automaton drafting.
    Suffix,
    /// Layer-skip self-drafting.
    LayerSkip,
    /// A draft model, by name (`draft:qwen2.5-coder-0.5b`).
    Draft(String),
    /// The drafter and length chosen per step.
    Auto,
    /// Copying from an encoder-decoder model's source text.
    InputCopy,
}

impl Mode {
    /// The modes that can be run, by name.
    pub const KNOWN: [&'static str; 9] = [
        "llama.cpp",
        "vanilla",
        "suffix",
        "layerskip",
        "draft:MODEL",
        "auto",
        "inputcopy",
        "naive:MODE",
        "socket:MODE",
    ];

    /// The name used on the command line and in results.
    pub fn name(&self) -> String {
        match self {
            Mode::LlamaCpp => "llama.cpp".into(),
            Mode::Vanilla => "vanilla".into(),
            Mode::Suffix => "suffix".into(),
            Mode::LayerSkip => "layerskip".into(),
            Mode::Draft(model) => format!("draft:{model}"),
            Mode::Auto => "auto".into(),
            Mode::InputCopy => "inputcopy".into(),
        }
    }

    /// The speculation mode our engine runs in (`None` for llama.cpp).
    pub fn spec(&self) -> Option<SpecMode> {
        match self {
            Mode::LlamaCpp => None,
            Mode::Vanilla => Some(SpecMode::Off),
            Mode::Suffix => Some(SpecMode::Suffix),
            Mode::LayerSkip => Some(SpecMode::LayerSkip),
            Mode::Draft(_) => Some(SpecMode::Draft),
            Mode::Auto => Some(SpecMode::Auto),
            Mode::InputCopy => Some(SpecMode::InputCopy),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl FromStr for Mode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "llama.cpp" => Ok(Mode::LlamaCpp),
            "vanilla" => Ok(Mode::Vanilla),
            "suffix" => Ok(Mode::Suffix),
            "layerskip" => Ok(Mode::LayerSkip),
            "auto" => Ok(Mode::Auto),
            "inputcopy" => Ok(Mode::InputCopy),
            _ => match s.strip_prefix("draft:") {
                Some(model) if !model.is_empty() => Ok(Mode::Draft(model.to_owned())),
                _ => Err(Error::UnknownMode(s.to_owned())),
            },
        }
    }
}

/// A mode and where and how it runs: `suffix`, or `suffix@q8_0` for the model's matrices
/// widened to Q8_0 at load ([`pocket_runtime::WeightFormat`]), so both can be compared in one run;
/// `naive:` before our engine's mode holds every KV cache (the draft model's too) for the whole
/// context from the start, as a plain two-model setup does, and is not held to a memory
/// budget; `socket:` before it sends the prompt to a running pocketd instead of generating in
/// this process.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunMode {
    /// The mode.
    pub mode: Mode,
    /// The weight format of the target model (draft models stay as stored).
    pub weights: WeightFormat,
    /// Whether the KV caches are allocated for the whole context up front.
    pub naive: bool,
    /// Whether it runs through a running pocketd (HTTP on its socket).
    pub socket: bool,
}

/// The prefix of a naive mode's name.
pub const NAIVE_PREFIX: &str = "naive:";

/// The prefix of a mode that runs through pocketd.
pub const SOCKET_PREFIX: &str = "socket:";

impl RunMode {
    /// The name used on the command line and in results.
    pub fn name(&self) -> String {
        let prefix = match (self.naive, self.socket) {
            (true, _) => NAIVE_PREFIX,
            (_, true) => SOCKET_PREFIX,
            _ => "",
        };
        match self.weights {
            WeightFormat::AsStored => format!("{prefix}{}", self.mode.name()),
            w => format!("{prefix}{}@{w}", self.mode.name()),
        }
    }

    /// The name of plain decoding in this process on the same weights: what this mode's
    /// output must equal.
    pub fn vanilla_name(&self) -> String {
        RunMode { mode: Mode::Vanilla, weights: self.weights, naive: false, socket: false }.name()
    }

    /// The same mode in this process (itself if it is one).
    pub fn in_process(&self) -> RunMode {
        RunMode { socket: false, ..self.clone() }
    }

    /// Parse a comma-separated list of modes (`llama.cpp,vanilla,suffix@q8_0`); unknown or
    /// repeated names are errors.
    pub fn parse_list(list: &str) -> Result<Vec<RunMode>, Error> {
        Self::parse_list_with(list, WeightFormat::AsStored)
    }

    /// As [`RunMode::parse_list`], with our engine's modes that name no weight format on
    /// `weights` (llama.cpp always runs the file as stored).
    pub fn parse_list_with(list: &str, weights: WeightFormat) -> Result<Vec<RunMode>, Error> {
        let mut modes: Vec<RunMode> = Vec::new();
        for name in list.split(',').map(str::trim) {
            let mut mode: RunMode = name.parse()?;
            if !name.contains('@') && mode.mode != Mode::LlamaCpp && !mode.socket {
                mode.weights = weights;
            }
            if modes.contains(&mode) {
                return Err(Error::Invalid(format!("mode {name:?} is listed twice")));
            }
            modes.push(mode);
        }
        Ok(modes)
    }
}

impl From<Mode> for RunMode {
    fn from(mode: Mode) -> Self {
        RunMode { mode, weights: WeightFormat::AsStored, naive: false, socket: false }
    }
}

impl fmt::Display for RunMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl FromStr for RunMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        if let Some(rest) = s.strip_prefix(SOCKET_PREFIX) {
            let mode: RunMode = rest.parse()?;
            if mode.naive
                || mode.socket
                || mode.mode == Mode::LlamaCpp
                || mode.weights != WeightFormat::AsStored
            {
                return Err(Error::Invalid(format!(
                    "mode {s:?}: `socket:` goes before one of our engine's modes on the weights as stored \
                     (socket:auto, socket:draft:MODEL): pocketd serves models as stored"
                )));
            }
            return Ok(RunMode { socket: true, ..mode });
        }
        if let Some(rest) = s.strip_prefix(NAIVE_PREFIX) {
            let mode: RunMode = rest.parse()?;
            if mode.naive || mode.socket || mode.mode == Mode::LlamaCpp {
                return Err(Error::Invalid(format!(
                    "mode {s:?}: `naive:` goes before one of our engine's modes (naive:suffix, \
                     naive:draft:MODEL)"
                )));
            }
            return Ok(RunMode { naive: true, ..mode });
        }
        let Some((mode, weights)) = s.rsplit_once('@') else { return Ok(s.parse::<Mode>()?.into()) };
        let mode: Mode = mode.parse()?;
        let weights: WeightFormat =
            weights.parse().map_err(|e| Error::Invalid(format!("mode {s:?}: {e}")))?;
        if mode == Mode::LlamaCpp && weights != WeightFormat::AsStored {
            return Err(Error::Invalid(format!(
                "mode {s:?}: llama.cpp runs the file as stored; weight formats are for our engine's modes"
            )));
        }
        Ok(RunMode { mode, weights, naive: false, socket: false })
    }
}

/// What one greedy generation produced, timed the same way in every mode (the way
/// [`pocket_core::Generation`] defines it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunOutput {
    /// Generated tokens, the end token not included.
    pub tokens: Vec<Token>,
    /// Seconds from the start of the prompt's decode until the first token was chosen
    /// (through pocketd: from sending the request until its first text arrived).
    pub prefill_seconds: f64,
    /// Seconds from the first token's choice until the last token's: the span in which
    /// `tokens[1..]` were produced.
    pub decode_seconds: f64,
    /// Tokens drafted (0 without speculation).
    pub drafted: u64,
    /// Drafted tokens accepted.
    pub accepted: u64,
    /// Verification steps that had a draft; `accepted / draft_steps` is the mean accepted
    /// length.
    pub draft_steps: u64,
    /// What the drafter did, in a line (`None` without speculation).
    pub drafter: Option<String>,
    /// Bytes the run's generation state held at its peak, as its engine accounts them (see
    /// [`crate::results::RunRecord::generation_memory_bytes`]).
    pub generation_memory_bytes: u64,
    /// What the session was given under the memory budget (`None` without one).
    pub plan: Option<pocket_core::memory::Plan>,
    /// The run's forward passes as our engine counts them (`None` where it does not: llama.cpp,
    /// pocketd over its socket).
    pub passes: Option<pocket_core::PassStats>,
}

/// A prompt as every mode gets it: the input (what a client sends pocketd) and its tokens
/// (rendered once by the pipeline, the same for every mode in this process).
#[derive(Debug, Clone, Copy)]
pub struct PromptRun<'a> {
    /// What the model is given.
    pub input: &'a PromptInput,
    /// Its tokens.
    pub tokens: &'a [Token],
    /// Most tokens to generate.
    pub max_tokens: usize,
}

/// Runs prompts in one mode. Made once per benchmark (models loaded up front); each
/// [`Runner::run`] starts from an empty context and, before returning, frees what it only
/// needed for that prompt (its session), so the next run's memory peak — often another
/// mode's — does not include it.
pub trait Runner {
    /// The mode's name, as results show it.
    fn name(&self) -> &str;

    /// KV cache bytes per token held.
    fn kv_bytes_per_token(&self) -> u64;

    /// Whether [`RunOutput::generation_memory_bytes`] accounts for all the run's memory (our
    /// engine's ledger); if not, the benchmark adds what the process's resident memory grew by
    /// during the run.
    fn accounts_memory(&self) -> bool {
        false
    }

    /// Whether the run happens in another process (pocketd), so that this process's resident
    /// memory says nothing about it.
    fn remote(&self) -> bool {
        false
    }

    /// Generate greedily from `prompt`, at most `prompt.max_tokens` tokens, stopping early at
    /// an end token.
    fn run(&mut self, prompt: &PromptRun<'_>) -> Result<RunOutput, Error>;

    /// [`Runner::run`] for every prompt at once, as that many clients asking together would:
    /// each output's prefill is its time from the common start to its first token.
    fn run_concurrent(&mut self, prompts: &[PromptRun<'_>]) -> Result<Vec<RunOutput>, Error> {
        let _ = prompts;
        Err(Error::Invalid(format!("mode {} does not run requests at once", self.name())))
    }
}

/// What every runner is built from: our engine's model (its tokenizer decides end tokens
/// for every mode) and the session settings, the same for all modes.
#[derive(Clone, Copy)]
pub struct RunnerContext<'a> {
    /// What the models were paid for in: the memory budget, or an unlimited ledger.
    pub ledger: &'a Ledger,
    /// Whether `ledger` is a memory budget that each run is planned under.
    pub budgeted: bool,
    /// Our engine's model, in the mode's weight format.
    pub model: &'a Arc<LoadedModel>,
    /// The model's name (pocketd serves it under this name).
    pub model_name: &'a str,
    /// Context length, batch, threads and KV type.
    pub session: &'a SessionConfig,
    /// Draft models by name, opened before the runs.
    pub draft_models: &'a [(String, Arc<LoadedModel>)],
    /// pocketd's socket, for `socket:` modes.
    pub socket: Option<&'a Path>,
}

/// Make the runner for `mode`; `cx` holds the target model in `mode.weights`.
pub fn open(mode: &RunMode, cx: RunnerContext<'_>) -> Result<Box<dyn Runner>, Error> {
    let spec = mode.mode.spec().unwrap_or_default();
    let draft_name = match &mode.mode {
        Mode::Draft(name) => Some(name.clone()),
        _ => None,
    };
    if mode.socket {
        let socket = cx.socket.ok_or_else(|| {
            Error::Invalid(format!("mode {mode} runs through pocketd: give its socket (--socket PATH)"))
        })?;
        return Ok(Box::new(SocketRunner::new(mode, spec, draft_name, socket, cx)?));
    }
    Ok(match &mode.mode {
        Mode::LlamaCpp => Box::new(LlamaCppRunner::load(cx)?),
        Mode::Draft(name) => {
            let draft = cx.draft_models.iter().find(|(n, _)| n == name).map(|(_, m)| m.clone());
            let draft = draft.ok_or_else(|| Error::Invalid(format!("draft model {name} was not loaded")))?;
            Box::new(PipelineRunner::new(mode, SpecMode::Draft, Some(draft), cx)?)
        }
        _ => Box::new(PipelineRunner::new(mode, spec, None, cx)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_lists_parse_and_unknown_modes_name_the_known_ones() {
        let stored = |m: Mode| RunMode::from(m);
        assert_eq!(
            RunMode::parse_list("llama.cpp, vanilla").unwrap(),
            vec![stored(Mode::LlamaCpp), stored(Mode::Vanilla)]
        );
        let e = RunMode::parse_list("vanilla,turbo").unwrap_err().to_string();
        assert!(e.contains("\"turbo\"") && e.contains("llama.cpp, vanilla, suffix"), "{e}");
        assert_eq!(
            RunMode::parse_list("suffix,draft:qwen2.5-coder-0.5b,auto").unwrap(),
            vec![stored(Mode::Suffix), stored(Mode::Draft("qwen2.5-coder-0.5b".into())), stored(Mode::Auto)]
        );
        assert!(RunMode::parse_list("draft:").is_err());
        let e = RunMode::parse_list("vanilla,vanilla").unwrap_err().to_string();
        assert!(e.contains("twice"), "{e}");
        assert!(RunMode::parse_list("").is_err());
    }

    #[test]
    fn a_mode_may_name_a_weight_format() {
        let list = RunMode::parse_list("vanilla,vanilla@q8_0,suffix@q8_0,draft:qwen@q8_0").unwrap();
        let names: Vec<String> = list.iter().map(RunMode::name).collect();
        assert_eq!(names, ["vanilla", "vanilla@q8_0", "suffix@q8_0", "draft:qwen@q8_0"]);
        assert_eq!(list[2].weights, WeightFormat::Q8_0);
        assert_eq!(list[3].mode, Mode::Draft("qwen".into()));
        assert_eq!(list[2].vanilla_name(), "vanilla@q8_0");
        assert_eq!(RunMode::from(Mode::Suffix).vanilla_name(), "vanilla");
        let e = RunMode::parse_list("suffix@q3").unwrap_err().to_string();
        assert!(e.contains("stored, q8_0"), "{e}");
        assert!(RunMode::parse_list("llama.cpp@q8_0").unwrap_err().to_string().contains("as stored"));
        assert!(RunMode::parse_list("vanilla@stored,vanilla").unwrap_err().to_string().contains("twice"));
        let naive = RunMode::parse_list("naive:draft:qwen,naive:suffix@q8_0").unwrap();
        assert!(naive.iter().all(|m| m.naive));
        assert_eq!(naive[0].mode, Mode::Draft("qwen".into()));
        assert_eq!(
            (naive[1].name(), naive[1].vanilla_name()),
            ("naive:suffix@q8_0".into(), "vanilla@q8_0".into())
        );
        assert!(RunMode::parse_list("naive:llama.cpp").is_err());
        assert!(RunMode::parse_list("naive:naive:suffix").is_err());
        let socket = RunMode::parse_list("socket:vanilla,socket:draft:qwen,vanilla").unwrap();
        assert!(socket[0].socket && socket[1].socket && !socket[2].socket);
        assert_eq!(socket[1].name(), "socket:draft:qwen");
        assert_eq!(socket[0].in_process(), socket[2]);
        for bad in ["socket:llama.cpp", "socket:naive:suffix", "naive:socket:suffix", "socket:suffix@q8_0"] {
            let e = RunMode::parse_list(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
        let defaulted =
            RunMode::parse_list_with("llama.cpp,vanilla,suffix@stored", WeightFormat::Q8_0).unwrap();
        let names: Vec<String> = defaulted.iter().map(RunMode::name).collect();
        assert_eq!(names, ["llama.cpp", "vanilla@q8_0", "suffix"]);
    }
}
