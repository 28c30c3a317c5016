//! `pocket pull NAME` (placeholder until written).

/// Flags of `pocket pull`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Manifest name of the model.
    pub name: String,
}

/// Run `pocket pull`.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
