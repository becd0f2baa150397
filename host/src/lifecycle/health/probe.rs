//! One health probe: an HTTP `CONNECT` through the proxy to a target, as a crawler would use it
//! (or, for a SOCKS5 upstream, a SOCKS5 `CONNECT`: `crate::support::socks`).
//! Written on a bare TCP stream: reqwest hides the proxy's answer to CONNECT behind its own
//! error types, and the probe needs exactly that answer (status code, timing), nothing more; its
//! status line is read by httparse.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::provider::credentials::ProxyLogin;
use crate::support::socks::{self, ProxyProtocol, Socks5Failure};

/// Largest CONNECT response head read (squid sends a few hundred bytes).
const MAX_HEAD: usize = 8 * 1024;

/// Why a probe failed. `reason()` is a fixed set, used as a metric label.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ProbeFailure {
    #[error("cannot connect to the proxy: {0}")]
    Connect(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("the proxy answered CONNECT with HTTP {0}{hint}", hint = status_hint(*.0))]
    Status(u16),
    #[error("the proxy's answer is not HTTP: {0}")]
    Protocol(String),
    /// A SOCKS5 upstream did not open the tunnel.
    #[error("SOCKS5: {0}")]
    Socks5(Socks5Failure),
}

/// What usually causes a refusal, for the statuses where that is known.
fn status_hint(code: u16) -> &'static str {
    match code {
        // squid's `http_access deny`, as every provider configures it.
        403 => {
            ": the proxy refused the request; usually the operator's address is not in the \
             provider's `allowFrom`, the port of --health-target is not in its `connectPorts`, \
             or the target's address is in the proxy's own network (loopback, private, \
             link-local) and not in its `allowDestinations`"
        }
        // squid's basic auth: the credentials sent are not the ones its password file has.
        407 => {
            ": the proxy did not accept its credentials; the Proxy's credentials Secret may have \
             changed without reaching the proxy (see the Proxy's events), or the proxy was made \
             before its credentials were known to this operator"
        }
        _ => "",
    }
}

impl ProbeFailure {
    pub fn reason(&self) -> &'static str {
        match self {
            ProbeFailure::Connect(_) => "connect",
            ProbeFailure::Timeout(_) => "timeout",
            ProbeFailure::Status(_) => "status",
            ProbeFailure::Protocol(_) => "protocol",
            ProbeFailure::Socks5(Socks5Failure::Reply { .. }) => "status",
            ProbeFailure::Socks5(Socks5Failure::LoginRefused(_))
            | ProbeFailure::Socks5(Socks5Failure::NoAcceptableMethod(_)) => "status",
            ProbeFailure::Socks5(_) => "protocol",
        }
    }
}

/// `CONNECT target` through `address:port` (in HTTP or SOCKS5, as `protocol` says), with the
/// proxy's credentials when it has them; the latency until the proxy said 2xx (SOCKS5:
/// succeeded).
pub async fn probe(
    address: &str,
    port: u16,
    protocol: ProxyProtocol,
    target: &str,
    login: Option<&ProxyLogin>,
    timeout: Duration,
) -> Result<Duration, ProbeFailure> {
    let started = Instant::now();
    let connect = async {
        match protocol {
            ProxyProtocol::Http => {
                let authorization = login.map(ProxyLogin::basic_authorization);
                connect_through(address, port, target, authorization.as_deref()).await
            }
            ProxyProtocol::Socks5 => socks5_through(address, port, target, login).await,
        }
    };
    match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(())) => Ok(started.elapsed()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ProbeFailure::Timeout(timeout)),
    }
}

async fn connect_through(
    address: &str,
    port: u16,
    target: &str,
    authorization: Option<&str>,
) -> Result<(), ProbeFailure> {
    let mut stream = TcpStream::connect((address, port))
        .await
        .map_err(|e| ProbeFailure::Connect(e.to_string()))?;
    let _ = stream.set_nodelay(true);
    let credentials = authorization
        .map(|value| format!("Proxy-Authorization: {value}\r\n"))
        .unwrap_or_default();
    let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{credentials}\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| ProbeFailure::Connect(e.to_string()))?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream
            .read(&mut buf)
            .await
            .map_err(|e| ProbeFailure::Protocol(e.to_string()))?;
        if n == 0 {
            return Err(ProbeFailure::Protocol(
                "connection closed before a response".into(),
            ));
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            return Err(ProbeFailure::Protocol(format!(
                "response head larger than {MAX_HEAD} bytes"
            )));
        }
    }
    connect_answer(&head)
}

