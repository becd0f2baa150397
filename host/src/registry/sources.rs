//! Where a provider instance's component comes from: a URL pinned by sha256 (downloaded once,
//! kept by digest), the plugins ConfigMap, or the built-in plugins directory, in that order;
//! and the decoding of the ConfigMap's keys.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;

use crate::config::{PluginSource, ProviderEntry, is_plugin_name};
use crate::digest::sha256_hex;

/// Largest component accepted from any source (decompressed).
pub const MAX_PLUGIN_BYTES: u64 = 256 << 20;

/// Where plugins come from.
#[derive(Clone, Debug)]
pub struct RegistryOptions {
    /// Built-in plugins, `<type>.wasm`.
    pub plugins_dir: PathBuf,
    /// The watched plugins ConfigMap (namespace, name), binaryData `<type>.wasm[.gz]`.
    pub configmap: Option<(String, String)>,
    /// Where URL plugins are kept after download (by digest); none: kept in memory only.
    pub download_dir: Option<PathBuf>,
}

/// The sources of components: the options and the client that downloads URL plugins.
pub(super) struct Sources {
    pub options: RegistryOptions,
    pub http: reqwest::Client,
}

/// Where an entry's component comes from, and its bytes.
pub(super) struct Resolved {
    pub source: String,
    pub bytes: Arc<Vec<u8>>,
    pub from_configmap: bool,
}

pub(super) enum Unresolved {
    /// In no source.
    Missing(String),
    /// Found but refused (digest mismatch, download failed); bool: from the ConfigMap.
    Refused(String, bool),
}

impl Sources {
    pub(super) async fn resolve(
        &self,
        configmap: &PluginFiles,
        entry: &ProviderEntry,
    ) -> Result<Resolved, Unresolved> {
        let (pin, download) = match entry.plugin_source() {
            PluginSource::ByType => (None, None),
            PluginSource::Pinned { sha256 } => (Some(sha256), None),
            PluginSource::Download { url, sha256 } => (Some(sha256.clone()), Some((url, sha256))),
        };
        let resolved = if let Some((url, sha)) = download {
            let bytes = self
                .download(&url, &sha)
                .await
                .map_err(|e| Unresolved::Refused(e, false))?;
            Resolved {
                source: url,
                bytes: Arc::new(bytes),
                from_configmap: false,
            }
        } else if let Some(bytes) = configmap.get(&entry.provider_type) {
            let (namespace, name) = self.options.configmap.clone().unwrap_or_default();
            Resolved {
                source: format!(
                    "configmap {namespace}/{name} key {}.wasm",
                    entry.provider_type
                ),
                bytes: Arc::new(bytes.clone()),
                from_configmap: true,
            }
        } else {
            let path = self
                .options
                .plugins_dir
                .join(format!("{}.wasm", entry.provider_type));
            match tokio::fs::read(&path).await {
                Ok(bytes) => Resolved {
                    source: path.display().to_string(),
                    bytes: Arc::new(bytes),
                    from_configmap: false,
                },
                Err(_) => {
                    let mut places = vec![format!(
                        "the plugins directory {}",
                        self.options.plugins_dir.display()
                    )];
                    if let Some((namespace, name)) = &self.options.configmap {
                        places.insert(0, format!("the plugins ConfigMap {namespace}/{name}"));
                    }
                    return Err(Unresolved::Missing(format!(
                        "no plugin `{}` in {} (available: {}); add `{}.wasm` or fix the type",
                        entry.provider_type,
                        places.join(" or "),
                        available(&self.options.plugins_dir),
                        entry.provider_type
                    )));
                }
            }
        };
        if let Some(pin) = pin {
            let found = sha256_hex(&resolved.bytes);
            if found != pin {
                return Err(Unresolved::Refused(
                    format!(
                        "{} has sha256 {found}, but plugin.sha256 pins {pin}; refusing to load it",
                        resolved.source
                    ),
                    resolved.from_configmap,
                ));
            }
        }
        Ok(resolved)
    }

    /// A URL plugin: from the download directory if it is there with the right digest, else
    /// downloaded once, verified, and kept.
    async fn download(&self, url: &str, sha: &str) -> Result<Vec<u8>, String> {
        let cached = self
            .options
            .download_dir
            .as_ref()
            .map(|d| d.join(format!("{sha}.wasm")));
        if let Some(path) = &cached
            && let Ok(bytes) = tokio::fs::read(path).await
            && sha256_hex(&bytes) == sha
        {
            return Ok(bytes);
        }
        let started = std::time::Instant::now();
        tracing::info!(%url, "downloading plugin");
        let mut response = self
            .http
            .get(url)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| format!("downloading {url}: {e}"))?;
        let mut bytes = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| format!("downloading {url}: {e}"))?
        {
            bytes.extend_from_slice(&chunk);
            if bytes.len() as u64 > MAX_PLUGIN_BYTES {
                return Err(format!(
                    "downloading {url}: larger than {} MiB",
                    MAX_PLUGIN_BYTES >> 20
                ));
            }
        }
        let found = sha256_hex(&bytes);
        if found != sha {
            return Err(format!(
                "{url} has sha256 {found}, but plugin.sha256 pins {sha}; refusing to load it"
            ));
        }
        tracing::info!(%url, bytes = bytes.len(), elapsed_ms = started.elapsed().as_millis() as u64, "downloaded plugin");
        if let Some(path) = cached {
            // Written whole then renamed: a crash never leaves a partial file under the digest.
            let write = || -> std::io::Result<()> {
                std::fs::create_dir_all(path.parent().expect("a file in a directory"))?;
                let tmp = path.with_extension("part");
                std::fs::write(&tmp, &bytes)?;
                std::fs::rename(&tmp, &path)
            };
            if let Err(e) = write() {
                tracing::warn!(path = %path.display(), error = %e, "cannot keep the downloaded plugin");
            }
        }
        Ok(bytes)
    }
}

