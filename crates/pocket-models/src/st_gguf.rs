//! `transform = "sentence-transformers-to-gguf"`: a sentence-transformers BERT model, as
//! packaged in a zip (`model.safetensors`, `config.json`, `tokenizer.json`, `modules.json`,
//! `1_Pooling/config.json`, `sentence_bert_config.json`), becomes one GGUF file that
//! llama.cpp's `bert` architecture loads.
//!
//! Why a GGUF and not our own encoder graph: llama.cpp's BERT graph already batches several
//! sequences in one pass with per-sequence attention masks and pools them, and runs on every
//! backend we build (CPU, CUDA, Vulkan); what it needs is the weights under its tensor names
//! and the hyper-parameters under its keys. Every tensor stays f32, as published: the model
//! is small (87 MiB), its vectors are then the reference's to rounding, and on x86 ggml
//! multiplies f32 matrices faster than f16 ones, which it widens element by element (measured
//! in docs/benchmarks.md: +27% sentences/s at batch 32 with AVX-512). ggml's CPU cannot add an
//! f16 row to f32 activations anyway, so the token-type table had to stay f32.
//!
//! The file is self-contained: the published `tokenizer.json` goes in whole under the
//! standard key `tokenizer.huggingface.json` (the engine tokenizes with it, exactly as the
//! reference does), beside the WordPiece vocabulary in llama.cpp's form; what
//! sentence-transformers adds to the transformer — the sequence length it truncates at and
//! whether it normalizes — goes under `sentence_transformers.*`. The output is a pure
//! function of the input, so its sha256 can be pinned in the manifest.

use std::collections::HashMap;
use std::io::{Cursor, Read};

use serde::Deserialize;

use crate::{Error, Result};

/// GGUF's data alignment (the default; `general.alignment` is not written).
const ALIGN: usize = 32;

