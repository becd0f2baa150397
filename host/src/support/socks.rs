//! SOCKS5 upstreams: how the operator speaks to a proxy ([`ProxyProtocol`]), and the client side
//! of a SOCKS5 handshake (RFC 1928 `CONNECT`, with RFC 1929 username/password when the operator
//! holds the upstream's login), used by the health probe and the gateway.
//!
//! Written here rather than with a SOCKS crate (`tokio-socks`, which reqwest's `socks` feature
//! pulls in, or `fast-socks5`): the callers need the server's exact answer — which reply code,
//! whether the method or the login was refused — to tell a refused destination (not the
//! upstream's fault, not retried) from a failing upstream (reported, another one tried), and
//! they run the handshake on a connection they opened and time themselves; the subset is a few
//! bounded reads, the same as the gateway's own SOCKS5 server side (`gateway/socks5.rs`). A new
//! crate would also change the image recipe (Cargo.lock) for ~100 lines.

use std::net::{Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How a proxy is spoken to. Every proxy the operator makes speaks HTTP; an upstream one (the
/// `upstream` provider) may speak SOCKS5.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyProtocol {
    #[default]
    Http,
    Socks5,
}

impl ProxyProtocol {
    /// The URL scheme: `http` or `socks5`.
    pub fn scheme(self) -> &'static str {
        match self {
            ProxyProtocol::Http => "http",
            ProxyProtocol::Socks5 => "socks5",
        }
    }

    /// The protocol a proxy URL's scheme names (`socks5h` is `socks5`: the operator always
    /// lets the upstream resolve names); `None` for a scheme the operator does not speak.
    pub fn of_scheme(scheme: &str) -> Option<Self> {
        match scheme.to_ascii_lowercase().as_str() {
            "http" => Some(ProxyProtocol::Http),
            "socks5" | "socks5h" => Some(ProxyProtocol::Socks5),
            _ => None,
        }
    }

    pub fn is_http(self) -> bool {
        self == ProxyProtocol::Http
    }
}

const VERSION: u8 = 5;
const NO_AUTH: u8 = 0x00;
const USERNAME_PASSWORD: u8 = 0x02;
const NO_ACCEPTABLE_METHOD: u8 = 0xFF;
const AUTH_VERSION: u8 = 1;
const CONNECT: u8 = 1;
const ATYP_IPV4: u8 = 1;
const ATYP_DOMAIN: u8 = 3;
const ATYP_IPV6: u8 = 4;

/// Why a SOCKS5 `CONNECT` through an upstream did not open a tunnel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Socks5Failure {
    /// Reading or writing failed, or the server closed the connection.
    #[error("the SOCKS5 handshake broke off: {0}")]
    Io(String),
    /// The server spoke something else.
    #[error("the answer is not SOCKS5: {0}")]
    Protocol(String),
    /// The server accepts none of the methods offered (e.g. it requires a login the operator
    /// does not hold).
    #[error(
        "the SOCKS5 server accepts none of the methods offered ({0}); it may require a login: set upstream.credentials"
    )]
    NoAcceptableMethod(&'static str),
    /// The server refused the username and password (RFC 1929 status not 0).
    #[error(
        "the SOCKS5 server refused the login (RFC 1929 status {0}); check upstream.credentials"
    )]
    LoginRefused(u8),
    /// The server answered the `CONNECT` with a failure reply (RFC 1928 section 6).
    #[error("the SOCKS5 server answered CONNECT with reply {code:#04x} ({})", reply_text(*.code))]
    Reply { code: u8 },
    /// The destination cannot be written in a SOCKS5 request (a name over 255 bytes).
    #[error("the destination {0} cannot be sent in a SOCKS5 request")]
    Destination(String),
}

impl Socks5Failure {
    /// The server's rules refused the destination (reply 0x02): the upstream works, this
    /// destination is not allowed through it.
    pub fn is_not_allowed(&self) -> bool {
        matches!(self, Socks5Failure::Reply { code: 0x02 })
    }
}

