//! Knowing a model file again without reading all of it.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use sha2::{Digest, Sha256};

/// A fingerprint of the files `paths`, in order: sha256 over each file's size, first MiB and
/// last MiB, as hex. Hashing every byte of a large model at each load would cost more than
/// the measurements it keys; a changed file of the same size that differs only in its middle
/// is the one case it misses.
pub fn fingerprint(paths: &[&Path]) -> std::io::Result<String> {
    const MIB: u64 = 1 << 20;
    let mut h = Sha256::new();
    let mut buf = Vec::with_capacity(MIB as usize);
    for path in paths {
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        h.update(len.to_le_bytes());
        buf.clear();
        f.by_ref().take(MIB).read_to_end(&mut buf)?;
        h.update(&buf);
        buf.clear();
        f.seek(SeekFrom::Start(len.saturating_sub(MIB)))?;
        f.take(MIB).read_to_end(&mut buf)?;
        h.update(&buf);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_bytes_same_fingerprint_other_bytes_or_sizes_another() {
        let dir = std::env::temp_dir().join(format!("pocket-fp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b, c) = (dir.join("a"), dir.join("b"), dir.join("c"));
        std::fs::write(&a, vec![7u8; 3 << 20]).unwrap();
        std::fs::write(&b, vec![7u8; 3 << 20]).unwrap();
        let mut other = vec![7u8; 3 << 20];
        *other.last_mut().unwrap() = 8;
        std::fs::write(&c, other).unwrap();
        let fp = |p: &[&Path]| fingerprint(p).unwrap();
        assert_eq!(fp(&[&a]), fp(&[&b]));
        assert_ne!(fp(&[&a]), fp(&[&c]));
        assert_ne!(fp(&[&a]), fp(&[&a, &b]));
        assert!(fingerprint(&[&dir.join("missing")]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
