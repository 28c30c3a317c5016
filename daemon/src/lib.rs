//! pocketd
