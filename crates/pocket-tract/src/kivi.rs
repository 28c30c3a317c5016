//! KIVI-style quantized KV cache store (Liu et al. 2024, "KIVI: A Tuning-Free Asymmetric
//! 2bit Quantization for KV Cache") for one tensor (keys or values) of one attention layer.
//!
//! Logical shape is `[heads, tokens, head_dim]` f32. Keys are quantized per channel (outliers
//! in keys live in fixed channels, so grouping along tokens keeps them from inflating the
//! scale of the other channels); values are quantized per token (value outliers are not
//! channel-aligned, and attention mixes values per token). The newest `window`..`window+31`
//! tokens stay in exact f32 so that rejecting a speculative draft only ever cuts f32 data.
//!
//! Storage: quantized blocks of [`GROUP`] tokens, each holding all heads as
//! `[head][token][channel]` codes (so a head's block dequantizes into one contiguous run of
//! the `[heads, len, head_dim]` output), plus one f32 tail buffer per head (`[tokens, head_dim]`,
//! so appending a head's slice and truncating are single `Vec` operations).

/// Tokens per quantization group; quantized data is only ever created in whole groups.
pub const GROUP: usize = 32;

/// Which attention tensor the store holds; decides the quantization grouping axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Keys: one scale/zero per (head, channel) over a group of 32 tokens.
    Key,
    /// Values: one scale/zero per (head, token) over each group of 32 channels.
    Value,
}

/// Storage precision of the quantized part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bits {
    /// No quantization: every token stays f32 (lets the engine use one type everywhere).
    F32,
    /// 8-bit asymmetric codes, one byte per element.
    Int8,
    /// 4-bit asymmetric codes, two per byte (low nibble = even element).
    Int4,
}

impl Bits {
    /// Code width in bits; 0 for F32, which never quantizes.
    fn width(self) -> usize {
        match self {
            Bits::F32 => 0,
            Bits::Int8 => 8,
            Bits::Int4 => 4,
        }
    }

    /// Largest code, `2^bits - 1`.
    fn qmax(self) -> f32 {
        ((1u32 << self.width()) - 1) as f32
    }
}

/// Quantized KV store for one tensor of one layer, batch 1.
#[derive(Clone, Debug)]
pub struct KvStore {
    kind: Kind,
    bits: Bits,
    heads: usize,
    head_dim: usize,
    window: usize,
    /// Quantized blocks back to back, `block_bytes()` each.
    qdata: Vec<u8>,
    /// Per-group scales and minimums (zero points), `pairs_per_block()` of each per block,
    /// head-major within a block; kept apart so dequantization reads them as plain slices.
    scales: Vec<f32>,
    mins: Vec<f32>,
    /// Per head, the f32 tokens after the quantized part, `[tokens, head_dim]`.
    tail: Vec<Vec<f32>>,
}

/// `1 / scale`, or 0 for a constant group so every element gets code 0 (= its min).
fn recip(scale: f32) -> f32 {
    if scale > 0.0 { 1.0 / scale } else { 0.0 }
}

/// Code of `x` in a group with minimum `min` (`x >= min`): round half up, saturate at `qmax`.
fn code(x: f32, min: f32, inv: f32, qmax: f32) -> u8 {
    ((x - min) * inv + 0.5).min(qmax) as u8
}

impl KvStore {
    /// Creates an empty store. `window` is the minimum number of newest tokens kept in exact
    /// f32 (the engine uses at least the longest draft + 1). Panics if `heads` or `head_dim` is 0.
    pub fn new(kind: Kind, bits: Bits, heads: usize, head_dim: usize, window: usize) -> Self {
        assert!(heads > 0 && head_dim > 0, "heads and head_dim must be non-zero");
        let tail = vec![Vec::new(); heads];
        let (qdata, scales, mins) = (Vec::new(), Vec::new(), Vec::new());
        Self { kind, bits, heads, head_dim, window, qdata, scales, mins, tail }
    }

    /// Bytes of codes in one quantized block (0 in F32 mode, which has no blocks; GROUP is
    /// even, so Int4 never leaves a half-filled byte).
    fn block_bytes(&self) -> usize {
        GROUP * self.heads * self.head_dim * self.bits.width() / 8
    }

