//! The results as a table for people.

use std::fmt::Write;

use super::results::{BenchResults, ConversationResults};

/// The results as text: a header, the cost curve, one row per mode (median decode and
/// prefill tok/s, each with its ratio to llama.cpp, identical output, peak RSS), decode
/// tok/s per prompt kind, and the replayed conversations: a row per turn and mode, then per
/// conversation and mode.
pub fn table(r: &BenchResults) -> String {
    let mut out = String::new();
    let sha = short_sha(&r.model.file_sha256);
    let _ = writeln!(
        out,
        "model {} (sha256 {sha}…, {}), kv {}, {} threads on {} ({}{}){}",
        r.model.name,
        mib(r.model.weights_bytes),
        r.settings.kv,
        r.machine.threads,
        r.machine.backend,
        r.machine.cpu,
        r.machine.arch.as_deref().map(|a| format!(" {a}")).unwrap_or_default(),
        // Kernels are those of this process's runs; with none, there is nothing to say.
        if r.runs.is_empty() {
            String::new()
        } else {
            format!(", kernels {}", r.machine.kernels.as_deref().unwrap_or("ggml"))
        },
    );
    for run in r.machine.placement.iter().filter(|run| run.peer.is_some()) {
        let _ = writeln!(
            out,
            "layers {}..{} on {} of peer {} ({}{}), llama.cpp's too",
            run.first_layer,
            run.first_layer + run.n_layers,
            run.device,
            run.peer.as_deref().unwrap_or_default(),
            mib(run.weight_bytes),
            run.round_trip_us.map(|us| format!(", round trip {us} µs at load")).unwrap_or_default()
        );
    }
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
            .map(|s| if r.conversations.is_some() {
                format!("; pocketd at {s}")
            } else {
                format!("; socket: modes through pocketd at {s}")
            })
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

    if !r.runs.is_empty() {
        modes_table(&mut out, r);
    }
    if let Some(c) = &r.concurrency {
        concurrency_table(&mut out, c);
    }
    if let Some(c) = &r.conversations {
        conversations_table(&mut out, c, r.settings.socket.as_deref());
    }
    if let Some(a) = &r.agentic {
        agentic_table(&mut out, a);
    }
    if let Some(warning) = contention_warning(r) {
        let _ = writeln!(out, "{warning}");
    }
    out
}

/// One row per mode, the comparisons with naive modes and with the same modes in process,
/// and decode tok/s per prompt kind.
fn modes_table(out: &mut String, r: &BenchResults) {
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
    write_rows(out, &rows);

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
        write_rows(out, &rows);
    }
    let _ =
        writeln!(out, "\nratios are medians of per-prompt ratios; decode counts the tokens after the first");
}

/// The replayed agentic stream: per mode, its first half, second half and all of it.
fn agentic_table(out: &mut String, a: &crate::agentic::records::AgenticResults) {
    let n = a.requests.iter().map(|r| r.index + 1).max().unwrap_or(0);
    let _ = writeln!(
        out,
        "\nagentic stream of {n} requests from {} through pocketd, modes {} (the reference) and {}; earlier \
         answers held after it: {} answers, {} tokens, {}",
        a.apps.join(", "),
        a.modes.first().map_or("-", String::as_str),
        a.modes.get(1..).unwrap_or_default().join(", "),
        a.store.answers,
        a.store.tokens,
        mib(a.store.bytes)
    );
    let _ = writeln!(
        out,
        "{:<10} {:<12} {:>9} {:>8} {:>8} {:>11} {:>9} {:>9} {:>9} {:>6} {:>10}",
        "mode",
        "part",
        "requests",
        "tok/s",
        "vs off",
        "vs no-hist.",
        "accepted",
        "recalled",
        "draft len",
        "trees",
        "identical"
    );
    for (mode, s) in &a.summary {
        for (part, p) in [("first half", &s.first_half), ("second half", &s.second_half), ("all", &s.all)] {
            let _ = writeln!(
                out,
                "{mode:<10} {part:<12} {:>9} {:>8.1} {:>7.2}x {:>10.2}x {:>8.0}% {:>8.0}% {:>9.1} {:>5.0}% {:>6}/{:<3}",
                p.requests,
                p.decode_tok_per_s,
                p.speedup,
                p.over_no_history,
                p.acceptance * 100.0,
                p.recalled_share * 100.0,
                p.draft_len,
                p.tree_share * 100.0,
                p.identical,
                p.requests
            );
        }
    }
    if let Some(b) = &a.bound {
        bound_table(out, b, a.summary.get(crate::agentic::records::DEFAULT));
    }
}

