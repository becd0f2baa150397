//! The discovery API over TLS as `proxy-operator run --discovery-tls-cert-file …` serves it
//! (`leases::serve_tls` with the certificate files reloaded, `tls::ReloadingCert`), called by
//! the clients crawlers use (reqwest, curl) and by the gateway binary: a client that trusts
//! the CA is served, one with another CA is refused with a certificate error, and a certificate
//! replaced in its files is the one new connections get while open ones go on.

use std::sync::Arc;
use std::time::Duration;

use harness::gateway::GatewayProcess;
use harness::process::{Check, wait_for};
use proxy_operator::leasing::leases::api::GatewayAccess;
use proxy_operator::leasing::leases::{self, Discovery, LeaseMetrics, LeaseOptions, LeaseStore};
use proxy_operator::support::tls::{CertFiles, ReloadingCert};
use reqwest::StatusCode;

use super::test_ca::{TestCa, TlsFiles, causes, client_trusting};
use super::{GATEWAY_TOKEN, TOKEN};

/// The name the test's certificates are for (loopback resolves it).
const HOST: &str = "localhost";

struct TlsApi {
    port: u16,
    files: TlsFiles,
    dir: tempfile::TempDir,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for TlsApi {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl TlsApi {
    /// The API over TLS with a certificate of `ca`, its files read again every 100 ms.
    async fn start(ca: &TestCa) -> TlsApi {
        let dir = tempfile::tempdir().unwrap();
        let files = ca.write(dir.path(), &[HOST]);
        let store = Arc::new(LeaseStore::new(
            LeaseOptions::default(),
            LeaseMetrics::unregistered().unwrap(),
            None,
        ));
        store.restore(Default::default());
        let discovery = Discovery::new(store, TOKEN).serving_the_gateway(GatewayAccess {
            token: GATEWAY_TOKEN.into(),
            max_connections_per_proxy: 2,
            block_statuses: vec![403, 429],
        });
        let cert = ReloadingCert::new(CertFiles {
            cert: files.cert.clone(),
            key: files.key.clone(),
        });
        assert!(cert.is_loaded());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let acceptor = cert.acceptor().unwrap();
        let tasks = vec![
            tokio::spawn(leases::serve_tls(
                listener,
                leases::router(Arc::new(discovery)),
                Some(acceptor),
                Default::default(),
            )),
            tokio::spawn(cert.watch(Duration::from_millis(100))),
        ];
        TlsApi {
            port,
            files,
            dir,
            tasks,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("https://{HOST}:{}{path}", self.port)
    }

    async fn proxies(&self, client: &reqwest::Client) -> Result<StatusCode, reqwest::Error> {
        let response = client
            .get(self.url("/v1/proxies"))
            .bearer_auth(TOKEN)
            .send()
            .await?;
        Ok(response.status())
    }

    /// curl's answer (`%{http_code}`, 000 when none) and its stderr, trusting `ca` (a file).
    async fn curl(&self, ca: &std::path::Path) -> (String, String) {
        let output = tokio::process::Command::new("curl")
            .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
            .arg(ca)
            .args(["-H", &format!("Authorization: Bearer {TOKEN}")])
            .arg(self.url("/v1/proxies"))
            .output()
            .await
            .expect("curl (tests/fixtures)");
        (
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }
}

#[tokio::test]
async fn a_client_trusting_the_ca_is_served_another_is_refused_and_a_new_certificate_is_used() {
    let (first_ca, second_ca) = (TestCa::new("first CA"), TestCa::new("second CA"));
    let api = TlsApi::start(&first_ca).await;

    // Trusting the CA: served, by reqwest and by curl.
    let trusting = client_trusting(&first_ca.pem);
    assert_eq!(api.proxies(&trusting).await.unwrap(), StatusCode::OK);
    assert_eq!(api.curl(&api.files.ca).await.0, "200");

    // Another CA: a certificate error, never an answer.
    let wrong = api
        .proxies(&client_trusting(&second_ca.pem))
        .await
        .unwrap_err();
    let why = causes(&wrong);
    assert!(
        why.contains("UnknownIssuer") || why.contains("certificate"),
        "{why}"
    );
    let second_ca_file = api.dir.path().join("second-ca.crt");
    std::fs::write(&second_ca_file, &second_ca.pem).unwrap();
    let (code, stderr) = api.curl(&second_ca_file).await;
    assert_eq!(code, "000", "{stderr}");
    assert!(stderr.contains("certificate"), "{stderr}");
    // Plain HTTP to the TLS port: no answer from the API.
    let plain = reqwest::get(format!("http://{HOST}:{}/v1/proxies", api.port)).await;
    assert!(
        plain
            .as_ref()
            .map_or(true, |r| r.status() != StatusCode::OK),
        "{plain:?}"
    );

    // The Secret renewed with another CA's certificate: new connections get it...
    second_ca.write(api.dir.path(), &[HOST]);
    let renewed = wait_for(
        "a new connection to see the new certificate",
        Duration::from_secs(10),
        || async {
            let client = client_trusting(&second_ca.pem);
            match api.proxies(&client).await {
                Ok(StatusCode::OK) => Check::Ready(()),
                other => Check::NotYet(format!("{other:?}")),
            }
        },
    )
    .await;
    renewed.unwrap();
    assert_eq!(api.curl(&api.files.ca).await.0, "200");
    let fresh = api.proxies(&client_trusting(&first_ca.pem)).await;
    assert!(
        fresh.is_err(),
        "a new connection trusting only the first CA: {fresh:?}"
    );
    // ...and the connection opened before the change goes on with the certificate it began with.
    assert_eq!(api.proxies(&trusting).await.unwrap(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_calls_a_tls_discovery_api_trusting_its_ca_and_refuses_another() {
    let ca = TestCa::new("discovery CA");
    let api = TlsApi::start(&ca).await;
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_proxy-operator"));
    let ca_file = api.files.ca.to_str().unwrap().to_string();
    let url = api.url("");
    // Ready once the leader takes its load report: the TLS calls work.
    let mut gateway = GatewayProcess::spawn_url(
        binary,
        &url,
        GATEWAY_TOKEN,
        "gw-tls",
        &["--discovery-ca-file", &ca_file, "--metrics-insecure"],
    )
    .unwrap();
    gateway.wait_ready(Duration::from_secs(30)).await.unwrap();

    // Trusting another CA: its calls fail with a certificate error, said in its log.
    let other = api.dir.path().join("other-ca.crt");
    std::fs::write(&other, TestCa::new("another CA").pem).unwrap();
    let refused = GatewayProcess::spawn_url(
        binary,
        &url,
        GATEWAY_TOKEN,
        "gw-wrong-ca",
        &[
            "--discovery-ca-file",
            other.to_str().unwrap(),
            "--metrics-insecure",
        ],
    )
    .unwrap();
    wait_for(
        "the gateway to say why the leader cannot be reached",
        Duration::from_secs(30),
        || async {
            let log = refused.process.log_tail(20);
            if log.contains("cannot report this replica's load") {
                Check::Ready(log)
            } else {
                Check::NotYet(log)
            }
        },
    )
    .await
    .unwrap();
    let readyz = reqwest::get(format!("http://{}/readyz", refused.metrics))
        .await
        .unwrap();
    assert_eq!(readyz.status(), StatusCode::SERVICE_UNAVAILABLE);

    // An http URL without --discovery-plain-http: refused at start, saying what to pass.
    let mut plain = GatewayProcess::spawn_url(
        binary,
        &format!("http://{HOST}:{}", api.port),
        GATEWAY_TOKEN,
        "gw-plain",
        &["--metrics-insecure"],
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let exited = loop {
        if let Some(status) = plain.process.try_exited() {
            break status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the gateway did not refuse an http URL"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!exited.success());
    assert!(
        plain
            .process
            .log_tail(10)
            .contains("--discovery-plain-http"),
        "{}",
        plain.process.log_tail(10)
    );
}

/// The gateway's HTTP front over TLS (`--tls-cert-file`, `--tls-key-file`): curl with
/// `--proxy https://…` trusting the CA fetches the site through the fleet, plainly and through
/// a CONNECT tunnel; trusting another CA it is refused before any request is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_serves_its_http_proxy_over_tls() {
    let ca = TestCa::new("gateway CA");
    let dir = tempfile::tempdir().unwrap();
    let files = ca.write(dir.path(), &[HOST]);
    let port = harness::process::free_port().unwrap();
    let https_addr = format!("127.0.0.1:{port}");
    let gw = super::gateway::Gateway::start_allowing(
        &[],
        &[
            "--https-addr",
            &https_addr,
            "--tls-cert-file",
            files.cert.to_str().unwrap(),
            "--tls-key-file",
            files.key.to_str().unwrap(),
        ],
    )
    .await;
    let page = gw.site.url("127.0.0.1", "/page");
    let proxy = format!("https://pool-crawlers.gw:{TOKEN}@{HOST}:{port}");
    let ca_file = files.ca.to_str().unwrap();
    for tunnel in [false, true] {
        let mut args = vec!["--proxy-cacert", ca_file, "-x", &proxy, &page];
        if tunnel {
            args.insert(0, "-p");
        }
        let (status, body, _) = gw.curl(&args).await;
        assert_eq!(
            (status, body.as_str()),
            (200, super::gateway::PAGE),
            "tunnel {tunnel}: {}",
            gw.log()
        );
    }
    let other = dir.path().join("other-ca.crt");
    std::fs::write(&other, TestCa::new("another CA").pem).unwrap();
    let (status, _, code) = gw
        .curl(&[
            "--proxy-cacert",
            other.to_str().unwrap(),
            "-x",
            &proxy,
            &page,
        ])
        .await;
    // curl's exit 60: the peer's certificate cannot be checked against the CA.
    assert_eq!((status, code), (0, 60), "{}", gw.log());
}