    /// `(scale, min)` pairs in one quantized block.
    fn pairs_per_block(&self) -> usize {
        match self.kind {
            Kind::Key => self.heads * self.head_dim,
            Kind::Value => self.heads * GROUP * self.head_dim.div_ceil(GROUP),
        }
    }

    /// Number of quantized blocks held.
    fn blocks(&self) -> usize {
        self.qdata.len().checked_div(self.block_bytes()).unwrap_or(0)
    }

    /// Tokens held in quantized form (always a multiple of [`GROUP`]).
    pub fn quantized_len(&self) -> usize {
        self.blocks() * GROUP
    }

    /// Tokens held in the exact f32 tail.
    pub fn tail_len(&self) -> usize {
        self.tail[0].len() / self.head_dim
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.quantized_len() + self.tail_len()
    }

    /// True when no tokens are held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `n` tokens; `data` is `[heads, n, head_dim]` row-major (an ONNX
    /// `present.*.key` slice for batch 1) and should be finite (min/max quantization).
    pub fn append(&mut self, data: &[f32], n: usize) {
        self.append_from(data, n, 0);
    }

    /// Appends tokens `[from, total)` of a `[heads, total, head_dim]` tensor, so the engine
    /// can hand over the model's whole present tensor and store only its new tail.
    pub fn append_from(&mut self, data: &[f32], total: usize, from: usize) {
        let hd = self.head_dim;
        assert!(from <= total, "from {from} > total {total}");
        assert_eq!(data.len(), self.heads * total * hd, "data is not [heads, total, head_dim]");
        for (h, t) in self.tail.iter_mut().enumerate() {
            t.extend_from_slice(&data[(h * total + from) * hd..(h + 1) * total * hd]);
        }
        self.flush();
    }

    /// Moves whole groups from the tail's front into quantized blocks while at least
    /// `window` tokens stay behind. All movable groups are quantized first and drained in one
    /// go, so a long prompt costs one memmove per head rather than one per group.
    fn flush(&mut self) {
        let tl = self.tail_len();
        if self.bits == Bits::F32 || tl < self.window + GROUP {
            return;
        }
        let k = (tl - self.window) / GROUP;
        for b in 0..k {
            self.quantize_block(b * GROUP);
        }
        for t in &mut self.tail {
            t.drain(..k * GROUP * self.head_dim);
        }
    }

    /// Quantizes tail tokens `[start, start + GROUP)` of every head into a new block. Codes
    /// go to a scratch buffer first (one allocation per 32 tokens) and are then packed.
    fn quantize_block(&mut self, start: usize) {
        let (hd, n, qmax) = (self.head_dim, GROUP * self.head_dim, self.bits.qmax());
        let base = self.qdata.len();
        self.qdata.resize(base + self.block_bytes(), 0);
        let (mut codes, mut inv) = (vec![0u8; n], Vec::with_capacity(hd));
        for (h, t) in self.tail.iter().enumerate() {
            let src = &t[start * hd..start * hd + n];
            let p0 = self.scales.len();
            match self.kind {
                Kind::Key => {
                    // Per-channel min/max taken row by row so inner loops run along contiguous
                    // channels; `scales` holds the running max until converted below.
                    self.mins.extend_from_slice(&src[..hd]);
                    self.scales.extend_from_slice(&src[..hd]);
                    let (lo, hi) = (&mut self.mins[p0..], &mut self.scales[p0..]);
                    for row in src.chunks_exact(hd).skip(1) {
                        for ((l, u), &x) in lo.iter_mut().zip(hi.iter_mut()).zip(row) {
                            (*l, *u) = (l.min(x), u.max(x));
                        }
                    }
                    inv.clear();
                    for (s, &l) in hi.iter_mut().zip(lo.iter()) {
                        *s = (*s - l) / qmax;
                        inv.push(recip(*s));
                    }
                    for (crow, row) in codes.chunks_exact_mut(hd).zip(src.chunks_exact(hd)) {
                        for (((q, &x), &m), &i) in crow.iter_mut().zip(row).zip(lo.iter()).zip(&inv) {
                            *q = code(x, m, i, qmax);
                        }
                    }
                }
                Kind::Value => {
                    for (crow, row) in codes.chunks_exact_mut(hd).zip(src.chunks_exact(hd)) {
                        // The last group is shorter than GROUP when head_dim % 32 != 0.
                        for (cg, g) in crow.chunks_mut(GROUP).zip(row.chunks(GROUP)) {
                            let (lo, hi) = g
                                .iter()
                                .fold((f32::INFINITY, f32::NEG_INFINITY), |(l, u), &x| (l.min(x), u.max(x)));
                            let s = (hi - lo) / qmax;
                            self.scales.push(s);
                            self.mins.push(lo);
                            let r = recip(s);
                            cg.iter_mut().zip(g).for_each(|(q, &x)| *q = code(x, lo, r, qmax));
                        }
                    }
                }
            }
            let dst = &mut self.qdata[base..];
            match self.bits {
                Bits::Int4 => {
                    // Block element index e lives in byte e / 2, low nibble first.
                    for (d, p) in dst[h * n / 2..(h + 1) * n / 2].iter_mut().zip(codes.chunks_exact(2)) {
                        *d = p[0] | p[1] << 4;
                    }
                }
                _ => dst[h * n..(h + 1) * n].copy_from_slice(&codes),
            }
        }
    }

