//! Bindings for `proxy-operator:provider@0.1.0` (`wit/since_v0.1.0`).

use std::time::Duration;

use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker, Resource};

use crate::capabilities::libvirt::{self as lv_cap, Hypervisor};
use crate::capabilities::{http as http_cap, kube as kube_cap, log as log_cap};
use crate::plugins::call::{Call, CallFailure, Output};
use crate::plugins::state::HostState;
use crate::plugins::types;

use super::shared::{
    call_through_bindings, host_imports, instance_spec_conversion, unchanged_conversions,
};

wasmtime::component::bindgen!({
    world: "provider-plugin",
    path: "../wit/since_v0.1.0",
    imports: { default: async },
    exports: { default: async },
    with: {
        "proxy-operator:provider/libvirt.hypervisor": crate::capabilities::libvirt::Hypervisor,
    },
});

use self::proxy_operator::provider::types as wit;
use self::proxy_operator::provider::{http, kube, libvirt, log};

unchanged_conversions!();
host_imports!();

// 0.1.0 cannot carry credentials: the host gives such plugins none.
instance_spec_conversion!(|spec|);

/// The WIT version these bindings serve.
pub const VERSION: &str = "0.1.0";

/// Adds this version's host imports to the linker.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    ProviderPlugin::add_to_linker::<_, HasSelf<_>>(linker, |s| s)
}

// 0.1.0 has no `set-credentials`: its plugins were never given credentials to change.
call_through_bindings!(|api, store, config, id, credentials| {
    let _ = (id, credentials);
    Ok(Err(types::ProviderError::Permanent(
        "this plugin is built for WIT 0.1.0, which cannot change a proxy's credentials; rebuild it for 0.2.0".into(),
    )))
});
