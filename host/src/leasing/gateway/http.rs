//! The HTTP front: `CONNECT host:port` tunnels and plain requests in absolute form
//! (`GET http://host/path`), each authenticated by `Proxy-Authorization: Basic` with the
//! routing username and the token as password. One request per client connection: every answer
//! says `Connection: close` (keep-alive is out of scope for now).

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tracing::{debug, warn};

use super::client_report::{self, ClientReport, GATEWAY_HOST};
use super::head::{HeadError, read_head};
use super::load::HandshakePermit;
use super::metrics::{Outcome, Protocol};
use super::relay::relay;
use super::upstream::{
    ClientStream, Context, PlainRequest, Refusal, authority, connection_listed, forward,
    is_hop_by_hop, open_tunnel,
};
use super::username::parse_username;
use super::{Destination, RouteError, RouteRequest, Routes, Routing, SessionReport};

/// Largest request head read from a client (431 beyond).
pub const MAX_REQUEST_HEAD: usize = 16 * 1024;
/// Header fields read from a client (431 beyond).
const MAX_HEADERS: usize = 100;
const CHALLENGE: &str = "Basic realm=\"proxy-operator\"";

/// An answer the gateway makes itself (an error, or a client report's receipt): status, body,
/// extra headers, and how the request counts.
struct Answer {
    status: u16,
    content_type: &'static str,
    body: String,
    headers: Vec<(&'static str, String)>,
    outcome: Outcome,
}

impl Answer {
    fn new(status: u16, body: impl Into<String>, outcome: Outcome) -> Self {
        Answer {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
            headers: Vec::new(),
            outcome,
        }
    }