    /// Dequantizes head `h` of block `b` into `dst` (`GROUP * head_dim` values). Two tight
    /// passes (codes to f32, then `min + q * scale` per group) so both loops vectorize.
    fn dequant(&self, b: usize, h: usize, dst: &mut [f32]) {
        let (hd, n, ppb) = (self.head_dim, GROUP * self.head_dim, self.pairs_per_block());
        let per = ppb / self.heads;
        let p0 = b * ppb + h * per;
        let (sc, mn) = (&self.scales[p0..p0 + per], &self.mins[p0..p0 + per]);
        let q0 = b * self.block_bytes();
        match self.bits {
            Bits::Int4 => {
                for (o, &q) in dst.chunks_exact_mut(2).zip(&self.qdata[q0 + h * n / 2..q0 + (h + 1) * n / 2])
                {
                    (o[0], o[1]) = ((q & 15) as f32, (q >> 4) as f32);
                }
            }
            _ => dst
                .iter_mut()
                .zip(&self.qdata[q0 + h * n..q0 + (h + 1) * n])
                .for_each(|(o, &q)| *o = q as f32),
        }
        match self.kind {
            Kind::Key => {
                for row in dst.chunks_exact_mut(hd) {
                    row.iter_mut().zip(sc).zip(mn).for_each(|((o, &s), &m)| *o = m + *o * s);
                }
            }
            Kind::Value => {
                let ng = hd.div_ceil(GROUP);
                for ((row, rs), rm) in
                    dst.chunks_exact_mut(hd).zip(sc.chunks_exact(ng)).zip(mn.chunks_exact(ng))
                {
                    for ((g, &s), &m) in row.chunks_mut(GROUP).zip(rs).zip(rm) {
                        g.iter_mut().for_each(|o| *o = m + *o * s);
                    }
                }
            }
        }
    }

