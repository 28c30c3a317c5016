//! Two results documents side by side (`pocket bench --compare A.json B.json`): the same
//! workload run on two devices (a board and a workstation, the CPU and the GPU of one
//! board), or on one device before and after a change.
//!
//! Ratios are B over A. Where both files ran the same prompt in the same mode, the decode
//! ratio is the median of the per-prompt ratios, as in one benchmark; the medians of each
//! side are shown beside it.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use super::Error;
use super::median::median;
use super::report::{mib, num, ratio, short_sha, write_rows};
use super::results::{BenchResults, CostPoint, RunRecord};

/// One side of a comparison: a results document and what to call it.
#[derive(Debug, Clone)]
pub struct Side {
    /// A short name for tables and the chart's legend (the file's stem).
    pub label: String,
    /// The document.
    pub results: BenchResults,
}

impl Side {
    /// Read a results document written by `pocket bench --json`.
    pub fn load(path: &Path) -> Result<Side, Error> {
        let text = std::fs::read_to_string(path).map_err(|error| Error::Io {
            action: "read the results",
            path: path.to_owned(),
            error,
        })?;
        let results: BenchResults = serde_json::from_str(&text).map_err(|e| {
            Error::Invalid(format!(
                "{}: not a results document of `pocket bench --json` ({e})",
                path.display()
            ))
        })?;
        let label =
            path.file_stem().map_or_else(|| path.display().to_string(), |s| s.to_string_lossy().into());
        Ok(Side { label, results })
    }
}

/// One mode's figures on both sides; `None` where a side did not run the mode.
#[derive(Debug, Clone, PartialEq)]
pub struct ModeRow {
    /// The mode.
    pub mode: String,
    /// Median decode tok/s on each side.
    pub decode: [Option<f64>; 2],
    /// Median over the prompts both sides ran of decode tok/s, B over A.
    pub decode_ratio: Option<f64>,
    /// Median prefill tok/s on each side.
    pub prefill: [Option<f64>; 2],
    /// Median over the prompts both sides ran of prefill tok/s, B over A.
    pub prefill_ratio: Option<f64>,
    /// Speed-up over `vanilla` on each side.
    pub vs_vanilla: [Option<f64>; 2],
    /// Acceptance on each side.
    pub acceptance: [Option<f64>; 2],
    /// Peak RSS on each side.
    pub peak_rss: [Option<u64>; 2],
    /// Runs of this mode whose tokens are the same on both sides, out of those compared.
    pub same_output: (usize, usize),
}

/// Everything the comparison shows.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// The two sides, A then B.
    pub sides: [Side; 2],
    /// Modes in the order A ran them, then those only B ran.
    pub rows: Vec<ModeRow>,
    /// Settings that differ between the sides (`kv: f16 / q8_0`), which make the comparison
    /// one of more than the device.
    pub differences: Vec<String>,
}

/// Compare `a` with `b`.
pub fn compare(a: Side, b: Side) -> Comparison {
    let (ra, rb) = (&a.results, &b.results);
    let mut modes = ra.modes();
    for m in rb.modes() {
        if !modes.contains(&m) {
            modes.push(m);
        }
    }
    let rows = modes.iter().map(|m| mode_row(m, ra, rb)).collect();
    let mut differences = Vec::new();
    let mut differ = |what: &str, x: String, y: String| {
        if x != y {
            differences.push(format!("{what}: {x} / {y}"));
        }
    };
    differ("model", ra.model.name.clone(), rb.model.name.clone());
    differ("model sha256", short_sha(&ra.model.file_sha256).into(), short_sha(&rb.model.file_sha256).into());
    differ("workload", ra.settings.workload.clone(), rb.settings.workload.clone());
    differ("kv", ra.settings.kv.clone(), rb.settings.kv.clone());
    differ("n_ctx", ra.settings.n_ctx.to_string(), rb.settings.n_ctx.to_string());
    differ(
        "max_tokens_cap",
        format!("{:?}", ra.settings.max_tokens_cap),
        format!("{:?}", rb.settings.max_tokens_cap),
    );
    differ(
        "memory budget",
        format!("{:?}", ra.settings.memory_budget_bytes),
        format!("{:?}", rb.settings.memory_budget_bytes),
    );
    differ("pocket version", ra.pocket_version.clone(), rb.pocket_version.clone());
    Comparison { sides: [a, b], rows, differences }
}

