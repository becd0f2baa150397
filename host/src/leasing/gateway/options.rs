//! The gateway's settings.

use std::time::Duration;

use super::policy::DestinationPolicy;

/// Timeouts, bounds and the destination policy of a gateway.
#[derive(Clone, Debug)]
pub struct GatewayOptions {
    /// From a client's connection to its complete request head or SOCKS5 request.
    pub handshake_timeout: Duration,
    /// To connect to an upstream and have its answer to CONNECT.
    pub connect_timeout: Duration,
    /// A tunnel or request with no byte either way for this long is closed.
    pub idle_timeout: Duration,
    /// Client connections open at once, in all, once they presented a token.
    pub max_clients: usize,
    /// Client connections that have not presented a token yet (in their TLS handshake, before
    /// their request head or SOCKS5 login is complete), at once: a room of their own, smaller
    /// than `max_clients`, so clients that never finish cannot take the others' places.
    pub max_handshaking: usize,
    /// Client connections open at once with one token.
    pub max_clients_per_token: u32,
    /// On shutdown, how long open connections may go on before they are cut.
    pub shutdown_grace: Duration,
    pub policy: DestinationPolicy,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        GatewayOptions {
            handshake_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            max_clients: 10_000,
            max_handshaking: 1_000,
            max_clients_per_token: 1_000,
            shutdown_grace: Duration::from_secs(30),
            policy: DestinationPolicy::default(),
        }
    }
}
