//! What the leader offers the gateway (the flags of `run`), apart from the handlers in
//! `gateway.rs` so the discovery API names it without naming them.

/// The header carrying the gateway's own token.
pub const GATEWAY_TOKEN_HEADER: &str = "x-proxy-operator-gateway-token";
/// What the leader tells the gateway, and how it shares proxies.
#[derive(Clone)]
pub struct GatewayAccess {
    /// The token gateway replicas present in [`GATEWAY_TOKEN_HEADER`].
    pub token: String,
    /// Open gateway connections one proxy carries at most.
    pub max_connections_per_proxy: u32,
    /// Plain-HTTP statuses the gateway reports as `blocked`.
    pub block_statuses: Vec<u16>,
}

impl std::fmt::Debug for GatewayAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayAccess")
            .field("token", &"<redacted>")
            .field("max_connections_per_proxy", &self.max_connections_per_proxy)
            .field("block_statuses", &self.block_statuses)
            .finish()
    }
}
