//! The HTTP/1.1 front: `CONNECT host:port` tunnels and absolute-form requests
//! (`GET http://host/path`), the client logged in with `Proxy-Authorization: Basic` (the
//! username says what to route through, the password is the client's token).

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::{debug, warn};

use super::head::{HeadError, read_head};
use super::metrics::{Outcome, Protocol};
use super::relay::relay;
use super::upstream::{
    Context, PlainRequest, Refusal, connection_listed, forward, is_hop_by_hop, open_tunnel,
};
use super::username::parse_username;
use super::{Destination, RouteError, RouteRequest, Routes, Routing};

/// Largest request head a client may send (`431` beyond).
pub const MAX_REQUEST_HEAD: usize = 16 * 1024;
/// Most header fields in a request head.
const MAX_HEADERS: usize = 100;

/// A complete answer from the gateway itself: `Connection: close`, a plain-text body.
pub fn answer(status: u16, reason: &str, headers: &[(&str, String)], body: &str) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status} {reason}\r\n");
    for (name, value) in headers {
        out.push_str(&format!("{name}: {}\r\n", header_safe(value)));
    }
    out.push_str(&format!(
        "Content-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    out.into_bytes()
}

/// A header value that cannot end its line: what a client sent (a username part) is echoed in
/// errors, and a CR or LF in it must not make a header of its own.
fn header_safe(value: &str) -> String {
    value
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn proxy_auth_required(why: &str) -> Vec<u8> {
    let mut headers = vec![(
        "Proxy-Authenticate",
        "Basic realm=\"proxy-operator\"".to_string(),
    )];
    if !why.is_empty() {
        headers.push(("X-Proxy-Operator-Error", why.to_string()));
    }
    answer(
        407,
        "Proxy Authentication Required",
        &headers,
        &format!(
            "{}\nLog in with the routing parameters as the username and a token as the password (docs/gateway.md).\n",
            if why.is_empty() {
                "proxy credentials required"
            } else {
                why
            }
        ),
    )
}

/// The client's answer to a request that was not carried, and its outcome.
pub fn refused(refusal: &Refusal) -> (Vec<u8>, Outcome) {
    match refusal {
        Refusal::Route(RouteError::Unauthenticated) => (
            proxy_auth_required("the token (the proxy password) is not accepted"),
            Outcome::Unauthenticated,
        ),
        Refusal::Route(RouteError::Invalid(why)) => {
            (proxy_auth_required(why), Outcome::Unauthenticated)
        }
        Refusal::Route(RouteError::Forbidden(why)) => (
            answer(
                403,
                "Forbidden",
                &[("X-Proxy-Operator-Error", why.clone())],
                why,
            ),
            Outcome::Refused,
        ),
        Refusal::Route(RouteError::NoProxy { retry_after }) => (
            answer(
                503,
                "Service Unavailable",
                &[
                    ("Retry-After", retry_after.as_secs().max(1).to_string()),
                    ("X-Proxy-Operator-Reason", "no-proxy-available".into()),
                ],
                "every matching proxy is busy, cooling down for this site or unhealthy\n",
            ),
            Outcome::NoProxy,
        ),
        Refusal::Route(RouteError::Unavailable(why)) => (
            answer(
                503,
                "Service Unavailable",
                &[("X-Proxy-Operator-Reason", "leader-unavailable".into())],
                &format!("the gateway cannot ask for a route now: {why}\n"),
            ),
            Outcome::NoProxy,
        ),
        Refusal::Denied(why) => (
            answer(
                403,
                "Forbidden",
                &[("X-Proxy-Operator-Error", why.clone())],
                why,
            ),
            Outcome::Refused,
        ),
        Refusal::Failed(why) => (
            answer(
                502,
                "Bad Gateway",
                &[("X-Proxy-Operator-Reason", "upstream-failed".into())],
                &format!("{why}\n"),
            ),
            Outcome::UpstreamFailed,
        ),
    }
}

/// `host:port` of a CONNECT (an IPv6 host in brackets), the host kept without brackets.
pub fn parse_authority(text: &str) -> Option<Destination> {
    let (host, port) = text.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    let host = match host.strip_prefix('[') {
        Some(inner) => inner.strip_suffix(']')?,
        None if host.contains(':') => return None,
        None => host,
    };
    (!host.is_empty()).then(|| Destination {
        host: host.to_ascii_lowercase(),
        port,
    })
}

/// The routing and the token of `Proxy-Authorization: Basic …`; the 407 answer otherwise.
fn login(headers: &[httparse::Header<'_>]) -> Result<(Routing, String), String> {
    use base64::Engine;
    let Some(value) = headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("proxy-authorization"))
        .map(|h| h.value)
    else {
        return Err(String::new());
    };
    let text =
        std::str::from_utf8(value).map_err(|_| "Proxy-Authorization is not text".to_string())?;
    let Some((scheme, encoded)) = text.trim().split_once(' ') else {
        return Err("Proxy-Authorization: expected `Basic <base64 of username:token>`".into());
    };
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(format!(
            "Proxy-Authorization: the scheme is `{}`; the gateway takes Basic",
            header_safe(&scheme.chars().take(32).collect::<String>())
        ));
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| "Proxy-Authorization: not base64".to_string())?;
    let pair =
        String::from_utf8(decoded).map_err(|_| "Proxy-Authorization: not UTF-8".to_string())?;
    let Some((username, token)) = pair.split_once(':') else {
        return Err("Proxy-Authorization: expected username:token".into());
    };
    if token.is_empty() {
        return Err("the token (the proxy password) is empty".into());
    }
    let routing = parse_username(username).map_err(|e| format!("username: {e}"))?;
    Ok((routing, token.to_string()))
}

/// A request the gateway will carry, once a route is found.
struct Admitted {
    protocol: Protocol,
    routing: Routing,
    token: String,
    destination: Destination,
    /// For a plain request: its head as it goes upstream.
    upstream_head: Vec<u8>,
}

/// What a request head asks for, checked (the request, the login, the destination and the
/// policy); otherwise the answer to send and the outcome to count.
fn admit(
    head: &[u8],
    policy: &super::policy::DestinationPolicy,
) -> Result<Admitted, (Protocol, Vec<u8>, Outcome)> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let parsed = request.parse(head);
    let (Ok(httparse::Status::Complete(_)), Some(method), Some(target)) =
        (parsed, request.method, request.path)
    else {
        let bytes = answer(400, "Bad Request", &[], "not an HTTP/1.1 proxy request\n");
        return Err((Protocol::Http, bytes, Outcome::Refused));
    };
    let protocol = if method == "CONNECT" {
        Protocol::Connect
    } else {
        Protocol::Http
    };
    let (routing, token) = login(request.headers).map_err(|why| {
        if !why.is_empty() {
            warn!(reason = %header_safe(&why), "refused a client's proxy login");
        }
        (
            protocol,
            proxy_auth_required(&why),
            Outcome::Unauthenticated,
        )
    })?;
    let destination = if protocol == Protocol::Connect {
        parse_authority(target)
    } else {
        absolute_destination(target)
    };
    let Some(destination) = destination else {
        let why = if protocol == Protocol::Connect {
            "CONNECT needs host:port"
        } else if target.starts_with("https://") {
            "an https:// URL goes through CONNECT (set the gateway as the HTTPS proxy)"
        } else {
            "the request target must be an absolute http:// URL (this is a proxy)"
        };
        let bytes = answer(400, "Bad Request", &[], &format!("{why}\n"));
        return Err((protocol, bytes, Outcome::Refused));
    };
    if let Err(why) = policy.check(&destination) {
        let bytes = answer(
            403,
            "Forbidden",
            &[("X-Proxy-Operator-Error", why.clone())],
            &format!("{why}\n"),
        );
        return Err((protocol, bytes, Outcome::Refused));
    }
    let upstream_head = if protocol == Protocol::Connect {
        Vec::new()
    } else {
        upstream_head(method, target, request.headers)
    };
    Ok(Admitted {
        protocol,
        routing,
        token,
        destination,
        upstream_head,
    })
}

