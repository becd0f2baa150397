//! The gateway's listeners: a task per client connection on the HTTP and SOCKS5 ports, each
//! counted against the bounds; on shutdown no new connection is taken and open ones get the
//! grace period to finish.

use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Routes;
use super::load::{ClientLoad, UpstreamLoad};
use super::metrics::{GatewayMetrics, Outcome, Protocol};
use super::options::GatewayOptions;
use super::upstream::Context;
use super::{http, socks5};

/// One gateway replica's data plane.
pub struct Gateway<R: Routes> {
    routes: Arc<R>,
    options: GatewayOptions,
    clients: ClientLoad,
    upstreams: UpstreamLoad,
    metrics: GatewayMetrics,
}

#[derive(Clone)]
enum Port {
    Http,
    Socks,
    /// The HTTP front over TLS (`curl --proxy https://…`).
    Https(tokio_rustls::TlsAcceptor),
}

impl<R: Routes> Gateway<R> {
    pub fn new(routes: Arc<R>, options: GatewayOptions, metrics: GatewayMetrics) -> Self {
        Gateway {
            clients: ClientLoad::new(
                options.max_clients,
                options.max_clients_per_token,
                options.max_handshaking,
                &metrics,
            ),
            upstreams: UpstreamLoad::new(&metrics),
            routes,
            options,
            metrics,
        }
    }

    /// Open connections per upstream proxy (what the leader is told).
    pub fn upstream_load(&self) -> &UpstreamLoad {
        &self.upstreams
    }

    /// The gateway's metrics (its bytes per pool go to the leader too).
    pub fn metrics(&self) -> &GatewayMetrics {
        &self.metrics
    }

    /// Open client connections.
    pub fn clients(&self) -> &ClientLoad {
        &self.clients
    }

    fn context(&self) -> Context<'_, R> {
        Context {
            routes: &self.routes,
            options: &self.options,
            clients: &self.clients,
            upstreams: &self.upstreams,
            metrics: &self.metrics,
        }
    }

    /// Serves both ports until `stop`, then waits up to the shutdown grace for open
    /// connections.
    pub async fn serve(
        self: Arc<Self>,
        http: TcpListener,
        socks: TcpListener,
        stop: CancellationToken,
    ) {
        self.serve_with_https(http, socks, None, stop).await
    }

    /// As [`Self::serve`], with the HTTP front over TLS on a third port when `https` is given
    /// (its listener and the acceptor holding the certificate).
    pub async fn serve_with_https(
        self: Arc<Self>,
        http: TcpListener,
        socks: TcpListener,
        https: Option<(TcpListener, tokio_rustls::TlsAcceptor)>,
        stop: CancellationToken,
    ) {
        let mut connections = JoinSet::new();
        let accept_https =
            async |https: &Option<(TcpListener, tokio_rustls::TlsAcceptor)>| match https {
                Some((listener, tls)) => (listener.accept().await, Port::Https(tls.clone())),
                None => std::future::pending().await,
            };
        loop {
            let (accepted, port) = tokio::select! {
                () = stop.cancelled() => break,
                accepted = http.accept() => (accepted, Port::Http),
                accepted = socks.accept() => (accepted, Port::Socks),
                accepted = accept_https(&https) => accepted,
            };
            while connections.try_join_next().is_some() {}
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: the next accept may do.
                    warn!("accepting a client connection: {e}");
                    tokio::task::yield_now().await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let gateway = self.clone();
            connections.spawn(async move { gateway.connection(stream, port).await });
        }
        // Closed at once: a client connecting now is refused, not left waiting in the backlog.
        drop((http, socks, https));
        let open = connections.len();
        if open > 0 {
            info!(open, grace = ?self.options.shutdown_grace, "stopping: open connections may finish");
            let drained = async { while connections.join_next().await.is_some() {} };
            if tokio::time::timeout(self.options.shutdown_grace, drained)
                .await
                .is_err()
            {
                connections.abort_all();
            }
        }
    }

    async fn connection(&self, stream: TcpStream, port: Port) {
        // A place of the handshake room until the client presents its token; the handlers
        // then take one of `max_clients` and give this back.
        let Some(handshake) = self.clients.handshake() else {
            let protocol = match port {
                Port::Http => {
                    http::refuse_busy(stream).await;
                    Protocol::Http
                }
                // A SOCKS5 client reads a reply only after its greeting, a TLS client after
                // its handshake: closing says it.
                Port::Socks => Protocol::Socks5,
                Port::Https(_) => Protocol::Http,
            };
            self.metrics.request(protocol, Outcome::Refused, None);
            return;
        };
        let ctx = self.context();
        match port {
            Port::Http => http::handle(&ctx, stream, handshake).await,
            Port::Socks => socks5::handle(&ctx, stream, handshake).await,
            Port::Https(tls) => {
                let accepting = tls.accept(stream);
                match tokio::time::timeout(self.options.handshake_timeout, accepting).await {
                    Ok(Ok(stream)) => http::handle(&ctx, stream, handshake).await,
                    // A client that does not trust the certificate, or speaks plain HTTP.
                    Ok(Err(e)) => tracing::debug!("gateway TLS handshake failed: {e}"),
                    Err(_) => tracing::debug!("gateway TLS handshake timed out"),
                }
            }
        }
    }
}
