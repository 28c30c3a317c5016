//! A GGUF file: its metadata through gguf_*, its tensor data memory-mapped.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use llama_cpp_sys_2 as sys;
use memmap2::{Mmap, UncheckedAdvice};

use crate::error::{Error, Result};
use crate::ffi::graph::Tensor;

/// An open GGUF file. The tensor descriptions live in a ggml context (no data allocated);
/// the data stays in the file mapping, where the page cache holds it.
pub(crate) struct GgufFile {
    path: PathBuf,
    gguf: NonNull<sys::gguf_context>,
    meta: NonNull<sys::ggml_context>,
    mmap: Arc<Mmap>,
    data_offset: usize,
}

// SAFETY: the gguf and ggml contexts are only read after `open` returns (lookups of keys and
// tensor descriptions); nothing mutates them, so sharing them between threads is sound.
unsafe impl Send for GgufFile {}
// SAFETY: see `Send` above: all access after construction is read-only.
unsafe impl Sync for GgufFile {}

impl Drop for GgufFile {
    fn drop(&mut self) {
        // SAFETY: both pointers came from gguf_init_from_file and are freed exactly once here.
        unsafe {
            sys::gguf_free(self.gguf.as_ptr());
            sys::ggml_free(self.meta.as_ptr());
        }
    }
}