fn mode_row(mode: &str, a: &BenchResults, b: &BenchResults) -> ModeRow {
    let side = |r: &BenchResults| r.summary.get(mode).cloned();
    let (sa, sb) = (side(a), side(b));
    let both = |f: &dyn Fn(&super::results::ModeSummary) -> Option<f64>| {
        [sa.as_ref().and_then(f), sb.as_ref().and_then(f)]
    };
    // Runs of this mode paired by (prompt, round); a prompt run in more rounds on one side
    // than the other pairs only the rounds both have.
    let runs = |r: &BenchResults| -> BTreeMap<(String, usize), RunRecord> {
        r.runs
            .iter()
            .filter(|run| run.mode == mode)
            .map(|run| ((run.prompt_id.clone(), run.round), run.clone()))
            .collect()
    };
    let (runs_a, runs_b) = (runs(a), runs(b));
    let pairs: Vec<(&RunRecord, &RunRecord)> =
        runs_a.iter().filter_map(|(key, x)| Some((x, runs_b.get(key)?))).collect();
    let ratio_of = |f: fn(&RunRecord) -> Option<f64>| {
        median(pairs.iter().filter_map(|(x, y)| Some(f(y)? / f(x)?)).filter(|r| r.is_finite()))
    };
    let same = pairs.iter().filter(|(x, y)| x.output_sha256 == y.output_sha256).count();
    ModeRow {
        mode: mode.to_owned(),
        decode: both(&|s| s.decode_tok_per_s_median),
        decode_ratio: ratio_of(|r| r.decode_tok_per_s),
        prefill: both(&|s| s.prefill_tok_per_s_median),
        prefill_ratio: ratio_of(|r| Some(r.prefill_tok_per_s)),
        vs_vanilla: both(&|s| s.speedup_vs_vanilla),
        acceptance: both(&|s| s.acceptance),
        peak_rss: [sa.map(|s| s.peak_rss_bytes_max), sb.map(|s| s.peak_rss_bytes_max)],
        same_output: (same, pairs.len()),
    }
}