/// Converts the zipped sentence-transformers model in `zip` to a GGUF file.
pub fn convert(zip: Vec<u8>) -> Result<Vec<u8>> {
    let mut archive =
        zip::ZipArchive::new(Cursor::new(zip)).map_err(|e| invalid(format!("not a zip: {e}")))?;
    let mut member = |name: &str| -> Result<Vec<u8>> {
        // The members sit at the top, or all in one top-level directory.
        let matches = |n: &str| n == name || n.split_once('/').is_some_and(|(_, rest)| rest == name);
        let index = (0..archive.len())
            .find(|&i| archive.name_for_index(i).is_some_and(|n| n == name))
            .or_else(|| (0..archive.len()).find(|&i| archive.name_for_index(i).is_some_and(matches)))
            .ok_or_else(|| invalid(format!("the zip has no {name}")))?;
        let mut entry = archive.by_index(index).map_err(|e| invalid(format!("cannot read {name}: {e}")))?;
        let mut out = Vec::with_capacity(entry.size() as usize);
        entry.read_to_end(&mut out).map_err(|e| invalid(format!("cannot read {name}: {e}")))?;
        Ok(out)
    };
    let config: BertConfig = json(&member("config.json")?, "config.json")?;
    let pooling: PoolingConfig = json(&member("1_Pooling/config.json")?, "1_Pooling/config.json")?;
    let modules: Vec<ModuleEntry> = json(&member("modules.json")?, "modules.json")?;
    let st_config: SentenceBertConfig =
        json(&member("sentence_bert_config.json")?, "sentence_bert_config.json")?;
    let tokenizer_json = String::from_utf8(member("tokenizer.json")?)
        .map_err(|_| invalid("tokenizer.json is not UTF-8".into()))?;
    let tokenizer: TokenizerJson = json(tokenizer_json.as_bytes(), "tokenizer.json")?;
    let safetensors = member("model.safetensors")?;
    drop(archive); // the zip's bytes, before the GGUF is built

    if config.model_type != "bert" {
        return Err(invalid(format!("model_type {:?}: only bert is converted", config.model_type)));
    }
    if config.hidden_act != "gelu" {
        return Err(invalid(format!("hidden_act {:?}: only gelu is converted", config.hidden_act)));
    }
    let pooling_type = match (pooling.pooling_mode_mean_tokens, pooling.pooling_mode_cls_token) {
        (true, false) => 1u32, // LLAMA_POOLING_TYPE_MEAN
        (false, true) => 2u32, // LLAMA_POOLING_TYPE_CLS
        _ => return Err(invalid("1_Pooling/config.json: only mean or CLS pooling is converted".into())),
    };
    let normalize = modules.iter().any(|m| m.kind.ends_with(".Normalize"));
    if tokenizer.model.kind != "WordPiece" {
        return Err(invalid(format!(
            "tokenizer.json's model is {}: only WordPiece is converted",
            tokenizer.model.kind
        )));
    }

    let tensors = Safetensors::parse(&safetensors)?;
    let mut gguf = GgufWriter::default();
    gguf.kv_str("general.architecture", "bert");
    gguf.kv_str("general.name", config.name_or_path.as_deref().unwrap_or("bert"));
    gguf.kv_u32("general.file_type", 0); // LLAMA_FTYPE_ALL_F32
    gguf.kv_u32("bert.context_length", config.max_position_embeddings);
    gguf.kv_u32("bert.embedding_length", config.hidden_size);
    gguf.kv_u32("bert.feed_forward_length", config.intermediate_size);
    gguf.kv_u32("bert.block_count", config.num_hidden_layers);
    gguf.kv_u32("bert.attention.head_count", config.num_attention_heads);
    gguf.kv_f32("bert.attention.layer_norm_epsilon", config.layer_norm_eps as f32);
    gguf.kv_bool("bert.attention.causal", false);
    gguf.kv_u32("bert.pooling_type", pooling_type);
    gguf.kv_u32("sentence_transformers.max_seq_length", st_config.max_seq_length);
    gguf.kv_bool("sentence_transformers.normalize", normalize);
    vocabulary(&mut gguf, &tokenizer, &config)?;
    gguf.kv_str("tokenizer.huggingface.json", &tokenizer_json);

    let name = |hf: &str| -> Option<String> {
        let layer = |rest: &str| -> Option<String> {
            let (n, rest) = rest.split_once('.')?;
            let ours = match rest {
                "attention.self.query.weight" => "attn_q.weight",
                "attention.self.query.bias" => "attn_q.bias",
                "attention.self.key.weight" => "attn_k.weight",
                "attention.self.key.bias" => "attn_k.bias",
                "attention.self.value.weight" => "attn_v.weight",
                "attention.self.value.bias" => "attn_v.bias",
                "attention.output.dense.weight" => "attn_output.weight",
                "attention.output.dense.bias" => "attn_output.bias",
                "attention.output.LayerNorm.weight" => "attn_output_norm.weight",
                "attention.output.LayerNorm.bias" => "attn_output_norm.bias",
                "intermediate.dense.weight" => "ffn_up.weight",
                "intermediate.dense.bias" => "ffn_up.bias",
                "output.dense.weight" => "ffn_down.weight",
                "output.dense.bias" => "ffn_down.bias",
                "output.LayerNorm.weight" => "layer_output_norm.weight",
                "output.LayerNorm.bias" => "layer_output_norm.bias",
                _ => return None,
            };
            Some(format!("blk.{n}.{ours}"))
        };
        let hf = hf.strip_prefix("bert.").unwrap_or(hf);
        Some(match hf {
            "embeddings.word_embeddings.weight" => "token_embd.weight".into(),
            "embeddings.position_embeddings.weight" => "position_embd.weight".into(),
            "embeddings.token_type_embeddings.weight" => "token_types.weight".into(),
            "embeddings.LayerNorm.weight" => "token_embd_norm.weight".into(),
            "embeddings.LayerNorm.bias" => "token_embd_norm.bias".into(),
            _ => layer(hf.strip_prefix("encoder.layer.")?)?,
        })
    };
    let mut converted = 0;
    for t in &tensors.tensors {
        // The pooler (BertModel's classification head) and the position-id buffer are not
        // part of the sentence encoder.
        let Some(ours) = name(&t.name) else { continue };
        if t.dtype != "F32" {
            return Err(invalid(format!("tensor {} is {}: only F32 is converted", t.name, t.dtype)));
        }
        let data = &safetensors[tensors.data_start + t.begin..tensors.data_start + t.end];
        if data.len() != t.shape.iter().product::<usize>() * 4 {
            return Err(invalid(format!("tensor {}'s data does not match its shape {:?}", t.name, t.shape)));
        }
        gguf.tensor(&ours, &t.shape, data);
        converted += 1;
    }
    let expected = 5 + 16 * config.num_hidden_layers as usize;
    if converted != expected {
        return Err(invalid(format!(
            "found {converted} of the {expected} BERT tensors in model.safetensors"
        )));
    }
    Ok(gguf.finish())
}

