//! OpenVINO's devices (the `openvino` feature): which there are, and which one ggml's OpenVINO
//! backend computes on.
//!
//! ggml-openvino registers every OpenVINO device (`OPENVINO0`, `OPENVINO1`, … in the sorted
//! order of OpenVINO's names: `CPU`, `GPU`, `NPU`) but runs ops on one only, chosen by
//! `GGML_OPENVINO_DEVICE` when the backend starts, and aborts the process if that names a
//! device OpenVINO does not have. So a device is asked for by OpenVINO's name
//! (`--device openvino:NPU`), checked here against OpenVINO's own list (its C API) before
//! ggml starts, and set for the backend then; a second, different one in the same process is
//! refused, since the backend cannot change its device.

use std::ffi::{CStr, c_char};
use std::sync::Mutex;

use llama_cpp_sys_2 as sys;

use crate::error::{Error, Result};

/// How `--device` names an OpenVINO device: `openvino:NPU`, `openvino:GPU.1`, `openvino:CPU`;
/// `openvino` alone is the backend's default (its CPU device where there is one).
pub(crate) const PREFIX: &str = "openvino";

#[repr(C)]
struct AvailableDevices {
    devices: *mut *mut c_char,
    size: usize,
}

#[link(name = "openvino_c")]
unsafe extern "C" {
    fn ov_core_create(core: *mut *mut std::ffi::c_void) -> i32;
    fn ov_core_free(core: *mut std::ffi::c_void);
    fn ov_core_get_available_devices(core: *const std::ffi::c_void, devices: *mut AvailableDevices) -> i32;
    fn ov_available_devices_free(devices: *mut AvailableDevices);
}

/// The devices OpenVINO's plugins find on this machine, by OpenVINO's names, sorted, without
/// its routing devices (`AUTO`, `MULTI`, `HETERO`), as ggml-openvino lists them.
pub(crate) fn available() -> Result<Vec<String>> {
    let mut core = std::ptr::null_mut();
    // SAFETY: `core` is a valid out-pointer; on success OpenVINO gives a core we free below.
    if unsafe { ov_core_create(&mut core) } != 0 || core.is_null() {
        return Err(Error::Ggml("OpenVINO's runtime did not start (ov_core_create failed)".into()));
    }
    let mut list = AvailableDevices { devices: std::ptr::null_mut(), size: 0 };
    // SAFETY: a live core and a valid out-struct, which OpenVINO fills with `size` C strings.
    let status = unsafe { ov_core_get_available_devices(core, &mut list) };
    let mut names = Vec::new();
    if status == 0 && !list.devices.is_null() {
        for i in 0..list.size {
            // SAFETY: `devices` holds `size` NUL-terminated strings, alive until freed below.
            let name = unsafe { CStr::from_ptr(*list.devices.add(i)) };
            names.push(name.to_string_lossy().into_owned());
        }
        // SAFETY: the list OpenVINO filled, freed once.
        unsafe { ov_available_devices_free(&mut list) };
    }
    // SAFETY: the core created above, freed once.
    unsafe { ov_core_free(core) };
    if status != 0 {
        return Err(Error::Ggml(format!("OpenVINO could not list its devices (status {status})")));
    }
    names.retain(|n| !["AUTO", "MULTI", "HETERO", "BATCH"].iter().any(|r| n.starts_with(r)));
    names.sort();
    names.dedup();
    Ok(names)
}

/// The device asked for before ggml started (none: the backend's default).
static REQUESTED: Mutex<Option<String>> = Mutex::new(None);

/// Ask for OpenVINO's device `name` (as OpenVINO names it; empty: the backend's default).
/// Before ggml starts it is checked against [`available`] and given to the backend; after, it
/// must be the device the backend already computes on.
pub(crate) fn request(name: &str) -> Result<()> {
    let mut requested = REQUESTED.lock().unwrap_or_else(|e| e.into_inner());
    if super::started() {
        let current = selected().unwrap_or_default();
        return if name.is_empty() || name.eq_ignore_ascii_case(&current) {
            Ok(())
        } else {
            Err(Error::NoDevice {
                wanted: format!("{PREFIX}:{name}"),
                available: format!(
                    "{PREFIX}:{current} (ggml's OpenVINO backend computes on one device per process, \
                     chosen when it starts)"
                ),
            })
        };
    }
    if name.is_empty() {
        return Ok(());
    }
    let names = available()?;
    let Some(found) = names.iter().find(|n| n.eq_ignore_ascii_case(name)) else {
        return Err(Error::NoDevice {
            wanted: format!("{PREFIX}:{name}"),
            available: names.iter().map(|n| format!("{PREFIX}:{n}")).collect::<Vec<_>>().join(", "),
        });
    };
    *requested = Some(found.clone());
    Ok(())
}

