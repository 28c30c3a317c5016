//! pocketd: the daemon and the `pocket` command-line client.
//!
//! The binaries are thin: `pocket`'s subcommands live in [`cli`], one module each; the daemon
//! (transports, scheduler, configuration) in [`server`]. Neither runs models itself: every
//! request goes through the one pipeline of `pocket_runtime`, and `pocket bench` is
//! `pocket_bench`.
#![deny(missing_docs)]

pub mod cli;
pub mod server;
