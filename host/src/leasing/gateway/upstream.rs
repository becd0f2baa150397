//! Carrying a tunnel or a plain request through an upstream squid the fleet picks, logging in
//! with the route's credentials; on a failure of the upstream (refused, timed out, 502/503/504
//! or 407 from squid), the upstream is reported and one other is tried. A SOCKS5 upstream (an
//! `upstream` provider's `socks5://` one) gets a SOCKS5 `CONNECT` to the destination instead
//! (RFC 1929's login with the route's credentials), and a plain request then goes through that
//! tunnel in origin form, as to the destination itself.

use std::time::Duration;

use tokio::io::{AsyncWriteExt, copy};
use tokio::net::TcpStream;
use tracing::{debug, warn};

use super::block::{SNIFFED_BODY, Sniffed, is_block};
use super::bytes::Metered;
use super::head::{Head, read_head};
use super::load::{ClientLoad, UpstreamGuard, UpstreamLoad};
use super::metrics::{GatewayMetrics, Outcome};
use super::options::GatewayOptions;
use super::relay::{Activity, Counted, idle_for};
use super::{Destination, Report, Route, RouteError, RouteRequest, Routes, UpstreamLogin};
use crate::support::socks::{self, ProxyProtocol, Socks5Failure};

/// A client connection: plain TCP, or TLS on the gateway's HTTPS port.
pub trait ClientStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> ClientStream for T {}

/// Largest response head read from an upstream.
pub const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// What a connection's handler needs of the gateway.
pub struct Context<'a, R> {
    pub routes: &'a R,
    pub options: &'a GatewayOptions,
    pub clients: &'a ClientLoad,
    pub upstreams: &'a UpstreamLoad,
    pub metrics: &'a GatewayMetrics,
}

/// Why a request or tunnel was not carried; nothing has reached the client yet.
#[derive(Debug)]
pub enum Refusal {
    /// The fleet chose no upstream.
    Route(RouteError),
    /// The upstream's own rules refused the destination (squid answered 403).
    Denied(String),
    /// The upstream failed, and the one tried after it (if any) too.
    Failed(String),
}

/// An open tunnel through an upstream: what the upstream sent past its answer is in
/// `leftover`.
pub struct Tunnel<'a> {
    pub stream: TcpStream,
    pub leftover: Vec<u8>,
    pub route: Route,
    _guard: UpstreamGuard<'a>,
}

/// How one try on one upstream ended, when it did not carry the request.
enum Attempt {
    /// A failure of the upstream: report it, try another.
    Retry(String),
    Final(Refusal),
}

/// Chooses an upstream (another than the failed one on the retry).
async fn choose<R: Routes>(
    ctx: &Context<'_, R>,
    request: &RouteRequest,
    failed: Option<&str>,
) -> Result<Route, Refusal> {
    match (ctx.routes.route(request).await, failed) {
        (Ok(route), _) => Ok(route),
        (Err(e), None) => Err(Refusal::Route(e)),
        (Err(e), Some(first)) => Err(Refusal::Failed(format!(
            "{first}; no other upstream to try: {e:?}"
        ))),
    }
}

/// A failed try: the fleet hears of it and the retry avoids that upstream.
async fn failed_on<R: Routes>(
    ctx: &Context<'_, R>,
    request: &mut RouteRequest,
    route: &Route,
    reason: &str,
) {
    warn!(proxy = %route.proxy, reason, "upstream failed; reported, trying another");
    ctx.routes
        .report(route, &request.destination, Report::Failure)
        .await;
    request.avoid = Some(route.proxy.clone());
}

/// Opens a CONNECT tunnel to the request's destination through an upstream, retrying once on
/// another upstream.
pub async fn open_tunnel<'a, R: Routes>(
    ctx: &Context<'a, R>,
    mut request: RouteRequest,
) -> Result<Tunnel<'a>, Refusal> {
    let mut failed: Option<String> = None;
    for _ in 0..2 {
        let route = choose(ctx, &request, failed.as_deref()).await?;
        match connect_tunnel(ctx.options.connect_timeout, &route, &request.destination).await {
            Ok((stream, leftover)) => {
                let _guard = ctx.upstreams.acquire(&route.proxy, route.pool.as_deref());
                return Ok(Tunnel {
                    stream,
                    leftover,
                    route,
                    _guard,
                });
            }
            Err(Attempt::Final(refusal)) => return Err(refusal),
            Err(Attempt::Retry(reason)) => {
                failed_on(ctx, &mut request, &route, &reason).await;
                failed = Some(reason);
            }
        }
    }
    Err(Refusal::Failed(failed.unwrap_or_default()))
}

