//! etcd + kube-apiserver on loopback, and a namespace per test.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use base64::Engine as _;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::sync::Mutex;

use crate::bins::k8s_binary;
use crate::http::http_get;
use crate::process::{Check, Proc, Scratch, free_port, run_output, wait_for};
use crate::shared::Shared;

/// The user in `system:masters` that the kubeconfig and [`ControlPlane::client`] use.
pub const ADMIN_USER: &str = "harness-admin";

/// How long to wait for etcd's `/health` and the apiserver's `/readyz`.
const ETCD_TIMEOUT: Duration = Duration::from_secs(30);
const APISERVER_TIMEOUT: Duration = Duration::from_secs(180);

/// A real kube-apiserver backed by a real etcd, both on free 127.0.0.1 ports,
/// with RBAC on and an admin token in `system:masters`.
///
/// There is no kube-controller-manager, scheduler or kubelet: Pods stay
/// `Pending`, ownerReference garbage collection does not happen and a deleted
/// namespace stays `Terminating`. Everything served by the apiserver itself
/// (CRDs, validation, RBAC, admission, watches, server-side apply) is real.
///
/// Use [`ControlPlane::shared`] in tests; [`ControlPlane::start`] for a private
/// instance (stopped on drop).
pub struct ControlPlane {
    // Fields drop in order: the apiserver first, then etcd, then the directory.
    apiserver: Mutex<Proc>,
    apiserver_bin: PathBuf,
    apiserver_args: Vec<String>,
    apiserver_log: PathBuf,
    etcd: Mutex<Proc>,
    url: String,
    etcd_url: String,
    token: String,
    ca_pem: String,
    kubeconfig: PathBuf,
    bin_dir: PathBuf,
    config: Config,
    started_in: Duration,
    scratch: Scratch,
}

/// Faults to start a private control plane with ([`ControlPlane::start_with`]).
#[derive(Debug, Clone, Default)]
pub struct ControlPlaneOptions {
    /// Appended to kube-apiserver's flags, e.g. `--max-requests-inflight=2` for 429s.
    pub apiserver_args: Vec<String>,
    /// Added before every chunk the apiserver and etcd send each other.
    pub etcd_delay: Option<Duration>,
    /// Appended to etcd's flags, e.g. `--quota-backend-bytes=67108864` for a small database.
    pub etcd_args: Vec<String>,
}

static SHARED: Shared<ControlPlane> = Shared::new("control plane");

