//! The daemon, `pocketd`: its configuration so far (the scheduler, HTTP on the Unix socket and
//! D-Bus come next; see issue 5).

pub mod config;

pub use config::{Bus, Config, DEFAULT_CONFIG_PATH};
