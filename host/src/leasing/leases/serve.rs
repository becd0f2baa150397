//! The discovery API's server: hyper's HTTP/1.1 with the header limits of `api.rs`, over plain
//! TCP or TLS (docs/discovery-api.md, "TLS"), within the listener bounds of
//! [`crate::support::listener`].

use axum::Router;
use axum::extract::Request;
use axum::response::IntoResponse;
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite};
use tower::ServiceExt;
use tracing::Instrument;

use super::api::{MAX_HEADERS, Problem, TRANSPORT_MAX_HEADERS};
use crate::support::listener::{
    ConnectionLimits, ListenerBounds, accept, http1, within_idle_timeout,
};

/// Serves `router` (the discovery API's) on `listener` over plain HTTP until the task is
/// dropped, within the default [`ListenerBounds`]. Like `axum::serve`, with the header limits:
/// every answer to a request that reaches the operator, including one with too many header
/// fields, is a problem document.
pub async fn serve(listener: tokio::net::TcpListener, router: Router) {
    serve_tls(listener, router, None, ListenerBounds::default()).await
}

/// As [`serve`], over TLS when `tls` is given: each connection's handshake first (within
/// [`crate::support::tls::HANDSHAKE_TIMEOUT`]), with the certificate the acceptor holds at that
/// moment; every connection within `bounds` (its place taken at accept, before the handshake:
/// docs/security.md, "Every listener bounded").
pub async fn serve_tls(
    mut listener: tokio::net::TcpListener,
    router: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    bounds: ListenerBounds,
) {
    let limits = ConnectionLimits::new(bounds);
    loop {
        let (stream, peer, admitted) = accept(&mut listener, &limits, "discovery API").await;
        let router = router.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _admitted = admitted;
            let Some(tls) = tls else {
                return serve_connection(stream, router, bounds).await;
            };
            match tokio::time::timeout(crate::support::tls::HANDSHAKE_TIMEOUT, tls.accept(stream))
                .await
            {
                Ok(Ok(stream)) => serve_connection(stream, router, bounds).await,
                // A client that does not trust the certificate, or speaks plain HTTP: its
                // error, said at debug (a scanner could fill the log otherwise).
                Ok(Err(e)) => tracing::debug!(%peer, "discovery API TLS handshake failed: {e}"),
                Err(_) => tracing::debug!(%peer, "discovery API TLS handshake timed out"),
            }
        });
    }
}

async fn serve_connection<I>(io: I, router: Router, bounds: ListenerBounds)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let router = router.clone();
        // A span per request (debug, as tower-http's trace layer has it: the grant path pays
        // nothing for it at the default level), so what a handler logs names the request, and
        // one event with the status when it is answered.
        let span = tracing::debug_span!(
            "discovery_request",
            method = %request.method(),
            path = %request.uri().path()
        );
        async move {
            let count = request.headers().len();
            if count > MAX_HEADERS {
                return Ok(Problem::headers_too_large(count).into_response());
            }
            let answered = router.oneshot(request).instrument(span.clone()).await;
            if let Ok(response) = &answered {
                let status = response.status().as_u16();
                tracing::debug!(parent: &span, status, "answered");
            }
            answered
        }
    });
    within_idle_timeout(io, bounds.idle_timeout, |io| async move {
        let mut http = http1(&bounds);
        http.max_headers(TRANSPORT_MAX_HEADERS);
        if let Err(e) = http
            .serve_connection(hyper_util::rt::TokioIo::new(io), service)
            .with_upgrades()
            .await
        {
            tracing::trace!("discovery API connection: {e}");
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The discovery API's listener against the slow loris (docs/security.md, "Every listener
    /// bounded"): its own server and service, a route answering 200.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_discovery_api_is_bounded_against_a_slow_loris() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/v1/ok", axum::routing::get(|| async { "ok" }));
        let bounds = crate::support::listener::tests::test_bounds();
        let server = tokio::spawn(serve_tls(listener, router, None, bounds));
        crate::support::listener::tests::slow_loris(addr, &bounds, "/v1/ok", "").await;
        server.abort();
    }
}