/// What RFC 1928 calls a reply code.
fn reply_text(code: u8) -> &'static str {
    match code {
        0x01 => "general SOCKS server failure",
        0x02 => "connection not allowed by ruleset",
        0x03 => "network unreachable",
        0x04 => "host unreachable",
        0x05 => "connection refused",
        0x06 => "TTL expired",
        0x07 => "command not supported",
        0x08 => "address type not supported",
        _ => "unassigned",
    }
}

fn io(e: std::io::Error) -> Socks5Failure {
    Socks5Failure::Io(e.to_string())
}

/// `CONNECT host:port` through the SOCKS5 server at the other end of `stream`, logging in with
/// `login` (user name, password) when given. On success the stream is the tunnel. A name is
/// sent as a name: the server resolves it, as an HTTP proxy would.
pub async fn connect<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    host: &str,
    port: u16,
    login: Option<(&str, &str)>,
) -> Result<(), Socks5Failure> {
    negotiate(stream, login).await?;
    let mut request = vec![VERSION, CONNECT, 0];
    if let Ok(v4) = host.parse::<Ipv4Addr>() {
        request.push(ATYP_IPV4);
        request.extend_from_slice(&v4.octets());
    } else if let Ok(v6) = host.trim_matches(['[', ']']).parse::<Ipv6Addr>() {
        request.push(ATYP_IPV6);
        request.extend_from_slice(&v6.octets());
    } else {
        let name = host.as_bytes();
        let len = u8::try_from(name.len())
            .ok()
            .filter(|l| *l > 0)
            .ok_or_else(|| Socks5Failure::Destination(format!("{host}:{port}")))?;
        request.extend_from_slice(&[ATYP_DOMAIN, len]);
        request.extend_from_slice(name);
    }
    request.extend_from_slice(&port.to_be_bytes());
    stream.write_all(&request).await.map_err(io)?;
    let mut head = [0u8; 4];
    stream.read_exact(&mut head).await.map_err(io)?;
    if head[0] != VERSION {
        return Err(Socks5Failure::Protocol(format!(
            "reply version {}",
            head[0]
        )));
    }
    if head[1] != 0 {
        return Err(Socks5Failure::Reply { code: head[1] });
    }
    // The bound address, read past and not used.
    let rest = match head[3] {
        ATYP_IPV4 => 4 + 2,
        ATYP_IPV6 => 16 + 2,
        ATYP_DOMAIN => stream.read_u8().await.map_err(io)? as usize + 2,
        other => {
            return Err(Socks5Failure::Protocol(format!(
                "bound address type {other}"
            )));
        }
    };
    let mut bound = vec![0u8; rest];
    stream.read_exact(&mut bound).await.map_err(io)?;
    Ok(())
}

