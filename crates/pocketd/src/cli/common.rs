//! Pieces several subcommands share: finding and opening a model.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pocket_core::memory::{BudgetSpec, Ledger, MemoryLimits};
use pocket_runtime::WeightFormat;
use pocket_runtime::rpc::{RemoteLayers, SplitOptions};
use pocket_runtime::{LoadedModel, OpenOptions};

/// Flags that choose a model.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelArgs {
    /// The model: a manifest name (`pocket pull --list`), a file in the models directory, or
    /// a path to a GGUF file or an ONNX model's directory.
    #[arg(short = 'm', long = "model", default_value = pocket_models::default_model())]
    pub model: String,
    /// Where pulled models live.
    #[arg(long, env = "POCKET_MODELS_DIR")]
    pub models_dir: Option<PathBuf>,
    /// The ggml device: `auto` (a GPU if there is one), `cpu`, or a device name.
    #[arg(long, default_value = "auto")]
    pub device: pocket_runtime::DeviceChoice,
    /// The format weight matrices are held in: `stored` (as the file has them), `q8_0` (4-
    /// to 6-bit matrices widened at load: more memory, cheaper verification of drafts on
    /// CPUs), or `auto` (`q8_0` when speculating on a CPU whose measured cost curves say it
    /// pays, else `stored`).
    #[arg(long, default_value = "auto")]
    pub weights: WeightChoice,
    /// Put the model's last layers on this RPC peer (`host:port`, running `pocket rpc-serve`);
    /// repeat for several. See docs/rpc.md.
    #[arg(long = "rpc", value_name = "HOST:PORT")]
    pub rpc: Vec<String>,
    /// With `--rpc`: how many of the model's last layers go to the peers — a count, or `auto`:
    /// as few as leave this machine's share of the weights within its memory budget (`auto`:
    /// what is available, less a tenth; none if the model fits).
    #[arg(long, default_value = "auto", requires = "rpc")]
    pub rpc_layers: RpcLayers,
}

/// `--rpc-layers`: a count, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RpcLayers {
    /// As few as leave this machine's share within its budget.
    Auto,
    /// The last `n`.
    Last(usize),
}

impl std::str::FromStr for RpcLayers {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(RpcLayers::Auto);
        }
        s.parse().map(RpcLayers::Last).map_err(|_| format!("{s:?} is not a layer count or auto"))
    }
}

/// `--weights`: a format, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightChoice {
    /// Chosen from the device's measured cost curves ([`pocket_runtime::weight_choice::choose_weights`]).
    Auto,
    /// This format.
    Format(WeightFormat),
}

impl std::str::FromStr for WeightChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(WeightChoice::Auto);
        }
        s.parse().map(WeightChoice::Format).map_err(|e| format!("{e}, or auto"))
    }
}

impl WeightChoice {
    /// The format to load first: the chosen one, or the stored one for `auto`.
    pub fn initial(self) -> WeightFormat {
        match self {
            WeightChoice::Auto => WeightFormat::AsStored,
            WeightChoice::Format(w) => w,
        }
    }
}

impl ModelArgs {
    /// The model file these flags name.
    pub fn resolve(&self) -> anyhow::Result<PathBuf> {
        let dir = pocket_models::models_dir(self.models_dir.as_deref());
        Ok(pocket_models::resolve(&self.model, &dir)?.path)
    }

    /// Resolve and open the model with its matrices in `weights`, its weights paid for in
    /// `ledger`, with a progress bar on stderr if loading takes over a second.
    pub fn open(&self, weights: WeightFormat, ledger: &Ledger) -> anyhow::Result<LoadedModel> {
        let path = self.resolve()?;
        let options = OpenOptions {
            device: self.device.clone(),
            weights,
            ledger: Some(ledger.clone()),
            split: self.split(),
            ..OpenOptions::default()
        };
        open_model(&path, &options)
    }

    /// The layers `--rpc` and `--rpc-layers` put on peers, if any.
    pub fn split(&self) -> Option<SplitOptions> {
        if self.rpc.is_empty() {
            return None;
        }
        let layers = match self.rpc_layers {
            RpcLayers::Last(n) => RemoteLayers::Last(n),
            RpcLayers::Auto => {
                RemoteLayers::Fit { local_bytes: BudgetSpec::Auto.resolve(&MemoryLimits::read()) }
            }
        };
        Some(SplitOptions { peers: self.rpc.clone(), layers })
    }
}

/// Open `path`; a progress bar appears on stderr when loading takes longer than a second.
pub fn open_model(path: &Path, options: &OpenOptions) -> anyhow::Result<LoadedModel> {
    let start = Instant::now();
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template("loading {msg} {wide_bar} {bytes}/{total_bytes}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
    let mut shown = false;
    let model = LoadedModel::open_with_progress(path, options, &mut |done, total| {
        if !shown && start.elapsed() > Duration::from_secs(1) {
            bar.set_draw_target(ProgressDrawTarget::stderr());
            shown = true;
        }
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    model.with_context(|| format!("loading {}", path.display()))
}
