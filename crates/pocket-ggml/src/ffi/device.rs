//! Choosing a ggml backend device through ggml's registry, and where weights go on it.
//!
//! With the `cuda` or `vulkan` feature, llama-cpp-sys-2 registers those devices in the same
//! registry; nothing here names a particular backend.

use std::ffi::{CStr, CString};

use llama_cpp_sys_2 as sys;

use crate::error::{Error, Result};
use crate::ffi::graph::Tensor;

/// Which device to run on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The first GPU in the registry (discrete or integrated) if there is one, else the CPU.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// A device by its ggml name (`CUDA0`, `Vulkan0`, ...).
    Named(String),
}

impl std::str::FromStr for DeviceChoice {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Ok(match s {
            "auto" | "" => DeviceChoice::Auto,
            "cpu" | "CPU" => DeviceChoice::Cpu,
            name => DeviceChoice::Named(name.to_owned()),
        })
    }
}

/// A ggml device and the buffer types weights may use on it, best first.
pub(crate) struct Device {
    pub(crate) dev: sys::ggml_backend_dev_t,
    pub(crate) cpu: sys::ggml_backend_dev_t,
    pub(crate) name: String,
    /// Buffer types for weights in order of preference: for the CPU the extra (repacking)
    /// types first, then plain host memory; for a GPU its own memory, then host memory.
    pub(crate) weight_bufts: Vec<sys::ggml_backend_buffer_type_t>,
    /// Where Q4_K matrices go when not every repacking is asked for: ggml's repacking buffer
    /// type on CPUs where our kernels read its layout (see `gemm::repacked`).
    pub(crate) q4_k_buft: Option<sys::ggml_backend_buffer_type_t>,
    /// Layers placed on other machines' devices (ggml's RPC backend), if any.
    pub(crate) remote: Option<Remote>,
}

/// Layers of a model on other machines' devices, reached through ggml's RPC backend: their
/// weights and KV cache live there, and the scheduler runs their ops there.
pub(crate) struct Remote {
    /// The devices, as ggml's RPC client reaches them.
    pub(crate) devices: Vec<RemoteDevice>,
    /// Per layer, the index in `devices` of the device it is on; None: on this machine.
    pub(crate) layers: Vec<Option<usize>>,
}

/// One device of a peer.
pub(crate) struct RemoteDevice {
    pub(crate) dev: sys::ggml_backend_dev_t,
    /// Its ggml name (`RPC0`).
    pub(crate) name: String,
    /// The peer's address (`host:port`), as given.
    pub(crate) endpoint: String,
    /// What ggml's client reaches the peer through (`dev` is the link's device).
    pub(crate) link: std::sync::Arc<crate::rpc::Link>,
}

impl RemoteDevice {
    /// Its buffer type (the peer's memory).
    pub(crate) fn buffer_type(&self) -> sys::ggml_backend_buffer_type_t {
        // SAFETY: an RPC device, which lives for the process (ggml caches it per endpoint).
        unsafe { sys::ggml_backend_dev_buffer_type(self.dev) }
    }
}

// SAFETY: device and buffer-type handles are process-wide singletons owned by ggml's registry
// (RPC devices: cached by ggml per endpoint for the process); they are never freed and their
// methods are thread-safe queries.
unsafe impl Send for Device {}
// SAFETY: as for Send.
unsafe impl Sync for Device {}

/// A buffer type kept beside what allocates in it later (a device's KV cache, as it grows).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BufferType(pub(crate) sys::ggml_backend_buffer_type_t);

// SAFETY: as for Device: a registry singleton, never freed.
unsafe impl Send for BufferType {}
// SAFETY: as for Send.
unsafe impl Sync for BufferType {}

/// The names of the devices ggml's registry knows.
pub fn device_names() -> Vec<String> {
    crate::ffi::init();
    // SAFETY: querying the registry; indices are in range and names are static C strings.
    unsafe { (0..sys::ggml_backend_dev_count()).map(|i| dev_name(sys::ggml_backend_dev_get(i))).collect() }
}

