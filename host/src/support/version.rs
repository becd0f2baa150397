//! What `proxy-operator --version` and `kubectl px --version` print: the crate's version and the
//! git commit the binary was built from (host/build.rs: `git rev-parse HEAD`, or the
//! `PROXY_OPERATOR_REVISION` variable where the build has no repository, as the Dockerfile's;
//! `unknown` when neither is there).

/// The commit, 40 hex digits, or what `PROXY_OPERATOR_REVISION` said, or `unknown`.
pub const REVISION: &str = env!("PROXY_OPERATOR_REVISION");

/// `0.1.0 (commit 0123abc…)`.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("PROXY_OPERATOR_REVISION"),
    ")"
);
