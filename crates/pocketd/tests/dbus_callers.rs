//! D-Bus callers that go away, or ask for too much: a `Generate` whose caller dies and a
//! `Start` whose caller closes its connection are cancelled and their memory returns; one
//! caller's jobs are limited; properties change as things happen.

mod common;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Daemon, Setup, used_without_parked};
use futures_util::StreamExt;
use serde_json::Value;

/// Wait until no session runs and the budget is back at `baseline`; how long that took.
fn wait_returned(d: &Daemon, baseline: u64, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let st = d.get("/v1/status");
        if st["sessions"].as_array().unwrap().is_empty() && used_without_parked(&st) == baseline {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "still running or holding memory after {within:?}: {st}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn baseline(d: &Daemon) -> u64 {
    let o = d.busctl_generate(&[], "Hi", &[&["max_tokens", "u", "1"]]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    used_without_parked(&d.idle_status(Duration::from_secs(5)))
}

/// `max_tokens` n, the prompt as plain text (a story's opening goes on; a chat answer may end).
fn options(n: u32) -> HashMap<&'static str, zbus::Variant<'static>> {
    HashMap::from([("max_tokens", zbus::Variant::from(n)), ("chat", zbus::Variant::from(false))])
}

#[zbus::proxy(
    interface = "org.pocketd.Pocketd1",
    default_service = "org.pocketd.Pocketd1",
    default_path = "/org/pocketd/Pocketd1"
)]
trait Pocketd1 {
    fn start(
        &self,
        model: &str,
        prompt: &str,
        options: HashMap<&str, zbus::Variant<'_>>,
    ) -> zbus::Result<zbus::OwnedObjectPath>;
    fn load_model(&self, name: &str) -> zbus::Result<u64>;
    fn unload_model(&self, name: &str) -> zbus::Result<()>;
}

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

#[test]
fn a_generate_whose_caller_dies_is_cancelled_and_its_memory_returns_within_a_second() {
    let d = Daemon::start(Setup { dbus: true, ..Setup::default() });
    let idle = baseline(&d);
    let address = d.bus.as_ref().unwrap().address.clone();
    let mut caller = Command::new("busctl")
        .arg(format!("--address={address}"))
        .args([
            "--timeout=600",
            "call",
            "org.pocketd.Pocketd1",
            "/org/pocketd/Pocketd1",
            "org.pocketd.Pocketd1",
        ])
        .args(["Generate", "ssa{sv}", "", "Once upon a time", "2", "max_tokens", "u", "1000"])
        .args(["chat", "b", "false"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    d.wait_generating();
    caller.kill().unwrap();
    caller.wait().unwrap();
    let took = wait_returned(&d, idle, Duration::from_secs(3));
    eprintln!("Generate's caller killed: cancelled and memory back in {took:?}");
    assert!(d.log().contains("D-Bus caller left"), "{}", d.log());
    let metrics = d.curl("GET", "/metrics", None).1;
    assert!(metrics.contains("pocketd_requests_total{outcome=\"ok\"} 2"), "{metrics}");
}

#[test]
fn a_start_whose_caller_closes_its_connection_is_cancelled_and_one_caller_s_jobs_are_limited() {
    let d =
        Daemon::start(Setup { dbus: true, extra: "dbus_jobs_per_caller = 1\n".into(), ..Setup::default() });
    let idle = baseline(&d);
    let address = d.bus.as_ref().unwrap().address.clone();
    let d = &d;
    block_on(async move {
        let connection = zbus::connection::Builder::address(address.as_str()).build().await.unwrap();
        let p = Pocketd1Proxy::new(&connection).await.unwrap();
        p.start("", "Once upon a time", options(1000)).await.unwrap();
        // One job at a time for this caller: the second is refused, naming the setting.
        let e = p.start("", "Hello", options(4)).await.unwrap_err().to_string();
        assert!(e.contains("org.pocketd.Error.QueueFull") && e.contains("dbus_jobs_per_caller"), "{e}");
        // Another caller is not held back by this one's limit (its job waits for the turn
        // the first job holds).
        let other = zbus::connection::Builder::address(address.as_str()).build().await.unwrap();
        let q = Pocketd1Proxy::new(&other).await.unwrap();
        let queued = tokio::spawn(async move { q.start("", "Hello", options(4)).await });
        d.wait_generating();
        drop(p);
        connection.close().await.unwrap();
        // The first job is cancelled, so the other caller's starts.
        tokio::time::timeout(Duration::from_secs(10), queued).await.unwrap().unwrap().unwrap();
    });
    let took = wait_returned(d, idle, Duration::from_secs(3));
    eprintln!("Start's caller gone: cancelled and memory back in {took:?}");
}

#[test]
fn properties_change_as_models_load_and_unload() {
    let d = Daemon::start(Setup { dbus: true, ..Setup::default() });
    let address = d.bus.as_ref().unwrap().address.clone();
    block_on(async move {
        let connection = zbus::connection::Builder::address(address.as_str()).build().await.unwrap();
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .interface("org.freedesktop.DBus.Properties")
            .member("PropertiesChanged")
            .path("/org/pocketd/Pocketd1")
            .build()
            .unwrap();
        let mut signals = zbus::MessageStream::for_match_rule(rule, &connection, None).await.unwrap();
        let p = Pocketd1Proxy::new(&connection).await.unwrap();
        for (load, expected) in [(true, vec!["smollm2.gguf".to_owned()]), (false, vec![])] {
            let asked = Instant::now();
            if load {
                p.load_model("smollm2").await.unwrap();
            } else {
                p.unload_model("smollm2").await.unwrap();
            }
            loop {
                let m = tokio::time::timeout(Duration::from_secs(5), signals.next())
                    .await
                    .expect("PropertiesChanged")
                    .unwrap()
                    .unwrap();
                let (_iface, changed, _): (String, HashMap<String, zbus::OwnedVariant>, Vec<String>) =
                    m.body().deserialize().unwrap();
                if let Some(v) = changed.get("LoadedModels") {
                    let names: Vec<String> = v.try_clone().unwrap().try_into().unwrap();
                    assert_eq!(names, expected);
                    eprintln!("LoadedModels changed {:?} after the call", asked.elapsed());
                    break;
                }
            }
        }
    });
    let status: Value = d.get("/v1/status");
    assert!(status["loaded"].as_array().unwrap().is_empty(), "{status}");
}