/// One client connection on the HTTP port.
pub async fn handle<R: Routes>(ctx: &Context<'_, R>, mut client: TcpStream) {
    let head = match tokio::time::timeout(
        ctx.options.handshake_timeout,
        read_head(&mut client, MAX_REQUEST_HEAD),
    )
    .await
    {
        Ok(Ok(head)) => head,
        Ok(Err(HeadError::TooLarge)) => {
            let body = format!("the request head is larger than {MAX_REQUEST_HEAD} bytes\n");
            let _ = client
                .write_all(&answer(431, "Request Header Fields Too Large", &[], &body))
                .await;
            ctx.metrics.request(Protocol::Http, Outcome::Refused);
            return;
        }
        Ok(Err(e)) => {
            debug!("client closed before its request: {e}");
            return;
        }
        Err(_) => {
            debug!("no request head within the handshake timeout");
            return;
        }
    };
    let admitted = match admit(head.head(), &ctx.options.policy) {
        Ok(admitted) => admitted,
        Err((protocol, bytes, outcome)) => {
            let _ = client.write_all(&bytes).await;
            ctx.metrics.request(protocol, outcome);
            return;
        }
    };
    let Admitted {
        protocol,
        routing,
        token,
        destination,
        upstream_head,
    } = admitted;
    let Some(_token_permit) = ctx.clients.token(&token) else {
        let _ = client
            .write_all(&answer(
                429,
                "Too Many Requests",
                &[("Retry-After", "1".into())],
                "too many connections open with this token\n",
            ))
            .await;
        ctx.metrics.request(protocol, Outcome::Refused);
        return;
    };
    let route_request = RouteRequest {
        routing,
        token,
        destination,
        avoid: None,
    };
    let outcome = if protocol == Protocol::Connect {
        tunnel(ctx, &mut client, route_request, head.rest()).await
    } else {
        let plain = PlainRequest {
            head: &upstream_head,
            early_body: head.rest(),
        };
        match forward(ctx, route_request, plain, &mut client).await {
            Ok(outcome) => outcome,
            Err(refusal) => {
                let (bytes, outcome) = refused(&refusal);
                let _ = client.write_all(&bytes).await;
                outcome
            }
        }
    };
    ctx.metrics.request(protocol, outcome);
}

