//! ggml's RPC backend (`ggml-rpc`), reached through ggml's registry: lending this machine's
//! device to peers ([`serve`]) and the protocol this build speaks ([`protocol`]).
//!
//! llama-cpp-sys-2 generates no bindings for `ggml-rpc.h`; its functions are looked up by name
//! in the `RPC` registry entry, which exists when ggml was built with `GGML_RPC=ON`
//! (`.cargo/config.toml` sets it for every build).
//!
//! **Capping what peers may take.** ggml's server gives a peer every byte its device has (for
//! the CPU, ggml reports all of the machine's memory as free). [`serve`] hands the server a copy of the device whose memory query answers
//! within the limit and whose buffer type refuses an allocation past it, and counts buffers
//! back when they are freed. That needs the layouts of ggml's device, buffer-type, buffer and
//! backend structs (`ggml-backend-impl.h`, which has no bindings): they are mirrored below for
//! the llama.cpp that `llama-cpp-sys-2 =0.1.161` vendors and checked against ggml's own
//! accessors before use, so a changed layout is refused, never written through.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use llama_cpp_sys_2 as sys;

use crate::error::{Error, Result};
use crate::ffi::device::{Device, DeviceChoice, Repack};

/// The RPC protocol version of the `ggml-rpc.h` this crate was built against (read by
/// build.rs); whether the backend itself is in the build is [`protocol`]'s question.
const HEADER_PROTOCOL: Option<&str> = option_env!("POCKET_RPC_PROTOCOL");

/// The RPC protocol this build speaks (`7.0.0`), or none when ggml was built without its RPC
/// backend. Peers must speak the same major version, and a minor no newer.
pub fn protocol() -> Option<&'static str> {
    registry().ok().and(HEADER_PROTOCOL)
}

fn registry() -> Result<sys::ggml_backend_reg_t> {
    crate::ffi::init();
    // SAFETY: a registry lookup by a NUL-terminated name.
    let reg = unsafe { sys::ggml_backend_reg_by_name(c"RPC".as_ptr()) };
    if reg.is_null() {
        return Err(Error::Rpc(
            "this build has no RPC backend: ggml was built without GGML_RPC=ON (a target folder \
             built before it was set: `cargo clean -p llama-cpp-sys-2`, then build again)"
                .into(),
        ));
    }
    Ok(reg)
}

/// `ggml_backend_rpc_add_server`'s type (ggml-rpc.h).
type AddServer = unsafe extern "C" fn(*const c_char) -> sys::ggml_backend_reg_t;

/// The devices of the RPC server at `endpoint`, as ggml's client reaches them. They are not
/// put in ggml's registry, so that [`DeviceChoice::Auto`] never picks one.
///
/// ggml's client aborts the process when the server is down or speaks another protocol: call
/// this only for an endpoint [`probe`](crate::rpc::probe) has just found up and compatible
/// (or our own link to one, which always answers).
pub(crate) fn add_server(endpoint: &str) -> Result<Vec<sys::ggml_backend_dev_t>> {
    let reg = registry()?;
    let endpoint = c_string(endpoint)?;
    // SAFETY: a registry lookup by a NUL-terminated name; the address, when present, is
    // `ggml_backend_rpc_add_server` as ggml-rpc.h declares it, called with a NUL-terminated
    // endpoint; the registry it returns (cached by ggml per endpoint) lives for the process.
    unsafe {
        let f = sys::ggml_backend_reg_get_proc_address(reg, c"ggml_backend_rpc_add_server".as_ptr());
        if f.is_null() {
            return Err(Error::Rpc("ggml's RPC backend has no ggml_backend_rpc_add_server".into()));
        }
        let add = std::mem::transmute::<*mut c_void, AddServer>(f);
        let server = add(endpoint.as_ptr());
        if server.is_null() {
            return Err(Error::Rpc(format!(
                "the RPC server at {} offers no device",
                endpoint.to_string_lossy()
            )));
        }
        Ok((0..sys::ggml_backend_reg_dev_count(server))
            .map(|i| sys::ggml_backend_reg_dev_get(server, i))
            .collect())
    }
}

