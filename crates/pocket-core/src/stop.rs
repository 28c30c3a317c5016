//! Stop conditions and text streaming (placeholder until written).
