//! Our sentence encoder: BERT (all-MiniLM-L6-v2 and its kin) on the CPU in f32 — token ids
//! in, pooled vectors out.
//!
//! llama.cpp's BERT graph computes the same function, and embedding models still run on it on
//! other devices and for other architectures ([`crate::EmbeddingModel`]). On a CPU ours is
//! faster where a batch of texts is embedded, for three reasons, each measured
//! (docs/benchmarks.md): attention is computed per text, where llama.cpp's mask spans every
//! text of a pass and its attention grows with the square of the pass; the products run on
//! packed f32 kernels ([`crate::gemm::dense`]) rather than tinyBLAS; and a pass of several
//! texts is split between threads by texts, each thread taking its texts through every layer
//! with no barrier between ops. One text alone is split by the products' columns instead.
//!
//! The arithmetic is BERT's as sentence-transformers computes it (GELU with erf, LayerNorm
//! in f32), so vectors agree with the reference's to float rounding.

mod math;

use pocket_core::Token;
use rayon::prelude::*;

use crate::ffi::gguf::GgufFile;
use crate::ffi::types;
use crate::gemm::dense::matmul;
use llama_cpp_sys_2 as sys;

/// How a text's token vectors become its vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pooling {
    /// Their mean.
    Mean,
    /// The first token's ([CLS]).
    Cls,
    /// The last token's.
    Last,
}

/// A LayerNorm's scale and shift.
struct Norm {
    w: Vec<f32>,
    b: Vec<f32>,
}

/// One encoder layer's weights, matrices input-major (`n_in × n_out`, row-major: GGUF's
/// transposed, the layout the products run fastest on, see [`crate::gemm::dense`]).
struct Layer {
    /// Q, K and V side by side (`n_embd × 3·n_embd`): one product for the three.
    wqkv: Vec<f32>,
    bqkv: Vec<f32>,
    wo: Vec<f32>,
    bo: Vec<f32>,
    attn_norm: Norm,
    w_up: Vec<f32>,
    b_up: Vec<f32>,
    w_down: Vec<f32>,
    b_down: Vec<f32>,
    out_norm: Norm,
}

/// A BERT encoder's weights, in f32 in memory.
pub(crate) struct Encoder {
    n_embd: usize,
    n_head: usize,
    n_ff: usize,
    /// Positions it has embeddings for: the most tokens a text may have.
    n_pos: usize,
    n_vocab: usize,
    eps: f32,
    pooling: Pooling,
    tok_embd: Vec<f32>,
    pos_embd: Vec<f32>,
    /// The embedding of token type 0, which every token of a single text has.
    type_embd: Vec<f32>,
    embd_norm: Norm,
    layers: Vec<Layer>,
}

