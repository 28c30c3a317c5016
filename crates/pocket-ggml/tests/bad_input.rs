//! Bad input gets an error that says what was wrong, never a panic or an abort inside ggml:
//! files that are not models (or not whole ones), models this engine cannot run, and decode
//! arguments outside what the session allows.

mod common;

use std::io::Write as _;
use std::path::Path;

use common::*;
use pocket_core::{Error as CoreError, Model, Rows, Session};
use pocket_ggml::{Error, GgmlModel, LoadOptions};

fn load(path: &Path) -> Result<GgmlModel, Error> {
    GgmlModel::load(path, &LoadOptions::default())
}

/// The load error for `path`, which must not load.
#[track_caller]
fn load_err(path: &Path) -> Error {
    match load(path) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e,
    }
}

/// A file with `bytes` in a temporary directory (removed when the returned guard drops).
fn file_with(name: &str, bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::File::create(&path).unwrap().write_all(bytes).unwrap();
    (dir, path)
}

/// A GGUF file written by hand (version 3, little-endian): metadata and tensors as given.
#[derive(Default)]
struct Gguf {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<u8>,
    n_tensors: u64,
    data: Vec<u8>,
}

const ALIGNMENT: usize = 32;
const TYPE_UINT32: u32 = 4;
const TYPE_STRING: u32 = 8;
const GGML_TYPE_F32: u32 = 0;

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl Gguf {
    fn string(mut self, key: &str, value: &str) -> Self {
        put_str(&mut self.kv, key);
        self.kv.extend(TYPE_STRING.to_le_bytes());
        put_str(&mut self.kv, value);
        self.n_kv += 1;
        self
    }

    fn u32(mut self, key: &str, value: u32) -> Self {
        put_str(&mut self.kv, key);
        self.kv.extend(TYPE_UINT32.to_le_bytes());
        self.kv.extend(value.to_le_bytes());
        self.n_kv += 1;
        self
    }

    /// An f32 tensor of shape `ne` (innermost first), filled with zeros.
    fn tensor_f32(mut self, name: &str, ne: &[u64]) -> Self {
        put_str(&mut self.tensors, name);
        self.tensors.extend((ne.len() as u32).to_le_bytes());
        for &n in ne {
            self.tensors.extend(n.to_le_bytes());
        }
        self.tensors.extend(GGML_TYPE_F32.to_le_bytes());
        self.tensors.extend((self.data.len() as u64).to_le_bytes());
        let bytes = ne.iter().product::<u64>() as usize * 4;
        self.data.resize((self.data.len() + bytes).next_multiple_of(ALIGNMENT), 0);
        self.n_tensors += 1;
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(self.n_tensors.to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kv);
        out.extend(&self.tensors);
        out.resize(out.len().next_multiple_of(ALIGNMENT), 0);
        out.extend(&self.data);
        out
    }
}

/// Hyperparameters of a tiny llama: 1 layer, width 64, 2 heads of 32, vocabulary 16.
fn tiny_llama() -> Gguf {
    Gguf::default()
        .string("general.architecture", "llama")
        .u32("llama.block_count", 1)
        .u32("llama.embedding_length", 64)
        .u32("llama.attention.head_count", 2)
        .u32("llama.feed_forward_length", 128)
        .u32("llama.context_length", 128)
        .u32("llama.vocab_size", 16)
}

#[test]
fn a_missing_file_is_an_io_error_naming_it() {
    let path = Path::new("/nonexistent/pocketd/model.gguf");
    let err = load_err(path);
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("/nonexistent/pocketd/model.gguf"), "{err}");
}

#[test]
fn a_directory_is_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = load_err(dir.path());
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
}

#[test]
fn an_empty_file_is_not_gguf() {
    let (_dir, path) = file_with("empty.gguf", b"");
    let err = load_err(&path);
    assert!(matches!(err, Error::NotGguf { .. }), "{err:?}");
    assert!(err.to_string().contains("not a GGUF model"), "{err}");
}

