//! Sampling (placeholder until written).