impl ControlPlane {
    /// The process-wide instance, started on first use and shared by every test
    /// in this test binary. Its processes are killed when the process exits.
    ///
    /// Only processes and configuration are shared: make a [`kube::Client`] per
    /// test with [`ControlPlane::client`] (a client belongs to the tokio runtime
    /// it was created on, and every `#[tokio::test]` has its own runtime).
    ///
    /// # Panics
    /// If the control plane cannot start (every later call panics with the same
    /// message), or if a fixture binary is missing.
    pub async fn shared() -> &'static ControlPlane {
        SHARED.get(ControlPlane::start).await
    }

    /// [`ControlPlane::shared`] for synchronous code (blocks the thread).
    pub fn shared_blocking() -> &'static ControlPlane {
        SHARED.get_blocking(ControlPlane::start)
    }

    /// Starts a private etcd + kube-apiserver (a few seconds warm). Stopped on drop.
    pub async fn start() -> Result<ControlPlane> {
        Self::start_with(ControlPlaneOptions::default()).await
    }

    /// [`ControlPlane::start`] with faults built in: extra kube-apiserver flags (later flags
    /// win, so they override the defaults) and a delay on every read between the apiserver and
    /// etcd (a slow disk or network under etcd). The delaying relay runs on the caller's tokio
    /// runtime.
    pub async fn start_with(options: ControlPlaneOptions) -> Result<ControlPlane> {
        let t0 = Instant::now();
        let etcd_bin = k8s_binary("etcd");
        let apiserver_bin = k8s_binary("kube-apiserver");
        k8s_binary("kubectl"); // fail early if missing
        let bin_dir = apiserver_bin.parent().unwrap().to_owned();

        let scratch = Scratch::new("control-plane")?;
        let dir = scratch.path().to_owned();
        let pki = scratch.subdir("pki", 0o700)?;

        // etcd
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut cmd = Command::new(&etcd_bin);
        cmd.arg("--name=harness")
            .arg(format!("--data-dir={}", dir.join("etcd").display()))
            .arg(format!("--listen-client-urls={etcd_url}"))
            .arg(format!("--advertise-client-urls={etcd_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=harness={peer_url}"))
            .arg("--initial-cluster-state=new")
            .arg("--unsafe-no-fsync")
            .arg("--log-level=warn")
            .args(&options.etcd_args);
        let etcd = Mutex::new(Proc::spawn("etcd", cmd, &dir.join("etcd.log"))?);
        let etcd_addr = ([127, 0, 0, 1], client_port).into();
        wait_for("etcd /health", ETCD_TIMEOUT, || async {
            if let Err(e) = etcd.lock().await.ensure_running() {
                return Check::Failed(e);
            }
            match http_get(etcd_addr, "/health").await {
                Ok((200, body)) if body.contains("\"health\":\"true\"") => Check::Ready(()),
                Ok((status, body)) => Check::NotYet(format!("{status}: {body}")),
                Err(e) => Check::NotYet(e.to_string()),
            }
        })
        .await?;

        let etcd_for_apiserver = match options.etcd_delay {
            None => etcd_url.clone(),
            Some(delay) => {
                let relay = crate::process::delaying_relay(etcd_addr, delay).await?;
                format!("http://{relay}")
            }
        };

        // Credentials: a CA, a serving certificate for 127.0.0.1, the
        // service-account signing key and the admin token.
        let port = free_port()?;
        let url = format!("https://127.0.0.1:{port}");
        let certs = Pki::generate()?;
        let write = |name: &str, text: &str| -> Result<PathBuf> {
            let p = pki.join(name);
            std::fs::write(&p, text).with_context(|| format!("write {}", p.display()))?;
            Ok(p)
        };
        let tls_cert = write("apiserver.crt", &certs.serving_cert_pem)?;
        let tls_key = write("apiserver.key", &certs.serving_key_pem)?;
        write("ca.crt", &certs.ca_pem)?;
        let sa_key = write("sa.key", &certs.sa_key_pem)?;
        let sa_pub = write("sa.pub", &certs.sa_pub_pem)?;
        let token = random_hex(24);
        let tokens = write(
            "tokens.csv",
            &format!("{token},{ADMIN_USER},{ADMIN_USER},\"system:masters\"\n"),
        )?;

        let apiserver_args: Vec<String> = vec![
            format!("--etcd-servers={}", etcd_for_apiserver),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            // The endpoint reconciler rejects a loopback advertise address; the
            // `kubernetes` Service has no endpoints here (no in-cluster clients).
            "--endpoint-reconciler-type=none".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", pki.display()),
            format!("--tls-cert-file={}", tls_cert.display()),
            format!("--tls-private-key-file={}", tls_key.display()),
            format!("--token-auth-file={}", tokens.display()),
            "--authorization-mode=RBAC".into(),
            format!("--service-account-issuer={url}"),
            format!("--service-account-key-file={}", sa_pub.display()),
            format!("--service-account-signing-key-file={}", sa_key.display()),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--enable-priority-and-fairness=false".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ];
        let apiserver_args: Vec<String> = apiserver_args
            .into_iter()
            .chain(options.apiserver_args.iter().cloned())
            .collect();
        let apiserver_log = dir.join("kube-apiserver.log");
        let mut cmd = Command::new(&apiserver_bin);
        cmd.args(&apiserver_args);
        let apiserver = Mutex::new(Proc::spawn("kube-apiserver", cmd, &apiserver_log)?);

        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&url, &certs.ca_pem, &token))
            .with_context(|| format!("write {}", kubeconfig.display()))?;
        let config = config_from_kubeconfig(&kubeconfig).await?;
        wait_apiserver_ready(&apiserver, &config, &apiserver_log).await?;

        let started_in = t0.elapsed();
        tracing::info!(%url, ?started_in, dir = %dir.display(), "control plane ready");
        Ok(ControlPlane {
            apiserver,
            apiserver_bin,
            apiserver_args,
            apiserver_log,
            etcd,
            url,
            etcd_url,
            token,
            ca_pem: certs.ca_pem,
            kubeconfig,
            bin_dir,
            config,
            started_in,
            scratch,
        })
    }

    /// A new client (admin, `system:masters`) on the current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn client(&self) -> Client {
        Client::try_from(self.config.clone()).expect("create kube::Client")
    }

    /// A client that impersonates `user` (and `groups`): RBAC applies to it as
    /// it would to that user, e.g. `system:serviceaccount:NS:NAME`.
    pub fn client_as(&self, user: &str, groups: &[&str]) -> Client {
        let mut config = self.config.clone();
        config.auth_info.impersonate = Some(user.to_owned());
        if !groups.is_empty() {
            config.auth_info.impersonate_groups =
                Some(groups.iter().map(|g| g.to_string()).collect());
        }
        Client::try_from(config).expect("create kube::Client")
    }

    /// The client configuration (admin). Cheap to clone; not tied to a runtime.
    pub fn config(&self) -> Config {
        self.config.clone()
    }

    /// `https://127.0.0.1:PORT`
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `http://127.0.0.1:PORT`
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// The admin bearer token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// PEM of the CA that signed the serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A kubeconfig for the admin user (context `harness`, namespace `default`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Writes the kubeconfig to `path` as well.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<()> {
        std::fs::copy(&self.kubeconfig, path)
            .with_context(|| format!("write {}", path.display()))?;
        Ok(())
    }

    /// The directory with `kube-apiserver`, `kubectl` and `etcd`.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The scratch directory (logs: `kube-apiserver.log`, `etcd.log`).
    pub fn dir(&self) -> &Path {
        self.scratch.path()
    }

    /// How long [`ControlPlane::start`] took.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// `kubectl --kubeconfig=...` ready for arguments.
    pub fn kubectl(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(self.bin_dir.join("kubectl"));
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display()));
        cmd
    }

    /// Runs kubectl with `args` (and `stdin`, e.g. a manifest for `apply -f -`);
    /// returns stdout, or an error carrying stderr.
    pub async fn kubectl_run(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        kubectl_run(self.kubectl(), args, stdin).await
    }

    /// `kubectl apply -f` of the CRD manifests in `dir`, then waits until every CRD of the
    /// cluster is Established (served).
    pub async fn apply_crds(&self, dir: &str) -> Result<()> {
        self.kubectl_run(&["apply", "-f", dir], None).await?;
        self.kubectl_run(
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd",
                "--all",
            ],
            None,
        )
        .await?;
        Ok(())
    }

    /// A fresh namespace for one test; see [`TestNamespace`].
    pub async fn namespace(&self, prefix: &str) -> Result<TestNamespace> {
        TestNamespace::create(self, prefix).await
    }

    /// Stops kube-apiserver (SIGTERM, then SIGKILL after 10 s), leaving etcd
    /// and everything stored; [`ControlPlane::start_apiserver`] brings it back
    /// on the same address. Never call this on the shared instance.
    pub async fn stop_apiserver(&self) {
        self.apiserver
            .lock()
            .await
            .stop(Duration::from_secs(10))
            .await;
    }

    /// Starts kube-apiserver again after [`ControlPlane::stop_apiserver`],
    /// with the same flags, and waits for its `/readyz`.
    pub async fn start_apiserver(&self) -> Result<()> {
        let mut cmd = Command::new(&self.apiserver_bin);
        cmd.args(&self.apiserver_args);
        *self.apiserver.lock().await = Proc::spawn("kube-apiserver", cmd, &self.apiserver_log)?;
        wait_apiserver_ready(&self.apiserver, &self.config, &self.apiserver_log).await
    }

    /// Stops the apiserver and etcd now (also done on drop). Never call this
    /// on the shared instance.
    pub async fn stop(&self) {
        self.apiserver
            .lock()
            .await
            .stop(Duration::from_secs(10))
            .await;
        self.etcd.lock().await.stop(Duration::from_secs(10)).await;
    }
}

