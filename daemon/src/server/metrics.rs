//! `/metrics`: counters in Prometheus's text format, kept as requests end.

use std::fmt::Write;
use std::sync::Mutex;

use super::error::ServeError;
use pocket_runtime::PromptCache;

use super::job::Finished;

#[derive(Debug, Default)]
struct Counters {
    requests_ok: u64,
    requests_failed: std::collections::BTreeMap<&'static str, u64>,
    prompt_tokens: u64,
    generated_tokens: u64,
    decode_seconds: f64,
    drafted: u64,
    accepted: u64,
    last_decode_tok_per_s: f64,
    session_peak_bytes: u64,
}

/// The connection table's gauge and counters, appended to `out`.
pub fn render_connections(out: &mut String, c: super::connections::Counts) {
    let _ = writeln!(
        out,
        "# HELP pocketd_connections_open HTTP connections open now.\n# TYPE pocketd_connections_open gauge\n\
         pocketd_connections_open {}",
        c.open
    );
    let _ = writeln!(
        out,
        "# HELP pocketd_connections_total HTTP connections by what became of them: accepted, refused \
         (503, every connection of the peer busy), evicted (closed to let a newer one in), timed_out \
         (head or idle timeout).\n# TYPE pocketd_connections_total counter"
    );
    for (outcome, n) in
        [("accepted", c.accepted), ("refused", c.refused), ("evicted", c.evicted), ("timed_out", c.timed_out)]
    {
        let _ = writeln!(out, "pocketd_connections_total{{outcome=\"{outcome}\"}} {n}");
    }
}

/// The daemon's counters.
#[derive(Debug, Default)]
pub struct Metrics(Mutex<Counters>);