    fn with(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    fn bad_request(body: impl Into<String>) -> Self {
        Answer::new(400, body, Outcome::Refused)
    }

    fn login_required(body: impl Into<String>) -> Self {
        Answer::new(407, body, Outcome::Unauthenticated).with("Proxy-Authenticate", CHALLENGE)
    }
}

/// What a client's request head asks for.
struct Parsed {
    protocol: Protocol,
    destination: Destination,
    /// Plain requests: the head as it goes upstream (request line and end-to-end headers).
    upstream_head: Vec<u8>,
    /// `Proxy-Authorization`'s value, if any.
    authorization: Option<Vec<u8>>,
    /// A request to the gateway itself ([`GATEWAY_HOST`]): a client's report.
    report: Option<ClientReport>,
}

/// Serves one client connection.
/// `handshake`: the connection's place in the handshake room, given back for one of the
/// total's once its head (with the token) is read.
pub async fn handle<R: Routes, C: ClientStream>(
    ctx: &Context<'_, R>,
    mut client: C,
    handshake: HandshakePermit<'_>,
) {
    let (protocol, outcome, pool) = match serve(ctx, &mut client, handshake).await {
        Ok(done) => done,
        Err((protocol, answer)) => {
            send(&mut client, &answer).await;
            (protocol, answer.outcome, None)
        }
    };
    ctx.metrics.request(protocol, outcome, pool.as_deref());
}

/// Answers a client that is over the gateway's bound on open connections.
pub async fn refuse_busy<C: ClientStream>(mut client: C) {
    let answer = Answer::new(429, "too many client connections open", Outcome::Refused)
        .with("Retry-After", "1");
    send(&mut client, &answer).await;
}

/// How a request ended, and the pool (`namespace/name`) of the proxy it was routed to.
type Served = (Protocol, Outcome, Option<String>);

async fn serve<R: Routes, C: ClientStream>(
    ctx: &Context<'_, R>,
    client: &mut C,
    handshake: HandshakePermit<'_>,
) -> Result<Served, (Protocol, Answer)> {
    let read = tokio::time::timeout(
        ctx.options.handshake_timeout,
        read_head(client, MAX_REQUEST_HEAD),
    );
    let head = match read.await {
        Ok(Ok(head)) => head,
        Ok(Err(HeadError::TooLarge)) => {
            let body = format!("the request head is over {MAX_REQUEST_HEAD} bytes");
            return Err((Protocol::Http, Answer::new(431, body, Outcome::Refused)));
        }
        Ok(Err(e)) => {
            debug!("client went away before its request: {e}");
            return Ok((Protocol::Http, Outcome::Refused, None));
        }
        Err(_) => {
            let answer = Answer::new(408, "no complete request in time", Outcome::Refused);
            return Err((Protocol::Http, answer));
        }
    };
    let parsed = parse_request(head.head()).map_err(|a| (Protocol::Http, a))?;
    let protocol = parsed.protocol;
    let fail = |answer: Answer| (protocol, answer);
    let (routing, token) = credentials(parsed.authorization.as_deref()).map_err(fail)?;
    let Some(_client) = ctx.clients.connect() else {
        return Err(fail(
            Answer::new(429, "too many client connections open", Outcome::Refused)
                .with("Retry-After", "1"),
        ));
    };
    drop(handshake);
    let Some(_permit) = ctx.clients.token(&token) else {
        let body = "too many connections open with this token";
        return Err(fail(
            Answer::new(429, body, Outcome::Refused).with("Retry-After", "1"),
        ));
    };
    if let Some(report) = parsed.report {
        let answer = take_report(ctx, routing, token, report).await;
        send(client, &answer).await;
        return Ok((protocol, answer.outcome, None));
    }
    if let Err(reason) = ctx.options.policy.check(&parsed.destination) {
        return Err(fail(Answer::new(403, reason, Outcome::Refused)));
    }
    let request = RouteRequest {
        routing,
        token,
        destination: parsed.destination,
        avoid: None,
    };
    if protocol == Protocol::Connect {
        let mut tunnel = open_tunnel(ctx, request)
            .await
            .map_err(|r| fail(refused(r)))?;
        let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
        if client.write_all(established).await.is_ok() {
            let idle = ctx.options.idle_timeout;
            let bytes = ctx.metrics.pool_bytes(tunnel.route.pool.as_deref());
            let relayed = relay(
                client,
                &mut tunnel.stream,
                head.rest(),
                &tunnel.leftover,
                idle,
                &bytes,
            );
            if let Err(e) = relayed.await {
                debug!(proxy = %tunnel.route.proxy, "tunnel ended: {e}");
            }
        }
        return Ok((protocol, Outcome::Ok, tunnel.route.pool));
    }
    let plain = PlainRequest {
        head: &parsed.upstream_head,
        early_body: head.rest(),
    };
    let outcome = forward(ctx, request, plain, client).await;
    outcome
        .map(|(o, pool)| (protocol, o, pool))
        .map_err(|r| fail(refused(r)))
}

/// The request head: a CONNECT tunnel or a plain request in absolute `http://` form.
fn parse_request(head: &[u8]) -> Result<Parsed, Answer> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(Answer::bad_request("incomplete request")),
        Err(httparse::Error::TooManyHeaders) => {
            let body = format!("more than {MAX_HEADERS} header fields");
            return Err(Answer::new(431, body, Outcome::Refused));
        }
        Err(e) => return Err(Answer::bad_request(format!("not an HTTP request: {e}"))),
    }
    let method = request.method.unwrap_or_default();
    let target = request.path.unwrap_or_default();
    let authorization = request
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("proxy-authorization"))
        .map(|h| h.value.to_vec());
    if method == "CONNECT" {
        return Ok(Parsed {
            protocol: Protocol::Connect,
            destination: connect_target(target)?,
            upstream_head: Vec::new(),
            authorization,
            report: None,
        });
    }
    let lower = target.get(..8).unwrap_or(target).to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Err(Answer::bad_request(
            "https:// URLs go through a CONNECT tunnel (clients do this for https when given an http:// proxy)",
        ));
    }
    if !lower.starts_with("http://") {
        return Err(Answer::bad_request(
            "this is a proxy: send the request in absolute form (GET http://host/path) or CONNECT host:port",
        ));
    }
    let mut url = url::Url::parse(target)
        .map_err(|e| Answer::bad_request(format!("the request URL does not parse: {e}")))?;
    let host = match url.host() {
        Some(url::Host::Domain(d)) => d.to_string(),
        Some(url::Host::Ipv4(ip)) => ip.to_string(),
        Some(url::Host::Ipv6(ip)) => ip.to_string(),
        None => return Err(Answer::bad_request("the request URL has no host")),
    };
    if host == GATEWAY_HOST {
        let report = client_report::parse(method, &url)
            .map_err(|(status, reason)| Answer::new(status, reason, Outcome::Refused))?;
        return Ok(Parsed {
            protocol: Protocol::Http,
            destination: Destination { host, port: 80 },
            upstream_head: Vec::new(),
            authorization,
            report: Some(report),
        });
    }
    let destination = Destination {
        host,
        port: url.port_or_known_default().unwrap_or(80),
    };
    // Credentials in the URL and the fragment are not the destination's business.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_fragment(None);
    let version = request.version.unwrap_or(1);
    let mut upstream_head = format!("{method} {url} HTTP/1.{version}\r\n").into_bytes();
    // The Host of an absolute-form request is its URL's.
    let host_header = match url.port() {
        Some(_) => authority(&destination),
        None => url.host_str().unwrap_or_default().to_string(),
    };
    upstream_head.extend_from_slice(format!("Host: {host_header}\r\n").as_bytes());
    let listed = connection_listed(request.headers);
    for h in request.headers.iter() {
        let dropped = is_hop_by_hop(h.name)
            || h.name.eq_ignore_ascii_case("host")
            || listed.iter().any(|l| h.name.eq_ignore_ascii_case(l));
        if !dropped {
            upstream_head.extend_from_slice(h.name.as_bytes());
            upstream_head.extend_from_slice(b": ");
            upstream_head.extend_from_slice(h.value);
            upstream_head.extend_from_slice(b"\r\n");
        }
    }
    Ok(Parsed {
        protocol: Protocol::Http,
        destination,
        upstream_head,
        authorization,
        report: None,
    })
}

