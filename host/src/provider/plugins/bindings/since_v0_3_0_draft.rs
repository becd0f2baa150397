//! A draft WIT version, `0.3.0-draft` (`draft_v0.3.0/`: `instance.exit-address` and a `drain`
//! function), built in the unit tests only and never served: the proof that a version is added
//! in this directory alone. Its unchanged interfaces are the newest released version's
//! (`with:`, the one implementation in `imports.rs`); only what it changed is written here.
//! Released, it would become `latest` and 0.2.0 would map onto it the way 0.1.0 maps onto 0.2.0.

use wasmtime::component::{HasSelf, Linker};

use crate::provider::plugins::state::HostState;

wasmtime::component::bindgen!({
    world: "provider-plugin",
    path: "src/provider/plugins/bindings/draft_v0.3.0",
    imports: { default: async },
    exports: { default: async },
    with: {
        "proxy-operator:provider/log": super::latest::proxy_operator::provider::log,
        "proxy-operator:provider/http": super::latest::proxy_operator::provider::http,
        "proxy-operator:provider/kube": super::latest::proxy_operator::provider::kube,
        "proxy-operator:provider/libvirt": super::latest::proxy_operator::provider::libvirt,
    },
});

use self::proxy_operator::provider::types as wit;

/// The WIT version these bindings serve.
pub const VERSION: &str = "0.3.0-draft";

impl wit::Host for HostState {}

/// Adds this version's host imports to the linker.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    wit::add_to_linker::<_, HasSelf<_>>(linker, |s| s)?;
    super::imports::add_to_linker_as(linker, VERSION)
}
