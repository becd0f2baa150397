//! The discovery API's server: hyper's HTTP/1.1 with the header limits of `api.rs`, over plain
//! TCP or TLS (docs/discovery-api.md, "TLS").

use axum::Router;
use axum::extract::Request;
use axum::response::IntoResponse;
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite};
use tower::ServiceExt;
use tracing::Instrument;

use super::api::{MAX_HEADERS, Problem, TRANSPORT_MAX_HEADERS};

/// Serves `router` (the discovery API's) on `listener` over plain HTTP until the task is
/// dropped. Like `axum::serve`, with the header limits: every answer to a request that reaches
/// the operator, including one with too many header fields, is a problem document.
pub async fn serve(listener: tokio::net::TcpListener, router: Router) {
    serve_tls(listener, router, None).await
}

/// As [`serve`], over TLS when `tls` is given: each connection's handshake first (within
/// [`crate::support::tls::HANDSHAKE_TIMEOUT`]), with the certificate the acceptor holds at that moment.
pub async fn serve_tls(
    mut listener: tokio::net::TcpListener,
    router: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    loop {
        let (stream, peer) = axum::serve::Listener::accept(&mut listener).await;
        let router = router.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let Some(tls) = tls else {
                return serve_connection(stream, router).await;
            };
            match tokio::time::timeout(crate::support::tls::HANDSHAKE_TIMEOUT, tls.accept(stream))
                .await
            {
                Ok(Ok(stream)) => serve_connection(stream, router).await,
                // A client that does not trust the certificate, or speaks plain HTTP: its
                // error, said at debug (a scanner could fill the log otherwise).
                Ok(Err(e)) => tracing::debug!(%peer, "discovery API TLS handshake failed: {e}"),
                Err(_) => tracing::debug!(%peer, "discovery API TLS handshake timed out"),
            }
        });
    }
}

async fn serve_connection<I>(io: I, router: Router)
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
    let mut http = hyper::server::conn::http1::Builder::new();
    http.max_headers(TRANSPORT_MAX_HEADERS);
    if let Err(e) = http
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        .with_upgrades()
        .await
    {
        tracing::trace!("discovery API connection: {e}");
    }
}
