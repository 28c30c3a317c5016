//! Shared by the integration tests: finding and loading the real models, and small helpers.
#![allow(dead_code, unreachable_pub)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

use pocket_core::{ChatMessage, LayerPlan, Logits, Model, SessionConfig, Threads, Token};
use pocket_ggml::{AttentionKernel, GgmlModel, GgmlSession, LoadOptions, WeightFormat};

/// SmolLM2-135M-Instruct (llama, 30 layers): the model most tests run on, being the fastest.
pub const SMOL: &str = "smollm2-135m";
/// Qwen2.5-Coder-0.5B-Instruct (qwen2, 24 layers): the second architecture.
pub const QWEN: &str = "qwen2.5-coder-0.5b";

/// The file of the model `name` in the models directory.
///
/// A model that is not there fails the test, saying how to get it: CI pulls the models before
/// running the tests, so a missing one is a broken setup, never a reason to skip.
pub fn model_path(name: &str) -> PathBuf {
    let dir = pocket_models::models_dir(None);
    match pocket_models::resolve(name, &dir) {
        Ok(model) => model.path,
        Err(e) => {
            // NotPulled already says what to run; any other error (say, a broken manifest in
            // the models directory) gets the hint too.
            let hint = format!("run: pocket pull {name}");
            let msg = e.to_string();
            let hint = if msg.contains(&hint) { String::new() } else { format!("\n{hint}") };
            panic!("the tests need the model {name} in {}: {msg}{hint}", dir.display())
        }
    }
}

/// The model `name` on the build's device (the CPU, or a GPU built in), loaded once per test
/// binary and shared by its tests.
pub fn model(name: &str) -> GgmlModel {
    model_as(name, WeightFormat::AsStored)
}

/// The model `name` with its matrices in `weights`, loaded once per test binary.
pub fn model_as(name: &str, weights: WeightFormat) -> GgmlModel {
    model_with(name, weights, AttentionKernel::Auto)
}

/// The model `name` attending with ggml's flash attention, as llama.cpp does: for
/// comparing the rest of the graph with llama.cpp to its rounding.
pub fn model_with_ggml_attention(name: &str) -> GgmlModel {
    model_with(name, WeightFormat::AsStored, AttentionKernel::Ggml)
}

fn model_with(name: &str, weights: WeightFormat, attention: AttentionKernel) -> GgmlModel {
    static MODELS: Mutex<Vec<(String, WeightFormat, AttentionKernel, GgmlModel)>> = Mutex::new(Vec::new());
    let mut models = MODELS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((.., m)) = models.iter().find(|(n, w, a, _)| n == name && *w == weights && *a == attention) {
        return m.clone();
    }
    let path = model_path(name);
    // The device the build has: a GPU where one is built in (`scripts/test-cuda`, and
    // `scripts/test-vulkan` on lavapipe), so that these tests say something about it.
    let options = LoadOptions { device: device(), weights, attention, ..LoadOptions::default() };
    let m = GgmlModel::load(&path, &options).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()));
    assert_on_the_device(m.device_name());
    if let Some(exact) = &m.info().exact_passes {
        eprintln!("{name} on {}: {}", m.device_name(), exact.why);
    }
    models.push((name.to_owned(), weights, attention, m.clone()));
    m
}

/// The device the engine's tests load on: `POCKET_TEST_DEVICE` if set (`openvino:CPU` in
/// `scripts/test-openvino`: OpenVINO's CPU device is not one `auto` takes), else the build's
/// own (`auto`: a GPU where one is built in).
pub fn device() -> pocket_ggml::DeviceChoice {
    std::env::var("POCKET_TEST_DEVICE")
        .map_or(pocket_ggml::DeviceChoice::Auto, |d| d.parse().unwrap_or_default())
}

/// Whether the test device keeps quantized KV caches: not an OpenVINO device (f16 only there).
pub fn quantized_kv() -> bool {
    !on_openvino()
}

/// Whether the tests were asked to run on an OpenVINO device (`POCKET_TEST_DEVICE=openvino…`).
fn on_openvino() -> bool {
    std::env::var("POCKET_TEST_DEVICE").is_ok_and(|d| d.to_ascii_lowercase().starts_with("openvino"))
}

/// How far a row's logits may differ between passes of different widths on the test device
/// (the tolerance of the conformance suite's row checks; top-1 must agree everywhere). On
/// the CPU our kernels give every width ggml's one-row bits but for f32 sums in another order
/// (rows.rs). A device's kernels round wide and narrow products otherwise: OpenVINO's CPU
/// plugin by up to 3.8e-3 (SmolLM2, measured 2026-12-06), lavapipe by up to 0.12
/// (docs/benchmarks.md); a GPU build is held to the latter until one is measured.
pub fn width_tolerance() -> f32 {
    let on_the_cpu = std::env::var("POCKET_TEST_DEVICE").is_ok_and(|d| d.eq_ignore_ascii_case("cpu"));
    if on_openvino() {
        1e-2
    } else if on_the_cpu || !cfg!(any(feature = "vulkan", feature = "cuda")) {
        1e-3
    } else {
        0.25
    }
}