/// `ggml_backend_rpc_start_server`'s type (ggml-rpc.h).
type StartServer =
    unsafe extern "C" fn(*const c_char, *const c_char, usize, usize, *mut sys::ggml_backend_dev_t);

/// What [`serve`] lends, and where.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// `HOST:PORT` to listen on; ggml's server takes IPv4 addresses only.
    pub endpoint: String,
    /// The device lent.
    pub device: DeviceChoice,
    /// The most bytes peers may allocate on it, all of them together; they see it as the
    /// device's size.
    pub memory: u64,
    /// Threads the CPU backend computes peers' graphs on.
    pub threads: usize,
    /// Where the server keeps tensors peers sent by hash, so that a peer loading the same
    /// model again sends hashes instead of bytes; none keeps no such cache.
    pub cache_dir: Option<std::path::PathBuf>,
}

/// The device [`serve`] would lend for `choice`, as `(name, description, free bytes, total
/// bytes)` before any cap.
pub fn serve_device(choice: &DeviceChoice) -> Result<(String, String, u64, u64)> {
    let device = Device::select(choice, Repack::None, || None)?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: a registry device; the out-pointers are valid for the call; the description is
    // a static NUL-terminated string.
    let description = unsafe {
        sys::ggml_backend_dev_memory(device.dev, &mut free, &mut total);
        CStr::from_ptr(sys::ggml_backend_dev_description(device.dev)).to_string_lossy().into_owned()
    };
    Ok((device.name, description, free as u64, total as u64))
}

/// Serve the chosen device to RPC peers on `options.endpoint`, one peer at a time, until the
/// process ends. Returns only when the server could not start (the address is taken or not
/// an IPv4 address of this machine, the device fails) or stopped accepting connections.
pub fn serve(options: &ServeOptions) -> Result<()> {
    let reg = registry()?;
    let device = Device::select(&options.device, Repack::None, || None)?;
    let mut dev = capped_device(device.dev, usize::try_from(options.memory).unwrap_or(usize::MAX))?;
    // SAFETY: a registry lookup by a NUL-terminated name; the address, when present, is
    // `ggml_backend_rpc_start_server` as ggml-rpc.h declares it.
    let start: StartServer = unsafe {
        let f = sys::ggml_backend_reg_get_proc_address(reg, c"ggml_backend_rpc_start_server".as_ptr());
        if f.is_null() {
            return Err(Error::Rpc("ggml's RPC backend has no ggml_backend_rpc_start_server".into()));
        }
        std::mem::transmute::<*mut c_void, StartServer>(f)
    };
    let endpoint = c_string(&options.endpoint)?;
    let cache = options.cache_dir.as_deref().map(path_c_string).transpose()?;
    let cache_ptr = cache.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: NUL-terminated strings and a one-element device array that outlive the call
    // (it only returns when the server stops); `dev` is our capped copy of a registry device,
    // leaked, so it lives for the process.
    unsafe { start(endpoint.as_ptr(), cache_ptr, options.threads.max(1), 1, &mut dev) };
    Err(Error::Rpc(format!(
        "the RPC server on {} stopped: the address is in use, not an IPv4 address of this \
         machine, or the device could not start (see the lines above)",
        options.endpoint
    )))
}

fn c_string(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::Rpc(format!("{s:?} contains a NUL byte")))
}

fn path_c_string(p: &Path) -> Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Error::Rpc(format!("{} contains a NUL byte", p.display())))
}

// ---------------------------------------------------------------------------------------------
// The capped device.

