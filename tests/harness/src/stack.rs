//! The whole product on one machine, for real: a control plane, a hypervisor (sshd + libvirtd
//! with QEMU under TCG, in the machine's network namespace behind the [`EgressGuard`]), the
//! guest proxy image served over loopback HTTP, the operator binary with the built plugins, and a
//! loopback site to reach through a proxy. `make dev` and the kvm end-to-end test both run it, so
//! what a newcomer sees is what CI proves.
//!
//! A guest on the user-mode network reaches the machine's loopback at its gateway address (passt
//! maps it), so the site and the health probe's CONNECT target are loopback servers that the
//! guest's squid reaches as `<gateway>:<port>`; the operator and crawlers reach the guest's squid
//! at `127.0.0.1:<published port>`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};

use crate::gateway::GatewayProcess;
use crate::guest_image::{GuestImage, guest_image};
use crate::process::{Proc, Scratch, free_port};
use crate::{ControlPlane, EgressGuard, FileServer, Libvirtd, Sshd};

/// The namespace the operator runs in (its Secrets and lease table).
pub const OPERATOR_NAMESPACE: &str = "proxy-operator";
/// The namespace of the sample Proxy.
pub const PROXY_NAMESPACE: &str = "crawlers";
/// The sample Proxy.
pub const PROXY_NAME: &str = "egress-1";
/// The discovery API's bearer token.
pub const TOKEN: &str = "dev-token";
/// The gateway's own token (the operator's GATEWAY_TOKEN).
pub const GATEWAY_TOKEN: &str = "dev-gateway-token";
/// The provider instance of the sample.
pub const PROVIDER: &str = "kvm-home";
/// What the loopback site answers at [`SITE_PATH`].
pub const SITE_BODY: &str = "hello from the loopback site, through a proxy VM\n";
pub const SITE_PATH: &str = "/hello";
/// The ports VMs are published on (the provider picks one per VM). Below the kernel's ephemeral
/// range (32768–60999 here): a port in it may be any outgoing connection's local port (`make
/// test`'s soak leaves thousands), and passt then cannot bind it ("Failed to bind any port").
pub const PORT_RANGE: (u16, u16) = (31100, 31119);

/// What to run.
pub struct StackOptions {
    /// The `proxy-operator` binary.
    pub operator_bin: PathBuf,
    /// The built provider components (`kvm.wasm`).
    pub plugins_dir: PathBuf,
    /// `uefi` (the provider's default) or `bios`.
    pub firmware: &'static str,
}

/// Prints each phase with the time since the start, and keeps them for a summary.
pub struct Phases {
    start: Instant,
    last: Instant,
    seen: std::sync::Mutex<Vec<(String, f64, f64)>>,
}

impl Phases {
    pub fn new() -> Phases {
        let now = Instant::now();
        Phases {
            start: now,
            last: now,
            seen: Default::default(),
        }
    }

    /// Records and prints `what` (`[  12.3 s] what (+4.5 s)`).
    pub fn done(&mut self, what: &str) {
        let now = Instant::now();
        let total = now.duration_since(self.start).as_secs_f64();
        let step = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        eprintln!("[{total:7.1} s] {what} (+{step:.1} s)");
        self.seen
            .lock()
            .unwrap()
            .push((what.to_string(), step, total));
    }

    /// Every phase so far: (what, seconds it took, seconds since the start).
    pub fn all(&self) -> Vec<(String, f64, f64)> {
        self.seen.lock().unwrap().clone()
    }

    /// Seconds since the start.
    pub fn elapsed(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}

impl Default for Phases {
    fn default() -> Self {
        Phases::new()
    }
}

/// The address a guest behind passt uses for the machine's loopback: the default gateway, which
/// passt maps to the machine's 127.0.0.1.
pub fn guest_view_of_loopback() -> Result<Ipv4Addr> {
    let routes = std::fs::read_to_string("/proc/net/route").context("read /proc/net/route")?;
    routes
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && f[1] == "00000000").then(|| u32::from_str_radix(f[2], 16).ok())?
        })
        .map(|gw| Ipv4Addr::from(gw.swap_bytes()))
        .find(|gw| !gw.is_unspecified())
        .context(
            "no IPv4 default route: passt (user-mode networking) copies the machine's default route; without one it cannot start",
        )
}