/// What an oracle copying earlier text could reach, per part, against what `default` did.
fn bound_table(
    out: &mut String,
    b: &crate::copying_bound::CopyingBound,
    default: Option<&crate::agentic::records::AgenticModeSummary>,
) {
    let _ = writeln!(
        out,
        "\nwhat no drafter copying earlier text can beat here (an oracle drafting every run of the `off` \
         answers' tokens held by the app's earlier answers, the prompt or the answer so far, found after \
         the same {} tokens or anywhere, its passes sized to {}; flat: a pass of up to {} tokens costs one step; \
         own text: after context in the prompt and the answer so far only, as `no-history` drafts)",
        b.context,
        if b.cost.is_empty() {
            "no curve: pocketd lists none for the model, run `pocket tune`".to_owned()
        } else {
            format!(
                "pocketd's cost curve {}",
                b.cost.iter().map(|c| format!("{c:.2}")).collect::<Vec<_>>().join(" ")
            )
        },
        crate::copying_bound::FLAT_WIDTH
    );
    let _ = writeln!(
        out,
        "{:<12} {:>7} {:>9} {:>8} {:>10} {:>9} {:>15} {:>9} {:>17}",
        "part",
        "tokens",
        "mean run",
        "own text",
        "after ctx",
        "anywhere",
        "flat: after ctx",
        "anywhere",
        "default/after ctx"
    );
    let x = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}x"));
    let parts = [
        ("first half", &b.first_half, default.map(|d| d.first_half.speedup)),
        ("second half", &b.second_half, default.map(|d| d.second_half.speedup)),
        ("all", &b.all, default.map(|d| d.all.speedup)),
    ];
    for (name, p, speedup) in parts {
        let reached = speedup
            .zip(p.after_context)
            .filter(|(_, bound)| *bound > 0.0)
            .map_or("-".to_owned(), |(speedup, bound)| format!("{:.0}%", speedup / bound * 100.0));
        let _ = writeln!(
            out,
            "{name:<12} {:>7} {:>9.2} {:>8} {:>10} {:>9} {:>15} {:>9} {:>17}",
            p.tokens,
            p.mean_run,
            x(p.own_text),
            x(p.after_context),
            x(p.anywhere),
            x(Some(p.flat_after_context)),
            x(Some(p.flat_anywhere)),
            reached
        );
    }
}

