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
        self.with(|c| *c.requests_failed.entry(e.name()).or_default() += 1);
    }

    /// Everything, in Prometheus's text exposition format: these counters, the gauges of
    /// `status` (the daemon's state now) and the prompt cache's counters.
    pub fn render(&self, status: &pocket_api::Status, prompt_cache: Option<&PromptCache>) -> String {
        let c = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Exposition::default();
        requests(&mut out, &c);
        memory(&mut out, &status.memory, c.session_peak_bytes);
        scheduling(&mut out, status);
        cpu(&mut out, &status.cpu.clone().unwrap_or_default());
        if let Some(cache) = prompt_cache {
            prompt_cache_metrics(&mut out, cache);
        }
        out.gauge("pocketd_models_loaded", "Models in memory.", status.loaded.len() as f64);
        out.0
    }
}

/// Prometheus's text exposition format, written metric by metric.
#[derive(Default)]
struct Exposition(String);

impl Exposition {
    /// A metric of `kind` with its samples (labels, value).
    fn metric(&mut self, name: &str, kind: &str, help: &str, samples: &[(&str, f64)]) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(self.0, "{name}{labels} {value}");
        }
    }

    /// A counter of one unlabelled sample.
    fn counter(&mut self, name: &str, help: &str, value: f64) {
        self.metric(name, "counter", help, &[("", value)]);
    }

    /// A gauge of one unlabelled sample.
    fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.metric(name, "gauge", help, &[("", value)]);
    }

    /// A metric whose samples carry labels made at run time.
    fn labelled(&mut self, name: &str, kind: &str, help: &str, samples: &[(String, f64)]) {
        let samples: Vec<(&str, f64)> = samples.iter().map(|(l, v)| (l.as_str(), *v)).collect();
        self.metric(name, kind, help, &samples);
    }
}

