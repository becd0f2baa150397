//! Loading a provider component: sha256, compile off the async runtime (or take the cached
//! compilation), find the WIT version it was built for, pick the bindings that serve that version,
//! type-check it against them, and ask it to `describe` itself.

use std::sync::Arc;

use wasmtime::component::{Component, types::ComponentItem};

use super::bindings::{
    self, PROVIDER_INTERFACE, PluginPre, SUPPORTED_WIT_VERSIONS, WitVersion, supported_wit_versions,
};
use super::call::{Call, Output};
use super::engine::PluginEngine;
use super::error::LoadError;
use super::types::PluginInfo;
use crate::provider::capabilities::CallContext;
use crate::support::digest::sha256_hex;

/// A plugin ready to serve calls: a compiled, type-checked component.
pub struct LoadedPlugin {
    /// What `describe` returned.
    pub info: PluginInfo,
    /// The WIT version it was built for (from its `provider` export).
    pub wit_version: String,
    /// The WIT version of the host bindings serving it: `wit_version` itself, or an earlier
    /// version of the same `major.minor` (see [`SUPPORTED_WIT_VERSIONS`]).
    pub bindings_version: &'static str,
    pub sha256: String,
    pub size: usize,
    /// Where it came from (a file name, a ConfigMap key), for messages.
    pub source_name: String,
    /// Whether the compiled code came from the on-disk cache.
    pub from_cache: bool,
    pub(crate) pre: PluginPre,
}

impl LoadedPlugin {
    /// Whether its WIT carries proxy credentials (0.2.0 on): a 0.1.0 plugin's squid cannot be
    /// told to require them, so its proxies have none.
    pub fn supports_credentials(&self) -> bool {
        self.pre.supports_credentials()
    }
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("name", &self.info.name)
            .field("wit_version", &self.wit_version)
            .field("bindings_version", &self.bindings_version)
            .field("sha256", &self.sha256)
            .finish()
    }
}

/// What a file is, as `plugin inspect` shows it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentSummary {
    pub kind: &'static str,
    pub size: usize,
    pub sha256: String,
    pub wit_version: Option<String>,
    pub exports: Vec<String>,
    pub imports: Vec<String>,
}

enum WasmKind {
    Component,
    CoreModule,
    NotWasm,
}

fn wasm_kind(bytes: &[u8]) -> WasmKind {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return WasmKind::NotWasm;
    }
    // Bytes 4..8 are version (u16) + layer (u16): layer 1 is a component, 0 a core module.
    match (bytes[6], bytes[7]) {
        (0, 0) => WasmKind::CoreModule,
        _ => WasmKind::Component,
    }
}

fn names(component: &Component, engine: &wasmtime::Engine) -> (Vec<String>, Vec<String>) {
    let ty = component.component_type();
    let exports = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    let imports = ty.imports(engine).map(|(n, _)| n.to_string()).collect();
    (exports, imports)
}

fn provider_version(component: &Component, engine: &wasmtime::Engine) -> Option<String> {
    component
        .component_type()
        .exports(engine)
        .find_map(|(name, item)| match item.ty {
            ComponentItem::ComponentInstance(_) => {
                name.strip_prefix(PROVIDER_INTERFACE).map(String::from)
            }
            _ => None,
        })
}

/// Describes a file without requiring it to be a valid provider.
pub fn inspect_component(
    engine: &PluginEngine,
    bytes: &[u8],
) -> Result<ComponentSummary, LoadError> {
    let sha256 = sha256_hex(bytes);
    let kind = match wasm_kind(bytes) {
        WasmKind::NotWasm => "not wasm",
        WasmKind::CoreModule => "core module",
        WasmKind::Component => "component",
    };
    let mut summary = ComponentSummary {
        kind,
        size: bytes.len(),
        sha256,
        wit_version: None,
        exports: Vec::new(),
        imports: Vec::new(),
    };
    if let WasmKind::Component = wasm_kind(bytes) {
        let component =
            Component::new(&engine.engine, bytes).map_err(|source| LoadError::Compile {
                source_name: "input".into(),
                source,
            })?;
        let (exports, imports) = names(&component, &engine.engine);
        summary.wit_version = provider_version(&component, &engine.engine);
        summary.exports = exports;
        summary.imports = imports;
    }
    Ok(summary)
}