/// The widest vector instructions ggml's CPU kernels were compiled for: `avx512`, `avx2`,
/// `avx`, `neon-dotprod`, `neon` or `scalar`. It is fixed when ggml is built (on x86-64 by the
/// target CPU, see `.cargo/config.toml`) and sets how fast its matrix products run, so it is
/// part of the kernels' name that measured speeds are kept under ([`Device::ggml_kernels`]).
fn ggml_cpu_build() -> &'static str {
    // SAFETY: queries of how ggml was compiled, with no arguments.
    unsafe {
        if sys::ggml_cpu_has_avx512() != 0 {
            "avx512"
        } else if sys::ggml_cpu_has_avx2() != 0 {
            "avx2"
        } else if sys::ggml_cpu_has_avx() != 0 {
            "avx"
        } else if sys::ggml_cpu_has_dotprod() != 0 {
            "neon-dotprod"
        } else if sys::ggml_cpu_has_neon() != 0 {
            "neon"
        } else {
            "scalar"
        }
    }
}

/// A device's memory, as its backend reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMemory {
    /// The device's ggml name (`CUDA0`, `Vulkan0`).
    pub name: String,
    /// Whether its memory is the host's (an integrated GPU: Jetson's, a Raspberry Pi's), so
    /// that one budget covers both.
    pub unified: bool,
    /// Bytes in all.
    pub total_bytes: u64,
    /// Bytes free now (for every process on the device).
    pub free_bytes: u64,
}

/// The memory of the device `choice` selects, or none for the CPU.
pub fn device_memory(choice: &DeviceChoice) -> Result<Option<DeviceMemory>> {
    let device = Device::select(choice, Repack::None, || None)?;
    if device.is_cpu() {
        return Ok(None);
    }
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: a registry device; the two out-pointers are valid for the call.
    let kind = unsafe {
        sys::ggml_backend_dev_memory(device.dev, &mut free, &mut total);
        sys::ggml_backend_dev_type(device.dev)
    };
    // ggml-openvino reports the device it computes on as a discrete GPU, whichever it is; its
    // CPU device computes in host memory, and the NPUs and most Intel GPUs it reaches share
    // the host's (a discrete Arc GPU is then budgeted in host memory: less, never more).
    let unified = kind == sys::GGML_BACKEND_DEVICE_TYPE_IGPU || device.is_openvino();
    Ok(Some(DeviceMemory { name: device.name, unified, total_bytes: total as u64, free_bytes: free as u64 }))
}

/// A device's (free, total) bytes, as its backend reports them.
pub(crate) fn dev_memory(dev: sys::ggml_backend_dev_t) -> (u64, u64) {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: a live device (a registry one, or an RPC one ggml keeps); out-pointers valid.
    unsafe { sys::ggml_backend_dev_memory(dev, &mut free, &mut total) };
    (free as u64, total as u64)
}

/// The registry's device `name` asks for: a ggml name (`CUDA0`), or with OpenVINO
/// `openvino[:NAME]`, the device the OpenVINO backend computes on.
fn named_device(devices: &[sys::ggml_backend_dev_t], name: &str) -> Result<sys::ggml_backend_dev_t> {
    #[cfg(feature = "openvino")]
    if openvino_name(name).is_some() {
        let selected = devices
            .iter()
            .copied()
            .find(|&d| crate::ffi::openvino::of(d).is_some_and(|(_, selected)| selected));
        return selected.ok_or_else(|| Error::NoDevice {
            wanted: name.to_owned(),
            available: device_names().join(", "),
        });
    }
    let dev =
        devices.iter().copied().find(|&d| dev_name(d).eq_ignore_ascii_case(name)).ok_or_else(|| {
            Error::NoDevice { wanted: name.to_owned(), available: device_names().join(", ") }
        })?;
    // Another OpenVINO device than the backend's runs nothing (and ggml aborts when data is
    // placed there): it is asked for by OpenVINO's name before the backend starts.
    #[cfg(feature = "openvino")]
    if let Some((ov, false)) = crate::ffi::openvino::of(dev) {
        let current = crate::ffi::openvino::selected().unwrap_or_default();
        return Err(Error::NoDevice {
            wanted: name.to_owned(),
            available: format!(
                "{name} is OpenVINO's {ov}, and ggml's OpenVINO backend computes on {current} in this process: \
                 ask for openvino:{ov} (pocketd started anew)"
            ),
        });
    }
    Ok(dev)
}