/// `host:port`, an IPv6 address in brackets.
pub fn authority(d: &Destination) -> String {
    if d.host.contains(':') {
        format!("[{}]:{}", d.host, d.port)
    } else {
        format!("{}:{}", d.host, d.port)
    }
}

/// The `Proxy-Authorization` header line of a login (empty without one).
fn login_header(login: Option<&UpstreamLogin>) -> String {
    use base64::Engine;
    login.map_or_else(String::new, |l| {
        let pair = format!("{}:{}", l.username, l.password);
        format!(
            "Proxy-Authorization: Basic {}\r\n",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    })
}

async fn connect(timeout: Duration, route: &Route) -> Result<TcpStream, String> {
    let target = (route.address.as_str(), route.port);
    match tokio::time::timeout(timeout, TcpStream::connect(target)).await {
        Ok(Ok(stream)) => {
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
        Ok(Err(e)) => Err(format!(
            "cannot connect to {}:{}: {e}",
            route.address, route.port
        )),
        Err(_) => Err(format!(
            "no connection to {}:{} within {timeout:?}",
            route.address, route.port
        )),
    }
}

/// The status of a response head, and whether squid made it (`X-Squid-Error`: its own error
/// page, not the destination's answer).
fn response_status(head: &[u8]) -> Option<(u16, bool)> {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut response = httparse::Response::new(&mut headers);
    response.parse(head).ok()?.is_complete().then_some(())?;
    let from_squid = response
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("x-squid-error"));
    Some((response.code?, from_squid))
}

/// A SOCKS5 `CONNECT` to the destination through the upstream at the other end of `stream`,
/// within `timeout`. Refused by the upstream's rules (reply 0x02): final, as squid's 403; a
/// refused login, a failure reply or no answer: the upstream's failure, retried elsewhere.
async fn socks5_open(
    timeout: Duration,
    route: &Route,
    destination: &Destination,
    stream: &mut TcpStream,
) -> Result<(), Attempt> {
    let login = route
        .login
        .as_ref()
        .map(|l| (l.username.as_str(), l.password.as_str()));
    let target = authority(destination);
    let handshake = socks::connect(stream, &destination.host, destination.port, login);
    match tokio::time::timeout(timeout, handshake).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(failure)) if failure.is_not_allowed() => Err(Attempt::Final(Refusal::Denied(
            format!("the upstream proxy refused CONNECT {target} (SOCKS5: {failure})"),
        ))),
        Ok(Err(
            failure @ (Socks5Failure::Reply { code: 0x07 | 0x08 } | Socks5Failure::Destination(_)),
        )) => Err(Attempt::Final(Refusal::Failed(format!(
            "the upstream proxy cannot carry CONNECT {target}: {failure}"
        )))),
        Ok(Err(failure)) => Err(Attempt::Retry(format!(
            "SOCKS5 CONNECT {target} through {}: {failure}",
            route.proxy
        ))),
        Err(_) => Err(Attempt::Retry(format!(
            "{} did not answer the SOCKS5 handshake within {timeout:?}",
            route.proxy
        ))),
    }
}

