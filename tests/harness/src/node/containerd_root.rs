//! The node's containerd starts from a prepared root with the node images already imported
//! and unpacked (`tests/fixtures/node-images/containerd-root.sh`, cached by the hash of its
//! inputs), linked into each cluster's scratch: ~0.15 s instead of three `ctr images import`
//! runs (4–8 s of CPU beside the API server's start, and a seen "content digest … not found"
//! under load).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use crate::bins::fixtures_cache_root;

const SCRIPT: &[u8] = include_bytes!("../../../fixtures/node-images/containerd-root.sh");

/// The script's path in the repository (the harness runs it when the cache lacks its root).
fn script_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/node-images/containerd-root.sh")
}

/// The prepared root's cache directory: keyed by the script, the images' key and containerd's
/// version (a newer containerd might read an older root differently).
fn cache_dir(images_key: &str) -> Result<PathBuf> {
    let version = Command::new("containerd")
        .arg("--version")
        .output()
        .context("run `containerd --version`")?;
    let mut hash = Sha256::new();
    hash.update(SCRIPT);
    hash.update(images_key.as_bytes());
    hash.update(&version.stdout);
    let key = &hex::encode(hash.finalize())[..16];
    Ok(fixtures_cache_root().join(format!("node-containerd-{key}")))
}

/// Puts a private copy of the prepared root at `dest` (containerd's `root`), preparing it
/// first if the cache does not have it yet.
pub(super) fn install(images_dir: &Path, images_key: &str, dest: &Path) -> Result<()> {
    let cached = cache_dir(images_key)?;
    if !cached.join("READY").is_file() {
        let out = Command::new(script_path())
            .arg(images_dir)
            .arg(images_key)
            .arg(&cached)
            .output()
            .context("run tests/fixtures/node-images/containerd-root.sh")?;
        if !out.status.success() {
            bail!(
                "preparing the node's containerd root failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    link_copy(&cached.join("root"), dest)
}

/// `cp -a` with hard links for every file but the bolt databases, which containerd writes in
/// place; a plain copy where the cache is on another file system than the scratch.
fn link_copy(from: &Path, to: &Path) -> Result<()> {
    let cp = |args: &[&str]| -> Result<bool> {
        let status = Command::new("cp")
            .args(args)
            .arg(from)
            .arg(to)
            .status()
            .context("run cp")?;
        Ok(status.success())
    };
    if !cp(&["-a", "-l"])? {
        let _ = std::fs::remove_dir_all(to);
        if !cp(&["-a"])? {
            bail!("copy {} to {}", from.display(), to.display());
        }
        return Ok(());
    }
    for db in bolt_databases(from)? {
        let relative = db.strip_prefix(from)?;
        let target = to.join(relative);
        std::fs::remove_file(&target).with_context(|| format!("unlink {}", target.display()))?;
        std::fs::copy(&db, &target).with_context(|| format!("copy {}", db.display()))?;
    }
    Ok(())
}

/// `*.db` files two levels down (`io.containerd.metadata.v1.bolt/meta.db`,
/// `io.containerd.snapshotter.v1.overlayfs/metadata.db`): where containerd's plugins keep them.
fn bolt_databases(root: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for plugin in std::fs::read_dir(root).with_context(|| format!("read {}", root.display()))? {
        let plugin = plugin?.path();
        if !plugin.is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(&plugin)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "db") && path.is_file() {
                found.push(path);
            }
        }
    }
    Ok(found)
}