/// Passes a client's report to the fleet; the answer names the upstream it landed on.
async fn take_report<R: Routes>(
    ctx: &Context<'_, R>,
    routing: Routing,
    token: String,
    report: ClientReport,
) -> Answer {
    if routing.session.is_none() {
        return Answer::bad_request(
            "a report lands on the upstream of your session: add session-<id> to the proxy username, as on the requests it is about",
        );
    }
    let session = SessionReport {
        routing,
        token,
        report: report.report,
        target: report.target,
    };
    match ctx.routes.report_session(&session).await {
        Ok(proxy) => {
            let outcome = session.report.as_str();
            let body =
                serde_json::json!({"proxy": proxy, "outcome": outcome, "target": session.target});
            Answer {
                content_type: "application/json",
                ..Answer::new(200, body.to_string(), Outcome::Ok)
            }
        }
        // The report itself was wrong (a session on no proxy, a bad target): not a login
        // problem, so not the 407 a route's would be.
        Err(RouteError::Invalid(reason)) => Answer::bad_request(reason),
        Err(e) => refused(Refusal::Route(e)),
    }
}

/// `host:port` or `[v6]:port` of a CONNECT.
fn connect_target(target: &str) -> Result<Destination, Answer> {
    let bad = || Answer::bad_request("CONNECT needs host:port (e.g. CONNECT example.com:443)");
    let (host, port) = if let Some(rest) = target.strip_prefix('[') {
        let (v6, port) = rest.split_once("]:").ok_or_else(bad)?;
        (v6, port)
    } else {
        target.rsplit_once(':').ok_or_else(bad)?
    };
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(bad)?;
    if host.is_empty() {
        return Err(bad());
    }
    Ok(Destination {
        host: host.to_string(),
        port,
    })
}

/// The routing username and the token of `Proxy-Authorization: Basic`.
fn credentials(authorization: Option<&[u8]>) -> Result<(Routing, String), Answer> {
    use base64::Engine;
    let how = "send Proxy-Authorization: Basic with the routing username (may be empty, e.g. pool-<namespace>.<name>,session-<id>) and your token as the password";
    let Some(value) = authorization else {
        return Err(Answer::login_required(format!(
            "proxy authentication required: {how}"
        )));
    };
    let value = String::from_utf8_lossy(value);
    let encoded = value
        .split_once(' ')
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("basic"))
        .map(|(_, rest)| rest.trim());
    let pair = encoded
        .and_then(|e| base64::engine::general_purpose::STANDARD.decode(e).ok())
        .and_then(|bytes| String::from_utf8(bytes).ok());
    let Some((user, token)) = pair.as_deref().and_then(|p| p.split_once(':')) else {
        return Err(Answer::login_required(format!(
            "Proxy-Authorization is not Basic base64(username:token): {how}"
        )));
    };
    if token.is_empty() {
        return Err(Answer::login_required(format!("no token: {how}")));
    }
    match parse_username(user) {
        Ok(routing) => Ok((routing, token.to_string())),
        Err(reason) => {
            warn!(%reason, "refused a malformed proxy username");
            Err(Answer::login_required(format!("proxy username: {reason}"))
                .with("X-Proxy-Operator-Error", reason))
        }
    }
}