impl GgufFile {
    /// Open `path`, checking what can be checked cheaply before ggml parses it: that it
    /// exists, starts with the GGUF magic, and that every tensor's data lies in the file.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let io = |source| Error::Io { path: path.to_owned(), source };
        let mut file = File::open(path).map_err(io)?;
        let mut magic = [0u8; 4];
        let n = read_up_to(&mut file, &mut magic).map_err(io)?;
        if &magic[..n] != b"GGUF" {
            let found = if n == 0 {
                "nothing (the file is empty)".to_owned()
            } else {
                format!("{:?}", String::from_utf8_lossy(&magic[..n]))
            };
            return Err(Error::NotGguf { path: path.to_owned(), found });
        }
        let corrupt = |reason: String| Error::Corrupt { path: path.to_owned(), reason };
        // Every count and length held against the file's size before ggml reads (and
        // allocates for) any of it, with a message that says what is wrong.
        let len = file.metadata().map_err(io)?.len();
        std::io::Seek::rewind(&mut file).map_err(io)?;
        super::gguf_check::check(std::io::BufReader::new(&file), len, &type_layout).map_err(corrupt)?;
        let cpath = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| corrupt("the path contains a NUL byte".into()))?;
        let mut meta: *mut sys::ggml_context = std::ptr::null_mut();
        let params = sys::gguf_init_params { no_alloc: true, ctx: &mut meta };
        // SAFETY: cpath is a valid C string; params.ctx points to a local that outlives the call.
        let gguf = unsafe { sys::gguf_init_from_file(cpath.as_ptr(), params) };
        let (Some(gguf), Some(meta)) = (NonNull::new(gguf), NonNull::new(meta)) else {
            if !gguf.is_null() {
                // SAFETY: a non-null context from gguf_init_from_file, freed once.
                unsafe { sys::gguf_free(gguf) };
            }
            return Err(corrupt(
                "its header does not parse (cut short or not written by a GGUF writer)".into(),
            ));
        };
        // SAFETY: mapping a file read-only. The file could be changed by another process while
        // mapped; model files are treated as immutable (as llama.cpp does) and verified by
        // sha256 when pulled.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        // SAFETY: gguf is a valid context.
        let data_offset = unsafe { sys::gguf_get_data_offset(gguf.as_ptr()) };
        let this = GgufFile { path: path.to_owned(), gguf, meta, mmap: Arc::new(mmap), data_offset };
        this.check_tensor_bounds()?;
        Ok(this)
    }

    fn check_tensor_bounds(&self) -> Result<()> {
        let len = self.mmap.len();
        // SAFETY: valid context; ids are in 0..n_tensors.
        let n = unsafe { sys::gguf_get_n_tensors(self.gguf.as_ptr()) };
        for id in 0..n {
            // SAFETY: as above.
            let (off, size) = unsafe {
                (
                    sys::gguf_get_tensor_offset(self.gguf.as_ptr(), id),
                    sys::gguf_get_tensor_size(self.gguf.as_ptr(), id),
                )
            };
            let end = self.data_offset.checked_add(off).and_then(|o| o.checked_add(size));
            if end.is_none_or(|end| end > len) {
                return Err(Error::Corrupt {
                    path: self.path.clone(),
                    reason: format!(
                        "tensor {:?} ends past the end of the file ({len} bytes): the file is truncated",
                        self.tensor_name(id)
                    ),
                });
            }
        }
        Ok(())
    }

    fn tensor_name(&self, id: i64) -> String {
        // SAFETY: valid context and id; the name is a NUL-terminated string owned by the context.
        unsafe { CStr::from_ptr(sys::gguf_get_tensor_name(self.gguf.as_ptr(), id)) }
            .to_string_lossy()
            .into_owned()
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The whole file mapping.
    pub(crate) fn mmap(&self) -> &Arc<Mmap> {
        &self.mmap
    }

    /// Give back the pages of `bytes` (a slice of the mapping) to the page cache's discretion:
    /// for weights copied elsewhere. Reading them again faults them back in from the file.
    pub(crate) fn drop_pages(&self, bytes: &[u8]) {
        let start = bytes.as_ptr() as usize;
        let base = self.mmap.as_ptr() as usize;
        if start < base || start + bytes.len() > base + self.mmap.len() {
            return;
        }
        // SAFETY: the range lies inside this read-only file mapping; dropping its pages does
        // not change what reading it gives (the file's bytes).
        let _ =
            unsafe { self.mmap.unchecked_advise_range(UncheckedAdvice::DontNeed, start - base, bytes.len()) };
    }

    fn key(&self, key: &str) -> Option<i64> {
        let ckey = CString::new(key).ok()?;
        // SAFETY: valid context and C string.
        let id = unsafe { sys::gguf_find_key(self.gguf.as_ptr(), ckey.as_ptr()) };
        (id >= 0).then_some(id)
    }

    /// A string value.
    pub(crate) fn get_str(&self, key: &str) -> Option<String> {
        let id = self.key(key)?;
        // SAFETY: valid context and key id.
        if unsafe { sys::gguf_get_kv_type(self.gguf.as_ptr(), id) } != sys::GGUF_TYPE_STRING {
            return None;
        }
        // SAFETY: the key holds a string, owned by the context and NUL-terminated.
        let s = unsafe { CStr::from_ptr(sys::gguf_get_val_str(self.gguf.as_ptr(), id)) };
        Some(s.to_string_lossy().into_owned())
    }

    /// An integer value of any integer type.
    pub(crate) fn get_u64(&self, key: &str) -> Option<u64> {
        let id = self.key(key)?;
        let g = self.gguf.as_ptr();
        // SAFETY: each getter is called only for the type the key holds.
        unsafe {
            match sys::gguf_get_kv_type(g, id) {
                sys::GGUF_TYPE_UINT8 => Some(sys::gguf_get_val_u8(g, id) as u64),
                sys::GGUF_TYPE_UINT16 => Some(sys::gguf_get_val_u16(g, id) as u64),
                sys::GGUF_TYPE_UINT32 => Some(sys::gguf_get_val_u32(g, id) as u64),
                sys::GGUF_TYPE_UINT64 => Some(sys::gguf_get_val_u64(g, id)),
                sys::GGUF_TYPE_INT32 => u64::try_from(sys::gguf_get_val_i32(g, id)).ok(),
                sys::GGUF_TYPE_INT64 => u64::try_from(sys::gguf_get_val_i64(g, id)).ok(),
                _ => None,
            }
        }
    }

    /// The model's display name: `general.name`, else the file's stem.
    pub(crate) fn model_name(&self) -> String {
        self.get_str("general.name")
            .filter(|n| !n.is_empty())
            .or_else(|| self.path().file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_default()
    }

    /// A boolean value.
    pub(crate) fn get_bool(&self, key: &str) -> Option<bool> {
        let id = self.key(key)?;
        let g = self.gguf.as_ptr();
        // SAFETY: the getter is called only for a key that holds a bool.
        unsafe {
            (sys::gguf_get_kv_type(g, id) == sys::GGUF_TYPE_BOOL).then(|| sys::gguf_get_val_bool(g, id))
        }
    }

    /// A float value (f32 or f64).
    pub(crate) fn get_f32(&self, key: &str) -> Option<f32> {
        let id = self.key(key)?;
        let g = self.gguf.as_ptr();
        // SAFETY: each getter is called only for the type the key holds.
        unsafe {
            match sys::gguf_get_kv_type(g, id) {
                sys::GGUF_TYPE_FLOAT32 => Some(sys::gguf_get_val_f32(g, id)),
                sys::GGUF_TYPE_FLOAT64 => Some(sys::gguf_get_val_f64(g, id) as f32),
                _ => None,
            }
        }
    }

    /// The length of an array value.
    pub(crate) fn get_arr_len(&self, key: &str) -> Option<usize> {
        let id = self.key(key)?;
        // SAFETY: valid context and key id; the type is checked before reading the length.
        unsafe {
            (sys::gguf_get_kv_type(self.gguf.as_ptr(), id) == sys::GGUF_TYPE_ARRAY)
                .then(|| sys::gguf_get_arr_n(self.gguf.as_ptr(), id))
        }
    }

    /// An integer value, or each value of an integer array (a per-layer setting).
    pub(crate) fn get_u64s(&self, key: &str) -> Option<Vec<u64>> {
        if let Some(v) = self.get_u64(key) {
            return Some(vec![v]);
        }
        let id = self.key(key)?;
        let g = self.gguf.as_ptr();
        // SAFETY: the types are checked before the data is read; the array holds n values of
        // the element type read.
        unsafe {
            if sys::gguf_get_kv_type(g, id) != sys::GGUF_TYPE_ARRAY {
                return None;
            }
            let n = sys::gguf_get_arr_n(g, id);
            let data = sys::gguf_get_arr_data(g, id);
            match sys::gguf_get_arr_type(g, id) {
                sys::GGUF_TYPE_UINT32 => Some(
                    std::slice::from_raw_parts(data.cast::<u32>(), n).iter().map(|&v| v as u64).collect(),
                ),
                sys::GGUF_TYPE_INT32 => Some(
                    std::slice::from_raw_parts(data.cast::<i32>(), n)
                        .iter()
                        .map(|&v| v.max(0) as u64)
                        .collect(),
                ),
                sys::GGUF_TYPE_UINT64 => Some(std::slice::from_raw_parts(data.cast::<u64>(), n).to_vec()),
                _ => None,
            }
        }
    }

    /// A boolean array value (GGUF bools are one byte each).
    pub(crate) fn get_bool_array(&self, key: &str) -> Option<Vec<bool>> {
        let id = self.key(key)?;
        let g = self.gguf.as_ptr();
        // SAFETY: the types are checked before the data is read; the array holds n bytes.
        unsafe {
            if sys::gguf_get_kv_type(g, id) != sys::GGUF_TYPE_ARRAY
                || sys::gguf_get_arr_type(g, id) != sys::GGUF_TYPE_BOOL
            {
                return None;
            }
            let n = sys::gguf_get_arr_n(g, id);
            let data = sys::gguf_get_arr_data(g, id).cast::<u8>();
            Some(std::slice::from_raw_parts(data, n).iter().map(|&b| b != 0).collect())
        }
    }

    /// The names of every tensor in the file.
    pub(crate) fn tensor_names(&self) -> Vec<String> {
        // SAFETY: valid context.
        let n = unsafe { sys::gguf_get_n_tensors(self.gguf.as_ptr()) };
        (0..n).map(|id| self.tensor_name(id)).collect()
    }

    /// The description of tensor `name` (no data attached), if the file has it; the handle is
    /// valid as long as the file is open.
    pub(crate) fn tensor(&self, name: &str) -> Option<Tensor> {
        let cname = CString::new(name).ok()?;
        // SAFETY: valid context and C string.
        let t = NonNull::new(unsafe { sys::ggml_get_tensor(self.meta.as_ptr(), cname.as_ptr()) })?;
        // SAFETY: the tensor is owned by `meta`, alive as long as self.
        Some(unsafe { Tensor::from_raw(t) })
    }

    /// The bytes of tensor `name` in the mapping.
    pub(crate) fn tensor_bytes(&self, name: &str) -> Option<&[u8]> {
        let cname = CString::new(name).ok()?;
        // SAFETY: valid context and C string.
        let id = unsafe { sys::gguf_find_tensor(self.gguf.as_ptr(), cname.as_ptr()) };
        if id < 0 {
            return None;
        }
        // SAFETY: valid id; bounds were checked against the mapping in `open`.
        let (off, size) = unsafe {
            (
                sys::gguf_get_tensor_offset(self.gguf.as_ptr(), id),
                sys::gguf_get_tensor_size(self.gguf.as_ptr(), id),
            )
        };
        let start = self.data_offset + off;
        Some(&self.mmap[start..start + size])
    }
}

/// How ggml stores tensor type `ty`: (elements per block, bytes per block), `None` for a
/// type this build does not know or no longer supports. [`super::gguf_check::check`] takes it.
pub fn type_layout(ty: u32) -> Option<(u64, u64)> {
    if i64::from(ty) >= sys::GGML_TYPE_COUNT as i64 {
        return None;
    }
    // SAFETY: ty is a valid ggml_type value (below GGML_TYPE_COUNT); both functions only read
    // ggml's static type table.
    let (block, bytes) = unsafe { (sys::ggml_blck_size(ty as _), sys::ggml_type_size(ty as _)) };
    // Removed types (Q4_2, the old repacked Q4_0 variants) keep an entry of size 0.
    (block > 0 && bytes > 0).then_some((block as u64, bytes as u64))
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}