/// The running stack; everything stops on drop (VMs first, with libvirtd).
pub struct Stack {
    pub cp: ControlPlane,
    pub libvirtd: Libvirtd,
    pub sshd: Sshd,
    pub files: FileServer,
    pub image: GuestImage,
    pub operator: Proc,
    pub metrics: SocketAddr,
    pub discovery: SocketAddr,
    /// `proxy-operator gateway`, and its HTTP and SOCKS5 ports.
    pub gateway: GatewayProcess,
    /// The loopback site as the guest sees it (`<gateway>:<port>`).
    pub site_for_guest: SocketAddr,
    pub kubeconfig: PathBuf,
    pub scratch: Scratch,
    http: reqwest::Client,
}

impl Stack {
    /// Starts everything up to a ready operator with the kvm provider; `phases` gets a line per
    /// step.
    pub async fn start(options: &StackOptions, phases: &mut Phases) -> Result<Stack> {
        for (what, path) in [
            (
                "the proxy-operator binary (cargo build -p proxy-operator)",
                &options.operator_bin,
            ),
            (
                "the kvm component (make plugins)",
                &options.plugins_dir.join("kvm.wasm"),
            ),
        ] {
            if !path.exists() {
                bail!("{what} is missing at {}", path.display());
            }
        }
        let image = guest_image();
        let gateway = guest_view_of_loopback()?;
        let guard = Arc::new(EgressGuard::install()?);
        phases.done("egress guard installed (QEMU and passt reach loopback only)");
        let (cp, libvirtd, sshd, files) = tokio::join!(
            ControlPlane::start(),
            Libvirtd::start_in_host_network(guard),
            Sshd::start(),
            FileServer::start(),
        );
        let (cp, libvirtd, sshd, files) = (
            cp.context("control plane")?,
            libvirtd.context("libvirtd")?,
            sshd.context("sshd")?,
            files.context("file server")?,
        );
        phases.done("control plane (etcd + kube-apiserver), sshd and libvirtd started");

        files.serve_file("/proxyvm/root.qcow2", &image.root);
        files.serve_file("/proxyvm/vmlinuz", &image.kernel);
        files.serve_file("/proxyvm/initrd.img", &image.initrd);
        files.serve(SITE_PATH, SITE_BODY);
        let site_for_guest = SocketAddr::from((gateway, files.addr().port()));

        let scratch = Scratch::new("stack")?;
        let dir = scratch.path().to_owned();
        let kubeconfig = dir.join("kubeconfig");
        cp.write_kubeconfig(&kubeconfig)?;
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let crds = repo.join("deploy/crds");
        cp.kubectl_run(&["apply", "-f", &crds.display().to_string()], None)
            .await?;
        for ns in [OPERATOR_NAMESPACE, PROXY_NAMESPACE] {
            cp.kubectl_run(&["create", "namespace", ns], None).await?;
        }
        cp.kubectl_run(
            &[
                "-n",
                OPERATOR_NAMESPACE,
                "create",
                "secret",
                "generic",
                "kvm-ssh",
                &format!(
                    "--from-file=ssh-privatekey={}",
                    sshd.client_key_path().display()
                ),
                &format!(
                    "--from-file=known_hosts={}",
                    sshd.known_hosts_path().display()
                ),
            ],
            None,
        )
        .await?;
        phases.done("CRDs, namespaces and the kvm-ssh Secret applied");

        let config_path = dir.join("providers-config.yaml");
        std::fs::write(
            &config_path,
            providers_config(options, &image, &libvirtd, &sshd, &files, gateway),
        )?;
        let (metrics, discovery): (SocketAddr, SocketAddr) = (
            ([127, 0, 0, 1], free_port()?).into(),
            ([127, 0, 0, 1], free_port()?).into(),
        );
        let mut cmd = std::process::Command::new(&options.operator_bin);
        cmd.arg("run")
            .arg("--providers-config")
            .arg(&config_path)
            .arg("--plugins-dir")
            .arg(&options.plugins_dir)
            .args(["--metrics-addr", &metrics.to_string()])
            .args(["--discovery-addr", &discovery.to_string()])
            .args(["--health-interval", "2s", "--health-timeout", "3s"])
            .args(["--health-success-threshold", "1"])
            .args(["--health-target", &site_for_guest.to_string()])
            .args(["--lease-cooldown", "30s"])
            .args(["--gc-min-age", "1m"])
            // A local run on loopback: no certificate to make, metrics open (docs/development.md).
            .args(["--discovery-plain-http", "--metrics-insecure"])
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAMESPACE", OPERATOR_NAMESPACE)
            .env("DISCOVERY_TOKEN", TOKEN)
            .env("GATEWAY_TOKEN", GATEWAY_TOKEN)
            .env("PLUGIN_CACHE_DIR", dir.join("plugin-cache"))
            .env(
                "LOG_LEVEL",
                std::env::var("LOG_LEVEL").unwrap_or_else(|_| "info".into()),
            );
        let operator = Proc::spawn("proxy-operator", cmd, &dir.join("operator.log"))?;
        // The gateway, as its Deployment runs it; the site is on the guest's view of loopback
        // (a private address), which only a test allows.
        let gateway = GatewayProcess::spawn(
            &options.operator_bin,
            discovery,
            GATEWAY_TOKEN,
            "dev-gateway",
            &[
                "--allowed-networks",
                &format!("{gateway}/32"),
                "--allowed-ports",
                &files.addr().port().to_string(),
            ],
        )?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()?;
        let mut stack = Stack {
            cp,
            libvirtd,
            sshd,
            files,
            image,
            operator,
            metrics,
            discovery,
            gateway,
            site_for_guest,
            kubeconfig,
            scratch,
            http,
        };
        stack.wait_operator_ready().await?;
        phases.done("operator ready (kvm provider loaded)");
        stack.gateway.wait_ready(Duration::from_secs(60)).await?;
        phases.done(&format!(
            "gateway ready (HTTP {}, SOCKS5 {})",
            stack.gateway.http, stack.gateway.socks
        ));
        Ok(stack)
    }