/// The answer to a request the gateway could not carry.
fn refused(refusal: Refusal) -> Answer {
    match refusal {
        Refusal::Route(RouteError::Unauthenticated) => {
            Answer::login_required("the token is not accepted")
        }
        Refusal::Route(RouteError::Invalid(reason)) => {
            warn!(%reason, "the fleet refused the proxy username");
            Answer::login_required(format!("proxy username: {reason}"))
                .with("X-Proxy-Operator-Error", reason)
        }
        Refusal::Route(RouteError::Forbidden(reason)) => Answer::new(403, reason, Outcome::Refused),
        Refusal::Route(RouteError::QuotaExceeded(reason)) => {
            Answer::new(429, reason, Outcome::Refused)
                .with("Retry-After", "5")
                .with("X-Proxy-Operator-Error", "quota-exceeded")
        }
        Refusal::Route(RouteError::NoProxy { retry_after }) => {
            let seconds = retry_after.as_secs_f64().ceil().max(1.0) as u64;
            Answer::new(503, "no upstream proxy is available now", Outcome::NoProxy)
                .with("Retry-After", seconds.to_string())
        }
        Refusal::Route(RouteError::Unavailable(reason)) => Answer::new(
            503,
            format!("the fleet cannot be asked now: {reason}"),
            Outcome::NoProxy,
        ),
        Refusal::Denied(reason) => Answer::new(403, reason, Outcome::Refused),
        Refusal::Failed(reason) => Answer::new(502, reason, Outcome::UpstreamFailed)
            .with("X-Proxy-Operator-Reason", "upstream-failed"),
    }
}

/// Writes an answer and closes the connection (write side), giving the client a moment to read.
async fn send<C: ClientStream>(client: &mut C, answer: &Answer) {
    let body = format!("{}\n", answer.body);
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        answer.status,
        phrase(answer.status),
        answer.content_type,
        body.len()
    );
    for (name, value) in &answer.headers {
        head.push_str(&format!("{name}: {}\r\n", header_safe(value)));
    }
    head.push_str("\r\n");
    head.push_str(&body);
    let written = async {
        client.write_all(head.as_bytes()).await?;
        client.shutdown().await
    };
    if let Err(e) = tokio::time::timeout(Duration::from_secs(5), written).await {
        debug!("answering a client: {e}");
    }
}

/// A header value as printable ASCII (a reason may quote a client's bytes).
fn header_safe(value: &str) -> String {
    value
        .chars()
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .collect()
}