/// How reports name a device: its ggml name, or for OpenVINO's devices (`OPENVINO0`) the name
/// it is asked for by, `openvino:CPU`, which says what computes.
fn shown_name(dev: sys::ggml_backend_dev_t) -> String {
    #[cfg(feature = "openvino")]
    if let Some((ov, _)) = crate::ffi::openvino::of(dev) {
        return format!("{}:{ov}", crate::ffi::openvino::PREFIX);
    }
    dev_name(dev)
}

/// Whether `auto` may take a device ggml reports as a GPU: not OpenVINO's. Our graph's output
/// there does not yet match llama.cpp's past a few decode steps (docs/benchmarks.md, OpenVINO
/// on its CPU device), so an OpenVINO device is only used when asked for by name.
fn auto_takes(_dev: sys::ggml_backend_dev_t) -> bool {
    #[cfg(feature = "openvino")]
    if crate::ffi::openvino::of(_dev).is_some() {
        return false;
    }
    true
}

/// `openvino` → the backend's default device (empty), `openvino:NPU` → `NPU`.
#[cfg(feature = "openvino")]
fn openvino_name(name: &str) -> Option<&str> {
    let prefix = crate::ffi::openvino::PREFIX;
    if name.eq_ignore_ascii_case(prefix) {
        return Some("");
    }
    let (head, rest) = name.split_once(':')?;
    head.eq_ignore_ascii_case(prefix).then_some(rest)
}

pub(crate) fn dev_name(dev: sys::ggml_backend_dev_t) -> String {
    // SAFETY: dev is a registry device; its name is a static NUL-terminated string.
    unsafe { CStr::from_ptr(sys::ggml_backend_dev_name(dev)) }.to_string_lossy().into_owned()
}

/// Which weight matrices ggml's CPU backend may repack into its own layouts when they are
/// loaded (llama.cpp repacks every one it can).
///
/// A repacked matrix multiplies groups of 4 tokens with one kernel and the rest with
/// another, so a verification pass of several tokens would not compute each row exactly as
/// decoding that token alone does (measured on Qwen2.5's Q4_K: logits off by up to 0.3), and
/// speculative decoding's greedy output must equal plain decoding's. Where our kernel reads
/// a repacked layout with the one-token kernel's arithmetic, the layout is safe.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Repack {
    /// Every matrix as the file stores it: the arithmetic of ggml's one-row kernels, which
    /// llama.cpp also computes with repacking off (`pocket parity` compares so).
    None,
    /// Q4_K matrices, on x86 with AVX2: one token goes through ggml's kernel for that layout
    /// (faster than its one-row kernel) and several through ours, which rounds as ggml's
    /// one-token kernel does (`gemm::repacked`); the rest stay as stored. Elsewhere, as
    /// [`Repack::None`].
    #[default]
    Q4K,
    /// Every matrix ggml repacks, as llama.cpp does: fastest plain decoding where ggml has
    /// such layouts, but verification passes no longer equal single steps.
    All,
}