/// Plugin components by type.
pub type PluginFiles = BTreeMap<String, Vec<u8>>;

/// `<type>.wasm` and `<type>.wasm.gz` keys of `binaryData` (gzip decoded); what was skipped
/// (key, why).
pub fn decode_configmap(map: &ConfigMap) -> (PluginFiles, Vec<(String, String)>) {
    let mut content = BTreeMap::new();
    let mut skipped = Vec::new();
    for (key, value) in map.binary_data.iter().flatten() {
        let (plugin_type, gzipped) = if let Some(t) = key.strip_suffix(".wasm.gz") {
            (t, true)
        } else if let Some(t) = key.strip_suffix(".wasm") {
            (t, false)
        } else {
            skipped.push((key.clone(), "not `<type>.wasm` or `<type>.wasm.gz`".into()));
            continue;
        };
        if !is_plugin_name(plugin_type) {
            skipped.push((
                key.clone(),
                "the type must be lowercase letters, digits and `-`".into(),
            ));
            continue;
        }
        let bytes = if gzipped {
            let mut out = Vec::new();
            let decoder = flate2::read::GzDecoder::new(value.0.as_slice());
            match decoder.take(MAX_PLUGIN_BYTES + 1).read_to_end(&mut out) {
                Ok(_) if out.len() as u64 <= MAX_PLUGIN_BYTES => out,
                Ok(_) => {
                    skipped.push((key.clone(), "larger than 256 MiB decompressed".into()));
                    continue;
                }
                Err(e) => {
                    // Keep the (broken) bytes: loading them fails and is reported like any bad plugin.
                    tracing::warn!(%key, error = %e, "not valid gzip");
                    value.0.clone()
                }
            }
        } else {
            value.0.clone()
        };
        content.insert(plugin_type.to_string(), bytes);
    }
    for key in map.data.iter().flatten().map(|(k, _)| k) {
        if key.ends_with(".wasm") || key.ends_with(".wasm.gz") {
            skipped.push((
                key.clone(),
                "plugins go in binaryData (kubectl create configmap --from-file does that)".into(),
            ));
        }
    }
    (content, skipped)
}

fn available(dir: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| {
                    e.path()
                        .file_name()
                        .and_then(|n| n.to_str())
                        .and_then(|n| n.strip_suffix(".wasm"))
                        .map(String::from)
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use k8s_openapi::ByteString;

    use super::*;

    fn configmap(binary: &[(&str, Vec<u8>)], data: &[&str]) -> ConfigMap {
        ConfigMap {
            binary_data: Some(
                binary
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.clone())))
                    .collect(),
            ),
            data: Some(data.iter().map(|k| (k.to_string(), "x".into())).collect()),
            ..Default::default()
        }
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn plugins_are_the_wasm_and_gzipped_wasm_keys_of_binary_data() {
        let map = configmap(
            &[
                ("kvm.wasm", b"\0asm-kvm".to_vec()),
                ("gcp.wasm.gz", gzip(b"\0asm-gcp")),
                ("readme.txt", b"hi".to_vec()),
                ("Bad_Type.wasm", b"\0asm".to_vec()),
            ],
            &["text.wasm"],
        );
        let (content, skipped) = decode_configmap(&map);
        assert_eq!(content.keys().collect::<Vec<_>>(), ["gcp", "kvm"]);
        assert_eq!(content["gcp"], b"\0asm-gcp");
        let skipped: BTreeMap<_, _> = skipped.into_iter().collect();
        assert!(skipped["readme.txt"].contains("not `<type>.wasm`"));
        assert!(skipped["Bad_Type.wasm"].contains("lowercase"));
        assert!(skipped["text.wasm"].contains("binaryData"));
    }

    #[test]
    fn broken_gzip_is_kept_to_fail_loading_like_any_bad_plugin() {
        let map = configmap(&[("kvm.wasm.gz", b"not gzip".to_vec())], &[]);
        let (content, skipped) = decode_configmap(&map);
        assert_eq!(content["kvm"], b"not gzip");
        assert!(skipped.is_empty());
    }

    #[test]
    fn the_plugins_directory_lists_what_it_has() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(available(dir.path()), "none");
        std::fs::write(dir.path().join("kvm.wasm"), b"").unwrap();
        std::fs::write(dir.path().join("gcp.wasm"), b"").unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"").unwrap();
        assert_eq!(available(dir.path()), "gcp, kvm");
        assert_eq!(available(&dir.path().join("missing")), "none");
    }
}
