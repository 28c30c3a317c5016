//! What the crates that use pocket-ggml need to know about the llama.cpp build under it.
//!
//! - **The RPC protocol.** ggml-rpc's protocol version exists only as `#define`s in the header
//!   llama-cpp-sys-2 installs (`<out>/include/ggml-rpc.h`, installed with or without the
//!   backend); when the backend's library was built too (`GGML_RPC=ON`), it is compiled in as
//!   `POCKET_RPC_PROTOCOL` (`7.0.0`) and passed on as `DEP_POCKET_GGML_RPC_PROTOCOL`, so that
//!   `pocket --version` and `/v1/status` say which peers this build speaks to.
//! - **Where llama.cpp's shared libraries are** (the `cuda` feature). llama-cpp-sys-2 then
//!   builds ggml and llama as shared libraries in its own output folder. The copies it puts
//!   beside the binaries are the unversioned symlinks alone (`libggml.so` → `libggml.so.0`,
//!   which is not there), so a binary looks in that folder itself: it is passed on as
//!   `DEP_POCKET_GGML_LIB_DIR` (the `links` key makes Cargo pass it), and pocketd's build script
//!   puts it in its binaries' rpath.
//! - **Where OpenVINO's libraries are** (the `openvino` feature, also shared libraries):
//!   `POCKET_OPENVINO_LIBS` from scripts/setup-openvino, passed on as
//!   `DEP_POCKET_GGML_OPENVINO_LIBS` for pocketd's binaries, and put with the folder above in
//!   the run path of this crate's own tests.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_GGML_CMAKE_DIR");
    // llama-cpp-sys-2's `cargo:ggml_cmake_dir`: the installed ggml package, `<out>/lib/cmake`.
    let lib_dir = std::env::var_os("DEP_LLAMA_GGML_CMAKE_DIR")
        .and_then(|cmake| Path::new(&cmake).parent().map(Path::to_path_buf));
    rpc_protocol(lib_dir.as_deref());
    let shared = ["CARGO_FEATURE_CUDA", "CARGO_FEATURE_OPENVINO"];
    if shared.iter().all(|feature| std::env::var_os(feature).is_none()) {
        return;
    }
    openvino_run_path(lib_dir.as_deref());
    match lib_dir {
        Some(lib) => println!("cargo:lib_dir={}", lib.display()),
        None => println!(
            "cargo:warning=llama-cpp-sys-2 gave no ggml_cmake_dir: binaries need LD_LIBRARY_PATH for libllama"
        ),
    }
}

/// Compile the protocol version of `<out>/include/ggml-rpc.h` in as `POCKET_RPC_PROTOCOL`, if
/// the backend's library is in `<out>/lib`.
fn rpc_protocol(lib_dir: Option<&Path>) {
    let Some(lib_dir) = lib_dir else { return };
    let Some(header) = lib_dir.parent().map(|out| out.join("include").join("ggml-rpc.h")) else {
        return;
    };
    println!("cargo:rerun-if-changed={}", header.display());
    let built = ["libggml-rpc.a", "libggml-rpc.so"].iter().any(|lib| lib_dir.join(lib).exists());
    if !built {
        return;
    }
    let Ok(text) = std::fs::read_to_string(&header) else {
        return;
    };
    let part = |name: &str| {
        text.lines().find_map(|line| {
            let rest = line.trim().strip_prefix("#define")?.trim();
            let value = rest.strip_prefix(name)?.trim();
            value.parse::<u32>().ok()
        })
    };
    match (part("RPC_PROTO_MAJOR_VERSION"), part("RPC_PROTO_MINOR_VERSION"), part("RPC_PROTO_PATCH_VERSION"))
    {
        (Some(major), Some(minor), Some(patch)) => {
            println!("cargo:rustc-env=POCKET_RPC_PROTOCOL={major}.{minor}.{patch}");
            println!("cargo:rpc_protocol={major}.{minor}.{patch}");
        }
        _ => println!("cargo:warning=no protocol version in {}", PathBuf::from(&header).display()),
    }
}

/// With `openvino`: pass the wheel's library folder on, and give this crate's tests a run path
/// to it and to llama-cpp-sys-2's shared libraries (pocketd's build script does the same for
/// its binaries).
fn openvino_run_path(lib_dir: Option<&Path>) {
    println!("cargo:rerun-if-env-changed=POCKET_OPENVINO_LIBS");
    if std::env::var_os("CARGO_FEATURE_OPENVINO").is_none() {
        return;
    }
    let Some(libs) = std::env::var_os("POCKET_OPENVINO_LIBS") else {
        println!("cargo:warning=POCKET_OPENVINO_LIBS is not set: run scripts/setup-openvino first");
        return;
    };
    let libs = PathBuf::from(libs);
    println!("cargo:openvino_libs={}", libs.display());
    // ffi/openvino.rs asks OpenVINO's C API for its devices.
    println!("cargo:rustc-link-search=native={}", libs.display());
    let mut dirs = vec![libs.display().to_string()];
    if let Some(lib) = lib_dir {
        dirs.push(lib.display().to_string());
    }
    println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags,-rpath,{}", dirs.join(":"));
}