/// The WordPiece vocabulary as llama.cpp's `bert` tokenizer reads it: a word-initial piece
/// gets the phantom space `▁`, a continuation (`##x`) loses its `##`, special tokens stay
/// as they are (what llama.cpp's own converter writes).
fn vocabulary(gguf: &mut GgufWriter, tokenizer: &TokenizerJson, config: &BertConfig) -> Result<()> {
    let n = tokenizer.model.vocab.len();
    if n != config.vocab_size as usize {
        return Err(invalid(format!(
            "tokenizer.json has {n} tokens, config.json says {}",
            config.vocab_size
        )));
    }
    let mut tokens = vec![String::new(); n];
    for (piece, &id) in &tokenizer.model.vocab {
        let slot =
            tokens.get_mut(id as usize).ok_or_else(|| invalid(format!("token id {id} out of range")))?;
        *slot = piece.clone();
    }
    let special: HashMap<&str, u32> =
        tokenizer.added_tokens.iter().filter(|t| t.special).map(|t| (t.content.as_str(), t.id)).collect();
    let mut types = Vec::with_capacity(n);
    for (id, piece) in tokens.iter_mut().enumerate() {
        if piece.is_empty() {
            return Err(invalid(format!("tokenizer.json has no token {id}")));
        }
        let is_special = special.get(piece.as_str()) == Some(&(id as u32));
        types.push(if is_special { 3i32 } else { 1i32 }); // CONTROL, NORMAL
        if !is_special {
            *piece = match piece.strip_prefix("##") {
                Some(rest) => rest.to_owned(),
                None => format!("\u{2581}{piece}"),
            };
        }
    }
    gguf.kv_str("tokenizer.ggml.model", "bert");
    gguf.kv_str("tokenizer.ggml.pre", "default");
    gguf.kv_strs("tokenizer.ggml.tokens", &tokens);
    gguf.kv_i32s("tokenizer.ggml.token_type", &types);
    gguf.kv_u32("tokenizer.ggml.token_type_count", config.type_vocab_size);
    for (key, token) in [
        ("unknown_token_id", "[UNK]"),
        ("seperator_token_id", "[SEP]"), // llama.cpp's spelling
        ("padding_token_id", "[PAD]"),
        ("cls_token_id", "[CLS]"),
        ("mask_token_id", "[MASK]"),
    ] {
        if let Some(&id) = special.get(token) {
            gguf.kv_u32(&format!("tokenizer.ggml.{key}"), id);
        }
    }
    Ok(())
}

fn invalid(reason: String) -> Error {
    Error::InvalidModel { reason }
}

fn json<'a, T: Deserialize<'a>>(bytes: &'a [u8], name: &str) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| invalid(format!("{name}: {e}")))
}

#[derive(Deserialize)]
struct BertConfig {
    model_type: String,
    #[serde(rename = "_name_or_path")]
    name_or_path: Option<String>,
    hidden_act: String,
    hidden_size: u32,
    intermediate_size: u32,
    num_hidden_layers: u32,
    num_attention_heads: u32,
    max_position_embeddings: u32,
    type_vocab_size: u32,
    vocab_size: u32,
    layer_norm_eps: f64,
}

#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_cls_token: bool,
}

#[derive(Deserialize)]
struct ModuleEntry {
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct SentenceBertConfig {
    max_seq_length: u32,
}

#[derive(Deserialize)]
struct TokenizerJson {
    model: WordPieceModel,
    #[serde(default)]
    added_tokens: Vec<AddedToken>,
}

#[derive(Deserialize)]
struct WordPieceModel {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    vocab: HashMap<String, u32>,
}

#[derive(Deserialize)]
struct AddedToken {
    id: u32,
    content: String,
    #[serde(default)]
    special: bool,
}

/// The index of a safetensors file: an 8-byte little-endian header length, a JSON header
/// naming each tensor's dtype, shape and byte range, then the data.
struct Safetensors {
    data_start: usize,
    tensors: Vec<SafeTensor>,
}

struct SafeTensor {
    name: String,
    dtype: String,
    shape: Vec<usize>,
    begin: usize,
    end: usize,
}

impl Safetensors {
    fn parse(bytes: &[u8]) -> Result<Safetensors> {
        let short = || invalid("model.safetensors is truncated".into());
        let len =
            u64::from_le_bytes(bytes.get(..8).ok_or_else(short)?.try_into().map_err(|_| short())?) as usize;
        let header = bytes.get(8..8usize.saturating_add(len)).ok_or_else(short)?;
        #[derive(Deserialize)]
        struct Entry {
            dtype: String,
            shape: Vec<usize>,
            data_offsets: (usize, usize),
        }
        let raw: HashMap<String, serde_json::Value> = json(header, "model.safetensors' header")?;
        let data_start = 8 + len;
        let mut tensors = Vec::new();
        for (name, value) in raw {
            if name == "__metadata__" {
                continue;
            }
            let e: Entry =
                serde_json::from_value(value).map_err(|e| invalid(format!("tensor {name}: {e}")))?;
            let (begin, end) = e.data_offsets;
            if begin > end || data_start + end > bytes.len() {
                return Err(invalid(format!("tensor {name}'s data lies outside the file")));
            }
            tensors.push(SafeTensor { name, dtype: e.dtype, shape: e.shape, begin, end });
        }
        // A fixed order, so the output is the same bytes on every machine.
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Safetensors { data_start, tensors })
    }
}

