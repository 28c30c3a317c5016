//! pocketd's configuration: a TOML file (`/etc/pocketd/pocketd.toml` by default), then flags
//! over it. `pocketd --print-config` prints the result as TOML, which is also a valid file.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use pocket_core::memory::BudgetSpec;
use pocket_core::spec::SpecMode;
use pocket_core::{KvType, Threads};
use serde::{Deserialize, Serialize};

/// Where the configuration is read from unless `--config` says otherwise.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/pocketd/pocketd.toml";

/// Permission bits of the socket, written in octal (`"0660"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketMode(pub u32);

impl std::str::FromStr for SocketMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        u32::from_str_radix(s.trim_start_matches("0o"), 8)
            .ok()
            .filter(|b| *b <= 0o777)
            .map(SocketMode)
            .ok_or_else(|| {
                format!("{s:?} is not a socket mode: expected octal permission bits such as \"0660\"")
            })
    }
}

impl Serialize for SocketMode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{:04o}", self.0))
    }
}

impl<'de> Deserialize<'de> for SocketMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// How many requests generate at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Parallel {
    /// As many as share a pass well on this device: from the default model's measured cost
    /// curve (the most sessions whose shared pass still costs at most twice one session's),
    /// [`Parallel::UNMEASURED`] until it is measured, 2 for a model whose sessions cannot
    /// share passes.
    #[default]
    Auto,
    /// Exactly this many (at least 1).
    Fixed(usize),
}

impl Parallel {
    /// `auto`'s count until the default model's cost curve is known.
    pub const UNMEASURED: usize = 4;
    /// The most `auto` picks: the most sessions one shared pass carries.
    pub const MAX_AUTO: usize = 8;

    /// The most requests that may ever generate at once with this setting.
    pub fn most(self) -> usize {
        match self {
            Parallel::Auto => Parallel::MAX_AUTO,
            Parallel::Fixed(n) => n,
        }
    }
}

impl std::fmt::Display for Parallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Parallel::Auto => f.write_str("auto"),
            Parallel::Fixed(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for Parallel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "auto" => Ok(Parallel::Auto),
            n => match n.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(Parallel::Fixed(n)),
                _ => Err(format!("parallel = {s:?}: use \"auto\" or a count of at least 1")),
            },
        }
    }
}

impl Serialize for Parallel {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Parallel::Auto => s.serialize_str("auto"),
            Parallel::Fixed(n) => s.serialize_u64(*n as u64),
        }
    }
}

impl<'de> Deserialize<'de> for Parallel {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Count(i64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Count(n) => n.to_string().parse(),
            Raw::Text(s) => s.parse(),
        }
        .map_err(serde::de::Error::custom)
    }
}

/// Which D-Bus bus to serve on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Bus {
    /// The system bus (a service; needs the policy file in `systemd/`).
    System,
    /// The user's session bus (development).
    Session,
    /// No D-Bus.
    None,
}