async fn connect_tunnel(
    timeout: Duration,
    route: &Route,
    destination: &Destination,
) -> Result<(TcpStream, Vec<u8>), Attempt> {
    let mut stream = connect(timeout, route).await.map_err(Attempt::Retry)?;
    if route.protocol == ProxyProtocol::Socks5 {
        socks5_open(timeout, route, destination, &mut stream).await?;
        return Ok((stream, Vec::new()));
    }
    let target = authority(destination);
    let request = format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{}\r\n",
        login_header(route.login.as_ref())
    );
    let answer = async {
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        read_head(&mut stream, MAX_RESPONSE_HEAD)
            .await
            .map_err(|e| e.to_string())
    };
    let head = match tokio::time::timeout(timeout, answer).await {
        Ok(Ok(head)) => head,
        Ok(Err(e)) => {
            return Err(Attempt::Retry(format!(
                "CONNECT through {}: {e}",
                route.proxy
            )));
        }
        Err(_) => {
            return Err(Attempt::Retry(format!(
                "{} did not answer CONNECT within {timeout:?}",
                route.proxy
            )));
        }
    };
    let Some((status, _)) = response_status(head.head()) else {
        return Err(Attempt::Retry(format!(
            "{} answered CONNECT with something not HTTP",
            route.proxy
        )));
    };
    match status {
        200..=299 => Ok((stream, head.rest().to_vec())),
        403 => Err(Attempt::Final(Refusal::Denied(format!(
            "the upstream proxy refused CONNECT {target} (403)"
        )))),
        407 | 502 | 503 | 504 => Err(Attempt::Retry(format!(
            "{} answered CONNECT {target} with {status}",
            route.proxy
        ))),
        other => Err(Attempt::Final(Refusal::Failed(format!(
            "the upstream proxy answered CONNECT {target} with {other}"
        )))),
    }
}

/// A plain request to forward: its head as it goes upstream (request line in absolute form and
/// the end-to-end headers, each line ending in CRLF, no blank line yet) and the body bytes read
/// with it.
pub struct PlainRequest<'r> {
    pub head: &'r [u8],
    pub early_body: &'r [u8],
}

/// Forwards a plain request through an upstream and relays the response to `client`, retrying
/// once on another upstream while nothing of the response reached the client and nothing of
/// the client's body was consumed. `Ok`: the response (of any status) was relayed, or begun.
pub async fn forward<R: Routes, C: ClientStream>(
    ctx: &Context<'_, R>,
    mut request: RouteRequest,
    plain: PlainRequest<'_>,
    client: &mut C,
) -> Result<(Outcome, Option<String>), Refusal> {
    let mut failed: Option<String> = None;
    for _ in 0..2 {
        let route = choose(ctx, &request, failed.as_deref()).await?;
        let attempt = match connect(ctx.options.connect_timeout, &route).await {
            Ok(mut upstream) => {
                let _guard = ctx.upstreams.acquire(&route.proxy, route.pool.as_deref());
                let timeout = ctx.options.connect_timeout;
                let destination = &request.destination;
                let opened = match route.protocol {
                    ProxyProtocol::Http => Ok(()),
                    ProxyProtocol::Socks5 => {
                        socks5_open(timeout, &route, destination, &mut upstream).await
                    }
                };
                match opened {
                    Ok(()) => {
                        exchange(ctx, &route, destination, &plain, client, &mut upstream).await
                    }
                    Err(attempt) => Err(attempt),
                }
            }
            Err(reason) => Err(Attempt::Retry(reason)),
        };
        match attempt {
            Ok(outcome) => return Ok((outcome, route.pool)),
            Err(Attempt::Final(refusal)) => return Err(refusal),
            Err(Attempt::Retry(reason)) => {
                failed_on(ctx, &mut request, &route, &reason).await;
                failed = Some(reason);
            }
        }
    }
    Err(Refusal::Failed(failed.unwrap_or_default()))
}

/// What goes upstream first: the request head, the login header, `Connection: close` and the
/// body read with the head; and the login header's length (the fleet's, not counted as the
/// client's bytes). Through a SOCKS5 tunnel the request goes to the destination itself: origin
/// form, and no proxy login (the handshake carried it).
fn first_message(route: &Route, plain: &PlainRequest<'_>) -> (Vec<u8>, usize) {
    let (head, login) = match route.protocol {
        ProxyProtocol::Http => (plain.head.to_vec(), login_header(route.login.as_ref())),
        ProxyProtocol::Socks5 => (origin_form(plain.head), String::new()),
    };
    let mut message = Vec::with_capacity(head.len() + 128 + plain.early_body.len());
    message.extend_from_slice(&head);
    message.extend_from_slice(login.as_bytes());
    message.extend_from_slice(b"Connection: close\r\n\r\n");
    message.extend_from_slice(plain.early_body);
    (message, login.len())
}

