//! Whether this CPU has the instructions the binary was compiled for.
//!
//! On x86-64 pocketd is compiled for the CPU of the machine that builds it (`.cargo/config.toml`),
//! and ggml with it. Moved to a CPU without, say, AVX-512, such a binary would die of an illegal
//! instruction somewhere in its first forward pass; checked first thing in `main`, it says which
//! instructions are missing and how to build one that runs.

/// The instruction set extensions this binary was compiled to use and this CPU lacks, or an
/// empty list. Only the extensions ggml's kernels and ours are compiled for are checked.
fn missing_features() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut missing = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        // `is_x86_feature_detected!` answers `true` for whatever the binary was compiled with,
        // without asking the CPU, so the CPU is asked here (CPUID leaf, subleaf, register, bit).
        macro_rules! check {
            ($($feature:literal at $leaf:literal, $sub:literal, $reg:ident, $bit:literal;)*) => {$(
                if cfg!(target_feature = $feature)
                    && std::arch::x86_64::__cpuid_count($leaf, $sub).$reg & (1 << $bit) == 0
                {
                    missing.push($feature);
                }
            )*};
        }
        check! {
            "fma" at 1, 0, ecx, 12;
            "avx" at 1, 0, ecx, 28;
            "f16c" at 1, 0, ecx, 29;
            "avx2" at 7, 0, ebx, 5;
            "bmi2" at 7, 0, ebx, 8;
            "avx512f" at 7, 0, ebx, 16;
            "avx512dq" at 7, 0, ebx, 17;
            "avx512bw" at 7, 0, ebx, 30;
            "avx512vl" at 7, 0, ebx, 31;
            "avx512vbmi" at 7, 0, ecx, 1;
            "avx512vnni" at 7, 0, ecx, 11;
            "avx512fp16" at 7, 0, edx, 23;
            "avxvnni" at 7, 1, eax, 4;
            "avx512bf16" at 7, 1, eax, 5;
        }
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
