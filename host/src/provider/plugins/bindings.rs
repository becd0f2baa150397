//! The WIT versions of `proxy-operator:provider` the host serves, and the one place that knows
//! them: which bindings serve a component, how their imports are linked, and how a [`Call`] is
//! made through them. The newest version's module (`latest`) converts its generated types to and
//! from `plugins::types`, and `imports.rs` implements the host's imports once, for its traits;
//! each older version maps its unchanged interfaces onto the newest's with `bindgen!`'s `with:`
//! and converts only its own types into the newest's (as Zed's `since_v0_x` modules do). A new
//! version touches only this directory (see docs/architecture.md).

mod imports;
pub mod since_v0_1_0;
pub mod since_v0_2_0;
#[cfg(test)]
mod since_v0_3_0_draft;

use since_v0_2_0 as latest;

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
pub const SUPPORTED_WIT_VERSIONS: &[&str] = &[since_v0_1_0::VERSION, since_v0_2_0::VERSION];

impl WitVersion {
    /// Every version, oldest first.
    pub const ALL: &[WitVersion] = &[WitVersion::V0_1_0, WitVersion::V0_2_0];

    /// The version's number, e.g. `0.1.0`.
    pub fn as_str(self) -> &'static str {
        match self {
            WitVersion::V0_1_0 => since_v0_1_0::VERSION,
            WitVersion::V0_2_0 => since_v0_2_0::VERSION,
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
    since_v0_1_0::add_to_linker(linker).map_err(|e| {
        anyhow::anyhow!("linking the {} host interfaces: {e}", since_v0_1_0::VERSION)
    })?;
    since_v0_2_0::add_to_linker(linker)
        .map_err(|e| anyhow::anyhow!("linking the {} host interfaces: {e}", since_v0_2_0::VERSION))
}

/// A component pre-instantiated with the bindings of its version.
pub(crate) enum PluginPre {
    V0_1_0(since_v0_1_0::ProviderPluginPre<HostState>),
    V0_2_0(since_v0_2_0::ProviderPluginPre<HostState>),
}

impl PluginPre {
    /// Whether the version's `instance-spec` carries proxy credentials, as its bindings say.
    pub(crate) fn supports_credentials(&self) -> bool {
        match self {
            PluginPre::V0_1_0(_) => since_v0_1_0::CARRIES_CREDENTIALS,
            PluginPre::V0_2_0(_) => since_v0_2_0::CARRIES_CREDENTIALS,
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
        WitVersion::V0_1_0 => Ok(PluginPre::V0_1_0(since_v0_1_0::ProviderPluginPre::new(
            instance_pre,
        )?)),
        WitVersion::V0_2_0 => Ok(PluginPre::V0_2_0(since_v0_2_0::ProviderPluginPre::new(
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
        PluginPre::V0_1_0(pre) => since_v0_1_0::call(store, pre, config, call).await?,
        PluginPre::V0_2_0(pre) => since_v0_2_0::call(store, pre, config, call).await?,
    };
    // Whatever the version, the answer is bounded before the host uses it.
    Ok(bounds::answer(function, answer))
}

#[cfg(test)]
mod tests {
    use wasmtime::component::{Component, Linker};
    use wasmtime::{Config, Engine};

    use super::{WitVersion, since_v0_3_0_draft, supported_wit_versions};
    use crate::provider::plugins::state::HostState;

    /// A component of `wit_dir`'s `provider-plugin` world whose functions all trap: enough for
    /// the linker and the bindings to type-check it.
    fn stub_component(engine: &Engine, wit_dir: &str) -> Component {
        use wit_component::{ComponentEncoder, StringEncoding};
        let mut resolve = wit_parser::Resolve::default();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(wit_dir);
        let (package, _) = resolve.push_dir(&dir).expect("the draft WIT parses");
        let world = resolve
            .select_world(&[package], Some("provider-plugin"))
            .expect("the provider-plugin world");
        let mut module =
            wit_component::dummy_module(&resolve, world, wit_parser::ManglingAndAbi::Standard32);
        wit_component::embed_component_metadata(
            &mut module,
            &resolve,
            world,
            StringEncoding::UTF8,
            false,
        )
        .expect("component metadata");
        let bytes = ComponentEncoder::default()
            .module(&module)
            .and_then(|encoder| encoder.validate(true).encode())
            .expect("a component");
        Component::new(engine, bytes).expect("the stub component compiles")
    }

    #[test]
    fn a_draft_version_written_in_the_bindings_alone_links_and_type_checks() {
        let engine = Engine::new(&Config::new()).unwrap();
        let mut linker = Linker::<HostState>::new(&engine);
        super::add_to_linker(&mut linker).unwrap();
        since_v0_3_0_draft::add_to_linker(&mut linker).unwrap();

        // The draft's capability interfaces are the released ones (`with:`), linked under the
        // draft's names beside the released versions'; its changed record and new function
        // type-check against its own bindings.
        let draft = stub_component(&engine, "src/provider/plugins/bindings/draft_v0.3.0");
        let pre = linker.instantiate_pre(&draft).expect("the draft links");
        since_v0_3_0_draft::ProviderPluginPre::new(pre).expect("the draft type-checks");

        // The released bindings refuse it (it is not served), and a 0.2.0 component is not
        // mistaken for the draft.
        assert_eq!(
            WitVersion::for_component_version(since_v0_3_0_draft::VERSION),
            None
        );
        let released = stub_component(&engine, "../wit/since_v0.2.0");
        let pre = linker.instantiate_pre(&released).unwrap();
        assert!(since_v0_3_0_draft::ProviderPluginPre::new(pre.clone()).is_err());
        super::since_v0_2_0::ProviderPluginPre::new(pre).expect("0.2.0 type-checks");
    }

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