/// The effective configuration. Every field has a default, so an empty file (or none) is a
/// working configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The Unix socket the HTTP API listens on (ignored when systemd passes a socket).
    pub socket: PathBuf,
    /// Permission bits of the socket, octal (`"0660"`): owner and group may connect.
    pub socket_mode: SocketMode,
    /// The group that owns the socket (`None`: the daemon's own group).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket_group: Option<String>,
    /// An additional TCP listener, loopback only (`"127.0.0.1:8077"`); off by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp: Option<SocketAddr>,
    /// The D-Bus bus to serve `org.pocketd.Pocketd1` on.
    pub bus: Bus,
    /// Where models (manifests' files and bare GGUF files) are found.
    pub models_dir: PathBuf,
    /// The model requests get when they name none.
    pub default_model: String,
    /// The memory budget: a size (`"1.5GiB"`) or `"auto"` (the cgroup's `memory.max` — what
    /// systemd's `MemoryMax=` sets — or the memory available at start, less a reserve).
    pub memory_budget: BudgetSpec,
    /// The ggml device models run on: `"auto"` (a GPU if there is one), `"cpu"`, or a device's
    /// name (`"CUDA0"`, `"Vulkan0"`; a name there is not is refused with the list of those there
    /// are).
    pub device: String,
    /// The budget of a discrete GPU's own memory, apart from `memory_budget`: a size or
    /// `"auto"` (what is free on the device at start, less a tenth of it in all). Where the
    /// GPU computes in the host's memory (Jetson) `memory_budget` covers both.
    pub device_memory_budget: BudgetSpec,
    /// CPU threads of each forward pass: `"auto"` (as many as other programs leave free, pass
    /// by pass: affinity, cgroup quota, load, stragglers) or a fixed count. `0` is read as
    /// `"auto"`.
    pub threads: Threads,
    /// Requests that generate at once — sharing each forward pass where the model allows —
    /// `"auto"` (from the default model's measured cost curve) or a count; more wait in the
    /// queue, the lowest `priority` first.
    pub parallel: Parallel,
    /// Requests that may wait for a turn; more are refused with 429.
    pub queue: usize,
    /// Seconds a model stays loaded after its last request (0: unload at once; models are
    /// also unloaded, least recently used first, when memory is needed).
    pub keep_alive_seconds: u64,
    /// The most tokens a request may generate (requests asking for more are capped).
    pub max_tokens: u32,
    /// The most tokens (prompt and generation) a session may hold.
    pub ctx_size: usize,
    /// Speculation for requests that do not ask for one.
    pub spec: SpecMode,
    /// KV cache type for requests that do not ask for one.
    pub kv: KvType,
    /// Seconds in-flight requests may take to finish after SIGTERM before they are
    /// cancelled.
    pub shutdown_seconds: u64,
    /// Learn what speculation needs about loaded models (their cost curves, skip sets) while
    /// no request is in flight, stopping the moment one arrives; `auto` uses only what is
    /// learned. Off: only what `pocket tune` measured is used.
    pub tune_when_idle: bool,
    /// Keep each finished conversation's KV cache (paid for in the budget, given up first
    /// when memory is needed) so that the next request sharing its beginning — the next turn
    /// of a chat — processes only what is new.
    pub prompt_cache: bool,
    /// Where kept conversations are written when their model unloads or the daemon stops, and
    /// read back from when a request continues one (none: not kept across unloads); earlier
    /// answers, which later ones are drafted from, are kept in its `histories` directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_cache_dir: Option<PathBuf>,
    /// The most the files in `prompt_cache_dir` may take (`"1GiB"`); the least recently used
    /// are deleted first.
    pub prompt_cache_disk: String,
    /// HTTP connections open at once (lowered at start to stay under the open files limit).
    /// Past it, a new connection closes the oldest one waiting for a request, or gets a 503
    /// when all are answering one.
    pub max_connections: usize,
    /// HTTP connections open at once from one peer (a uid on the Unix socket; the loopback
    /// TCP listener counts as one peer).
    pub max_connections_per_peer: usize,
    /// Seconds a request's head, and then its body, may take to arrive.
    pub header_timeout_seconds: u64,
    /// Seconds a kept-alive HTTP connection may wait for its next request.
    pub idle_timeout_seconds: u64,
    /// `Generate` and `Start` calls one D-Bus caller may have running or queued at once.
    pub dbus_jobs_per_caller: usize,
    /// Responses the Responses API keeps (`store`) for `previous_response_id` and `GET
    /// /v1/responses/{id}`, the oldest going first; 0 keeps none. The memory budget pays for
    /// them too.
    pub stored_responses: usize,
    /// RPC peers (`"host:port"`, each running `pocket rpc-serve`) that hold the last layers of
    /// a model too large for `memory_budget`, by the memory each offers (docs/rpc.md). A model
    /// that fits is loaded here alone.
    pub rpc: Vec<String>,
    /// Other names for models, each to a model's name (`"gpt-4o-mini" = "qwen2.5-coder-0.5b"`):
    /// an app that hard-codes a hosted model's name is pointed at a local one by the operator.
    /// An alias is read before the models' own names, once (not an alias of an alias).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub model_aliases: BTreeMap<String, String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            socket: PathBuf::from("/run/pocketd/pocketd.sock"),
            socket_mode: SocketMode(0o660),
            socket_group: None,
            tcp: None,
            bus: Bus::System,
            models_dir: PathBuf::from("/var/lib/pocketd/models"),
            default_model: pocket_models::default_model().to_owned(),
            memory_budget: BudgetSpec::Auto,
            device: "auto".to_owned(),
            device_memory_budget: BudgetSpec::Auto,
            threads: Threads::Auto,
            parallel: Parallel::Auto,
            queue: 16,
            keep_alive_seconds: 300,
            max_tokens: 1024,
            ctx_size: 4096,
            spec: SpecMode::Auto,
            kv: KvType::F16,
            shutdown_seconds: 10,
            tune_when_idle: true,
            prompt_cache: true,
            prompt_cache_dir: None,
            prompt_cache_disk: "1GiB".to_owned(),
            max_connections: 512,
            max_connections_per_peer: 128,
            header_timeout_seconds: 10,
            idle_timeout_seconds: 60,
            dbus_jobs_per_caller: 4,
            stored_responses: 256,
            rpc: Vec::new(),
            model_aliases: BTreeMap::new(),
        }
    }
}