/// The replayed conversations: a row per turn and mode (prompt and cached tokens, time to
/// first token, decode tok/s, identical to the reference), then per conversation and mode the
/// growth of the time to first token and the share of prompt tokens reused, with medians over
/// all conversations.
fn conversations_table(out: &mut String, c: &ConversationResults, socket: Option<&str>) {
    let reference = c.modes.first().map_or("-", String::as_str);
    let others: Vec<&str> = c.modes.iter().skip(1).map(String::as_str).collect();
    let _ = writeln!(
        out,
        "conversations replayed turn by turn through pocketd{}, spec {}{}: modes {} (the reference) and {}, \
         alternating per turn",
        socket.map(|s| format!(" at {s}")).unwrap_or_default(),
        c.spec,
        c.draft_model.as_deref().map(|d| format!(" ({d})")).unwrap_or_default(),
        reference,
        others.join(", "),
    );
    let rounds = c.turns.iter().any(|t| t.round > 0);
    let mut header = vec!["conversation"];
    if rounds {
        header.push("round");
    }
    header.extend([
        "turn",
        "mode",
        "prompt tok",
        "cached",
        "TTFT ms",
        "prefill ms",
        "decode tok/s",
        "generated",
        "identical",
    ]);
    // Names left-aligned, up to the mode.
    let left = header.iter().position(|h| *h == "mode").map_or(1, |m| m + 1);
    let mut rows = vec![header.into_iter().map(String::from).collect::<Vec<_>>()];
    for t in &c.turns {
        let mut row = vec![t.conversation_id.clone()];
        if rounds {
            row.push(t.round.to_string());
        }
        row.extend([
            t.turn.to_string(),
            t.mode.clone(),
            t.prompt_tokens.to_string(),
            t.cached_tokens.to_string(),
            format!("{:.1}", t.ttft_ms),
            format!("{:.1}", t.prefill_ms),
            num(t.decode_tok_per_s, 1),
            t.generated_tokens.to_string(),
            identical(t.identical_to_vanilla, t.diverges_at),
        ]);
        rows.push(row);
    }
    write_rows_left(out, &rows, left);

    let _ = writeln!(out, "\nper conversation: the last turn's TTFT over the first's and the second's");
    let mut header = vec!["conversation"];
    if rounds {
        header.push("round");
    }
    header.extend(["mode", "turns", "last/first", "last/second", "reused", "identical"]);
    // Names left-aligned, up to the mode.
    let left = header.iter().position(|h| *h == "mode").map_or(1, |m| m + 1);
    let mut rows = vec![header.into_iter().map(String::from).collect::<Vec<_>>()];
    for s in &c.by_conversation {
        let mut row = vec![s.conversation_id.clone()];
        if rounds {
            row.push(s.round.to_string());
        }
        row.extend([
            s.mode.clone(),
            s.turns.to_string(),
            ratio(s.ttft_last_over_first),
            ratio(s.ttft_last_over_second),
            percent(s.reused_share),
            identical(s.all_identical, None),
        ]);
        rows.push(row);
    }
    for mode in &c.modes {
        let Some(s) = c.summary.get(mode) else {
            continue;
        };
        let mut row = vec!["all (medians)".to_string()];
        if rounds {
            row.push(String::new());
        }
        row.extend([
            mode.clone(),
            s.turns.to_string(),
            ratio(s.ttft_last_over_first_median),
            ratio(s.ttft_last_over_second_median),
            percent(s.reused_share),
            identical(s.all_identical, None),
        ]);
        rows.push(row);
    }
    write_rows_left(out, &rows, left);
    let _ = writeln!(
        out,
        "\nTTFT: from sending a turn's request until its first text arrived; prefill: pocketd's own time to the \
         first token; reused: cached prompt tokens over all prompt tokens; identical: the same tokens as \
         {reference} at that turn (each mode answers from its own history)"
    );
}

/// `yes`, `NO` (with where it diverges when known) or `-`.
fn identical(identical: Option<bool>, diverges_at: Option<usize>) -> String {
    match (identical, diverges_at) {
        (Some(true), _) => "yes".into(),
        (Some(false), Some(at)) => format!("NO (token {at})"),
        (Some(false), None) => "NO".into(),
        (None, _) => "-".into(),
    }
}

fn percent(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.1}%", v * 100.0))
}