impl Metrics {
    fn with(&self, f: impl FnOnce(&mut Counters)) {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Count a finished generation.
    pub fn finished(&self, f: &Finished) {
        self.with(|c| {
            c.requests_ok += 1;
            c.prompt_tokens += u64::from(f.usage.prompt_tokens);
            c.generated_tokens += u64::from(f.usage.completion_tokens);
            c.decode_seconds += f.decode_seconds;
            c.drafted += f.timings.drafted;
            c.accepted += f.timings.accepted;
            if f.timings.decode_tok_per_s > 0.0 {
                c.last_decode_tok_per_s = f.timings.decode_tok_per_s;
            }
            c.session_peak_bytes = c.session_peak_bytes.max(f.peak_bytes);
        });
    }

    /// Count a failed request.
    pub fn failed(&self, e: &ServeError) {
        self.with(|c| *c.requests_failed.entry(e.code()).or_default() += 1);
    }

    /// Everything, in Prometheus's text exposition format: these counters, the gauges of
    /// `status` (the daemon's state now) and the prompt cache's counters.
    pub fn render(&self, status: &pocket_api::Status, prompt_cache: Option<&PromptCache>) -> String {
        let c = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mem = &status.memory;
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(&str, f64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let mut requests = vec![(r#"{outcome="ok"}"#.to_owned(), c.requests_ok as f64)];
        for (code, n) in &c.requests_failed {
            requests.push((format!(r#"{{outcome="{code}"}}"#), *n as f64));
        }
        let requests: Vec<(&str, f64)> = requests.iter().map(|(l, v)| (l.as_str(), *v)).collect();
        metric("pocketd_requests_total", "counter", "Generation requests by outcome.", &requests);
        metric(
            "pocketd_prompt_tokens_total",
            "counter",
            "Prompt tokens processed.",
            &[("", c.prompt_tokens as f64)],
        );
        metric(
            "pocketd_generated_tokens_total",
            "counter",
            "Tokens generated.",
            &[("", c.generated_tokens as f64)],
        );
        metric(
            "pocketd_decode_seconds_total",
            "counter",
            "Seconds spent decoding after each request's first token (tokens/s = rate of generated over this).",
            &[("", c.decode_seconds)],
        );
        metric(
            "pocketd_decode_tokens_per_second",
            "gauge",
            "Decode speed of the last request that generated more than one token.",
            &[("", c.last_decode_tok_per_s)],
        );
        metric(
            "pocketd_drafted_tokens_total",
            "counter",
            "Tokens proposed by drafters.",
            &[("", c.drafted as f64)],
        );
        metric(
            "pocketd_accepted_tokens_total",
            "counter",
            "Drafted tokens accepted.",
            &[("", c.accepted as f64)],
        );
        let acceptance = if c.drafted > 0 { c.accepted as f64 / c.drafted as f64 } else { 0.0 };
        metric(
            "pocketd_acceptance_ratio",
            "gauge",
            "Accepted over drafted tokens since start.",
            &[("", acceptance)],
        );
        metric(
            "pocketd_memory_budget_bytes",
            "gauge",
            "The memory budget.",
            &[("", mem.budget_bytes as f64)],
        );
        metric(
            "pocketd_memory_used_bytes",
            "gauge",
            "Bytes reserved in the budget now.",
            &[("", mem.used_bytes as f64)],
        );
        metric(
            "pocketd_memory_peak_bytes",
            "gauge",
            "Most bytes ever reserved at once.",
            &[("", mem.peak_bytes as f64)],
        );
        metric(
            "pocketd_resident_bytes",
            "gauge",
            "The process's resident memory (VmRSS).",
            &[("", mem.resident_bytes as f64)],
        );
        metric(
            "pocketd_session_peak_bytes",
            "gauge",
            "The most one session has held in the budget.",
            &[("", c.session_peak_bytes as f64)],
        );
        metric(
            "pocketd_sessions",
            "gauge",
            "Requests generating now.",
            &[("", status.sessions.len() as f64)],
        );
        metric("pocketd_queued", "gauge", "Requests waiting for a turn.", &[("", status.queued as f64)]);
        metric(
            "pocketd_parallel",
            "gauge",
            "Requests that may generate at once now.",
            &[("", status.parallel.unwrap_or(0) as f64)],
        );
        let shared: Vec<(String, pocket_core::SharedPasses)> =
            status.loaded.iter().filter_map(|m| Some((m.name.clone(), m.shared_passes?))).collect();
        let samples =
            |f: &dyn Fn(&pocket_core::SharedPasses) -> Vec<(&'static str, u64)>| -> Vec<(String, f64)> {
                shared
                    .iter()
                    .flat_map(|(name, s)| {
                        f(s).into_iter().map(move |(kind, v)| {
                            let kind =
                                if kind.is_empty() { String::new() } else { format!(",kind=\"{kind}\"") };
                            (format!("{{model=\"{name}\"{kind}}}"), v as f64)
                        })
                    })
                    .collect()
            };
        let passes = samples(&|s| vec![("alone", s.passes - s.shared), ("shared", s.shared)]);
        let passes: Vec<(&str, f64)> = passes.iter().map(|(l, v)| (l.as_str(), *v)).collect();
        metric(
            "pocketd_passes_total",
            "counter",
            "Forward passes of loaded models whose requests share passes, alone or shared.",
            &passes,
        );
        let jobs = samples(&|s| vec![("", s.jobs)]);
        let jobs: Vec<(&str, f64)> = jobs.iter().map(|(l, v)| (l.as_str(), *v)).collect();
        metric(
            "pocketd_shared_pass_requests_total",
            "counter",
            "Requests' passes carried by shared passes (per shared pass: this over the shared passes).",
            &jobs,
        );
        let cpu = status.cpu.clone().unwrap_or_default();
        metric(
            "pocketd_threads",
            "gauge",
            "CPU threads a forward pass runs on now.",
            &[("", cpu.threads as f64)],
        );
        metric(
            "pocketd_threads_max",
            "gauge",
            "The most CPU threads a forward pass may run on.",
            &[("", cpu.max_threads as f64)],
        );
        metric(
            "pocketd_cpu_allowed_cores",
            "gauge",
            "Cores this process may use (affinity, cgroup CPU quota).",
            &[("", cpu.allowed_cores as f64)],
        );
        metric(
            "pocketd_cpu_others_load",
            "gauge",
            "Other processes' load on those cores, in cores.",
            &[("", cpu.others_load)],
        );
        if let Some(cache) = prompt_cache {
            let st = cache.stats();
            let counters: [(&str, &str, u64); 5] = [
                (
                    "pocketd_prompt_cache_hits_total",
                    "Requests that continued a parked conversation.",
                    st.hits,
                ),
                (
                    "pocketd_prompt_cache_misses_total",
                    "Requests that found no parked conversation to continue.",
                    st.misses,
                ),
                (
                    "pocketd_prompt_cache_reused_tokens_total",
                    "Prompt tokens taken from parked conversations instead of processed.",
                    st.reused_tokens,
                ),
                (
                    "pocketd_prompt_cache_evictions_total",
                    "Parked conversations given up for memory.",
                    st.evictions,
                ),
                (
                    "pocketd_prompt_cache_disk_errors_total",
                    "Prompt cache files ignored (corrupt, foreign, stale) or not written.",
                    st.disk_errors,
                ),
            ];
            for (name, help, value) in counters {
                metric(name, "counter", help, &[("", value as f64)]);
            }
            metric(
                "pocketd_prompt_cache_disk_total",
                "counter",
                "Parked conversations written to and read back from the prompt cache directory.",
                &[(r#"{op="written"}"#, st.written as f64), (r#"{op="read"}"#, st.read as f64)],
            );
            metric(
                "pocketd_prompt_cache_parked_bytes",
                "gauge",
                "Bytes parked conversations hold in the budget.",
                &[("", cache.bytes() as f64)],
            );
            metric(
                "pocketd_prompt_cache_parked",
                "gauge",
                "Parked conversations.",
                &[("", cache.parked().len() as f64)],
            );
        }
        metric("pocketd_models_loaded", "gauge", "Models in memory.", &[("", status.loaded.len() as f64)]);
        out
    }
}