impl Device {
    /// The device for `choice`; on the CPU, `repack` says which weights go into ggml's
    /// repacking buffer types (see [`Repack`]).
    /// `q4_k_buft` gives the buffer type Q4_K matrices are repacked into for [`Repack::Q4K`]
    /// (asked only then, on the CPU): our kernels' layout, which the layer above knows.
    pub(crate) fn select(
        choice: &DeviceChoice,
        repack: Repack,
        q4_k_buft: fn() -> Option<sys::ggml_backend_buffer_type_t>,
    ) -> Result<Device> {
        // ggml's OpenVINO backend takes its one device as it starts.
        #[cfg(feature = "openvino")]
        if let DeviceChoice::Named(name) = choice
            && let Some(ov) = openvino_name(name)
        {
            crate::ffi::openvino::request(ov)?;
        }
        crate::ffi::init();
        // SAFETY: registry queries with in-range indices.
        let devices: Vec<sys::ggml_backend_dev_t> =
            unsafe { (0..sys::ggml_backend_dev_count()).map(|i| sys::ggml_backend_dev_get(i)).collect() };
        // SAFETY: registry query.
        let cpu = unsafe { sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU) };
        if cpu.is_null() {
            return Err(Error::Ggml("ggml has no CPU device".into()));
        }
        let dev = match choice {
            DeviceChoice::Cpu => cpu,
            // Integrated GPUs count: they are the GPUs of Jetsons and Raspberry Pis.
            DeviceChoice::Auto => devices
                .iter()
                .copied()
                .find(|&d| {
                    // SAFETY: registry devices.
                    let kind = unsafe { sys::ggml_backend_dev_type(d) };
                    let gpu = kind == sys::GGML_BACKEND_DEVICE_TYPE_GPU
                        || kind == sys::GGML_BACKEND_DEVICE_TYPE_IGPU;
                    gpu && auto_takes(d)
                })
                .unwrap_or(cpu),
            DeviceChoice::Named(name) => named_device(&devices, name)?,
        };
        let mut weight_bufts = Vec::new();
        if dev == cpu && repack == Repack::All {
            weight_bufts.extend(cpu_extra_bufts(cpu));
        }
        let q4_k_buft = if dev == cpu && repack == Repack::Q4K { q4_k_buft() } else { None };
        // SAFETY: registry device.
        weight_bufts.push(unsafe { sys::ggml_backend_dev_buffer_type(dev) });
        if dev != cpu {
            // A weight the GPU cannot use stays in host memory and its op runs on the CPU, as
            // in llama.cpp: Qwen2.5's output matrix (145 MB) is larger than the biggest storage
            // buffer a Vulkan shader may bind on some drivers (128 MiB on lavapipe).
            // SAFETY: registry device.
            weight_bufts.push(unsafe { sys::ggml_backend_dev_buffer_type(cpu) });
        }
        Ok(Device { dev, cpu, name: shown_name(dev), weight_bufts, q4_k_buft, remote: None })
    }

    /// This device with layers on other machines' devices.
    pub(crate) fn with_remote(self, remote: Remote) -> Device {
        Device { remote: Some(remote), ..self }
    }

    /// Whether some layers are on other machines' devices.
    pub(crate) fn is_split(&self) -> bool {
        self.remote.is_some()
    }

    /// The remote device layer `il` is on, if it is not on this machine.
    pub(crate) fn remote_of(&self, il: usize) -> Option<&RemoteDevice> {
        let remote = self.remote.as_ref()?;
        remote.layers.get(il).copied().flatten().map(|d| &remote.devices[d])
    }

    /// Why a peer holding some of the layers stopped answering, if one did: every computation
    /// since has given garbage, and the model cannot compute again until it is loaded anew.
    pub(crate) fn lost_peer(&self) -> Option<String> {
        self.remote.as_ref()?.devices.iter().find_map(|d| d.link.lost())
    }

    /// Whether `buft` is a peer's memory (not this machine's: not in its budget).
    pub(crate) fn is_remote_buft(&self, buft: sys::ggml_backend_buffer_type_t) -> bool {
        self.remote.as_ref().is_some_and(|r| r.devices.iter().any(|d| d.buffer_type() == buft))
    }

    /// The device's own buffer type (its memory).
    pub(crate) fn buffer_type(&self) -> sys::ggml_backend_buffer_type_t {
        // SAFETY: a registry device.
        unsafe { sys::ggml_backend_dev_buffer_type(self.dev) }
    }

    /// The CPU's buffer type (plain host memory).
    pub(crate) fn cpu_buffer_type(&self) -> sys::ggml_backend_buffer_type_t {
        // SAFETY: the registry's CPU device.
        unsafe { sys::ggml_backend_dev_buffer_type(self.cpu) }
    }

    /// Whether this machine's device is the CPU (its KV cache and weights in host memory;
    /// layers on peers, if any, are apart: [`Device::is_split`]).
    pub(crate) fn is_cpu(&self) -> bool {
        self.dev == self.cpu
    }

    /// Whether this is one of ggml's OpenVINO devices (`openvino:NPU`, `openvino:CPU`, ...).
    pub(crate) fn is_openvino(&self) -> bool {
        self.name.starts_with("openvino:")
    }

    /// Whether every layer runs on this machine's CPU: where our own CPU kernels and shared
    /// passes apply to the whole model.
    pub(crate) fn all_on_cpu(&self) -> bool {
        self.is_cpu() && !self.is_split()
    }

    /// ggml's own kernels here as kernel names say it: on the CPU, with what they were
    /// compiled for (`ggml-avx512`); on another device, `ggml`.
    pub(crate) fn ggml_kernels(&self) -> String {
        if self.is_cpu() { format!("ggml-{}", ggml_cpu_build()) } else { "ggml".to_owned() }
    }

    /// The kernels of a model on llama.cpp's own graph here: `llama.cpp`, and on the CPU
    /// ggml's build (`llama.cpp+ggml-avx512`).
    pub(crate) fn llama_cpp_kernels(&self) -> String {
        if self.is_cpu() { format!("llama.cpp+{}", self.ggml_kernels()) } else { "llama.cpp".to_owned() }
    }

    /// Where a weight of layer `layer` (None: a whole-model tensor, which stays here) goes:
    /// its peer's memory for a layer on a peer, else [`Device::weight_buft`].
    pub(crate) fn layer_weight_buft(
        &self,
        layer: Option<usize>,
        w: Tensor,
        op: WeightOp,
    ) -> sys::ggml_backend_buffer_type_t {
        match layer.and_then(|il| self.remote_of(il)) {
            Some(remote) => remote.buffer_type(),
            None => self.weight_buft(w, op),
        }
    }

    /// The first buffer type whose device can run `op` on a weight `w` placed in it.
    pub(crate) fn weight_buft(&self, w: Tensor, op: WeightOp) -> sys::ggml_backend_buffer_type_t {
        if op == WeightOp::MulMat
            && w.ty() == sys::GGML_TYPE_Q4_K
            && let Some(buft) = self.q4_k_buft
            && supports(self.dev, buft, w.ptr(), op)
        {
            return buft;
        }
        for &buft in &self.weight_bufts {
            if supports(self.dev, buft, w.ptr(), op) {
                return buft;
            }
        }
        // Plain host memory (the last on every device) runs every op our graph uses.
        *self.weight_bufts.last().expect("a plain buffer type is always listed")
    }
}

