//! A pass's inputs, filled before it is computed: every row's token and position, each
//! segment's causal masks and cache rows, the rows whose logits are wanted, the rotations of a
//! quantized cache.

use pocket_core::Token;

use super::{Graph, PassShape, fill_mask, hadamard};
use crate::Result;
use crate::hparams::Hparams;

/// What one segment's inputs are filled from: its tokens, where they go, its shape.
#[derive(Clone, Copy)]
pub(crate) struct SegmentData<'a> {
    pub(crate) tokens: &'a [Token],
    pub(crate) pos0: usize,
    pub(crate) shape: PassShape,
    /// For a tree of drafts ([`pocket_core::Session::decode_tree`]): each token's parent in
    /// the segment. Empty for a sequence.
    pub(crate) parents: &'a [u8],
}

/// Buffers the inputs are made in, kept between passes.
#[derive(Default)]
pub(crate) struct Scratch {
    mask: Vec<u16>,
    i32s: Vec<i32>,
    i64s: Vec<i64>,
    /// A tree's depths.
    depths: Vec<usize>,
    /// Hadamard matrices by size, made when first needed.
    rotations: Vec<(usize, Vec<f32>)>,
}

impl Scratch {
    fn rotation(&mut self, n: usize) -> &[f32] {
        let i = match self.rotations.iter().position(|(size, _)| *size == n) {
            Some(i) => i,
            None => {
                self.rotations.push((n, hadamard(n)));
                self.rotations.len() - 1
            }
        };
        &self.rotations[i].1
    }
}

/// Fill `g`'s inputs for `segments` (those it was built for, in its row order). A segment
/// whose shape has more rows than it has tokens (a decode step computed as two rows on a
/// device, see `exact`) repeats its last token, position and cache row in the rest.
pub(crate) fn set(g: &Graph, hp: &Hparams, segments: &[SegmentData<'_>], s: &mut Scratch) -> Result<()> {
    debug_assert_eq!(segments.len(), g.inputs.segments.len());
    let inp = &g.inputs;
    s.i32s.clear();
    s.i32s.extend(segments.iter().flat_map(|d| rows(d).map(|(t, _)| t as i32)));
    inp.tokens.set_data(&s.i32s)?;
    s.i32s.clear();
    for d in segments {
        if d.parents.is_empty() {
            s.i32s.extend(rows(d).map(|(_, p)| p as i32));
        } else {
            // A tree's token sits at its depth's position, in the cache row of its index.
            pocket_core::tree_depths(d.parents, &mut s.depths);
            s.i32s.extend(rows(d).map(|(_, row)| (d.pos0 + s.depths[row - d.pos0]) as i32));
        }
    }
    inp.pos.set_data(&s.i32s)?;
    for (d, si) in segments.iter().zip(&inp.segments) {
        let (n_tokens, pos0, shape) = (d.tokens.len(), d.pos0, d.shape);
        s.i64s.clear();
        s.i64s.extend(rows(d).map(|(_, p)| p as i64));
        si.kv_idxs.set_data(&s.i64s)?;
        // A pass that only fills the cache (no logits) with a plan that runs one layer stops
        // before that layer's attention: the mask is then not in the graph, and not allocated
        // (nor is the sliding-window mask where no such layer runs).
        if si.mask.is_allocated() {
            fill_mask(&mut s.mask, pos0, n_tokens, shape.q_rows, shape.n_kv, None, d.parents);
            si.mask.set_data(&s.mask)?;
        }
        if let (Some(mask), Some(swa)) = (si.mask_swa.filter(|m| m.is_allocated()), &hp.swa) {
            fill_mask(&mut s.mask, pos0, n_tokens, shape.q_rows, shape.n_kv, Some(swa.window), d.parents);
            mask.set_data(&s.mask)?;
        }
    }
    if let Some(ids) = inp.out_ids {
        s.i32s.clear();
        let mut r0 = 0;
        for d in segments {
            let n = d.shape.n_tokens;
            s.i32s.extend((r0 + n - d.shape.n_out..r0 + n).map(|i| i as i32));
            r0 += n;
        }
        ids.set_data(&s.i32s)?;
    }
    for r in [inp.k_rot, inp.v_rot].into_iter().flatten() {
        r.set_data(s.rotation(r.ne()[0] as usize))?;
    }
    Ok(())
}

/// Each row of a segment: its token and cache row (for a sequence also its position) — the
/// tokens', then the last one's again for rows past them.
fn rows<'a>(d: &SegmentData<'a>) -> impl Iterator<Item = (Token, usize)> + 'a {
    let (tokens, pos0) = (d.tokens, d.pos0);
    let last = tokens.len() - 1;
    (0..d.shape.n_tokens).map(move |i| (tokens[i.min(last)], pos0 + i.min(last)))
}