/// `struct ggml_backend_device_i` (ggml-backend-impl.h): 15 function pointers. Only the three
/// replaced are typed.
#[repr(C)]
#[derive(Clone, Copy)]
struct DeviceIface {
    get_name: *const c_void,
    get_description: *const c_void,
    get_memory: Option<unsafe extern "C" fn(sys::ggml_backend_dev_t, *mut usize, *mut usize)>,
    get_type: *const c_void,
    get_props: *const c_void,
    init_backend: Option<unsafe extern "C" fn(sys::ggml_backend_dev_t, *const c_char) -> sys::ggml_backend_t>,
    get_buffer_type: Option<unsafe extern "C" fn(sys::ggml_backend_dev_t) -> sys::ggml_backend_buffer_type_t>,
    rest: [*const c_void; 8],
}

/// `struct ggml_backend_device`.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawDevice {
    iface: DeviceIface,
    reg: sys::ggml_backend_reg_t,
    context: *mut c_void,
}

/// `struct ggml_backend_buffer_type_i`: 8 function pointers, the second replaced.
#[repr(C)]
#[derive(Clone, Copy)]
struct BufferTypeIface {
    get_name: *const c_void,
    alloc_buffer:
        Option<unsafe extern "C" fn(sys::ggml_backend_buffer_type_t, usize) -> sys::ggml_backend_buffer_t>,
    rest: [*const c_void; 6],
}

/// `struct ggml_backend_buffer_type`.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawBufferType {
    iface: BufferTypeIface,
    device: sys::ggml_backend_dev_t,
    context: *mut c_void,
}

/// The head of `struct ggml_backend_buffer`: its interface starts with `free_buffer`.
#[repr(C)]
struct RawBufferHead {
    free_buffer: Option<unsafe extern "C" fn(sys::ggml_backend_buffer_t)>,
}

/// The head of `struct ggml_backend`: a guid, the interface (16 function pointers), the device.
#[repr(C)]
struct RawBackendHead {
    guid: *mut c_void,
    iface: [*const c_void; 16],
    device: sys::ggml_backend_dev_t,
}

/// The one capped device of this process (a server lends one device), and its accounts.
struct Cap {
    limit: usize,
    /// The device lent and its buffer type, as ggml made them.
    inner_dev: usize,
    inner: RawDevice,
    inner_buft: RawBufferType,
    /// Our copies, handed to the server.
    dev: usize,
    buft: usize,
    /// Live buffers: their size and the `free_buffer` they came with.
    live: Mutex<HashMap<usize, (usize, unsafe extern "C" fn(sys::ggml_backend_buffer_t))>>,
}

impl Cap {
    fn used(&self) -> usize {
        self.live.lock().map(|l| l.values().map(|(size, _)| size).sum()).unwrap_or(self.limit)
    }
}

// SAFETY: the raw pointers are ggml's registry device and buffer type (process-wide, never
// freed) and function pointers; the mutable accounts are behind the mutex.
unsafe impl Send for Cap {}
// SAFETY: as for Send.
unsafe impl Sync for Cap {}

static CAP: OnceLock<Cap> = OnceLock::new();