pub(crate) async fn wait_apiserver_ready(
    apiserver: &Mutex<Proc>,
    config: &Config,
    log: &Path,
) -> Result<()> {
    let client = Client::try_from(config.clone()).context("kube client")?;
    wait_for("kube-apiserver /readyz", APISERVER_TIMEOUT, || async {
        if let Err(e) = apiserver.lock().await.ensure_running() {
            return Check::Failed(e);
        }
        let req = http::Request::get("/readyz").body(Vec::new()).unwrap();
        match client.request_text(req).await {
            Ok(_) => Check::Ready(()),
            Err(e) => Check::NotYet(e.to_string()),
        }
    })
    .await
    .with_context(|| format!("see {}", log.display()))
}

/// Runs `cmd` (a kubectl with its kubeconfig) with `args` and `stdin`; returns stdout, or an
/// error carrying stderr.
pub(crate) async fn kubectl_run(
    mut cmd: tokio::process::Command,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String> {
    cmd.args(args);
    match stdin {
        None => run_output(&mut cmd).await,
        Some(input) => {
            use tokio::io::AsyncWriteExt;
            let display = format!("kubectl {}", args.join(" "));
            let mut child = cmd
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("run {display}"))?;
            let mut pipe = child.stdin.take().unwrap();
            pipe.write_all(input.as_bytes()).await?;
            drop(pipe);
            let out = child.wait_with_output().await?;
            if !out.status.success() {
                return Err(anyhow!(
                    "{display} failed ({}):\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(String::from_utf8(out.stdout)?)
        }
    }
}

pub(crate) async fn config_from_kubeconfig(path: &Path) -> Result<Config> {
    let kc = Kubeconfig::read_from(path).with_context(|| format!("read {}", path.display()))?;
    Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("load {}", path.display()))
}

pub(crate) fn kubeconfig_yaml(url: &str, ca_pem: &str, token: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: harness
  cluster:
    server: {url}
    certificate-authority-data: {ca}
users:
- name: {ADMIN_USER}
  user:
    token: {token}
contexts:
- name: harness
  context:
    cluster: harness
    user: {ADMIN_USER}
    namespace: default
current-context: harness
"
    )
}

/// The control plane's credentials: a CA, kube-apiserver's serving certificate and the
/// service-account key pair.
pub(crate) struct Pki {
    pub(crate) ca_pem: String,
    pub(crate) serving_cert_pem: String,
    pub(crate) serving_key_pem: String,
    pub(crate) sa_key_pem: String,
    pub(crate) sa_pub_pem: String,
    ca: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl Pki {
    /// Serving certificate for 127.0.0.1 and the `kubernetes` Service's names.
    pub(crate) fn generate() -> Result<Pki> {
        Self::generate_with_sans(&[])
    }

    /// [`Pki::generate`] with more subject alternative names (IP addresses or DNS names).
    pub(crate) fn generate_with_sans(extra_sans: &[String]) -> Result<Pki> {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
            IsCa, KeyPair, KeyUsagePurpose,
        };
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.distinguished_name
            .push(DnType::CommonName, "proxy-operator-harness-ca");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;

        let mut sans = vec![
            "127.0.0.1".to_owned(),
            "localhost".to_owned(),
            "kubernetes".to_owned(),
            "kubernetes.default".to_owned(),
            "kubernetes.default.svc".to_owned(),
        ];
        sans.extend(extra_sans.iter().cloned());
        let mut serving = CertificateParams::new(sans)?;
        serving
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        serving.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let serving_key = KeyPair::generate()?;
        let serving_cert = serving.signed_by(&serving_key, &ca)?;

        let sa = KeyPair::generate()?;
        Ok(Pki {
            ca_pem: ca.pem(),
            serving_cert_pem: serving_cert.pem(),
            serving_key_pem: serving_key.serialize_pem(),
            sa_key_pem: sa.serialize_pem(),
            sa_pub_pem: sa.public_key_pem(),
            ca,
        })
    }

    /// A client certificate signed by the CA: `(cert PEM, key PEM)` for user `cn` in `groups`.
    pub(crate) fn client_cert(&self, cn: &str, groups: &[&str]) -> Result<(String, String)> {
        use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose};
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, cn);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.ca)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// `n` random bytes from the kernel, hex-encoded.
pub(crate) fn random_hex(n: usize) -> String {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .expect("read /dev/urandom");
    hex::encode(buf)
}

