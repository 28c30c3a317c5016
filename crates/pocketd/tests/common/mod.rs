//! What the daemon's end-to-end tests share: the models, a private D-Bus, a pocketd on a
//! temporary socket and the clients that talk to it.
#![allow(dead_code)] // each test file uses what it needs

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The workspace's root: the models directory, target/ and the examples are there.
pub(crate) fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The default model's file in the project's models directory.
pub(crate) fn smollm2() -> PathBuf {
    let p = root().join("models/store/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.is_file(), "run: pocket pull smollm2-135m (missing {})", p.display());
    p
}

/// flan-t5-small's directory in the project's models directory (pulled by `scripts/test`).
pub(crate) fn flan_t5() -> PathBuf {
    let p = root().join("models/store/flan-t5-small");
    assert!(p.is_dir(), "run: pocket pull flan-t5-small (missing {})", p.display());
    p
}

/// A tiny random-weight OLMo-2 GGUF (an architecture our graph does not build), written by
/// pocket-ggml's test script into `target/synthetic/` on first use (`scripts/test` makes its venv).
pub(crate) fn olmo2() -> PathBuf {
    let root = root();
    let path = root.join("target/synthetic/olmo2-f16.gguf");
    if !path.is_file() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let python = root.join("target/pyenv/bin/python");
        assert!(python.exists(), "the tests need the test venv: run scripts/test");
        let out = Command::new(python)
            .arg(root.join("crates/pocket-ggml/tests/synthetic/make_gguf.py"))
            .args(["--arch", "olmo2", "--weights", "f16", "--out"])
            .arg(&path)
            .arg("--tokenizer-from")
            .arg(smollm2())
            .output()
            .expect("run make_gguf.py");
        assert!(out.status.success(), "make_gguf.py: {}", String::from_utf8_lossy(&out.stderr));
    }
    path
}

/// A private session bus, killed on drop.
pub(crate) struct Bus {
    pub(crate) address: String,
    pub(crate) pid: i32,
}

impl Bus {
    pub(crate) fn start() -> Bus {
        let o = Command::new("dbus-daemon")
            .args(["--session", "--fork", "--print-address=1", "--print-pid=1"])
            .output()
            .expect("dbus-daemon runs (Debian package dbus)");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let out = String::from_utf8(o.stdout).unwrap();
        let mut lines = out.lines();
        let address = lines.next().unwrap().to_owned();
        let pid = lines.next().unwrap().trim().parse().unwrap();
        Bus { address, pid }
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.pid.to_string()).status();
    }
}

/// A running pocketd, stopped with SIGTERM on drop.
pub(crate) struct Daemon {
    pub(crate) child: Option<Child>,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) socket: PathBuf,
    pub(crate) bus: Option<Bus>,
}

/// Settings of a test daemon: its config file's extra lines and whether it is on D-Bus.
#[derive(Default)]
pub(crate) struct Setup {
    pub(crate) extra: String,
    pub(crate) dbus: bool,
    /// Also serve flan-t5-small (an encoder-decoder on tract).
    pub(crate) flan: bool,
    /// The daemon's default speculation (`off` unless given).
    pub(crate) spec: Option<&'static str>,
    /// Where it keeps what it learns (a directory of its own unless given).
    pub(crate) cache: Option<PathBuf>,
    /// Start it with this limit on open files, soft and hard (`ulimit -n`).
    pub(crate) open_files: Option<u64>,
    /// More models in its models directory: (name, file).
    pub(crate) models: Vec<(String, PathBuf)>,
}