/// A SOCKS5 `CONNECT target` through the upstream at `address:port`, logging in (RFC 1929) when
/// the operator holds its login.
async fn socks5_through(
    address: &str,
    port: u16,
    target: &str,
    login: Option<&ProxyLogin>,
) -> Result<(), ProbeFailure> {
    let (host, target_port) = match target.strip_prefix('[') {
        Some(v6) => v6.split_once("]:"),
        None => target.rsplit_once(':'),
    }
    .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
    .ok_or_else(|| ProbeFailure::Protocol(format!("--health-target {target} is not host:port")))?;
    let mut stream = TcpStream::connect((address, port))
        .await
        .map_err(|e| ProbeFailure::Connect(e.to_string()))?;
    let _ = stream.set_nodelay(true);
    let login = login.map(|l| (l.username(), l.password()));
    socks::connect(&mut stream, host, target_port, login)
        .await
        .map_err(ProbeFailure::Socks5)
}

/// What a proxy's answer to CONNECT (its response head) says: 2xx is a tunnel.
fn connect_answer(head: &[u8]) -> Result<(), ProbeFailure> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    // Only the status line matters, and httparse has read it (`code`) before any header it may
    // refuse: odd or too many headers after a good status line do not fail the probe.
    let _ = response.parse(head);
    match response.code {
        Some(code) if (200..300).contains(&code) => Ok(()),
        Some(code) => Err(ProbeFailure::Status(code)),
        None => Err(unreadable_status_line(head)),
    }
}

fn unreadable_status_line(head: &[u8]) -> ProbeFailure {
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    ProbeFailure::Protocol(format!(
        "status line `{}`",
        String::from_utf8_lossy(line)
            .trim()
            .chars()
            .take(80)
            .collect::<String>()
    ))
}

/// Largest answer read from the exit-IP service (an address, or a small JSON object).
const MAX_EXIT_IP_BODY: usize = 4 * 1024;