/// The comparison as text: who A and B are, what differs besides the device, one row per
/// mode, and the two cost curves.
pub fn table(c: &Comparison) -> String {
    let mut out = String::new();
    for (tag, side) in ["A", "B"].iter().zip(&c.sides) {
        let r = &side.results;
        let _ = writeln!(
            out,
            "{tag} = {}: {} on {} ({}{}, {} threads, kernels {}), kv {}, {} runs",
            side.label,
            r.model.name,
            r.machine.backend,
            r.machine.cpu,
            r.machine.arch.as_deref().map(|a| format!(" {a}")).unwrap_or_default(),
            r.machine.threads,
            r.machine.kernels.as_deref().unwrap_or("ggml"),
            r.settings.kv,
            r.runs.len(),
        );
    }
    if c.differences.is_empty() {
        let _ = writeln!(out, "same model, workload and settings: the difference is the machine");
    } else {
        let _ = writeln!(out, "differs besides the machine (A / B): {}", c.differences.join("; "));
    }
    let _ = writeln!(out);

    let header = [
        "mode",
        "decode A",
        "decode B",
        "B/A",
        "prefill A",
        "prefill B",
        "B/A",
        "vs vanilla A",
        "vs vanilla B",
        "acceptance A",
        "acceptance B",
        "same tokens",
        "peak RSS A",
        "peak RSS B",
    ];
    let mut rows = vec![header.map(String::from).to_vec()];
    for row in &c.rows {
        let share = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{:.0}%", v * 100.0));
        rows.push(vec![
            row.mode.clone(),
            num(row.decode[0], 1),
            num(row.decode[1], 1),
            ratio(row.decode_ratio),
            num(row.prefill[0], 1),
            num(row.prefill[1], 1),
            ratio(row.prefill_ratio),
            ratio(row.vs_vanilla[0]),
            ratio(row.vs_vanilla[1]),
            share(row.acceptance[0]),
            share(row.acceptance[1]),
            match row.same_output {
                (_, 0) => "-".into(),
                (same, n) => format!("{same}/{n}"),
            },
            row.peak_rss[0].map_or_else(|| "-".into(), mib),
            row.peak_rss[1].map_or_else(|| "-".into(), mib),
        ]);
    }
    write_rows(&mut out, &rows);

    let curves = [&c.sides[0].results.cost_curve, &c.sides[1].results.cost_curve];
    if curves.iter().any(|c| !c.is_empty()) {
        let _ = writeln!(out, "\nverification cost t(n)/t(1) (t(n) in ms)");
        let mut ns: Vec<usize> = curves.iter().flat_map(|c| c.iter().map(|p| p.n)).collect();
        ns.sort_unstable();
        ns.dedup();
        let mut rows = vec![vec!["n".to_string(), "A".to_string(), "B".to_string()]];
        let cell = |curve: &[CostPoint], n: usize| {
            curve
                .iter()
                .find(|p| p.n == n)
                .map_or_else(|| "-".into(), |p| format!("{:.2}x ({:.1})", p.relative, p.seconds * 1e3))
        };
        for n in ns {
            rows.push(vec![n.to_string(), cell(curves[0], n), cell(curves[1], n)]);
        }
        write_rows(&mut out, &rows);
    }
    let _ = writeln!(
        out,
        "\nB/A: median over the prompts both ran of B's tok/s over A's; same tokens: runs whose \
         greedy tokens match across the two"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results_sample::sample;

    fn sides() -> (Side, Side) {
        let a = Side { label: "workstation".into(), results: sample() };
        let mut b = sample();
        b.machine.cpu = "Cortex-A76".into();
        b.machine.arch = Some("aarch64".into());
        for run in &mut b.runs {
            run.decode_tok_per_s = run.decode_tok_per_s.map(|d| d / 4.0);
            run.prefill_tok_per_s /= 2.0;
        }
        b.runs[3].output_sha256 = "different".into();
        for p in &mut b.cost_curve {
            p.relative = 1.0 + (p.relative - 1.0) / 2.0;
        }
        (a, Side { label: "pi5".into(), results: b })
    }

    #[test]
    fn ratios_pair_runs_by_prompt_and_count_matching_tokens() {
        let (a, b) = sides();
        let c = compare(a, b);
        assert!(c.differences.is_empty(), "{:?}", c.differences);
        assert_eq!(c.rows.iter().map(|r| r.mode.as_str()).collect::<Vec<_>>(), ["llama.cpp", "vanilla"]);
        let vanilla = &c.rows[1];
        assert!((vanilla.decode_ratio.unwrap() - 0.25).abs() < 1e-12);
        assert!((vanilla.prefill_ratio.unwrap() - 0.5).abs() < 1e-12);
        assert_eq!(vanilla.same_output, (1, 2));
        assert_eq!(c.rows[0].same_output, (2, 2));

        let text = table(&c);
        assert!(text.contains("A = workstation: smollm2-135m on CPU (AMD EPYC x86_64, 2 threads"), "{text}");
        assert!(text.contains("B = pi5: smollm2-135m on CPU (Cortex-A76 aarch64"), "{text}");
        assert!(text.contains("the difference is the machine"), "{text}");
        assert!(text.contains("0.25x"), "{text}");
        assert!(text.contains("1/2"), "{text}");
        // The cost curves side by side: n = 2 is 1.31x on A and 1.155x on B.
        assert!(text.contains("1.31x (9.3)"), "{text}");
        assert!(text.contains("1.16x (9.3)"), "{text}");
    }

    #[test]
    fn modes_only_one_side_ran_and_differing_settings_are_shown() {
        let (a, mut b) = sides();
        b.results.settings.kv = "q8_0".into();
        for run in &mut b.results.runs {
            if run.mode == "llama.cpp" {
                run.mode = "suffix".into();
            }
        }
        let s = b.results.summary.remove("llama.cpp").unwrap();
        b.results.summary.insert("suffix".into(), s);
        let c = compare(a, b);
        assert_eq!(c.differences, ["kv: f16 / q8_0"]);
        let modes: Vec<&str> = c.rows.iter().map(|r| r.mode.as_str()).collect();
        assert_eq!(modes, ["llama.cpp", "vanilla", "suffix"]);
        assert_eq!(c.rows[0].decode[1], None);
        assert_eq!(c.rows[0].decode_ratio, None);
        assert_eq!(c.rows[2].decode[0], None);
        let text = table(&c);
        assert!(text.contains("differs besides the machine (A / B): kv: f16 / q8_0"), "{text}");
    }

    #[test]
    fn a_file_that_is_not_a_results_document_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("pocket-compare-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("prompts.json");
        std::fs::write(&path, r#"{"id": "x", "prompt": "hi"}"#).unwrap();
        let e = Side::load(&path).unwrap_err().to_string();
        assert!(e.contains("prompts.json: not a results document of `pocket bench --json`"), "{e}");
        let e = Side::load(&dir.join("missing.json")).unwrap_err().to_string();
        assert!(e.starts_with("cannot read the results"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