impl Encoder {
    /// The encoder of the BERT model in `file`, pooling as `pooling`; `Err` says why this file
    /// is not one ours computes (another architecture, a tensor missing, quantized weights),
    /// and the model then runs on llama.cpp's graph.
    pub(crate) fn load(file: &GgufFile, pooling: Pooling) -> Result<Encoder, String> {
        let arch = file.get_str("general.architecture").unwrap_or_default();
        if arch != "bert" {
            return Err(format!("architecture {arch:?}: ours computes \"bert\""));
        }
        let key = |k: &str| file.get_u64(&format!("bert.{k}")).map(|v| v as usize);
        let need = |k: &str| key(k).filter(|&v| v > 0).ok_or_else(|| format!("no bert.{k}"));
        let (n_embd, n_head, n_ff, n_layer) = (
            need("embedding_length")?,
            need("attention.head_count")?,
            need("feed_forward_length")?,
            need("block_count")?,
        );
        if !n_embd.is_multiple_of(n_head) {
            return Err(format!("{n_embd} dimensions do not split into {n_head} heads"));
        }
        let eps = file.get_f32("bert.attention.layer_norm_epsilon").unwrap_or(1e-12);
        let tok = file.tensor("token_embd.weight").ok_or("no token_embd.weight")?;
        let n_vocab = tok.ne()[1] as usize;
        let pos = file.tensor("position_embd.weight").ok_or("no position_embd.weight")?;
        let n_pos = pos.ne()[1] as usize;
        let read = |name: &str, shape: &[usize]| read_f32(file, name, shape);
        let norm = |name: &str| -> Result<Norm, String> {
            Ok(Norm {
                w: read(&format!("{name}.weight"), &[n_embd])?,
                b: read(&format!("{name}.bias"), &[n_embd])?,
            })
        };
        let mut layers = Vec::with_capacity(n_layer);
        for il in 0..n_layer {
            let blk = |t: &str| format!("blk.{il}.{t}");
            let mut wqkv = Vec::with_capacity(3 * n_embd * n_embd);
            let mut bqkv = Vec::with_capacity(3 * n_embd);
            for part in ["attn_q", "attn_k", "attn_v"] {
                wqkv.extend(read(&blk(&format!("{part}.weight")), &[n_embd, n_embd])?);
                bqkv.extend(read(&blk(&format!("{part}.bias")), &[n_embd])?);
            }
            let matrix = |name: &str, n_in: usize, n_out: usize| -> Result<Vec<f32>, String> {
                Ok(transpose(&read(&blk(name), &[n_in, n_out])?, n_out, n_in))
            };
            layers.push(Layer {
                wqkv: transpose(&wqkv, 3 * n_embd, n_embd),
                bqkv,
                wo: matrix("attn_output.weight", n_embd, n_embd)?,
                bo: read(&blk("attn_output.bias"), &[n_embd])?,
                attn_norm: norm(&blk("attn_output_norm"))?,
                w_up: matrix("ffn_up.weight", n_embd, n_ff)?,
                b_up: read(&blk("ffn_up.bias"), &[n_ff])?,
                w_down: matrix("ffn_down.weight", n_ff, n_embd)?,
                b_down: read(&blk("ffn_down.bias"), &[n_embd])?,
                out_norm: norm(&blk("layer_output_norm"))?,
            });
        }
        let type_embd = match file.tensor("token_types.weight") {
            Some(t) => read("token_types.weight", &[n_embd, t.ne()[1] as usize])?[..n_embd].to_vec(),
            None => vec![0.0; n_embd],
        };
        Ok(Encoder {
            n_embd,
            n_head,
            n_ff,
            n_pos,
            n_vocab,
            eps,
            pooling,
            tok_embd: read("token_embd.weight", &[n_embd, n_vocab])?,
            pos_embd: read("position_embd.weight", &[n_embd, n_pos])?,
            type_embd,
            embd_norm: norm("token_embd_norm")?,
            layers,
        })
    }

    /// Bytes of its weights in memory.
    pub(crate) fn bytes(&self) -> u64 {
        let norm = |n: &Norm| n.w.len() + n.b.len();
        let layer = |l: &Layer| {
            l.wqkv.len()
                + l.bqkv.len()
                + l.wo.len()
                + l.bo.len()
                + norm(&l.attn_norm)
                + l.w_up.len()
                + l.b_up.len()
                + l.w_down.len()
                + l.b_down.len()
                + norm(&l.out_norm)
        };
        let n = self.tok_embd.len()
            + self.pos_embd.len()
            + self.type_embd.len()
            + norm(&self.embd_norm)
            + self.layers.iter().map(layer).sum::<usize>();
        (n * size_of::<f32>()) as u64
    }

    /// The most tokens a text may have (its position embeddings).
    pub(crate) fn max_tokens(&self) -> usize {
        self.n_pos
    }

    /// The vocabulary's size.
    pub(crate) fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// Layers and dimensions.
    pub(crate) fn dims(&self) -> (usize, usize) {
        (self.layers.len(), self.n_embd)
    }

    /// Bytes a pass of `n` tokens works in: its activations (the hidden state, Q, K and V, the
    /// attention's output, the feed-forward's hidden layer) and one text's attention scores.
    pub(crate) fn pass_bytes(&self, n: usize) -> u64 {
        ((n * (5 * self.n_embd + self.n_ff) + self.n_pos) * size_of::<f32>()) as u64
    }