/// Asks `url` through the proxy at `address:port` which address the request came from: the
/// proxy's exit IP, as the service saw it. The service answers with the address as plain text
/// (ipify, icanhazip, `ifconfig.me/ip`) or as JSON with an `ip` or `origin` field (httpbin).
pub async fn exit_ip(
    address: &str,
    port: u16,
    login: Option<&ProxyLogin>,
    url: &str,
    timeout: Duration,
) -> Result<std::net::IpAddr, String> {
    let host = if address.contains(':') {
        format!("[{address}]")
    } else {
        address.to_string()
    };
    let mut proxy = reqwest::Proxy::all(format!("http://{host}:{port}"))
        .map_err(|e| format!("proxy address {host}:{port}: {e}"))?;
    if let Some(login) = login {
        proxy = proxy.basic_auth(login.username(), login.password());
    }
    // A client per request: the proxy is part of the client, and an exit IP is asked for
    // rarely (once per status refresh and proxy).
    let client = reqwest::Client::builder()
        .proxy(proxy)
        .timeout(timeout)
        .build()
        .map_err(|e| format!("HTTP client: {e}"))?;
    let mut response = client
        .get(url)
        .send()
        .await
        .map_err(|e| format!("GET {url} through the proxy: {e}"))?;
    if !response.status().is_success() {
        return Err(format!("GET {url} answered {}", response.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?
    {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_EXIT_IP_BODY {
            return Err(format!(
                "GET {url}: answer longer than {MAX_EXIT_IP_BODY} bytes; use a service that answers with the address only"
            ));
        }
    }
    parse_exit_ip(&body).ok_or_else(|| {
        format!(
            "GET {url}: no address in the answer `{}`",
            String::from_utf8_lossy(&body)
                .trim()
                .chars()
                .take(80)
                .collect::<String>()
        )
    })
}

/// The address in an exit-IP service's answer: the whole body, or the `ip` / `origin` field of
/// a JSON object (httpbin's `origin` may list forwarders after it: the first is the client).
fn parse_exit_ip(body: &[u8]) -> Option<std::net::IpAddr> {
    let text = std::str::from_utf8(body).ok()?.trim();
    if let Ok(ip) = text.parse() {
        return Some(ip);
    }
    let json: serde_json::Value = serde_json::from_str(text).ok()?;
    ["ip", "origin"].iter().find_map(|field| {
        json.get(field)?
            .as_str()?
            .split(',')
            .next()?
            .trim()
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A proxy that answers every CONNECT with `status_line`.
    async fn answering(status_line: &'static str) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = socket.read(&mut buf).await;
                let _ = socket
                    .write_all(format!("{status_line}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                    .await;
            }
        });
        addr
    }

    /// A 403 to CONNECT is the proxy's access rules, nearly always: say which ones.
    #[tokio::test]
    async fn a_refused_connect_says_what_usually_causes_it() {
        let addr = answering("HTTP/1.1 403 Forbidden").await;
        let failure = probe(
            "127.0.0.1",
            addr.port(),
            ProxyProtocol::Http,
            "www.example.com:443",
            None,
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert_eq!(failure, ProbeFailure::Status(403));
        let message = failure.to_string();
        for part in [
            "HTTP 403",
            "allowFrom",
            "connectPorts",
            "--health-target",
            "allowDestinations",
        ] {
            assert!(
                message.contains(part),
                "`{message}` should mention `{part}`"
            );
        }
        // Other statuses keep the plain message.
        let addr = answering("HTTP/1.1 502 Bad Gateway").await;
        let failure = probe(
            "127.0.0.1",
            addr.port(),
            ProxyProtocol::Http,
            "www.example.com:443",
            None,
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert_eq!(
            failure.to_string(),
            "the proxy answered CONNECT with HTTP 502"
        );
    }

    #[rstest::rstest]
    #[case::established("HTTP/1.1 200 Connection established\r\n\r\n", Ok(()))]
    #[case::http_1_0_without_reason("HTTP/1.0 200\r\n\r\n", Ok(()))]
    #[case::any_2xx("HTTP/1.1 204 No Content\r\nVia: squid\r\n\r\n", Ok(()))]
    #[case::refused(
        "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n",
        Err(ProbeFailure::Status(403))
    )]
    #[case::bad_gateway("HTTP/1.1 502 Bad Gateway\r\n\r\n", Err(ProbeFailure::Status(502)))]
    #[case::odd_header_after_a_good_status("HTTP/1.1 200 OK\r\nbad header\r\n\r\n", Ok(()))]
    #[case::not_http("SSH-2.0-OpenSSH_9.2\r\n\r\n", Err(ProbeFailure::Protocol("status line `SSH-2.0-OpenSSH_9.2`".into())))]
    #[case::no_status_code("HTTP/1.1 OK\r\n\r\n", Err(ProbeFailure::Protocol("status line `HTTP/1.1 OK`".into())))]
    fn the_answer_to_connect_decides_the_probe(
        #[case] head: &str,
        #[case] expected: Result<(), ProbeFailure>,
    ) {
        assert_eq!(connect_answer(head.as_bytes()), expected);
    }

    #[test]
    fn exit_ip_answers_of_common_services_are_understood() {
        let ip = |s: &str| parse_exit_ip(s.as_bytes()).map(|a| a.to_string());
        assert_eq!(ip("203.0.113.7\n").as_deref(), Some("203.0.113.7"));
        assert_eq!(ip("2001:db8::1").as_deref(), Some("2001:db8::1"));
        assert_eq!(
            ip(r#"{"ip":"203.0.113.7"}"#).as_deref(),
            Some("203.0.113.7")
        );
        assert_eq!(
            ip(r#"{"origin": "203.0.113.7, 198.51.100.2"}"#).as_deref(),
            Some("203.0.113.7")
        );
        assert_eq!(ip("<html>blocked</html>"), None);
        assert_eq!(ip(r#"{"ip": 7}"#), None);
        assert_eq!(ip(""), None);
    }
}
