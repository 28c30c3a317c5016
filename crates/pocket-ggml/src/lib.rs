//! ggml