async fn tunnel<R: Routes>(
    ctx: &Context<'_, R>,
    client: &mut TcpStream,
    request: RouteRequest,
    early: &[u8],
) -> Outcome {
    match open_tunnel(ctx, request).await {
        Ok(mut tunnel) => {
            if client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .is_err()
            {
                return Outcome::Ok;
            }
            if let Err(e) = relay(
                client,
                &mut tunnel.stream,
                early,
                &tunnel.leftover,
                ctx.options.idle_timeout,
            )
            .await
            {
                debug!(proxy = %tunnel.route.proxy, "tunnel ended: {e}");
            }
            Outcome::Ok
        }
        Err(refusal) => {
            let (bytes, outcome) = refused(&refusal);
            let _ = client.write_all(&bytes).await;
            outcome
        }
    }
}

/// The destination of an absolute-form `http://` request target.
fn absolute_destination(target: &str) -> Option<Destination> {
    let url = url::Url::parse(target).ok()?;
    if url.scheme() != "http" {
        return None;
    }
    let host = url.host_str()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some(Destination {
        host: host.to_ascii_lowercase(),
        port: url.port_or_known_default()?,
    })
}

/// The request line and end-to-end headers as they go upstream (no blank line: the upstream
/// login and `Connection: close` follow).
fn upstream_head(method: &str, target: &str, headers: &[httparse::Header<'_>]) -> Vec<u8> {
    let listed = connection_listed(headers);
    let mut out = format!("{method} {target} HTTP/1.1\r\n").into_bytes();
    for h in headers {
        if is_hop_by_hop(h.name) || listed.iter().any(|l| h.name.eq_ignore_ascii_case(l)) {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("example.com:443", Some(("example.com", 443)))]
    #[case("Example.COM:80", Some(("example.com", 80)))]
    #[case("[2001:db8::1]:443", Some(("2001:db8::1", 443)))]
    #[case("2001:db8::1:443", None)]
    #[case("example.com", None)]
    #[case("example.com:0", None)]
    #[case("example.com:99999", None)]
    #[case(":443", None)]
    #[case("[::1:443", None)]
    fn connect_authorities(#[case] text: &str, #[case] want: Option<(&str, u16)>) {
        let got = parse_authority(text);
        assert_eq!(
            got.as_ref().map(|d| (d.host.as_str(), d.port)),
            want,
            "{text}"
        );
    }

    #[rstest]
    #[case("http://example.com/a?b", Some(("example.com", 80)))]
    #[case("http://[::1]:8080/", Some(("::1", 8080)))]
    #[case("https://example.com/", None)]
    #[case("/origin-form", None)]
    #[case("ftp://example.com/", None)]
    fn absolute_targets(#[case] text: &str, #[case] want: Option<(&str, u16)>) {
        let got = absolute_destination(text);
        assert_eq!(
            got.as_ref().map(|d| (d.host.as_str(), d.port)),
            want,
            "{text}"
        );
    }

    fn basic(pair: &str) -> Vec<u8> {
        use base64::Engine;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
        .into_bytes()
    }

    #[test]
    fn logins_are_read_and_refusals_name_what_is_wrong() {
        let value = basic("pool-crawlers.egress,session-a1:tok");
        let headers = [httparse::Header {
            name: "Proxy-Authorization",
            value: &value,
        }];
        let (routing, token) = login(&headers).unwrap();
        assert_eq!(routing.pool, Some(("crawlers".into(), "egress".into())));
        assert_eq!(routing.session.as_deref(), Some("a1"));
        assert_eq!(token, "tok");
        assert_eq!(login(&[]), Err(String::new()));
        for (pair, wanted) in [
            ("pool-a.b:", "empty"),
            ("sesion-x:tok", "sesion"),
            ("no-colon", "username:token"),
        ] {
            let value = basic(pair);
            let headers = [httparse::Header {
                name: "proxy-authorization",
                value: &value,
            }];
            let why = login(&headers).unwrap_err();
            assert!(why.contains(wanted), "{pair}: {why}");
        }
        let bearer = [httparse::Header {
            name: "Proxy-Authorization",
            value: b"Bearer x",
        }];
        assert!(login(&bearer).unwrap_err().contains("Basic"));
    }

    #[test]
    fn what_a_client_sent_cannot_make_a_header_of_its_own() {
        let bytes = answer(
            407,
            "Proxy Authentication Required",
            &[("X-Proxy-Operator-Error", "bad\r\nSet-Cookie: x".into())],
            "",
        );
        let text = String::from_utf8(bytes).unwrap();
        assert!(
            text.contains("X-Proxy-Operator-Error: bad??Set-Cookie: x\r\n"),
            "{text}"
        );
        assert!(!text.contains("\r\nSet-Cookie"));
    }

    #[test]
    fn the_clients_login_and_hop_by_hop_headers_never_go_upstream() {
        let headers = [
            httparse::Header {
                name: "Host",
                value: b"example.com",
            },
            httparse::Header {
                name: "Proxy-Authorization",
                value: b"Basic c2VjcmV0",
            },
            httparse::Header {
                name: "Proxy-Connection",
                value: b"keep-alive",
            },
            httparse::Header {
                name: "Connection",
                value: b"X-Private",
            },
            httparse::Header {
                name: "X-Private",
                value: b"1",
            },
            httparse::Header {
                name: "Accept",
                value: b"*/*",
            },
        ];
        let head =
            String::from_utf8(upstream_head("GET", "http://example.com/", &headers)).unwrap();
        assert_eq!(
            head,
            "GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n"
        );
    }
}