/// One request on one upstream connection. The client's body is pumped upstream while the
/// response head is awaited (a client may wait for `100 Continue`), and on until the response
/// ends; one request per connection (keep-alive is out of scope), so the end of the response
/// is the end of both. Its bytes count for the route's pool: the request as it went upstream
/// (not the fleet's login, which is not the client's) and the response as the client got it.
async fn exchange<R: Routes, C: ClientStream>(
    ctx: &Context<'_, R>,
    route: &Route,
    destination: &Destination,
    plain: &PlainRequest<'_>,
    client: &mut C,
    upstream: &mut TcpStream,
) -> Result<Outcome, Attempt> {
    let bytes = ctx.metrics.pool_bytes(route.pool.as_deref());
    let (message, login) = first_message(route, plain);
    upstream
        .write_all(&message)
        .await
        .map_err(|e| Attempt::Retry(format!("sending the request to {}: {e}", route.proxy)))?;
    bytes.sent.add((message.len() - login) as u64);
    let from_client = Activity::default();
    let from_upstream = Activity::default();
    let (client_read, client_write) = tokio::io::split(client);
    let (upstream_read, upstream_write) = upstream.split();
    let mut client_write = Metered::new(client_write, &bytes.received);
    let mut upstream_write = Metered::new(upstream_write, &bytes.sent);
    let mut client_read = Counted::new(client_read, &from_client);
    let mut upstream_read = Counted::new(upstream_read, &from_upstream);
    let idle = idle_for(
        || from_client.reads() + from_upstream.reads(),
        ctx.options.idle_timeout,
    );
    tokio::pin!(idle);
    let pump = copy(&mut client_read, &mut upstream_write);
    tokio::pin!(pump);
    let mut pumped = false;
    let head: Result<Head, String> = {
        let response = read_head(&mut upstream_read, MAX_RESPONSE_HEAD);
        tokio::pin!(response);
        loop {
            tokio::select! {
                _ = &mut pump, if !pumped => pumped = true,
                read = &mut response => break read.map_err(|e| e.to_string()),
                () = &mut idle => break Err("no response within the idle timeout".to_string()),
            }
        }
    };
    let retry_or_fail = |reason: String| {
        if from_client.reads() == 0 {
            Attempt::Retry(reason)
        } else {
            Attempt::Final(Refusal::Failed(reason))
        }
    };
    let head = head.map_err(|e| retry_or_fail(format!("response from {}: {e}", route.proxy)))?;
    let Some(rewritten) = response_head(head.head()) else {
        return Err(retry_or_fail(format!(
            "{} answered something not HTTP",
            route.proxy
        )));
    };
    let (status, from_squid) = response_status(head.head()).unwrap_or((0, false));
    if (status == 407 && route.protocol.is_http()) || (from_squid && matches!(status, 502..=504)) {
        return Err(retry_or_fail(format!("{} answered {status}", route.proxy)));
    }
    // The start of the body, kept only when the pool names texts to look for in it.
    let sniff_limit = if route.block_body_patterns.is_empty() || from_squid {
        0
    } else {
        SNIFFED_BODY
    };
    let mut sniffed = head.rest()[..head.rest().len().min(sniff_limit)].to_vec();
    // From here on the client has bytes of the response: no retry.
    let relayed = async {
        client_write.write_all(&rewritten).await?;
        client_write.write_all(head.rest()).await?;
        {
            let mut upstream_read = Sniffed::new(&mut upstream_read, &mut sniffed, sniff_limit);
            let down = copy(&mut upstream_read, &mut client_write);
            tokio::pin!(down);
            loop {
                tokio::select! {
                    _ = &mut pump, if !pumped => pumped = true,
                    copied = &mut down => break copied.map(drop),
                    () = &mut idle => break Ok(()),
                }
            }?;
        }
        client_write.shutdown().await
    };
    if let Err(e) = relayed.await {
        debug!(proxy = %route.proxy, "relaying a response: {e}");
    }
    let seen = Response {
        status,
        from_squid,
        body_start: &sniffed,
    };
    Ok(report_a_block(ctx, route, destination, seen).await)
}

/// A relayed response, as far as telling a block goes.
struct Response<'b> {
    status: u16,
    from_squid: bool,
    /// The start of the body, when the route names patterns.
    body_start: &'b [u8],
}