fn phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        407 => "Proxy Authentication Required",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn basic(pair: &str) -> String {
        use base64::Engine;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }

    #[rstest]
    #[case::connect("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", Ok(("example.com", 443)))]
    #[case::connect_v6("CONNECT [2001:db8::1]:443 HTTP/1.1\r\n\r\n", Ok(("2001:db8::1", 443)))]
    #[case::connect_no_port("CONNECT example.com HTTP/1.1\r\n\r\n", Err(400))]
    #[case::connect_port_0("CONNECT example.com:0 HTTP/1.1\r\n\r\n", Err(400))]
    #[case::absolute("GET http://example.com/a?b HTTP/1.1\r\n\r\n", Ok(("example.com", 80)))]
    #[case::absolute_port("POST http://example.com:8080/ HTTP/1.1\r\n\r\n", Ok(("example.com", 8080)))]
    #[case::absolute_numeric_host("GET http://0x7f.1/ HTTP/1.1\r\n\r\n", Ok(("127.0.0.1", 80)))]
    #[case::absolute_v6("GET http://[::1]:81/ HTTP/1.1\r\n\r\n", Ok(("::1", 81)))]
    #[case::https("GET https://example.com/ HTTP/1.1\r\n\r\n", Err(400))]
    #[case::origin_form("GET /path HTTP/1.1\r\nHost: example.com\r\n\r\n", Err(400))]
    #[case::not_http("SSH-2.0-OpenSSH_9.2\r\n\r\n", Err(400))]
    fn request_targets(#[case] head: &str, #[case] expected: Result<(&str, u16), u16>) {
        let parsed = parse_request(head.as_bytes())
            .map(|p| (p.destination.host, p.destination.port))
            .map_err(|a| a.status);
        assert_eq!(parsed, expected.map(|(h, p)| (h.to_string(), p)));
    }

    #[test]
    fn too_many_headers_is_431() {
        let head = format!(
            "GET http://a.example/ HTTP/1.1\r\n{}\r\n",
            "X: y\r\n".repeat(101)
        );
        assert_eq!(parse_request(head.as_bytes()).err().unwrap().status, 431);
    }

    #[test]
    fn the_upstream_head_has_no_hop_by_hop_headers_and_the_urls_host() {
        let head = format!(
            "GET http://u:p@example.com/a#frag HTTP/1.1\r\nHost: evil.example\r\nProxy-Authorization: {}\r\nProxy-Connection: keep-alive\r\nConnection: X-Secret\r\nX-Secret: 1\r\nTE: trailers\r\nUpgrade: h2c\r\nKeep-Alive: 5\r\nAccept: */*\r\n\r\n",
            basic("u:token")
        );
        let parsed = parse_request(head.as_bytes()).ok().unwrap();
        assert_eq!(
            String::from_utf8(parsed.upstream_head).unwrap(),
            "GET http://example.com/a HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n"
        );
        assert!(parsed.authorization.is_some());
    }

    #[rstest]
    #[case::ok(Some(basic("pool-ns.p,session-a:tok")), Ok("tok"))]
    #[case::empty_username(Some(basic(":tok")), Ok("tok"))]
    #[case::token_with_colon(Some(basic("session-a:to:k")), Ok("to:k"))]
    #[case::missing(None, Err("proxy authentication required"))]
    #[case::bearer(Some("Bearer tok".to_string()), Err("is not Basic"))]
    #[case::not_base64(Some("Basic !!!".to_string()), Err("is not Basic"))]
    #[case::no_colon(Some(basic("justuser")), Err("is not Basic"))]
    #[case::no_token(Some(basic("session-a:")), Err("no token"))]
    #[case::bad_username(
        Some(basic("sesion-a:tok")),
        Err("part 1 `sesion-a`: unknown key `sesion`")
    )]
    fn credential_headers(#[case] header: Option<String>, #[case] expected: Result<&str, &str>) {
        let got = credentials(header.as_deref().map(str::as_bytes));
        match (got, expected) {
            (Ok((_, token)), Ok(want)) => assert_eq!(token, want),
            (Err(answer), Err(want)) => {
                assert_eq!(answer.status, 407);
                assert!(answer.body.contains(want), "{}", answer.body);
                assert!(
                    answer
                        .headers
                        .iter()
                        .any(|(n, _)| *n == "Proxy-Authenticate")
                );
            }
            (got, want) => panic!("{:?} vs {want:?}", got.map(|(r, _)| r).map_err(|a| a.body)),
        }
    }

    #[test]
    fn refusals_map_to_statuses() {
        let status = |r: Refusal| refused(r).status;
        assert_eq!(status(Refusal::Route(RouteError::Unauthenticated)), 407);
        assert_eq!(
            status(Refusal::Route(RouteError::Forbidden("x".into()))),
            403
        );
        assert_eq!(status(Refusal::Route(RouteError::Invalid("x".into()))), 407);
        assert_eq!(
            status(Refusal::Route(RouteError::Unavailable("x".into()))),
            503
        );
        assert_eq!(status(Refusal::Denied("x".into())), 403);
        let quota = refused(Refusal::Route(RouteError::QuotaExceeded(
            "ProxyQuota team-a/q1: gatewayConnections 2/2 in use".into(),
        )));
        assert_eq!(quota.status, 429);
        assert!(quota.body.contains("team-a/q1"), "{}", quota.body);
        let failed = refused(Refusal::Failed("x".into()));
        assert_eq!(failed.status, 502);
        assert!(
            failed
                .headers
                .contains(&("X-Proxy-Operator-Reason", "upstream-failed".into()))
        );
        let no_proxy = refused(Refusal::Route(RouteError::NoProxy {
            retry_after: Duration::from_millis(200),
        }));
        assert_eq!(no_proxy.status, 503);
        assert!(no_proxy.headers.contains(&("Retry-After", "1".into())));
    }
}