/// A copy of `dev` that lends at most `limit` bytes (see the module's comment).
fn capped_device(dev: sys::ggml_backend_dev_t, limit: usize) -> Result<sys::ggml_backend_dev_t> {
    let layout_changed = || {
        Error::Rpc(
            "ggml's backend structs differ from those pocket-ggml mirrors: --memory cannot be capped".into(),
        )
    };
    // SAFETY: `dev` is a registry device, which is a `struct ggml_backend_device`; we read it
    // as our mirror only after the field ggml's accessor reads (`reg`) is found where the
    // mirror puts it. Its buffer type likewise, checked by its `device` field.
    let (inner, inner_buft) = unsafe {
        let raw = *(dev as *const RawDevice);
        if raw.reg != sys::ggml_backend_dev_backend_reg(dev) {
            return Err(layout_changed());
        }
        let buft = sys::ggml_backend_dev_buffer_type(dev);
        let raw_buft = *(buft as *const RawBufferType);
        if raw_buft.device != sys::ggml_backend_buft_get_device(buft) || raw_buft.iface.alloc_buffer.is_none()
        {
            return Err(layout_changed());
        }
        (raw, raw_buft)
    };
    if inner.iface.get_memory.is_none() || inner.iface.init_backend.is_none() {
        return Err(layout_changed());
    }
    let mut copy = inner;
    copy.iface.get_memory = Some(capped_get_memory);
    copy.iface.init_backend = Some(capped_init_backend);
    copy.iface.get_buffer_type = Some(capped_buffer_type);
    let copy: &'static mut RawDevice = Box::leak(Box::new(copy));
    let copy_dev = copy as *mut RawDevice as sys::ggml_backend_dev_t;
    let mut buft = inner_buft;
    buft.iface.alloc_buffer = Some(capped_alloc_buffer);
    buft.device = copy_dev;
    let buft: &'static mut RawBufferType = Box::leak(Box::new(buft));
    let cap = Cap {
        limit,
        inner_dev: dev as usize,
        inner,
        inner_buft,
        dev: copy_dev as usize,
        buft: buft as *mut RawBufferType as usize,
        live: Mutex::new(HashMap::new()),
    };
    CAP.set(cap).map_err(|_| Error::Rpc("a process lends one device".into()))?;
    Ok(copy_dev)
}

/// # Safety
/// Called by ggml with our capped device and two valid out-pointers.
unsafe extern "C" fn capped_get_memory(_dev: sys::ggml_backend_dev_t, free: *mut usize, total: *mut usize) {
    let Some(cap) = CAP.get() else { return };
    if let Some(get_memory) = cap.inner.iface.get_memory {
        // SAFETY: the device's own query on the device it belongs to, with ggml's pointers.
        unsafe { get_memory(cap.inner_dev as sys::ggml_backend_dev_t, free, total) };
    }
    let left = cap.limit.saturating_sub(cap.used());
    // SAFETY: ggml's out-pointers, valid for the call.
    unsafe {
        *total = (*total).min(cap.limit);
        *free = (*free).min(left);
    }
}

/// # Safety
/// Called by ggml with our capped device.
unsafe extern "C" fn capped_buffer_type(_dev: sys::ggml_backend_dev_t) -> sys::ggml_backend_buffer_type_t {
    CAP.get().map_or(std::ptr::null_mut(), |cap| cap.buft as sys::ggml_backend_buffer_type_t)
}

/// Start the device's backend, then point it at our copy of the device: the server asks the
/// backend's device for its memory and buffer type.
///
/// # Safety
/// Called by ggml with our capped device and its params string.
unsafe extern "C" fn capped_init_backend(
    _dev: sys::ggml_backend_dev_t,
    params: *const c_char,
) -> sys::ggml_backend_t {
    let Some(cap) = CAP.get() else { return std::ptr::null_mut() };
    let Some(init) = cap.inner.iface.init_backend else { return std::ptr::null_mut() };
    // SAFETY: the device's own init on the device it belongs to.
    let backend = unsafe { init(cap.inner_dev as sys::ggml_backend_dev_t, params) };
    if backend.is_null() {
        return backend;
    }
    // SAFETY: a backend just made, a `struct ggml_backend`; its `device` field is checked to be
    // where the mirror puts it before it is written.
    unsafe {
        let head = backend as *mut RawBackendHead;
        if (*head).device != sys::ggml_backend_get_device(backend) {
            tracing::error!("ggml's backend struct differs from pocket-ggml's mirror: not lending it");
            sys::ggml_backend_free(backend);
            return std::ptr::null_mut();
        }
        (*head).device = cap.dev as sys::ggml_backend_dev_t;
    }
    backend
}