impl PluginEngine {
    /// Loads a provider component: compile (or take the cached compilation), pick the bindings
    /// of its WIT version, type-check it against them, and ask it to `describe` itself.
    pub async fn load(
        self: &Arc<Self>,
        source_name: &str,
        bytes: Vec<u8>,
    ) -> Result<Arc<LoadedPlugin>, LoadError> {
        let source_name = source_name.to_string();
        match wasm_kind(&bytes) {
            WasmKind::NotWasm => return Err(LoadError::NotWasm { source_name }),
            WasmKind::CoreModule => return Err(LoadError::CoreModule { source_name }),
            WasmKind::Component => {}
        }
        let sha256 = sha256_hex(&bytes);
        let size = bytes.len();
        let (component, from_cache) = self.compile(&source_name, &sha256, bytes).await?;
        let (version, bindings_version) = self.bindings_version(&source_name, &component)?;
        // Checked against earlier bindings of the same major.minor: say so in a mismatch.
        let through = if bindings_version.as_str() == version {
            String::new()
        } else {
            format!(
                " (checked with the host's {} bindings)",
                bindings_version.as_str()
            )
        };
        let pre =
            bindings::for_component(&self.linker, &component, bindings_version).map_err(|e| {
                LoadError::Incompatible {
                    source_name: source_name.clone(),
                    version: version.clone(),
                    reason: format!("{e:#}{through}"),
                }
            })?;
        let mut plugin = LoadedPlugin {
            info: PluginInfo::default(),
            wit_version: version,
            bindings_version: bindings_version.as_str(),
            sha256,
            size,
            source_name: source_name.clone(),
            from_cache,
            pre,
        };
        let context = Arc::new(CallContext::nothing_granted(&source_name));
        match self.invoke(&plugin, context, "", Call::Describe).await {
            Ok(Output::Info(info)) => plugin.info = info,
            Ok(_) => unreachable!("describe returns plugin info"),
            Err(e) => {
                return Err(LoadError::Describe {
                    source_name,
                    source: Box::new(e),
                });
            }
        }
        Ok(Arc::new(plugin))
    }

    /// The compiled component, from the cache or compiled now on a blocking thread (and cached).
    async fn compile(
        self: &Arc<Self>,
        source_name: &str,
        sha256: &str,
        bytes: Vec<u8>,
    ) -> Result<(Component, bool), LoadError> {
        let engine = self.clone();
        let (sha, name) = (sha256.to_string(), source_name.to_string());
        tokio::task::spawn_blocking(move || {
            if let Some(component) = engine.cache.as_ref().and_then(|c| c.load(&engine.engine, &sha)) {
                return Ok((component, true));
            }
            let started = std::time::Instant::now();
            let component = Component::new(&engine.engine, &bytes).map_err(|source| LoadError::Compile {
                source_name: name.clone(),
                source,
            })?;
            tracing::info!(plugin = %name, elapsed_ms = started.elapsed().as_millis() as u64, "compiled plugin");
            if let Some(cache) = &engine.cache {
                cache.store(&sha, &component);
            }
            Ok((component, false))
        })
        .await
        .map_err(|e| LoadError::Io {
            source_name: source_name.to_string(),
            reason: format!("compilation task failed: {e}"),
        })?
    }

    /// The WIT version a component was built for, and the bindings that serve it.
    fn bindings_version(
        &self,
        source_name: &str,
        component: &Component,
    ) -> Result<(String, WitVersion), LoadError> {
        let source_name = source_name.to_string();
        let Some(version) = provider_version(component, &self.engine) else {
            let (exports, _) = names(component, &self.engine);
            return Err(LoadError::NotAProvider {
                source_name,
                found: if exports.is_empty() {
                    "nothing".into()
                } else {
                    exports.join(", ")
                },
                supported: SUPPORTED_WIT_VERSIONS.join(", "),
            });
        };
        match WitVersion::for_component_version(&version) {
            Some(bindings) => Ok((version, bindings)),
            None => Err(LoadError::UnsupportedVersion {
                source_name,
                found: version,
                supported: supported_wit_versions(),
            }),
        }
    }

    /// Loads a provider component from a file.
    pub async fn load_file(
        self: &Arc<Self>,
        path: &std::path::Path,
    ) -> Result<Arc<LoadedPlugin>, LoadError> {
        let source_name = path.display().to_string();
        let bytes = tokio::fs::read(path).await.map_err(|e| LoadError::Io {
            source_name: source_name.clone(),
            reason: format!("cannot read: {e}"),
        })?;
        self.load(&source_name, bytes).await
    }
}