/// The requests run at once: a row per mode.
fn concurrency_table(out: &mut String, c: &crate::concurrency::ConcurrencyResults) {
    let _ = writeln!(
        out,
        "\n{} requests at once (each group of the workload's prompts alone, one after another, then together):",
        c.requests
    );
    let mut rows = vec![
        [
            "mode",
            "groups",
            "aggregate tok/s",
            "vs alone",
            "vs llama.cpp",
            "per request tok/s",
            "first token ms",
            "fastest/slowest",
            "identical to alone",
        ]
        .map(String::from)
        .to_vec(),
    ];
    let mut modes: Vec<&str> = c.groups.iter().map(|g| g.mode.as_str()).collect();
    modes.dedup();
    for mode in modes {
        let Some(s) = c.summary.get(mode) else { continue };
        rows.push(vec![
            mode.to_owned(),
            s.groups.to_string(),
            num(s.aggregate_decode_tok_per_s_median, 1),
            ratio(s.gain_median),
            ratio(s.aggregate_vs_llama_cpp),
            num(s.per_request_decode_tok_per_s_median, 1),
            num(s.first_token_ms_median, 0),
            ratio(s.fairness_median),
            if s.all_identical_to_alone { "yes".into() } else { "NO".into() },
        ]);
    }
    write_rows(out, &rows);
    let _ = writeln!(
        out,
        "aggregate: the requests' decode tok/s summed; vs alone: over one request alone (the same requests \
         alone, on average); medians over groups"
    );
}

/// A warning when other processes competed for the CPU during the runs.
fn contention_warning(r: &BenchResults) -> Option<String> {
    if r.settings.load > 0 {
        return Some(format!(
            "{} busy processes ran beside the measured runs (--load): the runs shared the cores on purpose",
            r.settings.load
        ));
    }
    let loads: Vec<f64> = r.runs.iter().filter_map(|run| run.other_cpu_cores).collect();
    let contended = loads.iter().filter(|&&l| l > super::machine::QUIET_CORES).count();
    if contended == 0 {
        return None;
    }
    let max = loads.iter().copied().fold(0.0, f64::max);
    let median = super::median::median(loads.iter().copied()).unwrap_or(0.0);
    Some(format!(
        "warning: other processes kept the CPU busy during {contended} of {} runs \
         (median {median:.2}, up to {max:.2} cores): those timings measure the competition too \
         (--wait-quiet makes runs wait for a quiet machine)",
        loads.len()
    ))
}

/// Columns padded to their widest cell: the first left-aligned, the rest right-aligned.
pub(super) fn write_rows(out: &mut String, rows: &[Vec<String>]) {
    write_rows_left(out, rows, 1);
}

/// Columns padded to their widest cell: the first `left` left-aligned (names), the rest
/// right-aligned (numbers).
fn write_rows_left(out: &mut String, rows: &[Vec<String>], left: usize) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            let sep = if c == 0 { "" } else { "  " };
            if c < left {
                let _ = write!(line, "{sep}{cell:<w$}", w = widths[c]);
            } else {
                let _ = write!(line, "{sep}{cell:>w$}", w = widths[c]);
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
    use crate::results_sample::{sample, sample_with_conversations};

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

    #[test]
    fn conversations_get_a_row_per_turn_and_a_summary_per_conversation() {
        let text = table(&sample_with_conversations());
        assert!(text.contains("modes no-cache (the reference) and cache"), "{text}");
        // The cells of the first row that starts with `words`.
        let row = |words: &str| -> Vec<&str> {
            let words: Vec<&str> = words.split(' ').collect();
            let mut rows = text.lines().map(|l| l.split_whitespace().collect::<Vec<_>>());
            rows.find(|cells| cells.starts_with(&words))
                .unwrap_or_else(|| panic!("no row {words:?} in\n{text}"))
        };
        // Conversation a, turn 3, with the cache: 160 prompt tokens, 150 cached, 60 ms.
        assert_eq!(row("a 3 cache"), ["a", "3", "cache", "160", "150", "60.0", "30.0", "103.0", "8", "yes"]);
        assert_eq!(row("a no-cache"), ["a", "no-cache", "3", "3.00x", "1.50x", "0.0%", "yes"]);
        assert_eq!(row("a cache"), ["a", "cache", "3", "0.60x", "1.20x", "80.0%", "yes"]);
        assert_eq!(
            row("all (medians) cache"),
            ["all", "(medians)", "cache", "6", "0.60x", "1.20x", "80.0%", "yes"]
        );
        // The prompts' table is still there, before.
        assert!(text.find("by kind").unwrap() < text.find("conversations replayed").unwrap(), "{text}");
    }
}
