//! Whether this CPU has the instructions the binary was compiled for.
//!
//! On x86-64 pocketd is compiled for the CPU of the machine that builds it (`.cargo/config.toml`),
//! and ggml with it. Moved to a CPU without, say, AVX-512, such a binary would die of an illegal
//! instruction somewhere in its first forward pass; checked first thing in `main`, it says which
//! instructions are missing and how to build one that runs.

/// The instruction set extensions this binary was compiled to use and this CPU lacks, or an
/// empty list. Only the extensions ggml's kernels and ours are compiled for are checked.
pub fn missing_features() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut missing = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! check {
            ($($feature:tt),*) => {$(
                if cfg!(target_feature = $feature) && !std::arch::is_x86_feature_detected!($feature) {
                    missing.push($feature);
                }
            )*};
        }
        check!(
            "avx",
            "avx2",
            "fma",
            "f16c",
            "bmi2",
            "avxvnni",
            "avx512f",
            "avx512bw",
            "avx512vl",
            "avx512dq",
            "avx512vnni",
            "avx512bf16",
            "avx512vbmi",
            "avx512fp16"
        );
    }
    missing
}

/// `Err` with what to do when this CPU lacks instructions the binary was compiled for.
pub fn check_build() -> Result<(), String> {
    refusal(&missing_features()).map_or(Ok(()), Err)
}

/// What to say when this CPU lacks `missing`, or `None` when nothing is missing.
fn refusal(missing: &[&str]) -> Option<String> {
    if missing.is_empty() {
        return None;
    }
    Some(format!(
        "this binary was compiled for a CPU with {} and this CPU lacks {}: build it on this \
         machine (`cargo build --release`), or build one for any x86-64 with AVX2 with \
         RUSTFLAGS=\"-C target-cpu=x86-64-v3\" cargo build --release",
        missing.join(", "),
        if missing.len() == 1 { "it" } else { "them" }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_that_built_the_tests_runs_them() {
        // The tests run where they were built, so nothing the build used can be missing.
        assert_eq!(missing_features(), Vec::<&str>::new());
        assert!(check_build().is_ok());
    }

    #[test]
    fn a_missing_extension_is_named_with_how_to_build_for_this_cpu() {
        assert_eq!(refusal(&[]), None);
        let said = refusal(&["avx512f", "avx512vnni"]).unwrap();
        assert!(said.contains("avx512f, avx512vnni"), "{said}");
        assert!(said.contains("target-cpu=x86-64-v3"), "{said}");
    }
}