/// Fail when a build with a GPU backend (or a test asked for a device) ran on the CPU: the
/// comparison would then test nothing new.
pub fn assert_on_the_device(device_name: &str) {
    let asked = std::env::var("POCKET_TEST_DEVICE").is_ok_and(|d| !d.eq_ignore_ascii_case("cpu"));
    let gpu_built = cfg!(any(feature = "vulkan", feature = "cuda"));
    assert!(
        !(asked || gpu_built) || device_name != "CPU",
        "expected a device other than the CPU (POCKET_TEST_DEVICE {:?}) but ggml gave the CPU (devices: {})",
        std::env::var("POCKET_TEST_DEVICE").ok(),
        pocket_ggml::device_names().join(", ")
    );
}

/// SmolLM2, the default test model.
pub fn smol() -> GgmlModel {
    model(SMOL)
}

/// CPU threads per session (and for llama.cpp) in the tests, unless a test is about threads.
///
/// ggml's CPU threads wait for each other on spinning barriers: on a 2-core machine that
/// something else is also using (another test binary, a build, a benchmark), a pass on 2
/// threads runs several times slower than on one (measured: SmolLM2's 128-token parity run
/// took 2.4 s on 1 thread and 13 s on 2 next to a benchmark). The tests check results, not
/// speed, and one thread keeps their time predictable.
pub const THREADS: usize = 1;

/// Run the tests of one binary one at a time.
///
/// Two sessions computing at once would share the cores (see [`THREADS`]) and make the run
/// time depend on which tests happen to overlap. Each test takes this lock for its whole body
/// (binaries themselves run one after another).
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A session configuration for tests: `n_ctx` tokens, f16 KV, [`THREADS`] threads.
pub fn config(n_ctx: usize) -> SessionConfig {
    SessionConfig { n_ctx, n_batch: 256, threads: Threads::Fixed(THREADS), ..SessionConfig::default() }
}

/// A new session on `model` with `config`.
pub fn session(model: &GgmlModel, config: &SessionConfig) -> GgmlSession {
    model.new_session(config).expect("a new session")
}

/// Every layer of `model`.
pub fn full(model: &GgmlModel) -> LayerPlan {
    LayerPlan::full(model.info().n_layers).unwrap()
}

/// Plain English prose, long enough to cut any test's token stream from.
const PROSE: &str = "The old lighthouse keeper climbed the spiral stairs every evening at dusk, \
    carrying a small brass lamp and a notebook full of observations about the sea. He wrote \
    down the colour of the water, the shape of the clouds, and the names of the ships that \
    passed on their way to the harbour. Over forty years the notebooks filled three shelves \
    in his kitchen, and the children of the village would sometimes come to read them, \
    looking for the storms their grandparents had told them about. One winter a scientist \
    from the university arrived with a question: had the tides changed over the years? The \
    keeper did not know, but he knew where to look, and together they spent a month turning \
    pages, copying numbers into columns, and drawing careful graphs by the light of the \
    stove. ";

/// The tokens of `text` (with the model's BOS if it uses one).
pub fn tokens(model: &GgmlModel, text: &str) -> Vec<Token> {
    model.tokenizer().encode(text, true).expect("tokenize")
}

/// The chat prompt for one user message, with the assistant's turn opened.
pub fn chat(model: &GgmlModel, user: &str) -> Vec<Token> {
    let messages = [ChatMessage::new(pocket_core::Role::User, user)];
    let text = model.tokenizer().apply_chat_template(&messages, true).expect("the model has a chat template");
    tokens(model, &text)
}

/// Exactly `n` tokens of English prose (repeated as needed), BOS first if the model uses one.
pub fn prose(model: &GgmlModel, n: usize) -> Vec<Token> {
    prose_of(model, n)
}

/// [`prose`] for a model of any engine.
pub fn prose_of(model: &dyn Model, n: usize) -> Vec<Token> {
    let mut text = String::from(PROSE);
    loop {
        let t = model.tokenizer().encode(&text, true).expect("tokenize");
        if t.len() >= n {
            return t[..n].to_vec();
        }
        text.push_str(PROSE);
    }
}

/// Tokens of a second, different text, `n` of them, no BOS: a continuation to append.
pub fn other_prose(model: &GgmlModel, n: usize) -> Vec<Token> {
    let text = "In the spring the scientist published a paper with the keeper's name on it, \
        and the keeper framed the first page and hung it above the stove, next to a picture \
        of his daughter and a map of the coast drawn by his father. ";
    let mut all = Vec::new();
    while all.len() < n {
        all.extend(model.tokenizer().encode(text, false).expect("tokenize"));
    }
    all.truncate(n);
    all
}

