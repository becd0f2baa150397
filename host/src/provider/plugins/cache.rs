//! The on-disk cache of compiled components, keyed by the component's sha256 and the engine's
//! compatibility hash. The operator deserializes only files it wrote: the directory must be
//! private to its user, and each file's digest, recorded when it was written, is checked first.

use std::hash::{Hash, Hasher};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::support::digest::sha256_hex;
use wasmtime::Engine;
use wasmtime::component::Component;

pub(crate) struct CompileCache {
    dir: PathBuf,
    compat: String,
}

impl CompileCache {
    pub(crate) fn open(dir: &Path, engine: &Engine) -> Result<Self, String> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let meta = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        if meta.uid() != uid || meta.permissions().mode() & 0o022 != 0 {
            return Err(format!(
                "{} must be owned by uid {uid} and writable by nobody else (mode {:o})",
                dir.display(),
                meta.permissions().mode() & 0o777
            ));
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let compat = format!("{:016x}", hasher.finish());
        Ok(CompileCache {
            dir: dir.to_path_buf(),
            compat,
        })
    }

    fn paths(&self, sha256: &str) -> (PathBuf, PathBuf) {
        let base = format!("{sha256}-{}", self.compat);
        (
            self.dir.join(format!("{base}.cwasm")),
            self.dir.join(format!("{base}.cwasm.sha256")),
        )
    }

    /// A cached compilation, if one is there and intact.
    pub(crate) fn load(&self, engine: &Engine, sha256: &str) -> Option<Component> {
        let (data, digest) = self.paths(sha256);
        let expected = std::fs::read_to_string(&digest).ok()?;
        let bytes = std::fs::read(&data).ok()?;
        if sha256_hex(&bytes) != expected.trim() {
            tracing::warn!(file = %data.display(), "cached compilation is corrupt; recompiling");
            return None;
        }
        // SAFETY: the bytes were written by `store` below for this engine configuration (the
        // compatibility hash is in the name) and are unchanged since (the digest matched).
        match unsafe { Component::deserialize(engine, &bytes) } {
            Ok(component) => Some(component),
            Err(e) => {
                tracing::warn!(file = %data.display(), error = %e, "cached compilation unusable");
                None
            }
        }
    }

    /// Stores a compilation; failures only cost a recompile next time.
    pub(crate) fn store(&self, sha256: &str, component: &Component) {
        let (data, digest) = self.paths(sha256);
        let result = (|| -> Result<(), String> {
            let bytes = component.serialize().map_err(|e| e.to_string())?;
            let tmp = data.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, &bytes).map_err(|e| e.to_string())?;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| e.to_string())?;
            std::fs::write(&digest, sha256_hex(&bytes)).map_err(|e| e.to_string())?;
            std::fs::rename(&tmp, &data).map_err(|e| e.to_string())
        })();
        if let Err(e) = result {
            tracing::warn!(file = %data.display(), error = %e, "cannot cache the compiled component");
        }
    }
}
