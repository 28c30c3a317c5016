//! The results as a table for people.

use std::fmt::Write;

use super::results::BenchResults;

/// The results as text: a header, the cost curve, one row per mode (median decode and
/// prefill tok/s, each with its ratio to llama.cpp, identical output, peak RSS), and decode
/// tok/s per prompt kind.
pub fn table(r: &BenchResults) -> String {
    let mut out = String::new();
    let sha = short_sha(&r.model.file_sha256);
    let _ = writeln!(
        out,
        "model {} (sha256 {sha}…, {}), kv {}, {} threads on {} ({}{}), kernels {}",
        r.model.name,
        mib(r.model.weights_bytes),
        r.settings.kv,
        r.machine.threads,
        r.machine.backend,
        r.machine.cpu,
        r.machine.arch.as_deref().map(|a| format!(" {a}")).unwrap_or_default(),
        r.machine.kernels.as_deref().unwrap_or("ggml"),
    );
    let _ = writeln!(
        out,
        "start {}{}",
        match r.settings.start {
            Some(crate::Start::Cold) => "cold: no warm-up run before the first measured one",
            Some(crate::Start::Warm) => "warm: each mode generated once, unrecorded, first",
            None => "warm (results from before cold starts were measured)",
        },
        r.settings
            .socket
            .as_deref()
            .map(|s| format!("; socket: modes through pocketd at {s}"))
            .unwrap_or_default()
    );
    let curve = |points: &[super::results::CostPoint]| -> String {
        let points: Vec<String> = points
            .iter()
            .map(|p| format!("n={} {:.2}x ({:.1} ms)", p.n, p.relative, p.seconds * 1e3))
            .collect();
        points.join(", ")
    };
    if r.cost_curves_by_weights.len() > 1 {
        for (weights, points) in &r.cost_curves_by_weights {
            let _ = writeln!(
                out,
                "cost curve t(n)/t(1), weights {weights}, at {} tokens of context: {}",
                r.settings.cost_curve_context,
                curve(points)
            );
        }
    } else if !r.cost_curve.is_empty() {
        let _ = writeln!(
            out,
            "cost curve t(n)/t(1) at {} tokens of context: {}",
            r.settings.cost_curve_context,
            curve(&r.cost_curve)
        );
    }
    let _ = writeln!(out);

    let header = [
        "mode",
        "runs",
        "decode tok/s",
        "vs vanilla",
        "vs llama.cpp",
        "prefill tok/s",
        "vs llama.cpp",
        "identical",
        "gen memory",
        "peak RSS",
    ];
    let mut rows = vec![header.map(String::from).to_vec()];
    let modes = r.modes();
    for mode in &modes {
        let Some(s) = r.summary.get(*mode) else {
            continue;
        };
        rows.push(vec![
            mode.to_string(),
            s.runs.to_string(),
            num(s.decode_tok_per_s_median, 1),
            match s.speedup_vs_same_weights {
                Some(same) => format!("{} ({} same weights)", ratio(s.speedup_vs_vanilla), ratio(Some(same))),
                None => ratio(s.speedup_vs_vanilla),
            },
            ratio(s.decode_vs_llama_cpp),
            num(s.prefill_tok_per_s_median, 1),
            ratio(s.prefill_vs_llama_cpp),
            match s.all_identical {
                Some(true) => "yes".into(),
                Some(false) => "NO".into(),
                None => "-".into(),
            },
            s.generation_memory_bytes_median.map_or_else(|| "-".into(), mib),
            if s.peak_rss_bytes_max == 0 { "-".into() } else { mib(s.peak_rss_bytes_max) },
        ]);
    }
    write_rows(&mut out, &rows);

    let against_naive: Vec<String> = modes
        .iter()
        .filter_map(|mode| {
            let s = r.summary.get(*mode)?;
            let (decode, memory) = (s.decode_vs_naive?, s.memory_vs_naive?);
            Some(format!(
                "{mode} vs naive:{mode}: decode {decode:.2}x, generation memory {memory:.2}x{}",
                if r.settings.memory_budget_bytes.is_some() { " (planned under the budget)" } else { "" }
            ))
        })
        .collect();
    if !against_naive.is_empty() {
        let _ = writeln!(
            out,
            "\nagainst the KV caches held for the whole context (medians of per-prompt ratios)"
        );
        for line in against_naive {
            let _ = writeln!(out, "  {line}");
        }
    }

    let through_daemon: Vec<String> = modes
        .iter()
        .filter_map(|mode| {
            let s = r.summary.get(*mode)?;
            let own = mode.strip_prefix(crate::modes::SOCKET_PREFIX)?;
            Some(format!(
                "{mode} vs {own}: decode {}, prefill {}, first token {}",
                ratio(s.decode_vs_in_process),
                ratio(s.prefill_vs_in_process),
                s.first_token_gap_ms.map_or_else(|| "-".into(), |g| format!("{g:+.1} ms")),
            ))
        })
        .collect();
    if !through_daemon.is_empty() {
        let _ = writeln!(
            out,
            "\nthrough pocketd against the same mode in this process (medians of per-prompt ratios; the \
             gap is the scheduler, the plan and the transport)"
        );
        for line in through_daemon {
            let _ = writeln!(out, "  {line}");
        }
    }

    let mut kinds: Vec<_> = r.runs.iter().map(|run| run.kind).collect();
    kinds.sort();
    kinds.dedup();
    if !kinds.is_empty() {
        let _ = writeln!(out, "\ndecode tok/s (median) by kind, and the median speed-up over vanilla");
        let mut header = vec!["kind".to_string()];
        header.extend(modes.iter().map(|m| m.to_string()));
        let mut rows = vec![header];
        for kind in kinds {
            let mut row = vec![kind.to_string()];
            for mode in &modes {
                let k = r.summary.get(*mode).and_then(|s| s.by_kind.get(&kind));
                let tok_s = num(k.and_then(|k| k.decode_tok_per_s_median), 1);
                row.push(match k.and_then(|k| k.speedup_vs_vanilla) {
                    Some(x) if *mode != "vanilla" => format!("{tok_s} ({x:.2}x)"),
                    _ => tok_s,
                });
            }
            rows.push(row);
        }
        write_rows(&mut out, &rows);
    }
    let _ =
        writeln!(out, "\nratios are medians of per-prompt ratios; decode counts the tokens after the first");
    if let Some(warning) = contention_warning(r) {
        let _ = writeln!(out, "{warning}");
    }
    out
}