/// The largest |a − b| over two rows.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "rows of different lengths");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Whether two slices of logits are bitwise equal (NaN-safe, −0 ≠ +0: the bits are compared).
pub fn bitwise_eq(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Assert two sets of logits rows are bitwise equal; on failure say where and by how much.
#[track_caller]
pub fn assert_bitwise(what: &str, a: &[f32], b: &[f32], n_vocab: usize) {
    assert_eq!(a.len(), b.len(), "{what}: different numbers of logits");
    if bitwise_eq(a, b) {
        return;
    }
    let rows: Vec<String> = a
        .chunks(n_vocab)
        .zip(b.chunks(n_vocab))
        .enumerate()
        .filter(|(_, (x, y))| !bitwise_eq(x, y))
        .map(|(i, (x, y))| {
            format!(
                "row {i}: max |Δ| {:e}, argmax {} vs {}",
                max_abs_diff(x, y),
                pocket_core::argmax(x),
                pocket_core::argmax(y)
            )
        })
        .collect();
    panic!("{what}: logits differ in {} of {} rows: {}", rows.len(), a.len() / n_vocab, rows.join("; "));
}

/// Assert two sets of logits rows agree in argmax per row and within `tol` everywhere.
#[track_caller]
pub fn assert_close(what: &str, a: &[f32], b: &[f32], n_vocab: usize, tol: f32) -> f32 {
    assert_eq!(a.len(), b.len(), "{what}: different numbers of logits");
    let mut worst = 0.0f32;
    for (i, (x, y)) in a.chunks(n_vocab).zip(b.chunks(n_vocab)).enumerate() {
        let d = max_abs_diff(x, y);
        worst = worst.max(d);
        assert_eq!(
            pocket_core::argmax(x),
            pocket_core::argmax(y),
            "{what}: row {i} argmax differs (max |Δ| {d:e})"
        );
        assert!(d < tol, "{what}: row {i} differs by {d:e} ≥ {tol:e}");
        assert!(x.iter().all(|v| v.is_finite()), "{what}: row {i} has non-finite logits");
    }
    worst
}

/// Every row of `logits`, copied (the borrow of the session ends).
pub fn collect(logits: &Logits<'_>) -> Vec<f32> {
    (0..logits.rows()).flat_map(|i| logits.row(i).iter().copied()).collect()
}

/// Resident anonymous memory of this process (`RssAnon`: the KV cache and compute buffers are
/// anonymous; the weights are a file mapping and do not count there), in bytes.
pub fn rss_anon() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    pocket_core::memory::proc_field(&status, "RssAnon").expect("RssAnon in /proc/self/status")
}

/// A synthetic model: the architecture and `make_gguf.py`'s shape arguments.
pub struct Synthetic {
    pub arch: &'static str,
    pub args: &'static [&'static str],
    pub weights: &'static str,
}

impl Synthetic {
    /// The file, written on first use into `target/synthetic/` (the script writes it
    /// atomically, so a file that is there is whole).
    pub fn path(&self) -> PathBuf {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let dir = root.join("target/synthetic");
        std::fs::create_dir_all(&dir).expect("target/synthetic");
        let name = format!("{}{}-{}.gguf", self.arch, self.args.join("").replace("--", "_"), self.weights);
        let path = dir.join(name);
        if !path.exists() {
            let python = root.join("target/pyenv/bin/python");
            assert!(
                python.exists(),
                "the tests need the test venv with llama.cpp's gguf writer; run scripts/test, or: \
                 python3 -m venv target/pyenv && target/pyenv/bin/pip install gguf==0.19.0 numpy"
            );
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/synthetic/make_gguf.py");
            let out = Command::new(python)
                .arg(script)
                .args(["--arch", self.arch, "--weights", self.weights, "--out"])
                .arg(&path)
                .arg("--tokenizer-from")
                .arg(model_path(SMOL))
                .args(self.args)
                .output()
                .expect("run make_gguf.py");
            assert!(out.status.success(), "make_gguf.py: {}", String::from_utf8_lossy(&out.stderr));
        }
        path
    }
}

/// Greedy generation of `max_tokens` from `prompt`, speculating with `drafter` if given.
pub fn greedy(
    model: &dyn Model,
    prompt: &[Token],
    max_tokens: usize,
    drafter: Option<&mut dyn pocket_core::spec::Drafter>,
) -> pocket_core::Generation {
    let request = pocket_core::GenerateRequest {
        prompt: prompt.to_vec(),
        sampling: pocket_core::SamplingConfig::default(),
        stop: pocket_core::StopConfig { max_tokens, stop: Vec::new() },
    };
    let mut session = model.session(&config(512)).expect("session");
    pocket_core::generate_speculative(
        model.info(),
        session.as_mut(),
        model.tokenizer(),
        &request,
        drafter,
        &mut |_| std::ops::ControlFlow::Continue(()),
    )
    .expect("generate")
}
