//! The shapes pocketd speaks: OpenAI's chat and text completion requests, responses, stream
//! chunks, model list and error object, as the OpenAI client libraries expect them,
//! OpenAI's Responses API ([`responses`]), Anthropic's Messages API ([`anthropic`]), OpenAI's embeddings, llama.cpp's tokenize endpoints, plus
//! pocketd's own extensions (speculation and memory per request) and native status.
//!
//! Only the wire format lives here, so that the daemon, the `pocket` client and other Rust
//! programs agree on it without depending on the engines.

#![deny(missing_docs)]

pub mod anthropic;
#[cfg(feature = "client")]
pub mod client;
mod embeddings;
mod openai;
pub mod responses;
mod status;
mod tokenize;

pub use embeddings::*;
pub use openai::*;
pub use status::*;
pub use tokenize::*;
