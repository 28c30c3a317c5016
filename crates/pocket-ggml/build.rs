//! Where llama.cpp's shared libraries are, for the crates that link pocket-ggml.
//!
//! With the `cuda` feature llama-cpp-sys-2 builds ggml and llama as shared libraries in its
//! own output folder. The copies it puts beside the binaries are the unversioned symlinks
//! alone (`libggml.so` → `libggml.so.0`, which is not there), so a binary looks in that
//! folder itself: it is passed on as `DEP_POCKET_GGML_LIB_DIR` (the `links` key makes Cargo
//! pass it), and pocketd's build script puts it in its binaries' rpath.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_GGML_CMAKE_DIR");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    // llama-cpp-sys-2's `cargo:ggml_cmake_dir`: the installed ggml package, `<out>/lib/cmake`.
    let Some(cmake) = std::env::var_os("DEP_LLAMA_GGML_CMAKE_DIR") else {
        println!(
            "cargo:warning=llama-cpp-sys-2 gave no ggml_cmake_dir: binaries need LD_LIBRARY_PATH for libllama"
        );
        return;
    };
    if let Some(lib) = std::path::Path::new(&cmake).parent() {
        println!("cargo:lib_dir={}", lib.display());
    }
}