impl Config {
    /// Read `path`; a missing file is the defaults when `required` is false (the default
    /// path), an error when it was asked for by name.
    pub fn load(path: &Path, required: bool) -> anyhow::Result<Config> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => return Ok(Config::default()),
            Err(e) => {
                return Err(e).with_context(|| format!("cannot read the configuration {}", path.display()));
            }
        };
        let config: Config =
            toml::from_str(&text).with_context(|| format!("in the configuration {}", path.display()))?;
        config.validate().with_context(|| format!("in the configuration {}", path.display()))?;
        Ok(config)
    }

    /// Check what types alone do not: ranges, a TCP listener on loopback only.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.max_tokens >= 1, "max_tokens must be at least 1");
        anyhow::ensure!(self.ctx_size >= 16, "ctx_size must be at least 16 tokens, not {}", self.ctx_size);
        self.prompt_cache_disk_bytes()?;
        anyhow::ensure!(self.max_connections >= 1, "max_connections must be at least 1");
        anyhow::ensure!(
            (1..=self.max_connections).contains(&self.max_connections_per_peer),
            "max_connections_per_peer must be between 1 and max_connections ({}), not {}",
            self.max_connections,
            self.max_connections_per_peer
        );
        anyhow::ensure!(self.header_timeout_seconds >= 1, "header_timeout_seconds must be at least 1");
        anyhow::ensure!(self.idle_timeout_seconds >= 1, "idle_timeout_seconds must be at least 1");
        anyhow::ensure!(self.dbus_jobs_per_caller >= 1, "dbus_jobs_per_caller must be at least 1");
        for (alias, name) in &self.model_aliases {
            anyhow::ensure!(
                !alias.is_empty() && !alias.contains('/') && alias != name,
                "model_aliases: {alias:?} = {name:?}: an alias is a name other than its model's, without '/'"
            );
        }
        for peer in &self.rpc {
            let port = peer.rsplit_once(':').and_then(|(host, port)| (!host.is_empty()).then_some(port));
            anyhow::ensure!(
                port.is_some_and(|p| p.parse::<u16>().is_ok_and(|p| p > 0)),
                "rpc = [{peer:?}]: a peer is \"host:port\" (the address `pocket rpc-serve --listen` was given)"
            );
        }
        if let Some(addr) = self.tcp {
            anyhow::ensure!(
                addr.ip().is_loopback(),
                "tcp = \"{addr}\": the TCP listener is for loopback only (127.0.0.1 or [::1]); the API has no \
                 authentication beyond the socket's permissions"
            );
        }
        Ok(())
    }

    /// `prompt_cache_disk` in bytes.
    pub fn prompt_cache_disk_bytes(&self) -> anyhow::Result<u64> {
        pocket_core::memory::parse_size(&self.prompt_cache_disk)
            .map_err(|e| anyhow::anyhow!("prompt_cache_disk = {:?}: {e}", self.prompt_cache_disk))
    }

    /// The configuration as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("the configuration serializes")
    }
}

/// pocketd's flags: each one overrides the configuration file's value.
#[derive(Debug, Clone, Default, clap::Parser)]
#[command(name = "pocketd", version = env!("POCKETD_VERSION"), about = "pocketd: a low-memory LLM inference daemon")]
pub struct Flags {
    /// The configuration file (default: /etc/pocketd/pocketd.toml, if it exists).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
    /// The Unix socket to listen on.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// The D-Bus bus to serve on.
    #[arg(long, value_enum)]
    pub bus: Option<Bus>,
    /// Where models are found.
    #[arg(long, value_name = "DIR", env = "POCKET_MODELS_DIR")]
    pub models_dir: Option<PathBuf>,
    /// The memory budget: a size (`1.5GiB`) or `auto`.
    #[arg(long, value_name = "SIZE")]
    pub memory_budget: Option<String>,
    /// The model requests get when they name none.
    #[arg(long, value_name = "NAME")]
    pub default_model: Option<String>,
    /// A loopback TCP listener besides the socket (`127.0.0.1:8077`).
    #[arg(long, value_name = "ADDR")]
    pub tcp: Option<SocketAddr>,
    /// Where kept conversations are written across unloads and restarts.
    #[arg(long, value_name = "DIR")]
    pub prompt_cache_dir: Option<PathBuf>,
    /// CPU threads of each forward pass: `auto` or a count.
    #[arg(long, value_name = "N")]
    pub threads: Option<Threads>,
    /// Requests that generate at once: `auto` or a count.
    #[arg(long, value_name = "N")]
    pub parallel: Option<Parallel>,
    /// An RPC peer (`host:port`) for models too large for the budget; repeat for several
    /// (replaces the file's `rpc`).
    #[arg(long = "rpc", value_name = "HOST:PORT")]
    pub rpc: Vec<String>,
}

