//! pocketd: the daemon and the `pocket` command-line client.
//!
//! The binaries are thin: `pocket`'s subcommands live in [`cli`], one module each.
#![deny(missing_docs)]

pub mod bench;
pub mod cli;
pub mod mem;
pub mod seq2seq;
pub mod server;
pub mod spec;
