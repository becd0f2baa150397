//! The WIT versions of `proxy-operator:provider` the host serves, and the one place that knows
//! them: which bindings serve a component, how their imports are linked, and how a [`Call`] is
//! made through them. Each version module converts its generated types into `plugins::types`
//! and implements its imports over the version-independent capabilities, so adding a version
//! touches only this file and a new module beside `v0_1_0` (see docs/architecture.md).

mod shared;
pub mod v0_1_0;
pub mod v0_2_0;

use wasmtime::Store;
use wasmtime::component::{Component, Linker};

use super::bounds;
use super::call::{Call, CallFailure, Output};
use super::state::HostState;
use super::types::ProviderError;

/// The interface a provider component exports, without its version (`…@0.1.0`).
pub(crate) const PROVIDER_INTERFACE: &str = "proxy-operator:provider/provider@";

/// A WIT version the host has bindings for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WitVersion {
    V0_1_0,
    V0_2_0,
}

/// WIT versions of `proxy-operator:provider` this host has bindings for. The bindings of `X.Y.Z`
/// also serve components built for a later patch version `X.Y.Z'` (`Z' > Z`) of the same
/// `X.Y`, e.g. 0.1.1 through the 0.1.0 bindings: wasmtime matches `…@0.1.0` and `…@0.1.1` as
/// semver-compatible names both for the host's imports and for the component's exports, and the
/// bindings only use the functions they know. Any other major or minor version is refused.
pub const SUPPORTED_WIT_VERSIONS: &[&str] = &[v0_1_0::VERSION, v0_2_0::VERSION];

impl WitVersion {
    /// Every version, oldest first.
    pub const ALL: &[WitVersion] = &[WitVersion::V0_1_0, WitVersion::V0_2_0];

    /// The version's number, e.g. `0.1.0`.
    pub fn as_str(self) -> &'static str {
        match self {
            WitVersion::V0_1_0 => v0_1_0::VERSION,
            WitVersion::V0_2_0 => v0_2_0::VERSION,
        }
    }

    /// The bindings that serve a component built for WIT `version`: those of exactly that
    /// version, or else the newest bindings of the same `major.minor` at or below its patch
    /// version. 0.0.x and pre-releases match only exactly, as in wasmtime's name matching.
    pub fn for_component_version(version: &str) -> Option<WitVersion> {
        if let Some(exact) = Self::ALL.iter().find(|v| v.as_str() == version) {
            return Some(*exact);
        }
        let wanted = semver::Version::parse(version).ok()?;
        if !wanted.pre.is_empty() || (wanted.major, wanted.minor) == (0, 0) {
            return None;
        }
        Self::ALL
            .iter()
            .map(|v| {
                (
                    *v,
                    semver::Version::parse(v.as_str()).expect("a bindings version"),
                )
            })
            .filter(|(_, b)| (b.major, b.minor) == (wanted.major, wanted.minor))
            .filter(|(_, b)| b.patch <= wanted.patch)
            .max_by(|(_, a), (_, b)| a.cmp(b))
            .map(|(v, _)| v)
    }
}

/// The supported versions for messages, e.g. `0.1.0 (and any later 0.1.x)`.
pub(crate) fn supported_wit_versions() -> String {
    WitVersion::ALL
        .iter()
        .map(|v| match semver::Version::parse(v.as_str()) {
            Ok(s) if (s.major, s.minor) != (0, 0) => {
                format!("{} (and any later {}.{}.x)", v.as_str(), s.major, s.minor)
            }
            _ => v.as_str().to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Adds the host's imports of every supported version to the linker.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> anyhow::Result<()> {
    v0_1_0::add_to_linker(linker)
        .map_err(|e| anyhow::anyhow!("linking the {} host interfaces: {e}", v0_1_0::VERSION))?;
    v0_2_0::add_to_linker(linker)
        .map_err(|e| anyhow::anyhow!("linking the {} host interfaces: {e}", v0_2_0::VERSION))
}

/// A component pre-instantiated with the bindings of its version.
pub(crate) enum PluginPre {
    V0_1_0(v0_1_0::ProviderPluginPre<HostState>),
    V0_2_0(v0_2_0::ProviderPluginPre<HostState>),
}

impl PluginPre {
    /// Whether the version's `instance-spec` carries proxy credentials (0.2.0 on).
    pub(crate) fn supports_credentials(&self) -> bool {
        match self {
            PluginPre::V0_1_0(_) => false,
            PluginPre::V0_2_0(_) => true,
        }
    }
}

/// Type-checks `component` against the bindings of `version` and pre-instantiates it.
pub(crate) fn for_component(
    linker: &Linker<HostState>,
    component: &Component,
    version: WitVersion,
) -> wasmtime::Result<PluginPre> {
    let instance_pre = linker.instantiate_pre(component)?;
    match version {
        WitVersion::V0_1_0 => Ok(PluginPre::V0_1_0(v0_1_0::ProviderPluginPre::new(
            instance_pre,
        )?)),
        WitVersion::V0_2_0 => Ok(PluginPre::V0_2_0(v0_2_0::ProviderPluginPre::new(
            instance_pre,
        )?)),
    }
}

/// Instantiates the component in `store` and makes one call through its version's bindings.
pub(crate) async fn call(
    store: &mut Store<HostState>,
    pre: &PluginPre,
    config: &str,
    call: Call,
) -> Result<Result<Output, ProviderError>, CallFailure> {
    let function = call.name();
    let answer = match pre {
        PluginPre::V0_1_0(pre) => v0_1_0::call(store, pre, config, call).await?,
        PluginPre::V0_2_0(pre) => v0_2_0::call(store, pre, config, call).await?,
    };
    // Whatever the version, the answer is bounded before the host uses it.
    Ok(bounds::answer(function, answer))
}

#[cfg(test)]
mod tests {
    use super::{WitVersion, supported_wit_versions};

    #[test]
    fn a_later_patch_of_the_same_minor_uses_the_earlier_bindings() {
        let bindings = |v| WitVersion::for_component_version(v).map(WitVersion::as_str);
        assert_eq!(bindings("0.1.0"), Some("0.1.0"));
        assert_eq!(bindings("0.1.1"), Some("0.1.0"));
        assert_eq!(bindings("0.1.17+build.5"), Some("0.1.0"));
        assert_eq!(bindings("0.2.0"), Some("0.2.0"));
        assert_eq!(bindings("0.2.3"), Some("0.2.0"));
        for refused in [
            "0.3.0",
            "1.0.0",
            "1.1.0",
            "0.0.1",
            "0.1.1-rc.1",
            "0.1",
            "0.1.x",
            "",
        ] {
            assert_eq!(bindings(refused), None, "{refused}");
        }
        assert_eq!(
            supported_wit_versions(),
            "0.1.0 (and any later 0.1.x), 0.2.0 (and any later 0.2.x)"
        );
    }
}