/// Reports the response as `blocked` if the route's rules say it is one.
async fn report_a_block<R: Routes>(
    ctx: &Context<'_, R>,
    route: &Route,
    destination: &Destination,
    seen: Response<'_>,
) -> Outcome {
    let blocked = is_block(
        seen.status,
        seen.from_squid,
        &route.block_statuses,
        &route.block_body_patterns,
        seen.body_start,
    );
    if blocked {
        ctx.routes.report(route, destination, Report::Blocked).await;
        Outcome::Blocked
    } else {
        Outcome::Ok
    }
}

/// The request head with its request line in origin form (`GET /path?query HTTP/1.1`), as a
/// server expects it over a tunnel; the absolute form is for proxies.
fn origin_form(head: &[u8]) -> Vec<u8> {
    let end = head
        .windows(2)
        .position(|w| w == b"\r\n")
        .unwrap_or(head.len());
    let line = String::from_utf8_lossy(&head[..end]);
    let mut parts = line.splitn(3, ' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return head.to_vec();
    };
    let Ok(url) = url::Url::parse(target) else {
        return head.to_vec();
    };
    let query = url.query().map(|q| format!("?{q}")).unwrap_or_default();
    let mut out = format!("{method} {}{query} {version}", url.path()).into_bytes();
    out.extend_from_slice(&head[end..]);
    out
}

/// Headers that concern one connection, not the message: never passed on.
pub fn is_hop_by_hop(name: &str) -> bool {
    const HOP: [&str; 8] = [
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "upgrade",
    ];
    HOP.iter().any(|h| name.eq_ignore_ascii_case(h))
}

/// The names a `Connection` header lists (they are hop-by-hop too).
pub fn connection_listed<'h>(headers: &[httparse::Header<'h>]) -> Vec<String> {
    headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"))
        .flat_map(|h| {
            String::from_utf8_lossy(h.value)
                .split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .collect::<Vec<_>>()
        })
        .filter(|t| !t.is_empty())
        .collect()
}

/// The response head as the client gets it: the status line, the end-to-end headers and
/// `Connection: close`.
fn response_head(head: &[u8]) -> Option<Vec<u8>> {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut response = httparse::Response::new(&mut headers);
    response.parse(head).ok()?.is_complete().then_some(())?;
    let listed = connection_listed(response.headers);
    let mut out = format!(
        "HTTP/1.1 {} {}\r\n",
        response.code?,
        response.reason.unwrap_or("")
    )
    .into_bytes();
    for h in response.headers.iter() {
        if is_hop_by_hop(h.name) || listed.iter().any(|l| h.name.eq_ignore_ascii_case(l)) {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_heads_lose_hop_by_hop_headers() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nX-Keep: 2\r\n\r\n";
        let out = String::from_utf8(response_head(head).unwrap()).unwrap();
        assert_eq!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-Keep: 2\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn squid_error_pages_are_told_from_the_destinations_answers() {
        let squid =
            b"HTTP/1.1 503 Service Unavailable\r\nX-Squid-Error: ERR_CONNECT_FAIL 111\r\n\r\n";
        assert_eq!(response_status(squid), Some((503, true)));
        let origin = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\n\r\n";
        assert_eq!(response_status(origin), Some((503, false)));
        assert_eq!(response_status(b"SSH-2.0-OpenSSH\r\n\r\n"), None);
    }

    #[test]
    fn a_request_through_a_socks5_tunnel_goes_in_origin_form() {
        let head = b"GET http://example.com:8080/a/b?c=1 HTTP/1.1\r\nHost: example.com:8080\r\n";
        assert_eq!(
            String::from_utf8(origin_form(head)).unwrap(),
            "GET /a/b?c=1 HTTP/1.1\r\nHost: example.com:8080\r\n"
        );
        let bare = b"POST http://example.com HTTP/1.0\r\nHost: example.com\r\n";
        assert_eq!(
            String::from_utf8(origin_form(bare)).unwrap(),
            "POST / HTTP/1.0\r\nHost: example.com\r\n"
        );
    }

    #[test]
    fn authorities_bracket_ipv6() {
        let d = |host: &str| Destination {
            host: host.into(),
            port: 443,
        };
        assert_eq!(authority(&d("example.com")), "example.com:443");
        assert_eq!(authority(&d("2001:db8::1")), "[2001:db8::1]:443");
    }
}