/// The operation a weight feeds: it decides which buffer types can hold the weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WeightOp {
    /// The token embedding table: rows are gathered.
    GetRows,
    /// A projection matrix.
    MulMat,
    /// Norm weights and biases: element-wise.
    Elementwise,
}

/// ggml's CPU buffer type that repacks quantized matrices for its CPU kernels
/// (`CPU_REPACK`), if this build has it. Only the x86 kernels read the repacked layout.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn cpu_repack_buffer_type() -> Option<sys::ggml_backend_buffer_type_t> {
    crate::ffi::init();
    // SAFETY: registry query.
    let cpu = unsafe { sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU) };
    if cpu.is_null() {
        return None;
    }
    cpu_extra_bufts(cpu).into_iter().find(|&b| buft_name(b) == "CPU_REPACK")
}

fn cpu_extra_bufts(cpu: sys::ggml_backend_dev_t) -> Vec<sys::ggml_backend_buffer_type_t> {
    let name = c"ggml_backend_dev_get_extra_bufts";
    // SAFETY: the CPU device's registry; the proc address, if present, has the documented type
    // `ggml_backend_dev_get_extra_bufts_t`.
    unsafe {
        let reg = sys::ggml_backend_dev_backend_reg(cpu);
        let f = sys::ggml_backend_reg_get_proc_address(reg, name.as_ptr());
        if f.is_null() {
            return Vec::new();
        }
        let f: unsafe extern "C" fn(sys::ggml_backend_dev_t) -> *mut sys::ggml_backend_buffer_type_t =
            std::mem::transmute(f);
        let mut list = f(cpu);
        let mut out = Vec::new();
        while !list.is_null() && !(*list).is_null() {
            out.push(*list);
            list = list.add(1);
        }
        out
    }
}

