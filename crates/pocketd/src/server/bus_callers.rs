//! D-Bus callers and their jobs. A caller (a unique bus name, `:1.42`) may have
//! `dbus_jobs_per_caller` `Generate` or `Start` calls running or queued at once; when it
//! leaves the bus — its process ended, or it closed its connection — the bus says so with
//! `NameOwnerChanged`, and its jobs are cancelled so their memory returns at once instead of
//! at the end of a text nobody will read.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use zbus::Connection;

use super::error::ServeError;
use super::job::Canceller;

/// The callers with jobs.
pub struct Callers {
    per_caller: usize,
    table: Mutex<HashMap<String, HashMap<u64, Option<Canceller>>>>,
    next: AtomicU64,
}

/// One job of a caller, from before it is queued to its end; dropping it takes it off.
pub struct Slot {
    callers: Arc<Callers>,
    caller: String,
    id: u64,
}

impl Callers {
    /// No callers yet; each may have `per_caller` jobs.
    pub fn new(per_caller: usize) -> Arc<Callers> {
        Arc::new(Callers { per_caller, table: Mutex::default(), next: AtomicU64::new(0) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<u64, Option<Canceller>>>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a new job of `caller`, unless it has its limit already.
    pub fn enter(self: &Arc<Self>, caller: &str) -> Result<Slot, ServeError> {
        let mut table = self.lock();
        let jobs = table.entry(caller.to_owned()).or_default();
        if jobs.len() >= self.per_caller {
            return Err(ServeError::CallerLimit(format!(
                "{caller} already has {} jobs running or queued (dbus_jobs_per_caller); call again when one \
                 has ended",
                jobs.len()
            )));
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        jobs.insert(id, None);
        Ok(Slot { callers: self.clone(), caller: caller.to_owned(), id })
    }

    /// `caller` left the bus: cancel its jobs. Returns how many there were.
    pub fn left(&self, caller: &str) -> usize {
        let jobs = self.lock().remove(caller).unwrap_or_default();
        for c in jobs.values().flatten() {
            c.cancel();
        }
        jobs.len()
    }

    /// Jobs of `caller` now.
    pub fn jobs(&self, caller: &str) -> usize {
        self.lock().get(caller).map_or(0, HashMap::len)
    }
}

impl Slot {
    /// The job started: cancel it with `c` if its caller leaves (or has left already).
    pub fn attach(&self, c: Canceller) {
        let mut table = self.callers.lock();
        match table.get_mut(&self.caller).and_then(|jobs| jobs.get_mut(&self.id)) {
            Some(entry) => *entry = Some(c),
            // `left` took the caller off while this job was queued.
            None => c.cancel(),
        }
    }

    /// The caller whose job this is.
    pub fn caller(&self) -> &str {
        &self.caller
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut table = self.callers.lock();
        if let Some(jobs) = table.get_mut(&self.caller) {
            jobs.remove(&self.id);
            if jobs.is_empty() {
                table.remove(&self.caller);
            }
        }
    }
}

/// Cancel the jobs of callers as they leave `connection`'s bus, until the connection closes.
pub async fn watch(connection: Connection, callers: Arc<Callers>) {
    let r = async {
        let bus = zbus::fdo::DBusProxy::new(&connection).await?;
        let mut owners = bus.receive_name_owner_changed().await?;
        while let Some(signal) = owners.next().await {
            let Ok(args) = signal.args() else { continue };
            // A unique name never gets a new owner: losing its owner means the caller is gone.
            if args.new_owner().is_none() && args.name().starts_with(':') {
                let n = callers.left(args.name());
                if n > 0 {
                    tracing::info!(caller = %args.name(), jobs = n, "D-Bus caller left: its jobs are cancelled");
                }
            }
        }
        zbus::Result::Ok(())
    }
    .await;
    if let Err(e) = r {
        tracing::warn!("cannot watch D-Bus callers leave (their jobs will run to their end): {e}");
    }
}

/// Whether `caller` is still on the bus (for a caller that left before its job was attached,
/// whose `NameOwnerChanged` may have come first).
pub async fn still_there(connection: &Connection, caller: &str) -> bool {
    let Ok(name) = zbus::names::BusName::try_from(caller) else { return true };
    match zbus::fdo::DBusProxy::new(connection).await {
        Ok(bus) => bus.name_has_owner(name).await.unwrap_or(true),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_s_jobs_are_limited_and_cancelled_when_it_leaves() {
        let callers = Callers::new(2);
        let a = callers.enter(":1.7").unwrap();
        let b = callers.enter(":1.7").unwrap();
        let e = callers.enter(":1.7").err().unwrap();
        assert!(e.to_string().contains("dbus_jobs_per_caller"), "{e}");
        assert!(callers.enter(":1.8").is_ok(), "another caller is not limited by this one");
        let (flag_a, flag_b) = (Canceller::new(), Canceller::new());
        a.attach(flag_a.clone());
        assert_eq!(callers.left(":1.7"), 2);
        assert!(flag_a.is_cancelled());
        // A job attached after its caller left is cancelled at once.
        b.attach(flag_b.clone());
        assert!(flag_b.is_cancelled());
        drop((a, b));
        assert_eq!(callers.jobs(":1.7"), 0);
        let c = callers.enter(":1.9").unwrap();
        drop(c);
        assert_eq!(callers.jobs(":1.9"), 0);
    }
}