    async fn wait_operator_ready(&mut self) -> Result<()> {
        let url = format!("http://{}/readyz", self.metrics);
        self.operator
            .wait_http_ok(&self.http, &url, Duration::from_secs(90))
            .await
    }

    /// The gateway's proxy URL for `username` (routing parameters) and the crawler token.
    pub fn gateway_url(&self, username: &str) -> String {
        self.gateway.proxy_url(username, TOKEN)
    }

    /// Ends a lease (its proxy goes back to the pool).
    pub async fn release(&self, id: &str) -> Result<()> {
        let (status, body) = self
            .discovery(reqwest::Method::DELETE, &format!("/v1/leases/{id}"), None)
            .await?;
        if status != 204 {
            bail!("DELETE /v1/leases/{id}: HTTP {status}: {body}");
        }
        Ok(())
    }

    /// The Proxy API (proxy-operator.dev/v1alpha1) in [`PROXY_NAMESPACE`].
    pub fn proxies(&self) -> Api<DynamicObject> {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("proxy-operator.dev", "v1alpha1", "Proxy"),
            "proxies",
        );
        Api::namespaced_with(self.cp.client(), PROXY_NAMESPACE, &resource)
    }

    /// Applies the sample Proxy: the kvm provider, no cloud-init at all.
    pub async fn apply_proxy(&self) -> Result<()> {
        self.cp
            .kubectl_run(&["apply", "-f", "-"], Some(&sample_proxy()))
            .await?;
        Ok(())
    }

    /// The Proxy's status, `None` when it is gone.
    pub async fn proxy_status(&self) -> Result<Option<Value>> {
        Ok(self
            .proxies()
            .get_opt(PROXY_NAME)
            .await?
            .map(|p| p.data.get("status").cloned().unwrap_or(Value::Null)))
    }

    /// Waits until the Proxy is `Ready`, printing each step the VM goes through; fails with the
    /// Proxy's conditions (and the operator's log) after `timeout`.
    pub async fn wait_ready(&mut self, phases: &mut Phases, timeout: Duration) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        let mut said = std::collections::BTreeSet::new();
        let mut say = |phases: &mut Phases, key: &'static str, what: String| {
            if said.insert(key) {
                phases.done(&what);
            }
        };
        let mut last_error = None;
        loop {
            // A failed read (the API server busy) is retried until the deadline.
            let status = match self.proxy_status().await {
                Ok(status) => status.unwrap_or(Value::Null),
                Err(e) if Instant::now() <= deadline => {
                    last_error = Some(e);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
                Err(e) => return Err(e.context("reading the Proxy failed until the deadline")),
            };
            let text = |k: &str| status.get(k).and_then(Value::as_str).map(str::to_string);
            if let Some(id) = text("providerID") {
                say(
                    phases,
                    "defined",
                    format!("VM {id} defined and started (image, overlay and seed in the pool)"),
                );
            }
            if let Some(address) = text("address") {
                let port = status
                    .get("port")
                    .and_then(Value::as_u64)
                    .unwrap_or_default();
                say(
                    phases,
                    "address",
                    format!("guest agent answered: the proxy is at {address}:{port}"),
                );
            }
            // `Ready` before the first probe means only "running"; the health engine's
            // `Healthy` condition says a real CONNECT passed.
            let healthy = status
                .get("conditions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Healthy")
                .map(|c| c["status"] == "True");
            if text("phase").as_deref() == Some("Ready") && healthy == Some(true) {
                say(
                    phases,
                    "ready",
                    "Ready: a real CONNECT through the guest's squid passed".into(),
                );
                return Ok(status);
            }
            if text("phase").as_deref() == Some("Failed") {
                bail!("the Proxy failed: {}", conditions(&status));
            }
            if let Some(exited) = self.operator.try_exited() {
                bail!(
                    "the operator exited ({exited}):\n{}",
                    self.operator.log_tail(40)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "the Proxy is not Ready after {timeout:?}: {}{}\noperator log:\n{}",
                    conditions(&status),
                    last_error
                        .map(|e| format!(" (a read failed on the way: {e:#})"))
                        .unwrap_or_default(),
                    self.operator.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// A discovery API call with the token.
    pub async fn discovery(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value)> {
        let mut request = self
            .http
            .request(method, format!("http://{}{path}", self.discovery))
            .bearer_auth(TOKEN);
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    /// Leases the sample Proxy; returns the lease (`id`, `proxyUrl`, ...). A `503` (the
    /// discovery pool takes up to one health round to follow the status) is retried after its
    /// `Retry-After`, as a crawler does, for up to 30 s.
    pub async fn lease(&self) -> Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // No answer (the machine busy) is retried until the deadline like a 503.
            let (status, lease) = match self
                .discovery(
                    reqwest::Method::POST,
                    "/v1/leases",
                    Some(json!({"proxy": format!("{PROXY_NAMESPACE}/{PROXY_NAME}")})),
                )
                .await
            {
                Ok(answer) => answer,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!("POST /v1/leases: no answer, retrying: {e:#}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
                Err(e) => return Err(e.context("POST /v1/leases: no answer until the deadline")),
            };
            match status {
                201 => return Ok(lease),
                503 if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(500)).await
                }
                _ => bail!("POST /v1/leases answered {status}: {lease}"),
            }
        }
    }

    /// GETs the loopback site through `proxy_url`; returns the status and body.
    pub async fn get_through(&self, proxy_url: &str) -> Result<(u16, String)> {
        let client = reqwest::Client::builder()
            .proxy(reqwest::Proxy::http(proxy_url)?)
            .timeout(Duration::from_secs(20))
            .build()?;
        let url = self.site_url();
        let response = client
            .get(&url)
            .send()
            .await
            .with_context(|| format!("GET {url} through {proxy_url}"))?;
        Ok((response.status().as_u16(), response.text().await?))
    }

    /// The site's URL as a crawler asks for it through the proxy.
    pub fn site_url(&self) -> String {
        format!("http://{}{SITE_PATH}", self.site_for_guest)
    }

    /// Deletes the sample Proxy and waits until it is gone (its VM deleted by the operator).
    pub async fn delete_proxy(&self, timeout: Duration) -> Result<()> {
        let api = self.proxies();
        if api.get_opt(PROXY_NAME).await?.is_none() {
            return Ok(());
        }
        api.delete(PROXY_NAME, &DeleteParams::default()).await?;
        let deadline = Instant::now() + timeout;
        loop {
            // A failed read (the API server busy) is retried until the deadline.
            let seen = api.get_opt(PROXY_NAME).await;
            if matches!(seen, Ok(None)) {
                break;
            }
            if Instant::now() > deadline {
                let seen = match seen {
                    Err(e) => format!("the last read failed: {e}"),
                    Ok(_) => "it still exists".into(),
                };
                bail!(
                    "the Proxy is still there after {timeout:?} ({seen}):\n{}",
                    self.operator.log_tail(20)
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        Ok(())
    }

    /// Copies the operator's log into `dir` (the stack's scratch directory, where it is written,
    /// goes with the stack), as `operator-<unix seconds>.log`; its path.
    pub fn keep_operator_log(&self, dir: &Path) -> Result<PathBuf> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let seconds = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let kept = dir.join(format!("operator-{seconds}.log"));
        std::fs::copy(self.operator.log_path(), &kept)
            .with_context(|| format!("copy the operator's log to {}", kept.display()))?;
        Ok(kept)
    }

    /// `export KUBECONFIG=...` and the rest of what a person can try.
    /// The lease's `proxyUrl` carries the proxy's password: kept in a shell variable, not printed.
    /// `address` is the bare proxy, which answers 407 without the credentials.
    pub fn instructions(&self, address: &str) -> String {
        format!(
            "\nThe proxy VM is Ready. Try it (in another terminal):\n\n  export KUBECONFIG={kubeconfig}\n  kubectl get px,ph -A -o wide\n  proxy_url=$(curl -s -X POST -H 'Authorization: Bearer {TOKEN}' http://{discovery}/v1/leases -d '{{\"proxy\": \"{PROXY_NAMESPACE}/{PROXY_NAME}\"}}' | jq -r .proxyUrl)\n  curl -s -x \"$proxy_url\" {site}\n  curl -s -o /dev/null -w '%{{http_code}}\\n' -x {address} {site}   # 407: the proxy requires its credentials\n\nOr through the gateway, one proxy endpoint for any client (docs/gateway.md; a proxy in gateway use is not leased for 30 s after):\n  curl -s -x 'http://provider-{PROVIDER}:{TOKEN}@{gateway_http}' {site}\n  curl -s --socks5-hostname {gateway_socks} -U 'provider-{PROVIDER}:{TOKEN}' {site}\n\nThe operator's log: {log} (copied to target/dev-logs/ when make dev ends)\nPress Ctrl-C to stop everything (the VM is removed).\n",
            kubeconfig = self.kubeconfig.display(),
            discovery = self.discovery,
            gateway_http = self.gateway.http,
            gateway_socks = self.gateway.socks,
            site = self.site_url(),
            log = self.operator.log_path().display(),
        )
    }
}

/// The Proxy's conditions, one per line, for error messages.
pub fn conditions(status: &Value) -> String {
    let mut out = format!(
        "phase {}",
        status.get("phase").and_then(Value::as_str).unwrap_or("-")
    );
    for c in status
        .get("conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.push_str(&format!(
            "\n  {} {} {}: {}",
            c["type"].as_str().unwrap_or_default(),
            c["status"].as_str().unwrap_or_default(),
            c["reason"].as_str().unwrap_or_default(),
            c["message"].as_str().unwrap_or_default()
        ));
    }
    if let Some(e) = status.get("lastError").and_then(Value::as_str) {
        out.push_str(&format!("\n  lastError: {e}"));
    }
    out
}

/// The sample Proxy: no cloud-init, the provider's managed squid does it all.
pub fn sample_proxy() -> String {
    format!(
        "apiVersion: proxy-operator.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {PROXY_NAME}\n  namespace: {PROXY_NAMESPACE}\nspec:\n  provider: {PROVIDER}\n"
    )
}

/// The providers config: one kvm hypervisor on loopback, the guest image with direct kernel
/// boot, a user-mode network publishing squid on loopback ports, squid admitting the gateway
/// (where the operator's and the crawlers' connections come from, through passt).
fn providers_config(
    options: &StackOptions,
    image: &GuestImage,
    libvirtd: &Libvirtd,
    sshd: &Sshd,
    files: &FileServer,
    gateway: Ipv4Addr,
) -> String {
    format!(
        r#"# Written by the proxy-operator dev stack (tests/harness/src/stack.rs).
providers:
  - name: {PROVIDER}
    type: kvm
    config:
      domainType: qemu            # TCG: /dev/kvm does not work on this machine
      hosts:
        - name: hv1
          pool: {pool}
          network: {{mode: user, publishAddress: 127.0.0.1, portRange: "{first}-{last}"}}
      images:
        proxyvm:
          url: "{root_url}"
          sha256: "{root_sha}"
          firmware: {firmware}
          kernel: {{url: "{kernel_url}", sha256: "{kernel_sha}"}}
          initrd: {{url: "{initrd_url}", sha256: "{initrd_sha}"}}
          cmdline: "root=/dev/vda rw console=ttyS0 net.ifnames=0"
      defaultImage: proxyvm
      defaults: {{memoryMib: 512, vcpus: 1, diskGib: 3}}
      # Through passt, connections from the machine's loopback arrive from the gateway.
      allowFrom: ["{gateway}/32"]
      connectPorts: [443, {site_port}]
      # The loopback site, as the guest reaches it (squid refuses its own network otherwise).
      allowDestinations: ["{gateway}/32"]
      # The guest has no DNS here (the egress guard drops it); squid must not wait for one.
      dnsNameservers: ["127.0.0.1"]
    grants:
      http: {{allow: ["http://{files}"]}}
      libvirt:
        hosts: [{{name: hv1, address: 127.0.0.1, port: {ssh_port}, user: {user}, socket: "{socket}", pools: ["{pool}"], userNetworking: true, publishAddress: 127.0.0.1, portRange: "{first}-{last}"}}]
"#,
        pool = libvirtd.pool_name(),
        first = PORT_RANGE.0,
        last = PORT_RANGE.1,
        root_url = files.url("/proxyvm/root.qcow2"),
        root_sha = image.root_sha256,
        firmware = options.firmware,
        kernel_url = files.url("/proxyvm/vmlinuz"),
        kernel_sha = image.kernel_sha256,
        initrd_url = files.url("/proxyvm/initrd.img"),
        initrd_sha = image.initrd_sha256,
        site_port = files.addr().port(),
        files = files.addr(),
        ssh_port = sshd.port(),
        user = sshd.user(),
        socket = libvirtd.socket().display(),
    )
}

/// `proxy_url` with its password replaced by `***`, for output a person reads.
pub fn without_password(proxy_url: &str) -> String {
    match url::Url::parse(proxy_url) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(Some("***"));
            url.to_string().trim_end_matches('/').to_string()
        }
        _ => proxy_url.to_string(),
    }
}

/// `proxy_url` without user name and password: what a crawler without the lease would try.
pub fn without_credentials(proxy_url: &str) -> String {
    match url::Url::parse(proxy_url) {
        Ok(mut url) => {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.to_string().trim_end_matches('/').to_string()
        }
        Err(_) => proxy_url.to_string(),
    }
}

#[cfg(test)]
mod credential_tests {
    #[test]
    fn urls_shown_without_the_password() {
        let url = "http://egress-1:s3cr%2Fet@10.0.0.7:3128";
        assert_eq!(
            super::without_password(url),
            "http://egress-1:***@10.0.0.7:3128"
        );
        assert_eq!(super::without_credentials(url), "http://10.0.0.7:3128");
        assert_eq!(
            super::without_password("http://10.0.0.7:3128"),
            "http://10.0.0.7:3128"
        );
    }
}
