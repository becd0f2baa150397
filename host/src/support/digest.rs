//! Content digests, as the operator writes them everywhere (pins, caches, logs).

use sha2::{Digest, Sha256};

/// The sha256 of `bytes` as 64 lowercase hex digits (what `sha256sum` prints).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The first 12 hex digits of a digest, for log lines and events.
pub fn short(sha: &str) -> &str {
    &sha[..12.min(sha.len())]
}