/// The method negotiation, and the RFC 1929 login when the server chooses it.
async fn negotiate<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    login: Option<(&str, &str)>,
) -> Result<(), Socks5Failure> {
    let greeting: &[u8] = match login {
        Some(_) => &[VERSION, 2, NO_AUTH, USERNAME_PASSWORD],
        None => &[VERSION, 1, NO_AUTH],
    };
    stream.write_all(greeting).await.map_err(io)?;
    let mut chosen = [0u8; 2];
    stream.read_exact(&mut chosen).await.map_err(io)?;
    if chosen[0] != VERSION {
        return Err(Socks5Failure::Protocol(format!(
            "method reply version {}",
            chosen[0]
        )));
    }
    match (chosen[1], login) {
        (NO_AUTH, _) => Ok(()),
        (USERNAME_PASSWORD, Some((username, password))) => {
            let (user, pass) = (username.as_bytes(), password.as_bytes());
            let too_long = |what| Socks5Failure::Destination(format!("{what} over 255 bytes"));
            let user_len = u8::try_from(user.len()).map_err(|_| too_long("a user name"))?;
            let pass_len = u8::try_from(pass.len()).map_err(|_| too_long("a password"))?;
            let mut message = Vec::with_capacity(3 + user.len() + pass.len());
            message.extend_from_slice(&[AUTH_VERSION, user_len]);
            message.extend_from_slice(user);
            message.push(pass_len);
            message.extend_from_slice(pass);
            stream.write_all(&message).await.map_err(io)?;
            let mut status = [0u8; 2];
            stream.read_exact(&mut status).await.map_err(io)?;
            match status[1] {
                0 => Ok(()),
                refused => Err(Socks5Failure::LoginRefused(refused)),
            }
        }
        (NO_ACCEPTABLE_METHOD, Some(_)) => {
            Err(Socks5Failure::NoAcceptableMethod("none, username/password"))
        }
        (NO_ACCEPTABLE_METHOD, None) => Err(Socks5Failure::NoAcceptableMethod("none")),
        (other, _) => Err(Socks5Failure::Protocol(format!(
            "the server chose method {other:#04x}, which was not offered"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `connect` against a scripted server: what it answers, and what the client sent.
    async fn against(
        answers: &'static [u8],
        host: &str,
        login: Option<(&str, &str)>,
    ) -> (Result<(), Socks5Failure>, Vec<u8>) {
        let (mut client, mut server) = tokio::io::duplex(1024);
        let server = tokio::spawn(async move {
            server.write_all(answers).await.unwrap();
            let mut sent = Vec::new();
            let _ = server.read_to_end(&mut sent).await;
            sent
        });
        let result = connect(&mut client, host, 443, login).await;
        drop(client);
        (result, server.await.unwrap())
    }

    #[tokio::test]
    async fn a_name_is_sent_as_a_name_and_the_login_as_rfc_1929_says() {
        let answers = &[5, 2, 1, 0, 5, 0, 0, 1, 127, 0, 0, 1, 0x1f, 0x90];
        let (result, sent) = against(answers, "example.com", Some(("u", "pw"))).await;
        assert_eq!(result, Ok(()));
        let mut expected = vec![5, 2, 0, 2, 1, 1, b'u', 2, b'p', b'w', 5, 1, 0, 3, 11];
        expected.extend_from_slice(b"example.com");
        expected.extend_from_slice(&[1, 187]);
        assert_eq!(sent, expected);
    }

    #[tokio::test]
    async fn each_refusal_is_told_apart() {
        type Case = (
            &'static [u8],
            Option<(&'static str, &'static str)>,
            Socks5Failure,
        );
        let cases: [Case; 5] = [
            (&[5, 0xFF], None, Socks5Failure::NoAcceptableMethod("none")),
            (
                &[5, 2, 1, 1],
                Some(("u", "bad")),
                Socks5Failure::LoginRefused(1),
            ),
            (
                &[5, 0, 5, 2, 0, 1, 0, 0, 0, 0, 0, 0],
                None,
                Socks5Failure::Reply { code: 2 },
            ),
            (
                &[5, 2],
                None,
                Socks5Failure::Protocol(
                    "the server chose method 0x02, which was not offered".into(),
                ),
            ),
            (
                b"HTTP/1.1 400 Bad Request\r\n",
                None,
                Socks5Failure::Protocol("method reply version 72".into()),
            ),
        ];
        for (answers, login, expected) in cases {
            let (result, _) = against(answers, "10.0.0.1", login).await;
            assert_eq!(result, Err(expected));
        }
        let refused = Socks5Failure::Reply { code: 2 };
        assert!(refused.is_not_allowed());
        assert!(refused.to_string().contains("not allowed by ruleset"));
    }

    #[tokio::test]
    async fn addresses_go_as_addresses() {
        let answers = &[
            5, 0, 5, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 80,
        ];
        let (result, sent) = against(answers, "2001:db8::1", None).await;
        assert_eq!(result, Ok(()));
        assert_eq!(&sent[3..7], &[5, 1, 0, 4]);
        assert_eq!(sent.len(), 3 + 4 + 16 + 2);
        assert_eq!(
            ProxyProtocol::of_scheme("SOCKS5H"),
            Some(ProxyProtocol::Socks5)
        );
        assert_eq!(ProxyProtocol::of_scheme("socks4"), None);
    }
}