    /// The pooled (not normalized) vector of each of `texts` (token ids in the vocabulary, at
    /// most [`Encoder::max_tokens`] each, as the caller checked), computed on `threads` threads
    /// of the rayon pool this is called in.
    pub(crate) fn embed(&self, texts: &[&[Token]], threads: usize) -> Vec<Vec<f32>> {
        if threads <= 1 || texts.is_empty() {
            return self.forward(texts, 1);
        }
        if texts.len() < threads {
            return self.forward(texts, threads);
        }
        split_by_tokens(texts, threads)
            .into_par_iter()
            .map(|group| self.forward(group, 1))
            .collect::<Vec<_>>()
            .concat()
    }

    /// Every layer over the tokens of `texts`, then each text's pooled vector; the products
    /// split by columns, attention and GELU by rows, between `threads` tasks.
    fn forward(&self, texts: &[&[Token]], threads: usize) -> Vec<Vec<f32>> {
        let d = self.n_embd;
        let parallel_rows = threads > 1;
        // Each row's text, as (first row, tokens).
        let mut row_text = Vec::new();
        for t in texts {
            let first = row_text.len();
            row_text.extend(std::iter::repeat_n((first, t.len()), t.len()));
        }
        let n = row_text.len();
        let mut x = vec![0f32; n * d];
        let tokens = texts.iter().flat_map(|t| t.iter());
        for (row, ((&(first, _), &id), out)) in
            row_text.iter().zip(tokens).zip(x.chunks_exact_mut(d)).enumerate()
        {
            let (id, pos) = (id as usize, row - first);
            let (t, p) = (&self.tok_embd[id * d..][..d], &self.pos_embd[pos * d..][..d]);
            for (((o, t), p), ty) in out.iter_mut().zip(t).zip(p).zip(&self.type_embd) {
                *o = t + p + ty;
            }
        }
        math::layer_norm(&mut x, &self.embd_norm.w, &self.embd_norm.b, self.eps);
        let mut qkv = vec![0f32; n * 3 * d];
        let mut attn = vec![0f32; n * d];
        let mut ff = vec![0f32; n * self.n_ff];
        for l in &self.layers {
            fill_rows(&mut qkv, &l.bqkv);
            matmul(&mut qkv, &x, &l.wqkv, n, d, 3 * d, true, threads);
            self.attention(&qkv, &mut attn, &row_text, parallel_rows);
            add_rows(&mut x, &l.bo);
            matmul(&mut x, &attn, &l.wo, n, d, d, true, threads);
            math::layer_norm(&mut x, &l.attn_norm.w, &l.attn_norm.b, self.eps);
            fill_rows(&mut ff, &l.b_up);
            matmul(&mut ff, &x, &l.w_up, n, d, self.n_ff, true, threads);
            if parallel_rows {
                ff.par_chunks_mut(self.n_ff).for_each(math::gelu);
            } else {
                math::gelu(&mut ff);
            }
            add_rows(&mut x, &l.b_down);
            matmul(&mut x, &ff, &l.w_down, n, self.n_ff, d, true, threads);
            math::layer_norm(&mut x, &l.out_norm.w, &l.out_norm.b, self.eps);
        }
        let mut first = 0;
        texts
            .iter()
            .map(|t| {
                let rows = &x[first * d..(first + t.len()) * d];
                first += t.len();
                match self.pooling {
                    Pooling::Cls => rows[..d].to_vec(),
                    Pooling::Last => rows[rows.len() - d..].to_vec(),
                    Pooling::Mean => {
                        let mut v = vec![0f32; d];
                        for r in rows.chunks_exact(d) {
                            math::axpy(&mut v, 1.0, r);
                        }
                        let inv = 1.0 / t.len() as f32;
                        v.iter_mut().for_each(|x| *x *= inv);
                        v
                    }
                }
            })
            .collect()
    }

    /// Self-attention of every row over the rows of its own text: `out` (`n × n_embd`) from
    /// `qkv` (`n × 3·n_embd`, each row Q, K, V).
    fn attention(&self, qkv: &[f32], out: &mut [f32], row_text: &[(usize, usize)], parallel: bool) {
        let d = self.n_embd;
        let hd = d / self.n_head;
        let scale = 1.0 / (hd as f32).sqrt();
        let one_row = |(row, out): (usize, &mut [f32])| {
            let (first, len) = row_text[row];
            let mut scores = vec![0f32; len];
            for h in 0..self.n_head {
                let q = &qkv[row * 3 * d + h * hd..][..hd];
                for (j, s) in scores.iter_mut().enumerate() {
                    *s = math::dot(q, &qkv[(first + j) * 3 * d + d + h * hd..][..hd]) * scale;
                }
                math::softmax(&mut scores);
                let o = &mut out[h * hd..][..hd];
                o.fill(0.0);
                for (j, &p) in scores.iter().enumerate() {
                    math::axpy(o, p, &qkv[(first + j) * 3 * d + 2 * d + h * hd..][..hd]);
                }
            }
        };
        if parallel {
            out.par_chunks_mut(d).enumerate().for_each(one_row);
        } else {
            out.chunks_mut(d).enumerate().for_each(one_row);
        }
    }
}