    /// Cuts the store back to `len` tokens (no-op if `len >= self.len()`). Normally only the
    /// f32 tail is cut. If that would leave fewer than `min(len, window)` f32 tokens (a deep
    /// rollback), the blocks from the one the window must start in are dequantized back into
    /// the tail and the rest dropped: kept tokens keep exactly the values `write_f32` gave, and
    /// the tail again holds `window..window + 31` tokens, so the next rejected draft is again a
    /// pure tail cut. `truncate(0)` empties the store.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len() {
            return;
        }
        let (hd, blocks) = (self.head_dim, self.blocks());
        // Same rule as `flush`: quantize only whole groups that leave >= window tokens behind.
        let b = len.saturating_sub(self.window) / GROUP;
        if b >= blocks {
            let keep = (len - blocks * GROUP) * hd;
            self.tail.iter_mut().for_each(|t| t.truncate(keep));
            return;
        }
        let keep = (len - b * GROUP) * hd;
        let mut buf = vec![0.0; GROUP * hd];
        for h in 0..self.heads {
            let mut t = Vec::with_capacity(keep + GROUP * hd);
            for blk in b..blocks {
                if t.len() >= keep {
                    break;
                }
                self.dequant(blk, h, &mut buf);
                t.extend_from_slice(&buf);
            }
            t.extend_from_slice(&self.tail[h]);
            t.truncate(keep);
            self.tail[h] = t;
        }
        self.qdata.truncate(b * self.block_bytes());
        self.scales.truncate(b * self.pairs_per_block());
        self.mins.truncate(b * self.pairs_per_block());
    }

    /// Writes all tokens, dequantized, as `[heads, len, head_dim]` row-major into `out`,
    /// which must hold exactly `heads * len * head_dim` values. Allocation-free.
    pub fn write_f32(&self, out: &mut [f32]) {
        let (hd, len, q) = (self.head_dim, self.len(), self.quantized_len());
        assert_eq!(out.len(), self.heads * len * hd, "out is not [heads, len, head_dim]");
        if len == 0 {
            return;
        }
        for (h, dst) in out.chunks_exact_mut(len * hd).enumerate() {
            for (b, blk) in dst[..q * hd].chunks_exact_mut(GROUP * hd).enumerate() {
                self.dequant(b, h, blk);
            }
            dst[q * hd..].copy_from_slice(&self.tail[h]);
        }
    }

    /// Bytes held now: codes + f32 scale/min pairs + the f32 tail, by length (not capacity).
    pub fn bytes(&self) -> usize {
        let params = self.scales.len() + self.mins.len();
        self.qdata.len() + 4 * params + 4 * self.heads * self.tail_len() * self.head_dim
    }

    /// Steady-state bytes of one more quantized token, for the memory planner: codes plus
    /// the f32 scale+min (8 bytes) per group amortised per token. Keys: one pair per channel
    /// per 32 tokens; values: one pair per 32-channel group per token.
    pub fn bytes_per_token(kind: Kind, bits: Bits, heads: usize, head_dim: usize) -> f64 {
        let elems = (heads * head_dim) as f64;
        if bits == Bits::F32 {
            return 4.0 * elems;
        }
        let codes = elems * bits.width() as f64 / 8.0;
        let pairs = match kind {
            Kind::Key => elems / GROUP as f64,
            Kind::Value => (heads * head_dim.div_ceil(GROUP)) as f64,
        };
        codes + 8.0 * pairs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ops::Range;
    const KINDS: [Kind; 2] = [Kind::Key, Kind::Value];
    const BITS: [Bits; 3] = [Bits::F32, Bits::Int8, Bits::Int4];

    /// Tiny 64-bit LCG (PCG multiplier); yields its high 31 bits.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> usize {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (self.0 >> 33) as usize
        }
        /// `n` values uniform in [-1, 1).
        fn vec(&mut self, n: usize) -> Vec<f32> {
            (0..n).map(|_| self.next() as f32 / (1u64 << 30) as f32 - 1.0).collect()
        }
    }

    fn dump(s: &KvStore) -> Vec<f32> {
        let mut out = vec![0.0; s.heads * s.len() * s.head_dim];
        s.write_f32(&mut out);
        out
    }

    /// Asserts, for every head, token `t` of `a` (`[heads, alen, hd]`) bit-equals token
    /// `t - off` of `b` (`[heads, blen, hd]`) for `t` in `ts`.
    fn same(a: &[f32], alen: usize, b: &[f32], blen: usize, hd: usize, ts: Range<usize>, off: usize) {
        for h in 0..a.len() / (alen * hd).max(1) {
            for t in ts.clone() {
                let (i, j) = ((h * alen + t) * hd, (h * blen + t - off) * hd);
                assert_eq!(a[i..i + hd], b[j..j + hd], "head {h} token {t}");
            }
        }
    }

    /// Random appends (both entry points) and truncates (draft rejections and deep rollbacks)
    /// against a naive per-head Vec model: F32 exact, quantized within half a step.
    fn random_ops(kind: Kind, bits: Bits, seed: u64) {
        let (heads, hd, window) = (3, 40, 5);
        let (mut rng, mut s) = (Lcg(seed), KvStore::new(kind, bits, heads, hd, window));
        let (mut model, mut deep) = (vec![Vec::new(); heads], 0);
        for step in 0..300 {
            let len = s.len();
            if rng.next() % 3 > 0 || len == 0 {
                let (n, from) = (1 + rng.next() % 40, rng.next() % 20);
                let total = from + n;
                let data = rng.vec(heads * total * hd);
                s.append_from(&data, total, from); // `append` is covered by the other tests
                for (h, m) in model.iter_mut().enumerate() {
                    m.extend_from_slice(&data[(h * total + from) * hd..(h + 1) * total * hd]);
                }
            } else {
                let back = if rng.next() % 8 == 0 { len } else { len.min(window) };
                let cut = len - rng.next() % (back + 1);
                let (prev, q0) = (dump(&s), s.quantized_len());
                s.truncate(cut);
                let (now, q1) = (dump(&s), s.quantized_len());
                same(&now, cut, &prev, len, hd, 0..cut, 0); // kept values never change
                deep += (q1 < q0) as usize;
                for (h, m) in model.iter_mut().enumerate() {
                    m.truncate(cut * hd);
                    if q1 < q0 {
                        // Tokens pulled back into the tail are now its data: track them as such.
                        m[q1 * hd..].copy_from_slice(&now[(h * cut + q1) * hd..(h + 1) * cut * hd]);
                    }
                }
            }
            let want = model.concat();
            assert_eq!((s.len(), s.is_empty()), (want.len() / (heads * hd), want.is_empty()));
            assert!(bits == Bits::F32 || (s.len().min(window)..window + GROUP).contains(&s.tail_len()));
            // Data is in [-1, 1): group range <= 2, so error <= half a step of 2 / qmax.
            let tol = if bits == Bits::F32 { 0.0 } else { 1.0 / bits.qmax() + 1e-5 };
            let err = dump(&s).iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(err <= tol, "{kind:?} {bits:?} step {step}: err {err}");
        }
        assert!(bits == Bits::F32 || deep >= 3, "only {deep} deep truncates");
    }

    #[test]
    fn f32_exact_and_random_ops_match_model() {
        let mut s = KvStore::new(Kind::Key, Bits::F32, 2, 8, 0);
        let data = Lcg(1).vec(2 * 100 * 8);
        s.append(&data, 100);
        assert_eq!((dump(&s), s.quantized_len(), s.bytes()), (data, 0, 6400));
        for kind in KINDS {
            for (i, bits) in BITS.into_iter().enumerate() {
                random_ops(kind, bits, 7 + i as u64);
            }
        }
    }

    #[test]
    fn group_error_within_half_step() {
        // Fully quantized (window 0); hd 70 has a 6-channel remainder value group, 33 is odd.
        for (kind, bits, hd) in KINDS
            .into_iter()
            .flat_map(|k| [(k, Bits::Int8), (k, Bits::Int4)])
            .flat_map(|(k, b)| [(k, b, 70), (k, b, 33)])
        {
            let (heads, len) = (3, 128);
            let data = Lcg(99).vec(heads * len * hd);
            let mut s = KvStore::new(kind, bits, heads, hd, 0);
            s.append(&data, len);
            let (got, d) = (dump(&s), &data);
            assert_eq!(s.quantized_len(), len);
            for i in 0..data.len() {
                let (h, t, c) = (i / (len * hd), i / hd % len, i % hd);
                // The element's group: 32 tokens of its channel (keys), <= 32 channels of its token (values).
                let (t0, c0) = (t / GROUP * GROUP, c / GROUP * GROUP);
                let (ts, cs) = match kind {
                    Kind::Key => (t0..t0 + GROUP, c..c + 1),
                    Kind::Value => (t..t + 1, c0..(c0 + GROUP).min(hd)),
                };
                let grp = ts.flat_map(|u| cs.clone().map(move |e| d[(h * len + u) * hd + e]));
                let (lo, hi) = grp.fold((f32::MAX, f32::MIN), |(l, u), x| (l.min(x), u.max(x)));
                let bound = (hi - lo) / bits.qmax() / 2.0 + 1e-6;
                assert!((got[i] - data[i]).abs() <= bound, "{kind:?} {bits:?} hd {hd} elem {i}");
            }
        }
    }

    #[test]
    fn window_tail_is_exact_and_draft_rejection_is_lossless() {
        for kind in KINDS {
            let (heads, hd, len) = (2, 64, 100);
            let data = Lcg(5).vec(heads * len * hd);
            let mut s = KvStore::new(kind, Bits::Int4, heads, hd, 9);
            let mut bulk = s.clone();
            bulk.append(&data, len);
            for t in 0..len {
                // One token at a time must end in the same state as one bulk append.
                let one: Vec<f32> = (0..heads)
                    .flat_map(|h| data[(h * len + t) * hd..(h * len + t + 1) * hd].to_vec())
                    .collect();
                s.append(&one, 1);
            }
            let before = dump(&s);
            assert_eq!(before, dump(&bulk));
            assert!((9..9 + GROUP).contains(&s.tail_len()), "tail {}", s.tail_len());
            same(&before, len, &data, len, hd, len - s.tail_len()..len, 0); // bit-exact f32 tail
            for k in 0..=8 {
                let mut c = s.clone();
                c.truncate(len - k);
                assert_eq!(c.quantized_len(), s.quantized_len());
                same(&dump(&c), len - k, &before, len, hd, 0..len - k, 0);
            }
        }
    }

    #[test]
    fn deep_truncate_keeps_values_and_appends_work() {
        for kind in KINDS {
            let (heads, hd, mut rng) = (2, 64, Lcg(11));
            let mut s = KvStore::new(kind, Bits::Int8, heads, hd, 9);
            s.append(&rng.vec(heads * 200 * hd), 200);
            let before = dump(&s);
            assert_eq!((s.quantized_len(), s.tail_len()), (160, 40));
            s.truncate(50); // inside block 1, which comes back into the f32 tail
            assert_eq!((s.len(), s.quantized_len(), s.tail_len()), (50, 32, 18));
            same(&dump(&s), 50, &before, 200, hd, 0..50, 0);
            let more = rng.vec(heads * 100 * hd);
            s.append(&more, 100);
            let out = dump(&s);
            assert_eq!(s.len(), 150);
            same(&out, 150, &before, 200, hd, 0..GROUP, 0); // block 0 untouched
            same(&out, 150, &more, 100, hd, 150 - s.tail_len()..150, 50); // new tail exact
            s.truncate(0);
            assert!(s.is_empty() && s.bytes() == 0);
        }
    }

    #[test]
    fn keys_per_channel_values_per_token() {
        let (heads, hd, len, half_step) = (2, 64, 128, 2.0 / 15.0 / 2.0 + 1e-5);
        // An outlier channel (5) hurts per-token grouping only; an outlier token (7) hurts
        // per-channel grouping only. Errors are measured away from the outlier.
        for channel_outlier in [true, false] {
            let outlier = |i: usize| if channel_outlier { i % hd == 5 } else { i / hd % len == 7 };
            let mut data = Lcg(3).vec(heads * len * hd);
            data.iter_mut().enumerate().filter(|(i, _)| outlier(*i)).for_each(|(_, x)| *x *= 100.0);
            let [k, v] = KINDS.map(|kind| {
                let mut s = KvStore::new(kind, Bits::Int4, heads, hd, 0);
                s.append(&data, len);
                let got = dump(&s);
                (0..data.len()).filter(|&i| !outlier(i)).map(|i| (got[i] - data[i]).abs()).fold(0.0, f32::max)
            });
            println!(
                "Int4, x100 outlier {}: max err elsewhere key {k:.4}, value {v:.4}",
                ["token 7", "channel 5"][channel_outlier as usize]
            );
            let (good, bad) = if channel_outlier { (k, v) } else { (v, k) };
            assert!(good <= half_step && bad > 1.0, "key {k} value {v}");
        }
    }

    #[test]
    fn bytes_accounting() {
        let (heads, hd, len) = (6, 64, 1024);
        for (kind, bits) in KINDS.into_iter().flat_map(|k| BITS.map(|b| (k, b))) {
            let bpt = KvStore::bytes_per_token(kind, bits, heads, hd);
            let mut s = KvStore::new(kind, bits, heads, hd, 9);
            s.append(&Lcg(1).vec(heads * len * hd), len);
            let (q, t) = (s.quantized_len(), s.tail_len());
            println!(
                "{kind:?} {bits:?}: bytes_per_token {bpt}; {len} tok: bytes {} = {q}*bpt + {t}*1536; bpt*len {}",
                s.bytes(),
                bpt * len as f64
            );
            assert_eq!(s.bytes() as f64, bpt * q as f64 + (t * heads * hd * 4) as f64);
        }
        assert_eq!(KvStore::bytes_per_token(Kind::Value, Bits::Int4, 1, 70), 35.0 + 3.0 * 8.0);
    }
}
