//! Which pass widths give, on a model's device, exactly the rows that single decode steps give
//! ([`ExactPasses`]), found by a probe when the model is loaded on a device other than the CPU.
//!
//! Greedy speculation gives plain decoding's tokens only if each row of a verification pass
//! (the next token and its draft, decoded together) is bit for bit what decoding that token
//! alone computes. Our CPU kernels are built so (each row rounded as one row alone is); a GPU's
//! kernels are not: ggml-cuda multiplies one column, two to four, five to eight and more with
//! different kernels or warp counts, and picks another attention kernel past one query row, so
//! the sums are taken in another order and the last bits differ. Which widths agree depends on
//! the device, the build and the model's shapes, so it is measured rather than assumed: a few
//! tokens are decoded one at a time, then again in passes of 2, 3, … tokens, and the widest
//! width up to which every pass gave every row's bits is the limit. Drafts are then kept to it
//! (`pocket_core::generate`), and where not even two tokens agree, speculation never drafts on
//! that device, with the reason in the model's status — never silently inexact.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use pocket_core::memory::Ledger;
use pocket_core::{ExactPasses, LayerPlan, Rows, Session, SessionConfig, Threads, Token};

use crate::Result;
use crate::kv::KV_PAD;
use crate::loaded::Inner;
use crate::session::GgmlSession;

/// The widest pass probed: more than any draft the pipeline makes (its `MAX_DRAFT`) plus the
/// next token.
pub(crate) const PROBE_WIDTH: usize = 16;

/// Tokens decoded before the probed passes: some within the first block of [`KV_PAD`]
/// positions, and past it. Attention reads the cache padded to the block, as sessions do, and
/// a kernel may split that length by the number of query rows: ggml-vulkan's flash attention
/// on Mesa 25's lavapipe gave one row and two alike over 64 positions, not over 256. The
/// session is as long as two blocks, so every probed pass reads 256 positions, then 512.
const PROBE_CONTEXTS: [usize; 2] = [8, KV_PAD + 8];

/// Rows a decode step is tried as: one, and two (the token repeated). ggml-cuda, for one, multiplies a
/// single column with its own kernel configuration and attends with its vector kernel; two rows
/// take the configuration of wider passes, so that verification's rows may then agree with steps.
const STEP_ROWS: [usize; 2] = [1, 2];

/// Probe the widths at which passes of the model in `inner` give single steps' rows on its
/// device, with decode steps computed as each of [`STEP_ROWS`]; keep the step rows that make
/// more widths exact (fewer on a tie) in `inner.step_rows`.
pub(crate) fn probe(inner: &Arc<Inner>) -> Result<ExactPasses> {
    let mut found = Vec::new();
    for rows in STEP_ROWS {
        inner.step_rows.store(rows, Ordering::Relaxed);
        found.push((rows, widest(Arc::clone(inner))?));
    }
    let (rows, widest) = found.iter().copied().fold((1, 0), |best, f| if f.1 > best.1 { f } else { best });
    inner.step_rows.store(rows, Ordering::Relaxed);
    let device = &inner.device.name;
    let tried: Vec<String> = found
        .iter()
        .map(|(r, w)| format!("{w} with steps as {r} row{}", if *r == 1 { "" } else { "s" }))
        .collect();
    let found = format!("widest exact pass {} of {PROBE_WIDTH} probed", tried.join(", "));
    let why = match widest {
        1 => format!(
            "on {device}, a pass of 2 tokens does not give exactly the rows of single steps ({found}): \
             no drafts are made, so that greedy output stays exactly plain decoding's"
        ),
        w if w == PROBE_WIDTH => {
            format!("on {device}, every probed pass gives exactly the rows of single steps ({found})")
        }
        w => format!(
            "on {device}, passes of up to {w} tokens give exactly the rows of single steps ({found}): drafts are kept to {}",
            w - 1
        ),
    };
    Ok(ExactPasses { max_tokens: widest, block: Some(KV_PAD), why })
}

/// The widest pass (up to [`PROBE_WIDTH`]) up to which every pass gives every row's bits as
/// single steps do after each of [`PROBE_CONTEXTS`], decoding steps as `inner.step_rows` says.
fn widest(inner: Arc<Inner>) -> Result<usize> {
    let plan = LayerPlan::full(inner.hp.n_layer).map_err(|e| crate::Error::Ggml(e.to_string()))?;
    let config = SessionConfig {
        n_ctx: 2 * KV_PAD,
        max_rows: PROBE_WIDTH,
        threads: Threads::Fixed(1),
        ..SessionConfig::default()
    };
    let n_vocab = inner.hp.n_vocab;
    let mut session = GgmlSession::new(inner, &config, &Ledger::unlimited())?;
    let mut widest = PROBE_WIDTH;
    for context in PROBE_CONTEXTS {
        if widest == 1 {
            break;
        }
        // Tokens spread over the vocabulary: what they say does not matter, only that every
        // row differs.
        let tokens: Vec<Token> =
            (0..context + PROBE_WIDTH).map(|i| ((i * 7919 + 13) % n_vocab) as Token).collect();
        widest = widest.min(widest_after(&mut session, &plan, &tokens, context)?);
    }
    Ok(widest)
}

/// [`widest`] after the first `context` of `tokens`, the passes taken from the rest.
fn widest_after(
    session: &mut GgmlSession,
    plan: &LayerPlan,
    tokens: &[Token],
    context: usize,
) -> Result<usize> {
    let (context_tokens, probed) = tokens.split_at(context);
    session.truncate(0)?;
    // A row is read back (not `Rows::None`): on lavapipe a first pass that read nothing back
    // was followed by a crash inside the driver (its queue thread, while ggml-vulkan compiled
    // the next pass's pipeline); reading waits for the device.
    session.decode(context_tokens, plan, Rows::Last)?;
    let mut single = Vec::with_capacity(PROBE_WIDTH);
    for &t in probed {
        single.push(session.decode(&[t], plan, Rows::Last)?.last().to_vec());
    }
    let mut widest = 1;
    for width in 2..=PROBE_WIDTH {
        session.truncate(context)?;
        let logits = session.decode(&probed[..width], plan, Rows::Tail(width))?;
        if !(0..width).all(|i| same_bits(logits.row(i), &single[i])) {
            break;
        }
        widest = width;
    }
    Ok(widest)
}

/// Whether two rows of logits are the same bits (NaNs included).
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}
