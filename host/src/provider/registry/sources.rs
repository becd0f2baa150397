//! Where a provider instance's component comes from: a URL pinned by sha256 (downloaded once,
//! kept by digest), the plugins ConfigMap, or the built-in plugins directory, in that order;
//! and the decoding of the ConfigMap's keys.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;

use crate::provider::config::{PluginSource, ProviderEntry, is_plugin_name};
use crate::support::digest::sha256_hex;

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
    /// A ConfigMap upload that would have replaced the built-in plugin without the providers
    /// config pinning it: refused (reported like a bad upload), and the built-in serves.
    pub refused_upload: Option<String>,
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
                refused_upload: None,
            }
        } else if let Some(packed) = configmap.get(&entry.provider_type) {
            let (namespace, name) = self.options.configmap.clone().unwrap_or_default();
            let source = format!(
                "configmap {namespace}/{name} key {}.wasm",
                entry.provider_type
            );
            let bytes = packed
                .unpack(MAX_PLUGIN_BYTES)
                .await
                .map_err(|e| Unresolved::Refused(format!("{source}: {e}"), true))?;
            let uploaded = Resolved {
                source,
                bytes: Arc::new(bytes),
                from_configmap: true,
                refused_upload: None,
            };
            self.unless_it_replaces_a_built_in(entry, pin.as_deref(), uploaded)
                .await
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
                    refused_upload: None,
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

    /// `uploaded` (a ConfigMap plugin), unless it would replace a built-in plugin of its type
    /// that the providers config did not pin it over: a plugin in the ConfigMap (which anybody
    /// who may write that ConfigMap controls) replaces the operator's own only when the platform
    /// engineer pinned the replacement's sha256 (`plugin.sha256`). Otherwise the built-in serves
    /// (or the built-in the pin names), and the refusal names both digests. A type with no
    /// built-in is the ConfigMap's to bring (the pin, if any, is checked by the caller).
    async fn unless_it_replaces_a_built_in(
        &self,
        entry: &ProviderEntry,
        pin: Option<&str>,
        uploaded: Resolved,
    ) -> Resolved {
        let found = sha256_hex(&uploaded.bytes);
        if pin == Some(found.as_str()) {
            return uploaded;
        }
        let path = self
            .options
            .plugins_dir
            .join(format!("{}.wasm", entry.provider_type));
        let Ok(built_in) = tokio::fs::read(&path).await else {
            return uploaded;
        };
        let built_in_sha = sha256_hex(&built_in);
        if pin.is_some_and(|pin| pin != built_in_sha) {
            // Pinned to neither: the caller refuses the upload against the pin.
            return uploaded;
        }
        let refusal = format!(
            "{} (sha256 {found}) would replace the built-in plugin `{}` (sha256 {built_in_sha}), \
             but the providers config does not pin it: the built-in keeps serving; to use the \
             upload, set `plugin: {{sha256: {found}}}` on provider instance {}",
            uploaded.source, entry.provider_type, entry.name
        );
        Resolved {
            source: path.display().to_string(),
            bytes: Arc::new(built_in),
            from_configmap: false,
            refused_upload: Some(refusal),
        }
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

/// Plugin components by type, as the ConfigMap holds them.
pub type PluginFiles = BTreeMap<String, PackedPlugin>;

/// A component as the plugins ConfigMap holds it: a gzipped one is inflated only when a provider
/// instance names its type, off the async runtime and with a size bound, so a gzip bomb under a
/// key nobody uses costs nothing and one that is used is refused early.
#[derive(Clone, PartialEq, Eq)]
pub struct PackedPlugin {
    bytes: Vec<u8>,
    gzipped: bool,
}

impl std::fmt::Debug for PackedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PackedPlugin({} bytes{})",
            self.bytes.len(),
            if self.gzipped { ", gzip" } else { "" }
        )
    }
}

impl PackedPlugin {
    /// A `<type>.wasm` key.
    pub fn plain(bytes: Vec<u8>) -> Self {
        PackedPlugin {
            bytes,
            gzipped: false,
        }
    }

    /// A `<type>.wasm.gz` key.
    pub fn gzipped(bytes: Vec<u8>) -> Self {
        PackedPlugin {
            bytes,
            gzipped: true,
        }
    }

    /// The component's bytes: inflated (on a blocking thread) to at most `limit` bytes.
    pub async fn unpack(&self, limit: u64) -> Result<Vec<u8>, String> {
        if !self.gzipped {
            return Ok(self.bytes.clone());
        }
        let bytes = self.bytes.clone();
        tokio::task::spawn_blocking(move || inflate(&bytes, limit))
            .await
            .map_err(|e| format!("inflating: {e}"))?
    }
}

/// Gzip-decoded `bytes`, refused past `limit` bytes without reading further.
fn inflate(bytes: &[u8], limit: u64) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .take(limit + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("not valid gzip: {e}"))?;
    if out.len() as u64 > limit {
        return Err(format!(
            "larger than {} MiB decompressed; refused",
            limit >> 20
        ));
    }
    Ok(out)
}

/// `<type>.wasm` and `<type>.wasm.gz` keys of `binaryData` (still packed); what was skipped
/// (key, why).
pub fn decode_configmap(map: &ConfigMap) -> (PluginFiles, Vec<(String, String)>) {
    let mut content = BTreeMap::new();
    let mut skipped = Vec::new();
    for (key, value) in map.binary_data.iter().flatten() {
        let (plugin_type, packed) = if let Some(t) = key.strip_suffix(".wasm.gz") {
            (t, PackedPlugin::gzipped(value.0.clone()))
        } else if let Some(t) = key.strip_suffix(".wasm") {
            (t, PackedPlugin::plain(value.0.clone()))
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
        content.insert(plugin_type.to_string(), packed);
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
        assert_eq!(content["gcp"], PackedPlugin::gzipped(gzip(b"\0asm-gcp")));
        assert_eq!(content["kvm"], PackedPlugin::plain(b"\0asm-kvm".to_vec()));
        let skipped: BTreeMap<_, _> = skipped.into_iter().collect();
        assert!(skipped["readme.txt"].contains("not `<type>.wasm`"));
        assert!(skipped["Bad_Type.wasm"].contains("lowercase"));
        assert!(skipped["text.wasm"].contains("binaryData"));
    }

    #[tokio::test]
    async fn gzip_is_inflated_only_when_unpacked_and_only_up_to_the_limit() {
        let packed = PackedPlugin::gzipped(gzip(b"\0asm-gcp"));
        assert_eq!(packed.unpack(1 << 20).await.unwrap(), b"\0asm-gcp");
        // A bomb: 4 MiB of zeros in a few KiB; with a 1 MiB limit it stops after 1 MiB + 1.
        let bomb = PackedPlugin::gzipped(gzip(&vec![0; 4 << 20]));
        assert!(bomb.bytes.len() < 64 << 10);
        let refused = bomb.unpack(1 << 20).await.unwrap_err();
        assert!(
            refused.contains("larger than 1 MiB decompressed"),
            "{refused}"
        );
        let broken = PackedPlugin::gzipped(b"not gzip".to_vec());
        assert!(
            broken
                .unpack(1 << 20)
                .await
                .unwrap_err()
                .contains("not valid gzip")
        );
        assert_eq!(
            PackedPlugin::plain(b"x".to_vec()).unpack(0).await.unwrap(),
            b"x"
        );
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