/// Requests by outcome, tokens, decode speed and speculation.
fn requests(out: &mut Exposition, c: &Counters) {
    let mut requests = vec![(r#"{outcome="ok"}"#.to_owned(), c.requests_ok as f64)];
    for (code, n) in &c.requests_failed {
        requests.push((format!(r#"{{outcome="{code}"}}"#), *n as f64));
    }
    out.labelled("pocketd_requests_total", "counter", "Generation requests by outcome.", &requests);
    out.counter("pocketd_prompt_tokens_total", "Prompt tokens processed.", c.prompt_tokens as f64);
    out.counter("pocketd_generated_tokens_total", "Tokens generated.", c.generated_tokens as f64);
    out.counter(
        "pocketd_decode_seconds_total",
        "Seconds spent decoding after each request's first token (tokens/s = rate of generated over this).",
        c.decode_seconds,
    );
    out.gauge(
        "pocketd_decode_tokens_per_second",
        "Decode speed of the last request that generated more than one token.",
        c.last_decode_tok_per_s,
    );
    out.counter("pocketd_drafted_tokens_total", "Tokens proposed by drafters.", c.drafted as f64);
    out.counter("pocketd_accepted_tokens_total", "Drafted tokens accepted.", c.accepted as f64);
    let acceptance = if c.drafted > 0 { c.accepted as f64 / c.drafted as f64 } else { 0.0 };
    out.gauge("pocketd_acceptance_ratio", "Accepted over drafted tokens since start.", acceptance);
}

/// The budget, its use, the process's resident memory and the largest session.
fn memory(out: &mut Exposition, mem: &pocket_api::MemoryStatus, session_peak_bytes: u64) {
    out.gauge("pocketd_memory_budget_bytes", "The memory budget.", mem.budget_bytes as f64);
    out.gauge("pocketd_memory_used_bytes", "Bytes reserved in the budget now.", mem.used_bytes as f64);
    out.gauge("pocketd_memory_peak_bytes", "Most bytes ever reserved at once.", mem.peak_bytes as f64);
    out.gauge("pocketd_resident_bytes", "The process's resident memory (VmRSS).", mem.resident_bytes as f64);
    out.gauge(
        "pocketd_session_peak_bytes",
        "The most one session has held in the budget.",
        session_peak_bytes as f64,
    );
    if let Some(d) = &mem.device {
        let budget = "The budget of the device's memory (the host's when unified).";
        out.gauge("pocketd_device_memory_budget_bytes", budget, d.budget_bytes as f64);
        let used = "Bytes reserved on the device now (inside pocketd_memory_used_bytes when unified).";
        out.gauge("pocketd_device_memory_used_bytes", used, d.used_bytes as f64);
        out.gauge(
            "pocketd_device_memory_free_bytes",
            "Free on the device now, for every process.",
            d.free_bytes as f64,
        );
    }
}

/// Sessions, the queue, turns, and the passes loaded models' requests share.
fn scheduling(out: &mut Exposition, status: &pocket_api::Status) {
    out.gauge("pocketd_sessions", "Requests generating now.", status.sessions.len() as f64);
    out.gauge("pocketd_queued", "Requests waiting for a turn.", status.queued as f64);
    out.gauge(
        "pocketd_parallel",
        "Requests that may generate at once now.",
        status.parallel.unwrap_or(0) as f64,
    );
    let shared: Vec<(String, pocket_core::SharedPasses)> =
        status.loaded.iter().filter_map(|m| Some((m.name.clone(), m.shared_passes?))).collect();
    let samples = |f: &dyn Fn(&pocket_core::SharedPasses) -> Vec<(&'static str, u64)>| -> Vec<(String, f64)> {
        shared
            .iter()
            .flat_map(|(name, s)| {
                f(s).into_iter().map(move |(kind, v)| {
                    let kind = if kind.is_empty() { String::new() } else { format!(",kind=\"{kind}\"") };
                    (format!("{{model=\"{name}\"{kind}}}"), v as f64)
                })
            })
            .collect()
    };
    out.labelled(
        "pocketd_passes_total",
        "counter",
        "Forward passes of loaded models whose requests share passes, alone or shared.",
        &samples(&|s| vec![("alone", s.passes - s.shared), ("shared", s.shared)]),
    );
    out.labelled(
        "pocketd_shared_pass_requests_total",
        "counter",
        "Requests' passes carried by shared passes (per shared pass: this over the shared passes).",
        &samples(&|s| vec![("", s.jobs)]),
    );
}

/// The threads passes run on and what the count follows.
fn cpu(out: &mut Exposition, cpu: &pocket_api::CpuStatus) {
    out.gauge("pocketd_threads", "CPU threads a forward pass runs on now.", cpu.threads as f64);
    out.gauge(
        "pocketd_threads_max",
        "The most CPU threads a forward pass may run on.",
        cpu.max_threads as f64,
    );
    out.gauge(
        "pocketd_cpu_allowed_cores",
        "Cores this process may use (affinity, cgroup CPU quota).",
        cpu.allowed_cores as f64,
    );
    out.gauge("pocketd_cpu_others_load", "Other processes' load on those cores, in cores.", cpu.others_load);
}

/// The prompt cache's hits, misses, reuse, evictions, disk traffic and what it holds.
fn prompt_cache_metrics(out: &mut Exposition, cache: &PromptCache) {
    let st = cache.stats();
    let counters: [(&str, &str, u64); 5] = [
        ("pocketd_prompt_cache_hits_total", "Requests that continued a parked conversation.", st.hits),
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
        ("pocketd_prompt_cache_evictions_total", "Parked conversations given up for memory.", st.evictions),
        (
            "pocketd_prompt_cache_disk_errors_total",
            "Prompt cache files ignored (corrupt, foreign, stale) or not written.",
            st.disk_errors,
        ),
    ];
    for (name, help, value) in counters {
        out.counter(name, help, value as f64);
    }
    out.metric(
        "pocketd_prompt_cache_disk_total",
        "counter",
        "Parked conversations written to and read back from the prompt cache directory.",
        &[(r#"{op="written"}"#, st.written as f64), (r#"{op="read"}"#, st.read as f64)],
    );
    out.gauge(
        "pocketd_prompt_cache_parked_bytes",
        "Bytes parked conversations hold in the budget.",
        cache.bytes() as f64,
    );
    out.gauge("pocketd_prompt_cache_parked", "Parked conversations.", cache.parked().len() as f64);
}