impl Flags {
    /// The configuration these flags ask for: the file, then the flags over it, checked.
    pub fn config(&self) -> anyhow::Result<Config> {
        let mut c = match &self.config {
            Some(path) => Config::load(path, true)?,
            None => Config::load(Path::new(DEFAULT_CONFIG_PATH), false)?,
        };
        if let Some(v) = &self.socket {
            c.socket = v.clone();
        }
        if let Some(v) = self.bus {
            c.bus = v;
        }
        if let Some(v) = &self.models_dir {
            c.models_dir = v.clone();
        }
        if let Some(v) = &self.memory_budget {
            c.memory_budget = v.parse().map_err(|e| anyhow::anyhow!("memory_budget = {v:?}: {e}"))?;
        }
        if let Some(v) = &self.default_model {
            c.default_model = v.clone();
        }
        if self.tcp.is_some() {
            c.tcp = self.tcp;
        }
        if let Some(v) = &self.prompt_cache_dir {
            c.prompt_cache_dir = Some(v.clone());
        }
        if let Some(v) = self.threads {
            c.threads = v;
        }
        if let Some(v) = self.parallel {
            c.parallel = v;
        }
        if !self.rpc.is_empty() {
            c.rpc = self.rpc.clone();
        }
        c.validate()?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_configuration_is_the_defaults() {
        let shipped: Config = toml::from_str(include_str!("../../../../systemd/pocketd.toml")).unwrap();
        assert_eq!(shipped, Config::default(), "systemd/pocketd.toml and Config::default() disagree");
    }

    #[test]
    fn an_empty_file_is_the_defaults_and_print_config_reads_back() {
        let c: Config = toml::from_str("").unwrap();
        assert_eq!(c, Config::default());
        let back: Config = toml::from_str(&Config::default().to_toml()).unwrap();
        assert_eq!(back, Config::default());
    }

    #[test]
    fn bad_values_are_refused_naming_the_field_and_what_is_allowed() {
        let e = toml::from_str::<Config>("sockt = \"/x\"").unwrap_err().to_string();
        assert!(e.contains("sockt"), "{e}");
        let e = toml::from_str::<Config>("bus = \"sytem\"").unwrap_err().to_string();
        assert!(e.contains("system") && e.contains("session"), "{e}");
        let e = toml::from_str::<Config>("socket_mode = \"rw\"").unwrap_err().to_string();
        assert!(e.contains("socket_mode") && e.contains("0660"), "{e}");
        let e = toml::from_str::<Config>("memory_budget = \"lots\"").unwrap_err().to_string();
        assert!(e.contains("memory_budget") && e.contains("200MiB") && e.contains("auto"), "{e}");
        let c: Config = toml::from_str("memory_budget = \"1.5GiB\"\nsocket_mode = \"0600\"").unwrap();
        assert_eq!((c.memory_budget, c.socket_mode), (BudgetSpec::Bytes(3 << 29), SocketMode(0o600)));
        let c = Config { tcp: Some("0.0.0.0:8077".parse().unwrap()), ..Config::default() };
        assert!(c.validate().unwrap_err().to_string().contains("loopback"));
        assert_eq!(Config::default().socket_mode, SocketMode(0o660));
    }

    #[test]
    fn flags_override_the_file() {
        use clap::Parser;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pocketd.toml");
        std::fs::write(&file, "socket = \"/tmp/a.sock\"\nqueue = 3\nbus = \"session\"\n").unwrap();
        let flags = Flags::parse_from([
            "pocketd",
            "--config",
            file.to_str().unwrap(),
            "--socket",
            "/tmp/b.sock",
            "--bus",
            "none",
        ]);
        let c = flags.config().unwrap();
        assert_eq!((c.socket.to_str().unwrap(), c.queue, c.bus), ("/tmp/b.sock", 3, Bus::None));
        let bad = Flags::parse_from(["pocketd", "--memory-budget", "lots"]);
        assert!(bad.config().unwrap_err().to_string().contains("memory_budget"));
    }

    #[test]
    fn a_missing_default_file_is_the_defaults_but_a_named_one_is_an_error() {
        let missing = Path::new("/nonexistent/pocketd.toml");
        assert_eq!(Config::load(missing, false).unwrap(), Config::default());
        assert!(Config::load(missing, true).unwrap_err().to_string().contains("/nonexistent/pocketd.toml"));
    }
}