/// `m` (`rows × cols`, row-major) transposed.
fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; m.len()];
    for (r, row) in m.chunks_exact(cols).enumerate().take(rows) {
        for (c, &v) in row.iter().enumerate() {
            t[c * rows + r] = v;
        }
    }
    t
}

/// Every row of `x` set to `b`.
fn fill_rows(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        row.copy_from_slice(b);
    }
}

/// `b` added to every row of `x`.
fn add_rows(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        math::axpy(row, 1.0, b);
    }
}

/// `texts` cut into `groups` runs of consecutive texts (at least one each; `texts` has at
/// least `groups`) with about as many tokens each.
fn split_by_tokens<'a, 'b>(texts: &'b [&'a [Token]], groups: usize) -> Vec<&'b [&'a [Token]]> {
    let total: usize = texts.iter().map(|t| t.len()).sum();
    let mut out = Vec::with_capacity(groups);
    let (mut start, mut seen) = (0, 0);
    for (i, t) in texts.iter().enumerate() {
        seen += t.len();
        let left = groups - out.len() - 1;
        let due = seen * groups >= total * (out.len() + 1);
        if left > 0 && (due || texts.len() - i - 1 == left) {
            out.push(&texts[start..=i]);
            start = i + 1;
        }
    }
    out.push(&texts[start..]);
    out
}

/// Tensor `name` of `file` as f32, checked to be of `shape` (ggml's order: the row length
/// first).
fn read_f32(file: &GgufFile, name: &str, shape: &[usize]) -> Result<Vec<f32>, String> {
    let t = file.tensor(name).ok_or_else(|| format!("no {name}"))?;
    let ne = t.ne();
    let want: Vec<i64> = shape.iter().map(|&v| v as i64).chain(std::iter::repeat(1)).take(4).collect();
    if ne[..] != want[..] {
        return Err(format!("{name} is {ne:?}, not {want:?}"));
    }
    let bytes = file.tensor_bytes(name).ok_or_else(|| format!("no data for {name}"))?;
    let n: usize = shape.iter().product();
    let ty = t.ty();
    if bytes.len() != types::bytes_of(ty, n) {
        return Err(format!("{name} has {} bytes for {n} values of type {ty}", bytes.len()));
    }
    let mut out = vec![0f32; n];
    if ty == sys::GGML_TYPE_F32 {
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    } else if ty == sys::GGML_TYPE_F16 || ty == sys::GGML_TYPE_BF16 {
        types::to_float(ty, bytes, &mut out);
    } else {
        // A quantized file was chosen to be small: in f32 it would take 4–8× its size, so it
        // stays on llama.cpp's graph, which multiplies it as stored.
        return Err(format!("{name} is quantized (ggml type {ty}); ours computes f32, f16 and bf16 weights"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_split_into_nonempty_groups_of_about_equal_tokens() {
        let a = [1u32; 10];
        let b = [1u32; 2];
        let texts: Vec<&[Token]> = vec![&a, &b, &b, &b, &b, &b, &a];
        let groups = split_by_tokens(&texts, 2);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups.iter().map(|g| g.len()).sum::<usize>(), texts.len());
        let tokens: Vec<usize> = groups.iter().map(|g| g.iter().map(|t| t.len()).sum()).collect();
        assert_eq!(tokens, vec![16, 14]);
        for n in 1..=7 {
            let groups = split_by_tokens(&texts, n);
            assert_eq!(groups.len(), n);
            assert!(groups.iter().all(|g| !g.is_empty()), "{n}: {groups:?}");
            assert_eq!(groups.concat(), texts);
        }
    }
}
