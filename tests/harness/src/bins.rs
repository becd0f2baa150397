//! Where the fixture binaries are. A missing binary is a panic that names the
//! command installing it: fixtures are never skipped.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// `tests/fixtures/k8s/go.sum`, compiled in so that the cache key always matches
/// the module this harness was built with (the same key `build.sh` computes).
const K8S_GO_SUM: &[u8] = include_bytes!("../../fixtures/k8s/go.sum");

/// `tests/fixtures/helm/go.sum`: the helm fixture's cache key, as `build.sh` there computes it.
const HELM_GO_SUM: &[u8] = include_bytes!("../../fixtures/helm/go.sum");

/// Overrides the directory holding `kube-apiserver`, `kubectl` and `etcd`.
pub const K8S_BIN_ENV: &str = "PROXY_OPERATOR_K8S_BIN";
/// Overrides the fixture cache root (`$HOME/.cache/proxy-operator/fixtures`).
pub const FIXTURES_ENV: &str = "PROXY_OPERATOR_FIXTURES";

/// The cache key of the Go fixture module: first 16 hex digits of sha256(go.sum).
pub fn k8s_fixture_key() -> String {
    hex::encode(Sha256::digest(K8S_GO_SUM))[..16].to_owned()
}

/// The fixture cache root: `$PROXY_OPERATOR_FIXTURES` or `$HOME/.cache/proxy-operator/fixtures`.
pub fn fixtures_cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os(FIXTURES_ENV) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    Path::new(&home).join(".cache/proxy-operator/fixtures")
}

/// The directory with `kube-apiserver`, `kubectl` and `etcd`: `$PROXY_OPERATOR_K8S_BIN`,
/// or `<cache root>/k8s-<key>/bin` as built by `tests/fixtures/k8s/build.sh`.
pub fn k8s_bin_dir() -> PathBuf {
    match std::env::var_os(K8S_BIN_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => fixtures_cache_root()
            .join(format!("k8s-{}", k8s_fixture_key()))
            .join("bin"),
    }
}

/// Path of a binary from the Go fixture module (`kube-apiserver`, `kubectl`, `etcd`).
///
/// # Panics
/// If it is missing, naming the command that builds it.
pub fn k8s_binary(name: &str) -> PathBuf {
    let path = k8s_bin_dir().join(name);
    if !is_executable(&path) {
        let how = if std::env::var_os(K8S_BIN_ENV).is_some() {
            format!("${K8S_BIN_ENV} points at a directory without it")
        } else {
            "build it (~10 min cold on 2 cores, cached afterwards) with `tests/fixtures/k8s/build.sh` \
             or `.ci/install-fixtures.sh`"
                .to_owned()
        };
        panic!(
            "test fixture `{name}` not found at {}: {how}",
            path.display()
        );
    }
    path
}

/// The cache key of the helm fixture module: first 16 hex digits of sha256(go.sum).
pub fn helm_fixture_key() -> String {
    hex::encode(Sha256::digest(HELM_GO_SUM))[..16].to_owned()
}

/// The helm CLI built by `tests/fixtures/helm/build.sh` (`<cache root>/helm-<key>/bin/helm`).
///
/// # Panics
/// If it is missing, naming the command that builds it.
pub fn helm_binary() -> PathBuf {
    let path = fixtures_cache_root()
        .join(format!("helm-{}", helm_fixture_key()))
        .join("bin/helm");
    if !is_executable(&path) {
        panic!(
            "test fixture `helm` not found at {}: build it (~3 min cold on 2 cores, cached \
             afterwards) with `tests/fixtures/helm/build.sh` or `.ci/install-fixtures.sh`",
            path.display()
        );
    }
    path
}

/// Path of a binary that comes from a Debian package.
///
/// # Panics
/// If it is missing, naming the package and `.ci/install-fixtures.sh`.
pub fn debian_binary(path: &str, package: &str) -> PathBuf {
    let p = PathBuf::from(path);
    if !is_executable(&p) {
        panic!(
            "test fixture {path} not found: install the Debian package `{package}` \
             (`.ci/install-fixtures.sh` installs every fixture)"
        );
    }
    p
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_16_hex_digits() {
        let key = k8s_fixture_key();
        assert_eq!(key.len(), 16);
        assert!(key.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(
            helm_fixture_key(),
            key,
            "each Go fixture module has its own cache"
        );
    }
}