/// Ask the device whether `op` on weight `w` is supported with `w` in a buffer of `buft`, the
/// way llama.cpp decides: build the op on a dummy input and point `w` at an empty buffer.
fn supports(
    dev: sys::ggml_backend_dev_t,
    buft: sys::ggml_backend_buffer_type_t,
    w: *mut sys::ggml_tensor,
    op: WeightOp,
) -> bool {
    if op == WeightOp::Elementwise {
        // Extra buffer types only speed up matrix products; small tensors stay plain.
        return !is_extra(dev, buft);
    }
    // SAFETY: a private no_alloc context holds the dummy op; `w` is a metadata-only tensor from
    // the GGUF context whose `buffer` field we set for the query and reset before returning.
    unsafe {
        let params = sys::ggml_init_params {
            mem_size: sys::ggml_tensor_overhead() * 8,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        };
        let ctx = sys::ggml_init(params);
        if ctx.is_null() {
            return false;
        }
        // Query a copy of the description so the GGUF context's tensor is never touched.
        let wt = sys::ggml_dup_tensor(ctx, w);
        let op_tensor = match op {
            WeightOp::GetRows => {
                let ids = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_I32, 512);
                sys::ggml_get_rows(ctx, wt, ids)
            }
            _ => {
                let x = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, (*wt).ne[0], 512);
                sys::ggml_mul_mat(ctx, wt, x)
            }
        };
        let buf = sys::ggml_backend_buft_alloc_buffer(buft, 0);
        (*wt).buffer = buf;
        // Asked of the device that owns the buffer type: that is where the op will run.
        let owner = sys::ggml_backend_buft_get_device(buft);
        let owner = if owner.is_null() { dev } else { owner };
        let ok = !buf.is_null() && sys::ggml_backend_dev_supports_op(owner, op_tensor);
        (*wt).buffer = std::ptr::null_mut();
        if !buf.is_null() {
            sys::ggml_backend_buffer_free(buf);
        }
        sys::ggml_free(ctx);
        ok
    }
}

fn is_extra(dev: sys::ggml_backend_dev_t, buft: sys::ggml_backend_buffer_type_t) -> bool {
    // SAFETY: registry device.
    buft != unsafe { sys::ggml_backend_dev_buffer_type(dev) }
}

/// The name of a buffer type, for logs.
pub(crate) fn buft_name(buft: sys::ggml_backend_buffer_type_t) -> String {
    // SAFETY: registry buffer type; the name is a static C string.
    unsafe { CStr::from_ptr(sys::ggml_backend_buft_name(buft)) }.to_string_lossy().into_owned()
}

/// Whether a buffer type's memory is the host's (the CPU's, or pinned host memory a GPU
/// reads), rather than a device's own.
pub(crate) fn buft_is_host(buft: sys::ggml_backend_buffer_type_t) -> bool {
    // SAFETY: registry buffer type; a query.
    unsafe { sys::ggml_backend_buft_is_host(buft) }
}

/// Turn a Rust string into a C string for ggml names (interior NULs dropped).
pub(crate) fn cstring(s: &str) -> CString {
    CString::new(s.replace('\0', "")).unwrap_or_default()
}