#[test]
fn a_text_file_is_not_gguf_and_the_message_shows_what_it_starts_with() {
    let (_dir, path) = file_with("notes.gguf", b"hello, this is not a model\n");
    let err = load_err(&path);
    assert!(matches!(err, Error::NotGguf { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("not a GGUF model") && msg.contains("\"hell\""), "{msg}");
}

#[test]
fn a_gguf_cut_inside_its_header_is_corrupt() {
    let real = std::fs::read(model_path(SMOL)).unwrap();
    // The header holds the whole vocabulary (several MB): 100 kB in is mid-metadata; 7 bytes
    // is mid-version.
    for cut in [7, 100_000] {
        let (_dir, path) = file_with("cut.gguf", &real[..cut]);
        let err = load_err(&path);
        assert!(matches!(err, Error::Corrupt { .. }), "cut at {cut}: {err:?}");
        assert!(err.to_string().contains("damaged GGUF"), "{err}");
    }
}

#[test]
fn a_gguf_cut_inside_its_tensor_data_is_corrupt_and_says_truncated() {
    let real = std::fs::read(model_path(SMOL)).unwrap();
    for cut in [real.len() / 2, real.len() - 100] {
        let (_dir, path) = file_with("cut.gguf", &real[..cut]);
        let err = load_err(&path);
        assert!(matches!(err, Error::Corrupt { .. }), "cut at {cut}: {err:?}");
        let msg = err.to_string();
        assert!(msg.contains("truncated") && msg.contains("past the end of the file"), "{msg}");
    }
}

#[test]
fn an_unsupported_architecture_is_named_with_the_supported_ones() {
    let (_dir, path) =
        file_with("mamba.gguf", &Gguf::default().string("general.architecture", "mamba").bytes());
    let err = load_err(&path);
    assert!(matches!(&err, Error::UnsupportedArchitecture { arch, .. } if arch == "mamba"), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("mamba") && msg.contains("llama") && msg.contains("qwen2"), "{msg}");
}

#[test]
fn a_gguf_without_an_architecture_is_a_bad_model() {
    let (_dir, path) = file_with("anon.gguf", &Gguf::default().string("general.name", "nobody").bytes());
    let err = load_err(&path);
    assert!(matches!(err, Error::BadModel { .. }), "{err:?}");
    assert!(err.to_string().contains("general.architecture"), "{err}");
}

#[test]
fn a_llama_without_its_hyperparameters_names_the_missing_key() {
    let (_dir, path) =
        file_with("bare.gguf", &Gguf::default().string("general.architecture", "llama").bytes());
    let err = load_err(&path);
    assert!(matches!(err, Error::BadModel { .. }), "{err:?}");
    assert!(err.to_string().contains("llama.block_count"), "{err}");
}

#[test]
fn a_llama_without_its_tensors_names_the_missing_one() {
    let (_dir, path) = file_with("hollow.gguf", &tiny_llama().bytes());
    let err = load_err(&path);
    assert!(matches!(err, Error::BadModel { .. }), "{err:?}");
    assert!(err.to_string().contains("token_embd.weight is missing"), "{err}");
}

#[test]
fn a_tensor_of_the_wrong_shape_is_an_error_not_a_ggml_abort() {
    // The embedding must be [64, 16] (width × vocabulary); this one has 8 rows.
    let gguf = tiny_llama().tensor_f32("token_embd.weight", &[64, 8]);
    let (_dir, path) = file_with("misshapen.gguf", &gguf.bytes());
    let err = load_err(&path);
    assert!(matches!(err, Error::BadModel { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("token_embd.weight") && msg.contains("[64, 8]") && msg.contains("[64, 16]"),
        "{msg}"
    );
}

#[test]
fn a_prompt_longer_than_the_context_is_a_context_overflow() {
    let _serial = serial();
    let model = smol();
    let plan = full(&model);
    let text = prose(&model, 17);
    let mut s = session(&model, &config(16));
    let err = s.decode(&text, &plan, Rows::Last).unwrap_err();
    assert_eq!(err, CoreError::ContextOverflow { needed: 17, limit: 16, prompt: 17 });
    assert!(s.is_empty(), "nothing was decoded");

    // Also when what the session already holds leaves too little room.
    s.decode(&text[..10], &plan, Rows::None).unwrap();
    let err = s.decode(&text[10..17], &plan, Rows::Last).unwrap_err();
    assert_eq!(err, CoreError::ContextOverflow { needed: 17, limit: 16, prompt: 7 });
    assert_eq!(s.len(), 10);
    // Filling the context exactly is fine.
    s.decode(&text[10..16], &plan, Rows::Last).unwrap();
    assert_eq!(s.len(), 16);
}

#[test]
fn a_token_outside_the_vocabulary_is_an_error() {
    let _serial = serial();
    let model = smol();
    let n_vocab = model.info().n_vocab;
    let plan = full(&model);
    let mut s = session(&model, &config(16));
    for bad in [n_vocab as u32, u32::MAX] {
        let err = s.decode(&[1, 2, bad], &plan, Rows::Last).unwrap_err();
        assert!(matches!(err, CoreError::InvalidArgument { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains(&bad.to_string()) && msg.contains("vocabulary"), "{msg}");
    }
    assert!(s.is_empty());
    s.decode(&[1, 2, n_vocab as u32 - 1], &plan, Rows::Last).unwrap();
}

#[test]
fn an_empty_batch_is_an_error() {
    let _serial = serial();
    let model = smol();
    let mut s = session(&model, &config(16));
    let err = s.decode(&[], &full(&model), Rows::Last).unwrap_err();
    assert!(matches!(err, CoreError::InvalidArgument { .. }), "{err:?}");
    assert!(err.to_string().contains("at least one token"), "{err}");
}

#[test]
fn more_rows_than_the_batch_is_an_error() {
    let _serial = serial();
    let model = smol();
    let mut s = session(&model, &config(16));
    let err = s.decode(&[1, 2, 3], &full(&model), Rows::Tail(4)).unwrap_err();
    assert!(matches!(err, CoreError::InvalidArgument { .. }), "{err:?}");
    assert!(err.to_string().contains("4 rows of a pass of 3 tokens"), "{err}");
    assert!(s.is_empty());
}

#[test]
fn a_tensor_our_graph_would_leave_out_is_refused_as_unsupported() {
    // Loading it would silently drop what the tensor does; llama.cpp itself may run the file.
    let gguf = tiny_llama().tensor_f32("blk.0.mystery.weight", &[64]);
    let (_dir, path) = file_with("extra.gguf", &gguf.bytes());
    let err = load_err(&path);
    assert!(matches!(&err, Error::Unsupported { arch, .. } if arch == "llama"), "{err:?}");
    assert!(err.not_built_here(), "{err:?}");
    assert!(err.to_string().contains("blk.0.mystery.weight"), "{err}");
}

#[test]
fn a_rope_scaling_our_graph_does_not_build_is_refused_as_unsupported() {
    let gguf = tiny_llama().string("llama.rope.scaling.type", "yarn");
    let (_dir, path) = file_with("yarn.gguf", &gguf.bytes());
    let err = load_err(&path);
    assert!(matches!(err, Error::Unsupported { .. }), "{err:?}");
    assert!(err.to_string().contains("\"yarn\""), "{err}");
}

#[test]
fn a_head_size_of_zero_is_a_bad_model() {
    let gguf = tiny_llama().u32("llama.attention.key_length", 0);
    let (_dir, path) = file_with("headless.gguf", &gguf.bytes());
    let err = load_err(&path);
    assert!(matches!(err, Error::BadModel { .. }), "{err:?}");
    assert!(err.to_string().contains("head size 0"), "{err}");
}

impl Gguf {
    /// A tensor description written as given (type, offset), with no data added for it.
    fn tensor_raw(mut self, name: &str, ne: &[u64], ty: u32, offset: u64) -> Self {
        put_str(&mut self.tensors, name);
        self.tensors.extend((ne.len() as u32).to_le_bytes());
        for &n in ne {
            self.tensors.extend(n.to_le_bytes());
        }
        self.tensors.extend(ty.to_le_bytes());
        self.tensors.extend(offset.to_le_bytes());
        self.n_tensors += 1;
        self
    }
}

#[test]
fn hostile_headers_are_refused_before_anything_is_allocated_saying_what_is_wrong() {
    let cases: [(&str, Vec<u8>, &str); 6] = [
        (
            "absurd tensor count",
            {
                let mut g = tiny_llama();
                g.n_tensors = 1 << 50;
                g.bytes()
            },
            "more than a file of",
        ),
        (
            "absurd metadata count",
            {
                let mut g = tiny_llama();
                g.n_kv = u64::MAX;
                g.bytes()
            },
            "more than a file of",
        ),
        (
            "absurd dimensions",
            tiny_llama().tensor_raw("token_embd.weight", &[1 << 40, 1 << 40], GGML_TYPE_F32, 0).bytes(),
            "overflow",
        ),
        (
            "an unknown tensor type",
            tiny_llama().tensor_raw("token_embd.weight", &[64, 16], 250, 0).bytes(),
            "tensor type 250",
        ),
        (
            "data past the end",
            tiny_llama().tensor_raw("token_embd.weight", &[64, 16], GGML_TYPE_F32, 1 << 40).bytes(),
            "past the end of the file",
        ),
        (
            "a string longer than the file",
            {
                let mut g = tiny_llama();
                put_str(&mut g.kv, "general.name");
                g.kv.extend(TYPE_STRING.to_le_bytes());
                g.kv.extend((1u64 << 60).to_le_bytes());
                g.n_kv += 1;
                g.bytes()
            },
            "only",
        ),
    ];
    for (what, bytes, says) in cases {
        let (_dir, path) = file_with("hostile.gguf", &bytes);
        let err = load_err(&path);
        assert!(matches!(err, Error::Corrupt { .. }), "{what}: {err:?}");
        assert!(err.to_string().contains(says), "{what}: {err}");
    }
}
