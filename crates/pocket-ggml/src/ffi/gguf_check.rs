//! A bounds-checked walk over a GGUF file's header, metadata and tensor descriptions, done
//! before ggml parses it: every count and length is held against the bytes the file has
//! left, so a damaged or hostile file is refused with what is wrong — a count no file of its
//! size could hold, a dimension that overflows, a tensor type ggml does not know, data past
//! the end — before anything is allocated for it. Nothing read is kept; values are skipped.

use std::io::Read;

/// What the walk found, for the caller's checks and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// The GGUF version (2 or 3).
    pub version: u32,
    /// Tensors described.
    pub tensors: u64,
    /// Metadata entries.
    pub metadata: u64,
}

/// How ggml stores a tensor type: elements per block and bytes per block, `None` for a type
/// it does not know (or no longer supports).
pub type TypeLayout<'a> = &'a dyn Fn(u32) -> Option<(u64, u64)>;

/// The smallest a tensor description can be: name length, dimension count, one dimension,
/// type, offset.
const MIN_TENSOR_INFO: u64 = 8 + 4 + 8 + 4 + 8;
/// The smallest a metadata entry can be: key length, value type, a one-byte value.
const MIN_KV: u64 = 8 + 4 + 1;
/// Dimensions a ggml tensor has at most.
const MAX_DIMS: u32 = 4;
const TYPE_STRING: u32 = 8;
const TYPE_ARRAY: u32 = 9;

struct Walker<R> {
    inner: R,
    /// Bytes of the file not yet read.
    left: u64,
}

impl<R: Read> Walker<R> {
    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        if self.left < N as u64 {
            return Err(format!("the file ends inside {what}: it is cut short"));
        }
        let mut b = [0u8; N];
        self.inner.read_exact(&mut b).map_err(|e| format!("reading {what}: {e}"))?;
        self.left -= N as u64;
        Ok(b)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        self.bytes::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        self.bytes::<8>(what).map(u64::from_le_bytes)
    }

    /// Skip `n` bytes that must be in the file.
    fn skip(&mut self, n: u64, what: &str) -> Result<(), String> {
        if n > self.left {
            return Err(format!("{what} is {n} bytes, but only {} bytes of the file are left", self.left));
        }
        let copied = std::io::copy(&mut (&mut self.inner).take(n), &mut std::io::sink())
            .map_err(|e| format!("reading {what}: {e}"))?;
        if copied != n {
            return Err(format!("the file ends inside {what}: it is cut short"));
        }
        self.left -= n;
        Ok(())
    }

    /// A string: its length checked against what is left, then its bytes (kept only when
    /// short, for names in messages).
    fn string(&mut self, what: &str) -> Result<String, String> {
        let n = self.u64(what)?;
        if n > self.left {
            return Err(format!(
                "{what} claims {n} bytes, but only {} bytes of the file are left",
                self.left
            ));
        }
        if n <= 256 {
            let mut b = vec![0u8; n as usize];
            self.inner.read_exact(&mut b).map_err(|e| format!("reading {what}: {e}"))?;
            self.left -= n;
            Ok(String::from_utf8_lossy(&b).into_owned())
        } else {
            self.skip(n, what)?;
            Ok(String::new())
        }
    }

    /// Skip one value of GGUF type `ty` (not an array).
    fn scalar(&mut self, ty: u32, what: &str) -> Result<(), String> {
        match scalar_size(ty) {
            Some(n) => self.skip(n, what),
            None if ty == TYPE_STRING => self.string(what).map(drop),
            None => Err(format!("{what} has value type {ty}, which GGUF does not define (0 to 12)")),
        }
    }
}

/// Bytes of a fixed-size GGUF value type.
fn scalar_size(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1), // u8, i8, bool
        2 | 3 => Some(2),     // u16, i16
        4..=6 => Some(4),     // u32, i32, f32
        10..=12 => Some(8),   // u64, i64, f64
        _ => None,
    }
}

