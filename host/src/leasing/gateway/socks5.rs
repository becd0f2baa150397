//! SOCKS5 (RFC 1928) with username/password (RFC 1929) and the CONNECT command: the username
//! says what to route through, the password is the client's token. A domain name is passed to
//! the upstream proxy as a name, never resolved here.
//!
//! Written here rather than with a SOCKS crate: the login and the routing happen inside the
//! handshake (the username is parsed, the route asked for before the reply), which the server
//! crates' fixed auth callbacks do not fit, and the protocol subset is a few bounded reads.

use std::net::{Ipv4Addr, Ipv6Addr};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::{debug, warn};

use super::load::HandshakePermit;
use super::metrics::{Outcome, Protocol};
use super::relay::relay;
use super::upstream::{Context, Refusal, open_tunnel};
use super::username::parse_username;
use super::{Destination, RouteError, RouteRequest, Routes, Routing};

const VERSION: u8 = 5;
const USERNAME_PASSWORD: u8 = 0x02;
const NO_ACCEPTABLE_METHOD: u8 = 0xFF;
const AUTH_VERSION: u8 = 1;
const CONNECT: u8 = 1;

/// RFC 1928 reply codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Reply {
    Succeeded = 0x00,
    GeneralFailure = 0x01,
    NotAllowed = 0x02,
    HostUnreachable = 0x04,
    CommandNotSupported = 0x07,
    AddressTypeNotSupported = 0x08,
}

/// What went wrong in a handshake, answered or not.
#[derive(Debug)]
enum Handshake {
    /// The peer spoke something else, or went away: close without a word.
    Close,
    /// Answered already; the outcome to count.
    Answered(Outcome),
}

impl From<std::io::Error> for Handshake {
    fn from(_: std::io::Error) -> Self {
        Handshake::Close
    }
}

/// The reply for a tunnel that was not opened.
pub fn reply_for(refusal: &Refusal) -> (Reply, Outcome) {
    match refusal {
        Refusal::Route(RouteError::Unauthenticated | RouteError::Invalid(_)) => {
            (Reply::NotAllowed, Outcome::Unauthenticated)
        }
        Refusal::Route(RouteError::Forbidden(_) | RouteError::QuotaExceeded(_))
        | Refusal::Denied(_) => (Reply::NotAllowed, Outcome::Refused),
        Refusal::Route(RouteError::NoProxy { .. } | RouteError::Unavailable(_)) => {
            (Reply::GeneralFailure, Outcome::NoProxy)
        }
        Refusal::Failed(_) => (Reply::HostUnreachable, Outcome::UpstreamFailed),
    }
}

async fn send_reply(client: &mut TcpStream, reply: Reply) -> std::io::Result<()> {
    // The bound address is not told (zeros): the gateway's upstream connection is the fleet's.
    client
        .write_all(&[VERSION, reply as u8, 0, 1, 0, 0, 0, 0, 0, 0])
        .await
}

/// Reads a length-prefixed field (RFC 1929's and a domain name's).
async fn read_field(client: &mut TcpStream) -> Result<Vec<u8>, Handshake> {
    let len = client.read_u8().await? as usize;
    let mut field = vec![0u8; len];
    client.read_exact(&mut field).await?;
    Ok(field)
}

/// Method selection and the RFC 1929 login: the routing and the token.
async fn login(client: &mut TcpStream) -> Result<(Routing, String), Handshake> {
    if client.read_u8().await? != VERSION {
        return Err(Handshake::Close);
    }
    let methods = read_field(client).await?;
    if !methods.contains(&USERNAME_PASSWORD) {
        client.write_all(&[VERSION, NO_ACCEPTABLE_METHOD]).await?;
        return Err(Handshake::Answered(Outcome::Unauthenticated));
    }
    client.write_all(&[VERSION, USERNAME_PASSWORD]).await?;
    if client.read_u8().await? != AUTH_VERSION {
        return Err(Handshake::Close);
    }
    let username = read_field(client).await?;
    let password = read_field(client).await?;
    let parsed = match (String::from_utf8(username), String::from_utf8(password)) {
        (Ok(username), Ok(token)) if !token.is_empty() => {
            parse_username(&username).map(|routing| (routing, token))
        }
        (Ok(_), Ok(_)) => Err("the token (the password) is empty".into()),
        _ => Err("the username and password must be UTF-8".into()),
    };
    match parsed {
        Ok(login) => {
            // The token itself is checked by the leader with the route.
            client.write_all(&[AUTH_VERSION, 0]).await?;
            Ok(login)
        }
        Err(why) => {
            let shown: String = why
                .chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .collect();
            warn!(reason = %shown, "refused a SOCKS5 login");
            client.write_all(&[AUTH_VERSION, 1]).await?;
            Err(Handshake::Answered(Outcome::Unauthenticated))
        }
    }
}