/// Allocate within the limit, and take note of the buffer to count it back when freed.
///
/// # Safety
/// Called by ggml with our capped buffer type.
unsafe extern "C" fn capped_alloc_buffer(
    buft: sys::ggml_backend_buffer_type_t,
    size: usize,
) -> sys::ggml_backend_buffer_t {
    let Some(cap) = CAP.get() else { return std::ptr::null_mut() };
    let Ok(mut live) = cap.live.lock() else { return std::ptr::null_mut() };
    let used: usize = live.values().map(|(s, _)| s).sum();
    if used.saturating_add(size) > cap.limit {
        tracing::warn!(
            asked = size,
            used,
            limit = cap.limit,
            "refused a peer's buffer of {} MiB: {} MiB of the {} MiB lent are in use",
            size >> 20,
            used >> 20,
            cap.limit >> 20
        );
        return std::ptr::null_mut();
    }
    let Some(alloc) = cap.inner_buft.iface.alloc_buffer else { return std::ptr::null_mut() };
    // SAFETY: the buffer type's own allocator, given our copy, whose context is its own.
    let buffer = unsafe { alloc(buft, size) };
    if buffer.is_null() {
        return buffer;
    }
    // SAFETY: a buffer just made, a `struct ggml_backend_buffer`, whose interface starts with
    // `free_buffer`; ggml_backend_buffer_free calls it before deleting the struct.
    unsafe {
        let head = buffer as *mut RawBufferHead;
        let Some(free) = (*head).free_buffer else { return buffer };
        live.insert(buffer as usize, (sys::ggml_backend_buffer_get_size(buffer), free));
        (*head).free_buffer = Some(capped_free_buffer);
    }
    buffer
}

/// # Safety
/// Called by ggml_backend_buffer_free with a buffer [`capped_alloc_buffer`] made.
unsafe extern "C" fn capped_free_buffer(buffer: sys::ggml_backend_buffer_t) {
    let Some(cap) = CAP.get() else { return };
    let entry = cap.live.lock().ok().and_then(|mut live| live.remove(&(buffer as usize)));
    if let Some((_, free)) = entry {
        // SAFETY: the buffer's own free function, which it was made with.
        unsafe { free(buffer) };
    }
}