/// A namespace created for one test, with a `default` ServiceAccount (there is
/// no controller-manager to create it, and the ServiceAccount admission plugin
/// wants it for Pods).
///
/// Names are `<prefix>-<n>-<random>`, unique across tests sharing a control
/// plane. Call [`TestNamespace::delete`] to clean up; otherwise it goes away
/// with the control plane (without a controller-manager, a deleted namespace
/// stays `Terminating` anyway).
pub struct TestNamespace {
    name: String,
    client: Client,
}

impl TestNamespace {
    pub async fn create(cp: &ControlPlane, prefix: &str) -> Result<TestNamespace> {
        static N: AtomicU64 = AtomicU64::new(0);
        let mut name: String = prefix
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(40)
            .collect();
        name = name.trim_matches('-').to_owned();
        if name.is_empty() {
            name.push_str("test");
        }
        write!(
            name,
            "-{}-{}",
            N.fetch_add(1, Ordering::Relaxed),
            random_hex(3)
        )
        .unwrap();

        let client = cp.client();
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(
                    [("proxy-operator.test/harness".to_owned(), "true".to_owned())].into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("create namespace {name}"))?;
        let sa = ServiceAccount {
            metadata: ObjectMeta {
                name: Some("default".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<ServiceAccount>::namespaced(client.clone(), &name)
            .create(&PostParams::default(), &sa)
            .await
            .with_context(|| format!("create ServiceAccount default in {name}"))?;
        Ok(TestNamespace { name, client })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The admin client this namespace was created with (current runtime).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// A namespaced API for `K` in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// A token of the ServiceAccount `sa` of this namespace for `audience`, valid `seconds`,
    /// from the TokenRequest API (as the kubelet gets one for a projected volume).
    pub async fn service_account_token(
        &self,
        sa: &str,
        audience: &str,
        seconds: i64,
    ) -> Result<String> {
        use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
        use k8s_openapi::api::core::v1::ServiceAccount;
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(vec![audience.to_string()]),
                expiration_seconds: Some(seconds),
                ..Default::default()
            }),
            ..Default::default()
        };
        let answer = self
            .api::<ServiceAccount>()
            .create_token_request(sa, &Default::default(), &request)
            .await
            .with_context(|| format!("a token of {}/{sa}", self.name))?;
        answer.status.and_then(|s| s.token).with_context(|| {
            format!(
                "the TokenRequest of {}/{sa} came back without a token",
                self.name
            )
        })
    }

    /// Deletes the namespace (it stays `Terminating`: there is no namespace controller).
    pub async fn delete(self) -> Result<()> {
        Api::<Namespace>::all(self.client)
            .delete(&self.name, &DeleteParams::default())
            .await
            .with_context(|| format!("delete namespace {}", self.name))?;
        Ok(())
    }
}
