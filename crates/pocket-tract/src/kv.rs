//! The decoder's KV cache, owned by the engine between decoder calls.
//!
//! tract runs the with-past decoder as a pure function: the cache goes in as
//! `past_key_values.*` and comes back, one call longer, as `present.*`. Between calls the
//! engine keeps it — the self-attention K/V in a [`KvStore`] per layer and tensor (f32, or
//! KIVI-quantized to 8 or 4 bits with recent tokens kept in f32), the cross-attention K/V
//! (fixed once the source is encoded) as the tensors the first call returned, which are
//! passed back without a copy.
//!
//! A quantized cache saves memory *between* calls: during a call tract needs the past as
//! f32 tensors, so each call writes them out and drops them afterwards (counted as compute
//! memory by the footprint).

use pocket_core::{KvElement, KvType, Result};
use tract_onnx::prelude::*;

use crate::kivi::{Bits, Kind, KvStore};
use crate::roles::LayerSlots;

/// Recent tokens kept in f32 by a quantized cache: one more than the longest draft, so that
/// cutting a rejected draft never reaches quantized blocks.
pub const KV_WINDOW: usize = pocket_core::spec::MAX_DRAFT + 1;

/// How one half of a session's [`KvType`] is stored by this engine: `f32` and `f16` as f32
/// (the graphs take f32), `q8_0` and `q4_0` as KIVI 8- and 4-bit groups of 32.
pub fn kv_bits(t: KvElement) -> Bits {
    match t {
        KvElement::F32 | KvElement::F16 => Bits::F32,
        KvElement::Q8_0 => Bits::Int8,
        KvElement::Q4_0 => Bits::Int4,
    }
}

/// Bytes one more decoder token takes in a long cache of `kv`'s types.
pub fn kv_bytes_per_token(kv: KvType, layers: usize, heads: usize, head_dim: usize) -> f64 {
    layers as f64
        * (KvStore::bytes_per_token(Kind::Key, kv_bits(kv.k), heads, head_dim)
            + KvStore::bytes_per_token(Kind::Value, kv_bits(kv.v), heads, head_dim))
}

struct LayerCache {
    key: KvStore,
    value: KvStore,
    cross_key: TValue,
    cross_value: TValue,
}

/// Every layer's cache.
pub(crate) struct DecoderCache {
    layers: Vec<LayerCache>,
    heads: usize,
    head_dim: usize,
}

/// `[1, heads, len, head_dim]` of a K/V tensor, and its data.
fn kv_view(t: &TValue) -> Result<(usize, usize, usize, &[f32])> {
    let shape = t.shape();
    let [1, heads, len, dim] = *shape else {
        return Err(pocket_core::Error::engine(format!(
            "a K/V output of shape {shape:?}; expected [1, heads, len, dim]"
        )));
    };
    let data = t.try_as_plain_ram().and_then(|v| v.as_slice::<f32>()).map_err(pocket_core::Error::engine)?;
    Ok((heads, len, dim, data))
}

impl DecoderCache {
    /// The cache the first decoder call returned in `outputs`.
    pub(crate) fn from_first(outputs: &TVec<TValue>, slots: &[LayerSlots], kv: KvType) -> Result<Self> {
        let (heads, _, head_dim, _) = kv_view(&outputs[slots[0].self_key])?;
        let mut layers = Vec::with_capacity(slots.len());
        for s in slots {
            let Some((ck, cv)) = s.cross else {
                return Err(pocket_core::Error::engine("the first decoder call returned no encoder K/V"));
            };
            layers.push(LayerCache {
                key: KvStore::new(Kind::Key, kv_bits(kv.k), heads, head_dim, KV_WINDOW),
                value: KvStore::new(Kind::Value, kv_bits(kv.v), heads, head_dim, KV_WINDOW),
                cross_key: outputs[ck].clone(),
                cross_value: outputs[cv].clone(),
            });
        }
        let mut cache = DecoderCache { layers, heads, head_dim };
        cache.append(outputs, slots)?;
        Ok(cache)
    }

    /// Tokens held.
    pub(crate) fn len(&self) -> usize {
        self.layers.first().map_or(0, |l| l.key.len())
    }

    /// Take the new tokens of the `present.*` tensors in `outputs` (each `[1, H, len + n, D]`).
    pub(crate) fn append(&mut self, outputs: &TVec<TValue>, slots: &[LayerSlots]) -> Result<()> {
        let held = self.len();
        for (layer, s) in self.layers.iter_mut().zip(slots) {
            for (store, slot) in [(&mut layer.key, s.self_key), (&mut layer.value, s.self_value)] {
                let (heads, total, dim, data) = kv_view(&outputs[slot])?;
                if heads != self.heads || dim != self.head_dim || total < held {
                    return Err(pocket_core::Error::engine(format!(
                        "a present K/V of {heads} heads × {total} tokens × {dim}; the cache holds \
                         {} heads × {held} × {}",
                        self.heads, self.head_dim
                    )));
                }
                store.append_from(data, total, held);
            }
        }
        Ok(())
    }

    /// Every layer's `(self key, self value, cross key, cross value)` for the next call.
    pub(crate) fn past(&self) -> Result<Vec<[TValue; 4]>> {
        let len = self.len();
        let shape = [1, self.heads, len, self.head_dim];
        let write = |store: &KvStore| -> Result<TValue> {
            let mut t = Tensor::zero::<f32>(&shape).map_err(pocket_core::Error::engine)?;
            let mut view = t.try_as_plain_ram_mut().map_err(pocket_core::Error::engine)?;
            store.write_f32(view.as_slice_mut::<f32>().map_err(pocket_core::Error::engine)?);
            Ok(t.into())
        };
        self.layers
            .iter()
            .map(|l| Ok([write(&l.key)?, write(&l.value)?, l.cross_key.clone(), l.cross_value.clone()]))
            .collect()
    }

    /// Keep the first `len` tokens.
    pub(crate) fn truncate(&mut self, len: usize) {
        for l in &mut self.layers {
            l.key.truncate(len);
            l.value.truncate(len);
        }
    }

    /// Bytes of the self-attention cache.
    pub(crate) fn self_bytes(&self) -> u64 {
        self.layers.iter().map(|l| (l.key.bytes() + l.value.bytes()) as u64).sum()
    }

    /// Bytes of the cross-attention K/V.
    pub(crate) fn cross_bytes(&self) -> u64 {
        self.layers.iter().map(|l| (l.cross_key.len() + l.cross_value.len()) as u64 * 4).sum()
    }
}