/// Bytes peers hold on the capped device now, and its limit (for tests and logs).
pub fn lent() -> Option<(u64, u64)> {
    CAP.get().map(|cap| (cap.used() as u64, cap.limit as u64))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use super::*;

    /// Held by each test that talks to [`server`]: it serves one client at a time, and ggml's
    /// client holds process-wide locks while it waits for a reply (making a buffer type, adding
    /// a server), so two such tests at once can each wait for the other.
    pub(crate) static ONE_CLIENT: Mutex<()> = Mutex::new(());

    /// The one server of this test process (a process lends one device): a CPU with 64 MiB
    /// for peers, on a free loopback port.
    pub(crate) fn server() -> &'static str {
        static ENDPOINT: OnceLock<String> = OnceLock::new();
        ENDPOINT
            .get_or_init(|| crate::rpc::serve_on_loopback(64 << 20, 1).expect("an RPC server on loopback"))
    }

    #[test]
    fn a_capped_server_lends_no_more_than_its_memory() {
        let _one = ONE_CLIENT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let endpoint = server();
        let peer = crate::rpc::probe(endpoint, Duration::from_secs(2)).unwrap();
        assert_eq!(peer.version.to_string(), protocol().unwrap());
        assert_eq!(peer.devices.len(), 1);
        assert_eq!(peer.devices[0].total_bytes, 64 << 20);
        assert_eq!(peer.devices[0].free_bytes, 64 << 20);

        let devices = add_server(endpoint).unwrap();
        assert_eq!(devices.len(), 1);
        let free = |dev| {
            let (mut free, mut total) = (0usize, 0usize);
            // SAFETY: an RPC device of a live server; out-pointers valid for the call.
            unsafe { sys::ggml_backend_dev_memory(dev, &mut free, &mut total) };
            (free, total)
        };
        // SAFETY: buffers of the RPC device's buffer type, each freed once below.
        unsafe {
            let buft = sys::ggml_backend_dev_buffer_type(devices[0]);
            let first = sys::ggml_backend_buft_alloc_buffer(buft, 40 << 20);
            assert!(!first.is_null(), "40 of 64 MiB refused");
            let (left, total) = free(devices[0]);
            assert_eq!(total, 64 << 20);
            assert!(left <= 24 << 20, "{left} bytes free after 40 of 64 MiB were taken");
            let second = sys::ggml_backend_buft_alloc_buffer(buft, 40 << 20);
            assert!(second.is_null(), "80 of 64 MiB lent");
            sys::ggml_backend_buffer_free(first);
            assert_eq!(free(devices[0]).0, 64 << 20, "a freed buffer is counted back");
            let third = sys::ggml_backend_buft_alloc_buffer(buft, 40 << 20);
            assert!(!third.is_null(), "40 MiB refused after the first 40 were freed");
            sys::ggml_backend_buffer_free(third);
        }
    }

    /// ggml's RPC client on the first device of an endpoint, for tests outside `ffi` (which
    /// may not call ggml themselves).
    pub(crate) struct Client(sys::ggml_backend_dev_t);

    /// A buffer on a [`Client`]'s device, freed on drop.
    pub(crate) struct Buffer(sys::ggml_backend_buffer_t);

    impl Client {
        /// ggml's client for `endpoint`'s first device (ggml caches the device list per
        /// endpoint for the process).
        pub(crate) fn new(endpoint: &str) -> Client {
            Client(add_server(endpoint).unwrap()[0])
        }

        /// The device's (free, total) bytes, as ggml asks the server.
        pub(crate) fn memory(&self) -> (u64, u64) {
            let (mut free, mut total) = (0usize, 0usize);
            // SAFETY: an RPC device (which lives for the process); out-pointers valid for the call.
            unsafe { sys::ggml_backend_dev_memory(self.0, &mut free, &mut total) };
            (free as u64, total as u64)
        }

        /// A buffer of `size` bytes, or none when the server refused it.
        pub(crate) fn alloc(&self, size: usize) -> Option<Buffer> {
            // SAFETY: the device's buffer type (made once per endpoint, never freed); the buffer
            // is owned by the returned `Buffer`, which frees it once.
            let buffer = unsafe {
                sys::ggml_backend_buft_alloc_buffer(sys::ggml_backend_dev_buffer_type(self.0), size)
            };
            (!buffer.is_null()).then_some(Buffer(buffer))
        }
    }

    impl Buffer {
        /// Write `data` at the start of the buffer and read it back, through ggml's client.
        pub(crate) fn round_trip(&self, data: &[u8]) -> Vec<u8> {
            let mut back = vec![0u8; data.len()];
            // SAFETY: a no_alloc context for one tensor description, freed below; the tensor is
            // placed at the buffer's base, within it (checked); `data` and `back` hold its bytes.
            unsafe {
                assert!(data.len() <= sys::ggml_backend_buffer_get_size(self.0));
                let ctx = sys::ggml_init(sys::ggml_init_params {
                    mem_size: sys::ggml_tensor_overhead() * 2,
                    mem_buffer: std::ptr::null_mut(),
                    no_alloc: true,
                });
                assert!(!ctx.is_null());
                let t = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_I8, data.len() as i64);
                let base = sys::ggml_backend_buffer_get_base(self.0);
                assert_eq!(sys::ggml_backend_tensor_alloc(self.0, t, base), sys::GGML_STATUS_SUCCESS);
                sys::ggml_backend_tensor_set(t, data.as_ptr().cast(), 0, data.len());
                sys::ggml_backend_tensor_get(t, back.as_mut_ptr().cast(), 0, back.len());
                sys::ggml_free(ctx);
            }
            back
        }
    }

    impl Drop for Buffer {
        fn drop(&mut self) {
            // SAFETY: a buffer `Client::alloc` made, freed once here.
            unsafe { sys::ggml_backend_buffer_free(self.0) };
        }
    }
}