/// A warning when other processes competed for the CPU during the runs.
fn contention_warning(r: &BenchResults) -> Option<String> {
    let loads: Vec<f64> = r.runs.iter().filter_map(|run| run.other_cpu_cores).collect();
    let contended = loads.iter().filter(|&&l| l > super::machine::QUIET_CORES).count();
    if contended == 0 {
        return None;
    }
    let max = loads.iter().copied().fold(0.0, f64::max);
    let median = super::summary::median(loads.iter().copied()).unwrap_or(0.0);
    Some(format!(
        "warning: other processes kept the CPU busy during {contended} of {} runs \
         (median {median:.2}, up to {max:.2} cores): those timings measure the competition too \
         (--wait-quiet makes runs wait for a quiet machine)",
        loads.len()
    ))
}

/// Columns padded to their widest cell: the first left-aligned, the rest right-aligned.
pub(super) fn write_rows(out: &mut String, rows: &[Vec<String>]) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c == 0 {
                let _ = write!(line, "{cell:<w$}", w = widths[c]);
            } else {
                let _ = write!(line, "  {cell:>w$}", w = widths[c]);
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

/// The first 12 hex digits of a sha256, enough to tell files apart.
pub(super) fn short_sha(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

pub(super) fn num(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.decimals$}"))
}

pub(super) fn ratio(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.2}x"))
}

pub(super) fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::tests::sample;

    #[test]
    fn the_table_has_a_row_per_mode_in_run_order() {
        let text = table(&sample());
        let lines: Vec<&str> = text.lines().collect();
        let header = lines.iter().position(|l| l.starts_with("mode ")).unwrap();
        assert!(lines[header + 1].starts_with("llama.cpp"), "{text}");
        assert!(lines[header + 2].starts_with("vanilla"), "{text}");
        // vanilla: decode 125, 118 → 121.5; per-prompt ratios 125/130 and 118/120.
        let ratio = (125.0 / 130.0 + 118.0 / 120.0) / 2.0;
        assert!(lines[header + 2].contains("121.5"), "{text}");
        assert!(lines[header + 2].contains(&format!("{ratio:.2}x")), "{text}");
        assert!(text.contains("n=2 1.31x (9.3 ms)"), "{text}");
        assert!(text.contains("by kind"), "{text}");
        assert!(!text.contains("warning"), "{text}");

        let mut busy = sample();
        busy.runs[1].other_cpu_cores = Some(1.5);
        let text = table(&busy);
        assert!(text.contains("during 1 of 4 runs (median 0.00, up to 1.50 cores)"), "{text}");
    }
}