/// Writes GGUF version 3: header, key-value metadata, tensor infos, then tensor data, each
/// tensor aligned to [`ALIGN`] bytes.
#[derive(Default)]
struct GgufWriter {
    kv: Vec<u8>,
    n_kv: u64,
    infos: Vec<u8>,
    data: Vec<u8>,
    n_tensors: u64,
}

const GGUF_U32: u32 = 4;
const GGUF_I32: u32 = 5;
const GGUF_F32: u32 = 6;
const GGUF_BOOL: u32 = 7;
const GGUF_STRING: u32 = 8;
const GGUF_ARRAY: u32 = 9;
const GGML_F32: u32 = 0;

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

impl GgufWriter {
    fn key(&mut self, key: &str, kind: u32) {
        put_str(&mut self.kv, key);
        self.kv.extend_from_slice(&kind.to_le_bytes());
        self.n_kv += 1;
    }

    fn kv_u32(&mut self, key: &str, v: u32) {
        self.key(key, GGUF_U32);
        self.kv.extend_from_slice(&v.to_le_bytes());
    }

    fn kv_f32(&mut self, key: &str, v: f32) {
        self.key(key, GGUF_F32);
        self.kv.extend_from_slice(&v.to_le_bytes());
    }

    fn kv_bool(&mut self, key: &str, v: bool) {
        self.key(key, GGUF_BOOL);
        self.kv.push(v as u8);
    }

    fn kv_str(&mut self, key: &str, v: &str) {
        self.key(key, GGUF_STRING);
        put_str(&mut self.kv, v);
    }

    fn kv_strs(&mut self, key: &str, v: &[String]) {
        self.key(key, GGUF_ARRAY);
        self.kv.extend_from_slice(&GGUF_STRING.to_le_bytes());
        self.kv.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for s in v {
            put_str(&mut self.kv, s);
        }
    }

    fn kv_i32s(&mut self, key: &str, v: &[i32]) {
        self.key(key, GGUF_ARRAY);
        self.kv.extend_from_slice(&GGUF_I32.to_le_bytes());
        self.kv.extend_from_slice(&(v.len() as u64).to_le_bytes());
        for x in v {
            self.kv.extend_from_slice(&x.to_le_bytes());
        }
    }

    /// Adds an f32 tensor of row-major `shape` (PyTorch's order) from little-endian `data`.
    /// GGUF lists dimensions fastest-first, so they are reversed.
    fn tensor(&mut self, name: &str, shape: &[usize], data: &[u8]) {
        let pad = self.data.len().next_multiple_of(ALIGN);
        self.data.resize(pad, 0);
        put_str(&mut self.infos, name);
        self.infos.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        for &d in shape.iter().rev() {
            self.infos.extend_from_slice(&(d as u64).to_le_bytes());
        }
        self.infos.extend_from_slice(&GGML_F32.to_le_bytes());
        self.infos.extend_from_slice(&(self.data.len() as u64).to_le_bytes());
        self.data.extend_from_slice(data);
        self.n_tensors += 1;
    }

    fn finish(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.kv.len() + self.infos.len() + ALIGN + self.data.len());
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&self.n_tensors.to_le_bytes());
        out.extend_from_slice(&self.n_kv.to_le_bytes());
        out.extend_from_slice(&self.kv);
        out.extend_from_slice(&self.infos);
        out.resize(out.len().next_multiple_of(ALIGN), 0);
        out.extend_from_slice(&self.data);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gguf_header_lists_its_metadata_and_tensors_in_order() {
        let mut w = GgufWriter::default();
        w.kv_u32("a.b", 7);
        let data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        w.tensor("t", &[2, 3], &data);
        let out = w.finish();
        assert_eq!(&out[..4], b"GGUF");
        assert_eq!(u32::from_le_bytes(out[4..8].try_into().unwrap()), 3);
        assert_eq!(u64::from_le_bytes(out[8..16].try_into().unwrap()), 1, "one tensor");
        assert_eq!(u64::from_le_bytes(out[16..24].try_into().unwrap()), 1, "one key");
        // Data begins aligned and holds the six values as they came.
        assert_eq!(&out[out.len() - 24..], &data[..]);
        assert_eq!((out.len() - 24) % ALIGN, 0);
    }

    #[test]
    fn a_zip_without_the_model_is_refused_by_name() {
        let err = convert(b"not a zip".to_vec()).unwrap_err();
        assert!(err.to_string().contains("not a zip"), "{err}");
    }
}
