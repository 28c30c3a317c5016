//! The three graphs' roles: which inputs and outputs each must have, checked at load so
//! that a wrong file is a clear error rather than a failure mid-generation.
//!
//! Names are Hugging Face Optimum's (see the t5-tiny fixture's README): the encoder takes
//! `input_ids` and `attention_mask` and returns `last_hidden_state`; the decoders take
//! `input_ids`, `encoder_attention_mask` and either `encoder_hidden_states` (the first
//! call) or `past_key_values.{i}.{decoder,encoder}.{key,value}` (later calls), and return
//! `logits` and `present.{i}.decoder.{key,value}` (plus `present.{i}.encoder.*` from the
//! first call).

use tract_onnx::prelude::*;

use crate::Error;
use crate::graph::Graph;

/// The encoder.
pub(crate) struct EncoderGraph {
    pub(crate) graph: Graph,
    ids: usize,
    mask: Option<usize>,
    /// Position of `last_hidden_state` among the outputs.
    pub(crate) hidden: usize,
}

/// Positions of one layer's K/V tensors among a graph's inputs or outputs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LayerSlots {
    pub(crate) self_key: usize,
    pub(crate) self_value: usize,
    /// Cross-attention K/V: outputs of the first decoder call, inputs of later ones.
    pub(crate) cross: Option<(usize, usize)>,
}

/// A decoder graph: the first call's (with `encoder_hidden_states`) or the with-past one.
pub(crate) struct DecoderGraph {
    pub(crate) graph: Graph,
    ids: usize,
    mask: Option<usize>,
    /// `encoder_hidden_states` (first-call decoders only).
    hidden: Option<usize>,
    pub(crate) logits: usize,
    /// Past K/V inputs per layer (with-past decoders only).
    pub(crate) past: Vec<LayerSlots>,
    /// Present K/V outputs per layer (empty for a decoder without a cache).
    pub(crate) present: Vec<LayerSlots>,
}

fn ids_tensor(tokens: &[u32]) -> TValue {
    let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
    tract_ndarray::Array2::from_shape_vec((1, ids.len()), ids)
        .expect("1 × n holds n ids")
        .into_tensor()
        .into()
}

/// An all-ones mask over `n` source positions.
pub(crate) fn ones_mask(n: usize) -> TValue {
    tract_ndarray::Array2::from_elem((1, n), 1i64).into_tensor().into()
}

/// Inputs in graph order from `(position, value)` pairs that cover every input.
fn ordered(graph: &Graph, given: Vec<(usize, TValue)>) -> pocket_core::Result<TVec<TValue>> {
    let mut slots: TVec<Option<TValue>> = (0..graph.inputs.len()).map(|_| None).collect();
    for (i, v) in given {
        slots[i] = Some(v);
    }
    slots
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            v.ok_or_else(|| pocket_core::Error::engine(format!("input {} not given", graph.inputs[i])))
        })
        .collect()
}

impl EncoderGraph {
    pub(crate) fn new(graph: Graph) -> Result<Self, Error> {
        if graph.output("logits").is_some() {
            return Err(graph.error(format!(
                "outputs logits: it is a decoder graph, not an encoder (inputs: {}; outputs: {})",
                graph.input_list(),
                graph.output_list()
            )));
        }
        let ids = graph.input("input_ids");
        let unknown = graph.inputs.iter().any(|n| n != "input_ids" && n != "attention_mask");
        let Some(ids) = ids.filter(|_| !unknown) else {
            return Err(graph.error(format!(
                "takes inputs ({}); an encoder takes input_ids and optionally attention_mask",
                graph.input_list()
            )));
        };
        let hidden = graph.output("last_hidden_state").unwrap_or(0);
        let mask = graph.input("attention_mask");
        Ok(EncoderGraph { graph, ids, mask, hidden })
    }

    /// The encoder's output for `tokens`: `[1, S, d_model]`.
    pub(crate) fn run(&self, tokens: &[u32], mask: &TValue) -> pocket_core::Result<TValue> {
        let mut given = vec![(self.ids, ids_tensor(tokens))];
        given.extend(self.mask.map(|m| (m, mask.clone())));
        let mut out = self.graph.run(ordered(&self.graph, given)?)?;
        Ok(out.swap_remove(self.hidden))
    }

    /// The model width, where the graph fixes it.
    pub(crate) fn width(&self) -> Option<usize> {
        self.graph.output_widths.get(self.hidden).copied().flatten()
    }
}

impl DecoderGraph {
    /// The first-call decoder: `encoder_hidden_states` in, `present.*` out if it has a cache.
    pub(crate) fn first(graph: Graph) -> Result<Self, Error> {
        if graph.inputs.iter().any(|n| n.starts_with("past_key_values")) {
            return Err(graph.error(
                "takes past_key_values: it is a with-past decoder; the first decoder call takes \
                 encoder_hidden_states (name this file decoder_with_past_model.onnx, beside decoder_model.onnx)",
            ));
        }
        let hidden = graph.input("encoder_hidden_states");
        let d = Self::common(graph, &["encoder_hidden_states"])?;
        let Some(hidden) = hidden else {
            return Err(d.graph.error(format!(
                "takes inputs ({}) without encoder_hidden_states: it is not an encoder-decoder's decoder",
                d.graph.input_list()
            )));
        };
        let present = present_slots(&d.graph, true);
        Ok(DecoderGraph { hidden: Some(hidden), present, ..d })
    }

