//! The gateway in front of SOCKS5 upstreams (an `upstream` provider's `socks5://` proxies): real
//! SOCKS5 servers from Debian — microsocks requiring an RFC 1929 login that only the operator
//! holds, dante without one — and curl through each of the gateway's doors (plain HTTP, a
//! CONNECT tunnel, SOCKS5). The gateway speaks SOCKS5 to the upstream and logs in itself; the
//! client and the site never see the login; a wrong login is the upstream's failure.

use harness::socks::SocksServer;
use proxy_operator::leasing::leases::{LeaseOptions, ProvisionedProxy};
use proxy_operator::provider::credentials::ProxyLogin;
use proxy_operator::support::socks::ProxyProtocol;

use super::gateway::{PAGE, Site, curl, spawn_replica};
use super::{TOKEN, pooled, serve};

const USER: &str = "vendor-customer-9";
const PASSWORD: &str = "s0cks-Vendor-pw";

/// A SOCKS5 upstream of pool `crawlers/{pool}` at `port`, with `login` if given.
fn socks5_entry(name: &str, pool: &str, port: u16, login: Option<ProxyLogin>) -> ProvisionedProxy {
    ProvisionedProxy {
        port,
        login,
        protocol: ProxyProtocol::Socks5,
        ..pooled(name, pool)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_door_of_the_gateway_reaches_the_site_through_socks5_upstreams() {
    let site = Site::start().await;
    let vendor = SocksServer::microsocks_with_login(USER, PASSWORD)
        .await
        .unwrap();
    let open = SocksServer::dante().await.unwrap();
    let login = |password: &str| Some(ProxyLogin::of_upstream(USER, password, false).unwrap());
    let pool = vec![
        socks5_entry("socks-vendor", "vendor", vendor.port(), login(PASSWORD)),
        socks5_entry("socks-open", "open", open.port(), None),
        socks5_entry(
            "socks-wrong",
            "wrong",
            vendor.port(),
            login("not-the-password"),
        ),
    ];
    let options = LeaseOptions {
        failure_threshold: 1,
        ..super::options()
    };
    let api = serve(options, pool).await;
    let replica = spawn_replica(api.addr, &[site.port], "gw-socks5", &[]).await;
    let page = site.url("127.0.0.1", "/page");
    let socks = replica.socks.to_string();

    for pool in ["vendor", "open"] {
        let username = format!("pool-crawlers.{pool}");
        let proxy = replica.proxy_url(&username, TOKEN);
        let user = format!("{username}:{TOKEN}");
        let doors = [
            ("plain HTTP", curl(&["-x", &proxy, &page]).await),
            ("CONNECT", curl(&["-p", "-x", &proxy, &page]).await),
            (
                "SOCKS5",
                curl(&["--socks5-hostname", &socks, "-U", &user, &page]).await,
            ),
        ];
        for (door, (status, body, _)) in doors {
            assert_eq!(
                (status, body.as_str()),
                (200, PAGE),
                "pool {pool} through the gateway's {door} door: {}\n{}\n{}",
                replica.process.log_tail(40),
                vendor.log(),
                open.log()
            );
        }
    }
    // The site got the request as from a client (origin form, its own Host), no proxy login.
    let seen = site.seen("/page");
    assert_eq!(seen.len(), 6, "{seen:?}");
    for request in &seen {
        assert!(
            !request.headers.contains_key("proxy-authorization"),
            "{request:?}"
        );
        assert_eq!(
            request.host,
            format!("127.0.0.1:{}", site.port),
            "{request:?}"
        );
    }
    // The vendor's upstream wants the login: the gateway logged in, nobody else can without it.
    let (_, _, code) = curl(&["--socks5-hostname", &vendor.addr(), &page]).await;
    assert_ne!(code, 0, "microsocks answered without a login");

    // A wrong login never carries a request: the gateway says why, and reports the upstream.
    let proxy = replica.proxy_url("pool-crawlers.wrong", TOKEN);
    let (status, _, _) = curl(&["-x", &proxy, &page]).await;
    assert_ne!(status, 200);
    assert_eq!(site.seen("/page").len(), 6);
    let log = replica.process.log_tail(400);
    assert!(log.contains("refused the login"), "{log}");
    assert!(
        !log.contains(PASSWORD),
        "the gateway's log has the password"
    );
}