/// Walk `file` (`len` bytes long) from its first byte: the header, every metadata entry and
/// every tensor description, each tensor's data checked to lie in the file.
pub fn check(file: impl Read, len: u64, layout: TypeLayout<'_>) -> Result<Summary, String> {
    let mut w = Walker { inner: file, left: len };
    let magic = w.bytes::<4>("the magic number")?;
    if &magic != b"GGUF" {
        return Err(format!("it does not start with \"GGUF\" but {:?}", String::from_utf8_lossy(&magic)));
    }
    let version = w.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(format!("GGUF version {version}: versions 2 and 3 are supported"));
    }
    let tensors = w.u64("the tensor count")?;
    let metadata = w.u64("the metadata count")?;
    let room = w.left;
    if tensors.checked_mul(MIN_TENSOR_INFO).is_none_or(|b| b > room)
        || metadata.checked_mul(MIN_KV).is_none_or(|b| b > room)
    {
        return Err(format!(
            "it claims {tensors} tensors and {metadata} metadata entries, more than a file of {len} bytes can describe"
        ));
    }
    let mut alignment = 32u64;
    for i in 0..metadata {
        let key = w.string(&format!("metadata key {i}"))?;
        let what = format!("metadata {key:?}");
        let ty = w.u32(&what)?;
        if ty == TYPE_ARRAY {
            let elem = w.u32(&what)?;
            let n = w.u64(&what)?;
            let min = match (scalar_size(elem), elem) {
                (Some(s), _) => s,
                (None, TYPE_STRING) => 8,
                _ => return Err(format!("{what} is an array of type {elem}, which GGUF arrays cannot hold")),
            };
            if n.checked_mul(min).is_none_or(|b| b > w.left) {
                return Err(format!(
                    "{what} claims {n} elements, but only {} bytes of the file are left",
                    w.left
                ));
            }
            match scalar_size(elem) {
                Some(s) => w.skip(n * s, &what)?,
                None => {
                    for _ in 0..n {
                        w.string(&what)?;
                    }
                }
            }
        } else if key == "general.alignment" {
            if ty != 4 {
                return Err(format!("{what} must be a u32, not value type {ty}"));
            }
            alignment = u64::from(w.u32(&what)?);
            if alignment == 0 || !alignment.is_power_of_two() {
                return Err(format!("{what} is {alignment}: it must be a power of two"));
            }
        } else {
            w.scalar(ty, &what)?;
        }
    }
    let mut spans = Vec::new();
    for i in 0..tensors {
        let name = w.string(&format!("tensor name {i}"))?;
        let what = format!("tensor {name:?}");
        let dims = w.u32(&what)?;
        if dims == 0 || dims > MAX_DIMS {
            return Err(format!("{what} has {dims} dimensions: ggml tensors have 1 to {MAX_DIMS}"));
        }
        let mut elements: u64 = 1;
        let mut ne0 = 0;
        for d in 0..dims {
            let n = w.u64(&what)?;
            if d == 0 {
                ne0 = n;
            }
            elements = elements
                .checked_mul(n)
                .filter(|&e| e <= i64::MAX as u64)
                .ok_or_else(|| format!("{what}'s dimensions overflow a 64-bit element count"))?;
        }
        let ty = w.u32(&what)?;
        let (block, block_bytes) = layout(ty)
            .ok_or_else(|| format!("{what} has tensor type {ty}, which this build of ggml does not know"))?;
        if block == 0 || ne0 % block != 0 {
            return Err(format!(
                "{what}'s rows ({ne0} elements) are not whole blocks of {block} (type {ty})"
            ));
        }
        let bytes = (elements / block)
            .checked_mul(block_bytes)
            .ok_or_else(|| format!("{what}'s size overflows 64 bits"))?;
        let offset = w.u64(&what)?;
        if offset % alignment != 0 {
            return Err(format!(
                "{what}'s data offset {offset} is not a multiple of the alignment {alignment}"
            ));
        }
        spans.push((name, offset, bytes));
    }
    let header_end = len - w.left;
    let data_start = header_end.next_multiple_of(alignment);
    for (name, offset, bytes) in spans {
        let end = data_start.checked_add(offset).and_then(|o| o.checked_add(bytes));
        if end.is_none_or(|end| end > len) {
            return Err(format!(
                "tensor {name:?} ({bytes} bytes at offset {offset}) ends past the end of the file ({len} bytes): \
                 the file is truncated"
            ));
        }
    }
    Ok(Summary { version, tensors, metadata })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// F32 and Q8_0, as ggml lays them out.
    fn layout(ty: u32) -> Option<(u64, u64)> {
        match ty {
            0 => Some((1, 4)),
            8 => Some((32, 34)),
            _ => None,
        }
    }

    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    /// A small valid file: two metadata entries (one an array of strings) and two tensors.
    fn valid() -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(2u64.to_le_bytes());
        out.extend(2u64.to_le_bytes());
        put_str(&mut out, "general.architecture");
        out.extend(TYPE_STRING.to_le_bytes());
        put_str(&mut out, "llama");
        put_str(&mut out, "tokenizer.ggml.tokens");
        out.extend(TYPE_ARRAY.to_le_bytes());
        out.extend(TYPE_STRING.to_le_bytes());
        out.extend(3u64.to_le_bytes());
        for t in ["a", "b", "c"] {
            put_str(&mut out, t);
        }
        put_str(&mut out, "w");
        out.extend(2u32.to_le_bytes());
        out.extend(32u64.to_le_bytes());
        out.extend(2u64.to_le_bytes());
        out.extend(8u32.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        put_str(&mut out, "n");
        out.extend(1u32.to_le_bytes());
        out.extend(4u64.to_le_bytes());
        out.extend(0u32.to_le_bytes());
        out.extend(96u64.to_le_bytes());
        out.resize(out.len().next_multiple_of(32), 0);
        out.resize(out.len() + 96 + 16, 0);
        out
    }

    fn run(bytes: &[u8]) -> Result<Summary, String> {
        check(bytes, bytes.len() as u64, &layout)
    }

    /// A file with one metadata entry and one tensor `t` of shape `dims`, type `ty` at `offset`,
    /// followed by `data` bytes of tensor data.
    fn one_tensor(dims: &[u64], ty: u32, offset: u64, data: usize) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(1u64.to_le_bytes());
        out.extend(1u64.to_le_bytes());
        put_str(&mut out, "general.architecture");
        out.extend(TYPE_STRING.to_le_bytes());
        put_str(&mut out, "llama");
        put_str(&mut out, "t");
        out.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            out.extend(d.to_le_bytes());
        }
        out.extend(ty.to_le_bytes());
        out.extend(offset.to_le_bytes());
        out.resize(out.len().next_multiple_of(32) + data, 0);
        out
    }

    #[test]
    fn a_valid_file_walks_and_each_kind_of_damage_is_named() {
        let good = valid();
        assert_eq!(run(&good), Ok(Summary { version: 3, tensors: 2, metadata: 2 }));
        let with = |at: usize, bytes: &[u8]| {
            let mut b = good.clone();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            run(&b).unwrap_err()
        };
        assert!(with(0, b"GGML").contains("does not start with"));
        assert!(with(4, &1u32.to_le_bytes()).contains("versions 2 and 3"));
        assert!(with(8, &(1u64 << 40).to_le_bytes()).contains("more than a file of"));
        assert!(with(16, &u64::MAX.to_le_bytes()).contains("more than a file of"));
        // The first key's length.
        assert!(with(24, &(1u64 << 50).to_le_bytes()).contains("only"));
        // The token array's element count: right after its key, value type and element type.
        let at = 24 + 8 + 20 + 4 + 8 + 5 + 8 + 21 + 4 + 4;
        assert_eq!(good[at..at + 8], 3u64.to_le_bytes());
        let e = with(at, &(1u64 << 61).to_le_bytes());
        assert!(e.contains("claims 2305843009213693952 elements"), "{e}");
        assert!(run(&good[..good.len() - 10]).unwrap_err().contains("truncated"));

        assert!(run(&one_tensor(&[32, 2], 8, 0, 68)).is_ok());
        let e = run(&one_tensor(&[32, 2], 8, 0, 60)).unwrap_err();
        assert!(e.contains("ends past the end of the file") && e.contains("truncated"), "{e}");
        let e = run(&one_tensor(&[32, 2], 8, 1 << 62, 68)).unwrap_err();
        assert!(e.contains("past the end"), "{e}");
        let e = run(&one_tensor(&[32, 2], 8, 3, 68)).unwrap_err();
        assert!(e.contains("not a multiple of the alignment"), "{e}");
        let e = run(&one_tensor(&[32, 2, 1, 1, 1], 8, 0, 68)).unwrap_err();
        assert!(e.contains("5 dimensions"), "{e}");
        let e = run(&one_tensor(&[1 << 40, 1 << 40], 0, 0, 64)).unwrap_err();
        assert!(e.contains("overflow"), "{e}");
        let e = run(&one_tensor(&[30, 2], 8, 0, 68)).unwrap_err();
        assert!(e.contains("not whole blocks"), "{e}");
        let e = run(&one_tensor(&[32, 2], 200, 0, 68)).unwrap_err();
        assert!(e.contains("type 200") && e.contains("does not know"), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Any bytes at all: an answer, never a panic, an overflow or a large allocation.
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = run(&bytes);
        }

        /// A valid file with bytes changed or cut: still an answer, and a cut file never passes.
        #[test]
        fn damaged_files_never_panic(
            changes in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
            cut in any::<prop::sample::Index>(),
            do_cut in any::<bool>(),
        ) {
            let mut b = valid();
            for (at, v) in changes {
                let i = at.index(b.len());
                b[i] = v;
            }
            let unchanged = b == valid();
            if do_cut {
                let n = cut.index(b.len());
                b.truncate(n);
            }
            let r = run(&b);
            // The last tensor ends at the last byte, so any cut of an intact file fails.
            prop_assert!(!(do_cut && unchanged) || r.is_err(), "an intact file cut short passed");
        }
    }
}