    /// The with-past decoder, for a model whose first decoder returns `layers` layers of K/V.
    pub(crate) fn with_past(graph: Graph, layers: usize) -> Result<Self, Error> {
        let mut past = Vec::new();
        for i in 0.. {
            let name = |part: &str| format!("past_key_values.{i}.{part}");
            let slots =
                [name("decoder.key"), name("decoder.value"), name("encoder.key"), name("encoder.value")]
                    .map(|n| graph.input(&n));
            match slots {
                [Some(sk), Some(sv), Some(ck), Some(cv)] => {
                    past.push(LayerSlots { self_key: sk, self_value: sv, cross: Some((ck, cv)) })
                }
                [None, None, None, None] => break,
                _ => return Err(graph.error(format!("layer {i} lacks some of its past_key_values inputs"))),
            }
        }
        let allowed: Vec<String> =
            graph.inputs.iter().filter(|n| n.starts_with("past_key_values.")).cloned().collect();
        let allowed: Vec<&str> = allowed.iter().map(String::as_str).collect();
        let d = Self::common(graph, &allowed)?;
        let present = present_slots(&d.graph, false);
        if past.len() != layers || present.len() != layers {
            return Err(d.graph.error(format!(
                "has {} layers of past_key_values inputs and {} of present outputs, where the first \
                 decoder returns {layers}",
                past.len(),
                present.len()
            )));
        }
        Ok(DecoderGraph { past, present, ..d })
    }

    /// What both decoders share: `input_ids`, an optional `encoder_attention_mask`, `logits`.
    fn common(graph: Graph, extra: &[&str]) -> Result<Self, Error> {
        let known = |n: &str| n == "input_ids" || n == "encoder_attention_mask" || extra.contains(&n);
        let (Some(ids), true) = (graph.input("input_ids"), graph.inputs.iter().all(|n| known(n))) else {
            return Err(graph.error(format!(
                "takes inputs ({}); a decoder takes input_ids, encoder_attention_mask and {}",
                graph.input_list(),
                if extra.first().is_some_and(|e| e.starts_with("past")) {
                    "past_key_values.*"
                } else {
                    "encoder_hidden_states"
                }
            )));
        };
        let Some(logits) = graph.output("logits") else {
            return Err(graph.error(format!("has no logits output (outputs: {})", graph.output_list())));
        };
        let mask = graph.input("encoder_attention_mask");
        Ok(DecoderGraph { graph, ids, mask, hidden: None, logits, past: Vec::new(), present: Vec::new() })
    }

    /// The vocabulary size, where the graph fixes it.
    pub(crate) fn vocab(&self) -> Option<usize> {
        self.graph.output_widths.get(self.logits).copied().flatten()
    }

    /// Run the first-call decoder over `tokens`.
    pub(crate) fn run_first(
        &self,
        tokens: &[u32],
        mask: &TValue,
        hidden: &TValue,
    ) -> pocket_core::Result<TVec<TValue>> {
        let mut given = vec![(self.ids, ids_tensor(tokens))];
        given.extend(self.mask.map(|m| (m, mask.clone())));
        given.extend(self.hidden.map(|h| (h, hidden.clone())));
        self.graph.run(ordered(&self.graph, given)?)
    }

    /// Run the with-past decoder over `tokens`, `past[i]` being layer i's
    /// `(self key, self value, cross key, cross value)`.
    pub(crate) fn run_with_past(
        &self,
        tokens: &[u32],
        mask: &TValue,
        past: Vec<[TValue; 4]>,
    ) -> pocket_core::Result<TVec<TValue>> {
        let mut given = vec![(self.ids, ids_tensor(tokens))];
        given.extend(self.mask.map(|m| (m, mask.clone())));
        for (slots, [sk, sv, ck, cv]) in self.past.iter().zip(past) {
            given.push((slots.self_key, sk));
            given.push((slots.self_value, sv));
            if let Some((k, v)) = slots.cross {
                given.push((k, ck));
                given.push((v, cv));
            }
        }
        self.graph.run(ordered(&self.graph, given)?)
    }

    /// `(heads, head_dim)` of the self-attention cache, where the graph fixes them.
    pub(crate) fn kv_dims(&self) -> Option<(usize, usize)> {
        let slot = self.past.first()?.self_key;
        match self.graph.input_dims.get(slot)?.as_slice() {
            [_, Some(h), _, Some(d)] => Some((*h, *d)),
            _ => None,
        }
    }
}

/// The `present.{i}.*` outputs per layer; with `cross`, the first call's encoder K/V too.
fn present_slots(graph: &Graph, cross: bool) -> Vec<LayerSlots> {
    let mut layers = Vec::new();
    for i in 0.. {
        let name = |part: &str| format!("present.{i}.{part}");
        let (Some(k), Some(v)) = (graph.output(&name("decoder.key")), graph.output(&name("decoder.value")))
        else {
            break;
        };
        let c = graph.output(&name("encoder.key")).zip(graph.output(&name("encoder.value")));
        layers.push(LayerSlots { self_key: k, self_value: v, cross: if cross { c } else { None } });
    }
    layers
}