/// Called as ggml starts: hand the requested device to the backend and set its options.
///
/// OpenVINO's own cache of compiled models on disk is left off unless the operator sets
/// `GGML_OPENVINO_CACHE_DIR`: on its CPU device reading a model back took as long as compiling
/// it (a fresh `pocket run` on SmolLM2 in 33.5 s without it, 34.0 s with it warm), and each
/// shape's file held the weights again (186 MB for SmolLM2's 94 MB; 3.6 GB after a day's
/// tests). The backend keeps the models it compiled while the model is loaded.
pub(super) fn configure() {
    let requested = REQUESTED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(name) = requested.as_deref() {
        // SAFETY: set once, while ggml starts (under `init`'s Once, before its registry reads
        // it); Rust code of this process does not read this variable.
        unsafe { std::env::set_var("GGML_OPENVINO_DEVICE", name) };
    }
    // The backend's attention for grouped queries as plain matrix products: its fused one
    // fails the x86 CPU plugin's shape inference for our graph's passes of several tokens
    // ("Incompatible MatMul batch dimension", SmolLM2's 9 query heads over 3 KV heads). The
    // arm64 plugin (on Arm's Compute Library) is the other way round: it refuses the manual
    // form's 5-D f16 products ("ACL does not support more than 4 dimensions") and ran the
    // fused one for passes of 1 to 8 tokens (under qemu; cross/README.md).
    if cfg!(target_arch = "x86_64") && std::env::var_os("GGML_OPENVINO_MANUAL_GQA_ATTN").is_none() {
        // SAFETY: as above.
        unsafe { std::env::set_var("GGML_OPENVINO_MANUAL_GQA_ATTN", "1") };
    }
    // Q6_K and Q5_K matrices as the file has them: by default the backend requantizes them to
    // 8 bits per row, which moves the logits away from llama.cpp's on the CPU.
    if std::env::var_os("GGML_OPENVINO_REQUANT_KQUANT").is_none() {
        // SAFETY: as above.
        unsafe { std::env::set_var("GGML_OPENVINO_REQUANT_KQUANT", "native") };
    }
}

/// OpenVINO's name for the device the backend computes on, read from the ggml devices'
/// descriptions (`GGML_OPENVINO_DEVICE=NPU (selected) - …`).
pub(crate) fn selected() -> Option<String> {
    crate::ffi::init();
    // SAFETY: registry queries with in-range indices.
    let devices: Vec<_> =
        unsafe { (0..sys::ggml_backend_dev_count()).map(|i| sys::ggml_backend_dev_get(i)).collect() };
    devices.into_iter().find_map(|d| of(d).and_then(|(ov, selected)| selected.then_some(ov)))
}

/// OpenVINO's name for a device of ggml's registry, if it is one of the backend's, and whether
/// the backend computes on it.
pub(crate) fn of(dev: sys::ggml_backend_dev_t) -> Option<(String, bool)> {
    // SAFETY: a registry device; its description is a NUL-terminated string it keeps.
    let description = unsafe { CStr::from_ptr(sys::ggml_backend_dev_description(dev)) }.to_string_lossy();
    let ov = ov_name(&description)?.to_owned();
    Some((ov, description.contains("(selected)")))
}

/// OpenVINO's name for a ggml device's description, if it is one of the backend's.
pub(crate) fn ov_name(description: &str) -> Option<&str> {
    let rest = description.strip_prefix("GGML_OPENVINO_DEVICE=")?;
    Some(rest.split_once(' ').map_or(rest, |(name, _)| name))
}
