//! The version the binaries print, and where a CUDA build finds its shared libraries at run
//! time.
//!
//! `--version` names the ggml RPC protocol the build speaks (peers must speak the same), which
//! pocket-ggml's build script passes on as `DEP_POCKET_GGML_RPC_PROTOCOL`: `POCKETD_VERSION`.
//!
//! With the `cuda` feature ggml is built as shared libraries (see pocket-ggml's Cargo.toml).
//! The binaries look for them beside themselves (`$ORIGIN`), in `$ORIGIN/../lib/pocketd` (where
//! cross/install.sh puts a board's), in llama-cpp-sys-2's output folder
//! (`DEP_POCKET_GGML_LIB_DIR`), and for the CUDA runtime and cuBLAS in the toolkit's library
//! folder the build used (`$CUDA_PATH/lib`, `lib64`), so a `pocketd` built with
//! `scripts/setup-cuda` runs without `LD_LIBRARY_PATH` on the machine that built it. Elsewhere
//! (a board with JetPack, a GPU server) the CUDA runtime and cuBLAS come from
//! `/usr/local/cuda/lib64`, the last entry, or the system's library path or `LD_LIBRARY_PATH`.
//! With the `openvino` feature ggml is shared too, and OpenVINO's libraries are found in the
//! wheel's folder that scripts/setup-openvino unpacked (`DEP_POCKET_GGML_OPENVINO_LIBS`).
//!
//! The search path is written as DT_RPATH rather than DT_RUNPATH (`--disable-new-dtags`):
//! only DT_RPATH also applies to the libraries' own dependencies — libggml-cuda.so needs
//! libcudart and libcublas, and carries no search path of its own.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_POCKET_GGML_RPC_PROTOCOL");
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let rpc = std::env::var("DEP_POCKET_GGML_RPC_PROTOCOL")
        .map_or_else(|_| "no RPC backend".to_owned(), |p| format!("ggml RPC protocol {p}"));
    println!("cargo:rustc-env=POCKETD_VERSION={version} ({rpc})");
    println!("cargo:rerun-if-env-changed=CUDA_PATH");
    println!("cargo:rerun-if-env-changed=DEP_POCKET_GGML_LIB_DIR");
    println!("cargo:rerun-if-env-changed=DEP_POCKET_GGML_OPENVINO_LIBS");
    let cuda = std::env::var_os("CARGO_FEATURE_CUDA").is_some();
    if !cuda && std::env::var_os("CARGO_FEATURE_OPENVINO").is_none() {
        return;
    }
    let mut dirs = vec!["$ORIGIN".to_string(), "$ORIGIN/../lib/pocketd".to_string()];
    // llama-cpp-sys-2's output folder, which has the versioned libraries the symlinks it puts
    // beside the binaries point to (see pocket-ggml's build.rs).
    if let Some(lib) = std::env::var_os("DEP_POCKET_GGML_LIB_DIR") {
        dirs.push(std::path::PathBuf::from(lib).display().to_string());
    }
    // OpenVINO's runtime, plugins and oneTBB from the wheel scripts/setup-openvino unpacked.
    if let Some(libs) = std::env::var_os("DEP_POCKET_GGML_OPENVINO_LIBS") {
        dirs.push(std::path::PathBuf::from(libs).display().to_string());
    }
    if !cuda {
        println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags,-rpath,{}", dirs.join(":"));
        return;
    }
    if let Some(cuda) = std::env::var_os("CUDA_PATH") {
        let cuda = std::path::PathBuf::from(cuda);
        for lib in ["lib", "lib64"] {
            let dir = cuda.join(lib);
            if dir.is_dir() {
                dirs.push(dir.display().to_string());
            }
        }
    }
    // Where NVIDIA's installers and JetPack put the runtime and cuBLAS, for a binary that runs
    // on another machine than the one that built it.
    dirs.push("/usr/local/cuda/lib64".to_string());
    println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags,-rpath,{}", dirs.join(":"));
}