/// The CONNECT request's destination.
async fn request(client: &mut TcpStream) -> Result<Destination, Handshake> {
    let mut fixed = [0u8; 4];
    client.read_exact(&mut fixed).await?;
    let [version, command, _, address_type] = fixed;
    if version != VERSION {
        return Err(Handshake::Close);
    }
    let host = match address_type {
        1 => {
            let mut ip = [0u8; 4];
            client.read_exact(&mut ip).await?;
            Ipv4Addr::from(ip).to_string()
        }
        3 => {
            let name = read_field(client).await?;
            match String::from_utf8(name) {
                Ok(name) if !name.is_empty() && name.is_ascii() => name.to_ascii_lowercase(),
                _ => {
                    send_reply(client, Reply::AddressTypeNotSupported).await?;
                    return Err(Handshake::Answered(Outcome::Refused));
                }
            }
        }
        4 => {
            let mut ip = [0u8; 16];
            client.read_exact(&mut ip).await?;
            Ipv6Addr::from(ip).to_string()
        }
        _ => {
            send_reply(client, Reply::AddressTypeNotSupported).await?;
            return Err(Handshake::Answered(Outcome::Refused));
        }
    };
    let port = client.read_u16().await?;
    if command != CONNECT {
        send_reply(client, Reply::CommandNotSupported).await?;
        return Err(Handshake::Answered(Outcome::Refused));
    }
    Ok(Destination { host, port })
}

/// One client connection on the SOCKS5 port.
/// `handshake`: the connection's place in the handshake room, given back for one of the
/// total's once its login and request are read.
pub async fn handle<R: Routes>(
    ctx: &Context<'_, R>,
    mut client: TcpStream,
    place: HandshakePermit<'_>,
) {
    let handshake = async {
        let (routing, token) = login(&mut client).await?;
        let destination = request(&mut client).await?;
        Ok::<_, Handshake>((routing, token, destination))
    };
    let (routing, token, destination) =
        match tokio::time::timeout(ctx.options.handshake_timeout, handshake).await {
            Ok(Ok(parts)) => parts,
            Ok(Err(Handshake::Answered(outcome))) => {
                ctx.metrics.request(Protocol::Socks5, outcome, None);
                return;
            }
            Ok(Err(Handshake::Close)) | Err(_) => {
                debug!("SOCKS5 handshake ended or timed out");
                return;
            }
        };
    let Some(_client) = ctx.clients.connect() else {
        let _ = send_reply(&mut client, Reply::GeneralFailure).await;
        ctx.metrics
            .request(Protocol::Socks5, Outcome::Refused, None);
        return;
    };
    drop(place);
    let Some(_token_permit) = ctx.clients.token(&token) else {
        let _ = send_reply(&mut client, Reply::GeneralFailure).await;
        ctx.metrics
            .request(Protocol::Socks5, Outcome::Refused, None);
        return;
    };
    if let Err(why) = ctx.options.policy.check(&destination) {
        debug!(reason = %why, "SOCKS5 destination refused");
        let _ = send_reply(&mut client, Reply::NotAllowed).await;
        ctx.metrics
            .request(Protocol::Socks5, Outcome::Refused, None);
        return;
    }
    let route_request = RouteRequest {
        routing,
        token,
        destination,
        avoid: None,
    };
    let (outcome, pool) = match open_tunnel(ctx, route_request).await {
        Ok(mut tunnel) => {
            let bytes = ctx.metrics.pool_bytes(tunnel.route.pool.as_deref());
            if send_reply(&mut client, Reply::Succeeded).await.is_ok()
                && let Err(e) = relay(
                    &mut client,
                    &mut tunnel.stream,
                    &[],
                    &tunnel.leftover,
                    ctx.options.idle_timeout,
                    &bytes,
                )
                .await
            {
                debug!(proxy = %tunnel.route.proxy, "SOCKS5 tunnel ended: {e}");
            }
            (Outcome::Ok, tunnel.route.pool)
        }
        Err(refusal) => {
            let (reply, outcome) = reply_for(&refusal);
            debug!(?refusal, "SOCKS5 tunnel refused");
            let _ = send_reply(&mut client, reply).await;
            (outcome, None)
        }
    };
    ctx.metrics
        .request(Protocol::Socks5, outcome, pool.as_deref());
}
