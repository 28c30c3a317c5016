//! The plain generation loop (placeholder until written).