impl Daemon {
    /// pocketd over a models directory holding the default model as a bare file
    /// (`smollm2.gguf`) and, with `qwen`, the 0.5B model too.
    pub(crate) fn start(setup: Setup) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let models = dir.path().join("models");
        std::fs::create_dir(&models).unwrap();
        std::os::unix::fs::symlink(smollm2(), models.join("smollm2.gguf")).unwrap();
        if setup.flan {
            std::os::unix::fs::symlink(flan_t5(), models.join("flan-t5-small")).unwrap();
        }
        for (name, file) in &setup.models {
            std::os::unix::fs::symlink(file, models.join(name)).unwrap();
        }
        let socket = dir.path().join("pocketd.sock");
        let bus = setup.dbus.then(Bus::start);
        let config = format!(
            "socket = {socket:?}\nmodels_dir = {models:?}\ndefault_model = \"smollm2\"\nbus = \"{}\"\n\
             threads = 1\nspec = {:?}\n{}{}{}",
            if bus.is_some() { "session" } else { "none" },
            setup.spec.unwrap_or("off"),
            if setup.extra.contains("tune_when_idle") { "" } else { "tune_when_idle = false\n" },
            if setup.extra.contains("memory_budget") { "" } else { "memory_budget = \"1GiB\"\n" },
            setup.extra
        );
        std::fs::write(dir.path().join("pocketd.toml"), config).unwrap();
        let mut command = match setup.open_files {
            // sh execs pocketd, so the child is pocketd itself.
            Some(n) => {
                let mut c = Command::new("sh");
                c.args([
                    "-c",
                    "ulimit -n \"$0\" && exec \"$@\"",
                    &n.to_string(),
                    env!("CARGO_BIN_EXE_pocketd"),
                ]);
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_pocketd")),
        };
        command
            .arg("--config")
            .arg(dir.path().join("pocketd.toml"))
            .env("POCKET_CACHE_DIR", setup.cache.clone().unwrap_or_else(|| dir.path().join("cache")))
            .env_remove("POCKET_MODELS_DIR")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("log")).unwrap());
        if let Some(b) = &bus {
            command.env("DBUS_SESSION_BUS_ADDRESS", &b.address);
        }
        let child = command.spawn().expect("pocketd starts");
        let mut d = Daemon { child: Some(child), dir, socket, bus };
        d.wait_ready();
        d
    }

    pub(crate) fn wait_ready(&mut self) {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if UnixStream::connect(&self.socket).is_ok() && (self.bus.is_none() || self.dbus_ready()) {
                return;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("pocketd exited with {status}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("pocketd did not start:\n{}", self.log());
    }

    pub(crate) fn dbus_ready(&self) -> bool {
        self.dbus(&[
            "call",
            "org.pocketd.Pocketd1",
            "/org/pocketd/Pocketd1",
            "org.freedesktop.DBus.Peer",
            "Ping",
        ])
        .status
        .success()
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// `curl` on the socket: the status code and the body.
    pub(crate) fn curl(&self, method: &str, path: &str, body: Option<&[u8]>) -> (u16, String) {
        let mut c = Command::new("curl");
        c.args(["-sS", "--max-time", "120", "-o", "-", "-w", "\n%{http_code}", "--unix-socket"])
            .arg(&self.socket)
            .args(["-X", method, &format!("http://localhost{path}")]);
        if body.is_some() {
            c.args(["-H", "Content-Type: application/json", "--data-binary", "@-"]);
        }
        c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().expect("curl runs");
        let mut stdin = child.stdin.take().unwrap();
        if let Some(b) = body {
            stdin.write_all(b).unwrap();
        }
        drop(stdin);
        let o = child.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let (body, code) = out.rsplit_once('\n').expect("curl printed the status");
        (code.trim().parse().unwrap_or(0), body.to_owned())
    }

    pub(crate) fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (code, text) = self.curl("POST", path, Some(body.to_string().as_bytes()));
        (code, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
    }

    pub(crate) fn get(&self, path: &str) -> Value {
        let (code, text) = self.curl("GET", path, None);
        assert_eq!(code, 200, "{text}");
        serde_json::from_str(&text).unwrap()
    }

    /// `busctl` on the private bus.
    pub(crate) fn dbus(&self, args: &[&str]) -> Output {
        let b = self.bus.as_ref().expect("started with D-Bus");
        Command::new("busctl").arg(format!("--address={}", b.address)).args(args).output().unwrap()
    }

    /// `Generate` on the default model through busctl, as a shell script calls it:
    /// `options` are the `a{sv}` entries, each as busctl writes them (`max_tokens u 24`), and
    /// `flags` go before the call (`--json=short`).
    pub(crate) fn busctl_generate(&self, flags: &[&str], prompt: &str, options: &[&[&str]]) -> Output {
        self.busctl_generate_on("", flags, prompt, options)
    }

    /// [`Daemon::busctl_generate`] on `model` (`""`: the default one).
    pub(crate) fn busctl_generate_on(
        &self,
        model: &str,
        flags: &[&str],
        prompt: &str,
        options: &[&[&str]],
    ) -> Output {
        let n = options.len().to_string();
        let mut args = vec![model, prompt, &n];
        args.extend(options.iter().flat_map(|o| o.iter().copied()));
        self.busctl_call(flags, "Generate", "ssa{sv}", &args)
    }

    /// `method` of the daemon's main object through busctl: `flags` before the call
    /// (`--json=short`), `args` as busctl writes them after the `signature`.
    pub(crate) fn busctl_call(&self, flags: &[&str], method: &str, signature: &str, args: &[&str]) -> Output {
        let mut all = flags.to_vec();
        all.extend([
            "call",
            "org.pocketd.Pocketd1",
            "/org/pocketd/Pocketd1",
            "org.pocketd.Pocketd1",
            method,
            signature,
        ]);
        all.extend(args);
        self.dbus(&all)
    }

    pub(crate) fn dbus_send(&self, args: &[&str]) -> Output {
        let b = self.bus.as_ref().expect("started with D-Bus");
        Command::new("dbus-send")
            .arg(format!("--bus={}", b.address))
            .args(["--print-reply", "--dest=org.pocketd.Pocketd1", "/org/pocketd/Pocketd1"])
            .args(args)
            .output()
            .unwrap()
    }

    /// SIGTERM, and the exit status.
    pub(crate) fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().unwrap();
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let start = Instant::now();
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                return s;
            }
            if start.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                panic!("pocketd did not stop within 30 s of SIGTERM:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Wait until a request has generated more than a few tokens; returns the status then.
    pub(crate) fn wait_generating(&self) -> Value {
        let start = Instant::now();
        loop {
            let st = self.get("/v1/status");
            if st["sessions"]
                .as_array()
                .unwrap()
                .first()
                .is_some_and(|s| s["generated_tokens"].as_u64().unwrap() > 5)
            {
                return st;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "never started: {st}\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Wait until no request is generating; returns the status then.
    pub(crate) fn idle_status(&self, within: Duration) -> Value {
        let start = Instant::now();
        loop {
            let s = self.get("/v1/status");
            if s["sessions"].as_array().unwrap().is_empty() {
                return s;
            }
            assert!(start.elapsed() < within, "a session is still running after {within:?}: {s}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.terminate();
        }
    }
}

/// What the budget holds apart from parked prompt-cache prefixes: the models and live sessions.
/// A finished (or hung-up) session is parked, so its memory moves to `parked` rather than
/// leaving the ledger, and its answer is kept for drafting (`histories`); this is the figure
/// that must return to its idle value.
pub(crate) fn used_without_parked(status: &Value) -> u64 {
    let sum = |field: &str| -> u64 {
        status[field].as_array().map_or(0, |p| p.iter().map(|e| e["bytes"].as_u64().unwrap()).sum())
    };
    status["memory"]["used_bytes"].as_u64().unwrap() - sum("parked") - sum("histories")
}

/// A raw HTTP request on the socket, left open for the caller to read from or hang up.
pub(crate) fn raw_request(socket: &Path, path: &str, body: &Value) -> UnixStream {
    let mut s = UnixStream::connect(socket).unwrap();
    let body = body.to_string();
    write!(s, "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len())
        .unwrap();
    s
}

pub(crate) fn sse_data(body: &str) -> Vec<String> {
    body.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_owned).collect()
}

impl Setup {
    pub(crate) fn with_budget(mut self, budget: &str) -> Setup {
        self.extra.push_str(&format!("memory_budget = \"{budget}\"\n"));
        self
    }
}

/// Run one of the Python check scripts in tests/ against `d` (`--socket` and `args`): each
/// prints a line per check and "all passed" at the end.
pub(crate) fn python_checks(d: &Daemon, script: &str, args: &[&str]) {
    let python = root().join("target/pyenv/bin/python");
    assert!(python.exists(), "the tests need the test venv: run scripts/test");
    let o = Command::new(&python)
        .arg(root().join("crates/pocketd/tests").join(script))
        .arg("--socket")
        .arg(&d.socket)
        .args(args)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.contains("all passed"),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
