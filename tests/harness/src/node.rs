//! A real single-node Kubernetes cluster (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler, kubelet, kube-proxy, containerd + runc, bridge CNI) inside a network
//! namespace with no uplink, and the images its Pods run, built without a registry.
//!
//! Isolation (see `fixtures.md`, "A real single-node cluster"):
//! * one network namespace per cluster (`ip netns add`), `lo` up with the node IP as a /32, no
//!   route off it: a route lookup to an outside address must fail before the kubelet starts
//!   ([`Cluster::check_no_uplink`]); nothing adds a route or NAT towards the host's network;
//! * one private mount namespace (a holder process, `unshare --mount --propagation private`)
//!   that every daemon enters with `nsenter`, with a tmpfs over each host path the kubelet and
//!   containerd hard-code, so nothing they write there reaches the host;
//! * a cgroup root of its own (`/proxy-operator-node-<pid>-<n>`) for the Pods, removed at
//!   teardown, and the host-wide sysctls the kubelet sets restored (it has no opt-out);
//! * the host reaches the apiserver through a relay thread from a free 127.0.0.1 port that
//!   connects from inside the namespace.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, Config};
use sha2::{Digest, Sha256};

use crate::bins::{debian_binary, fixtures_cache_root, k8s_binary};
use crate::control_plane::{
    ADMIN_USER, Pki, config_from_kubeconfig, kubeconfig_yaml, kubectl_run, random_hex,
    wait_apiserver_ready,
};
use crate::netns::{check_no_uplink, connect_in, enter_netns, run};
use crate::process::{Check, ExitHook, Proc, Scratch, at_exit, free_port, run_output, wait_for};
use crate::shared::Shared;

mod containerd_root;

/// The node's IP: a /32 on the namespace's `lo` (the kernel here has no `dummy` module).
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
/// The node's name.
pub const NODE_NAME: &str = "harness-node";
/// Pod addresses (CNI bridge `cni0`, host-local IPAM); the bridge is `10.244.0.1`.
pub const POD_CIDR: &str = "10.244.0.0/24";
/// Service ClusterIPs (kube-proxy, iptables mode, inside the namespace).
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The `kubernetes` Service: in-cluster clients reach the apiserver here.
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
/// The body the web image serves at `/` (port 8080); `tests/fixtures/node-images/build.sh`.
pub const WEB_BODY: &str = "proxy-operator node fixture: hello from the web Pod\n";

const APISERVER_PORT: u16 = 6443;
const NODE_IMAGES_SCRIPT: &[u8] = include_bytes!("../../fixtures/node-images/build.sh");
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Host paths the kubelet, containerd and CNI hard-code: a tmpfs over each, in the private
/// mount namespace only.
const TMPFS_PATHS: &[&str] = &[
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/cni",
    "/run/containerd",
    "/run/nri",
];
/// Host-wide sysctls the kubelet sets at start (`setupKernelTunables`), restored at teardown.
const KUBELET_SYSCTLS: &[&str] = &[
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];
/// References of the images the fixture imported into the node's containerd (use them with
/// `imagePullPolicy: Never`).
#[derive(Debug, Clone)]
pub struct Images {
    /// `local/pause:<key>`: the sandbox image.
    pub pause: String,
    /// `local/squid:<key>`: Debian's squid; entrypoint `squid -N -f /etc/squid/squid.conf`
    /// (mount your own there), runs as root (drops to `proxy`) or as any `runAsUser`, e.g. 13.
    pub squid: String,
    /// `local/web:<key>`: busybox httpd on port 8080 serving [`WEB_BODY`], as uid 65534.
    pub web: String,
}

/// The directory with the image archives (`pause.tar`, `squid.tar`, `web.tar`) built by
/// `tests/fixtures/node-images/build.sh`, and their tag.
pub fn node_images_dir() -> (PathBuf, String) {
    let key = hex::encode(Sha256::digest(NODE_IMAGES_SCRIPT))[..16].to_owned();
    (
        fixtures_cache_root().join(format!("node-images-{key}")),
        key,
    )
}

/// A real single-node cluster in its own network namespace. See the module docs.
///
/// Use [`Cluster::shared`] in tests (one per test binary); [`Cluster::start`] for a private
/// one, torn down on drop.
pub struct Cluster {
    procs: Mutex<Vec<Proc>>,
    teardown: Arc<Teardown>,
    _exit: ExitHook,
    relay: Relay,
    netns_path: PathBuf,
    url: String,
    kubeconfig: PathBuf,
    config: Config,
    bin_dir: PathBuf,
    containerd_socket: PathBuf,
    /// (archive, reference) pairs imported so far, behind the lock every import takes.
    imported: tokio::sync::Mutex<HashSet<(PathBuf, String)>>,
    images: Images,
    started_in: Duration,
    phases: Vec<(&'static str, Duration)>,
    scratch: Scratch,
}

static SHARED: Shared<Cluster> = Shared::new("node cluster");

impl Cluster {
    /// The process-wide cluster, started on first use and shared by every test in this test
    /// binary; torn down when the process exits. Make a client per test with
    /// [`Cluster::client`] (a client belongs to its tokio runtime).
    ///
    /// # Panics
    /// If the cluster cannot start (every later call panics with the same message), or if a
    /// fixture is missing.
    pub async fn shared() -> &'static Cluster {
        SHARED.get(Cluster::start).await
    }

    /// [`Cluster::shared`] for synchronous code (blocks the thread).
    pub fn shared_blocking() -> &'static Cluster {
        SHARED.get_blocking(Cluster::start)
    }

    /// Starts a private cluster (fresh etcd data, new namespaces, its own cgroup root). Torn
    /// down on drop.
    pub async fn start() -> Result<Cluster> {
        let t0 = Instant::now();
        let mut phases = Vec::new();
        let mut phase_start = Instant::now();
        let mut phase = |name: &'static str| {
            phases.push((name, phase_start.elapsed()));
            phase_start = Instant::now();
        };

        // Fixtures first: a missing one is a panic naming the command that installs it.
        let bin = |name: &str| k8s_binary(name);
        let (etcd_bin, apiserver_bin, cm_bin, sched_bin, kubelet_bin, proxy_bin) = (
            bin("etcd"),
            bin("kube-apiserver"),
            bin("kube-controller-manager"),
            bin("kube-scheduler"),
            bin("kubelet"),
            bin("kube-proxy"),
        );
        bin("kubectl");
        let bin_dir = apiserver_bin.parent().unwrap().to_owned();
        let containerd_bin = debian_binary("/usr/bin/containerd", "containerd");
        debian_binary("/usr/bin/ctr", "containerd");
        debian_binary("/usr/sbin/runc", "runc");
        debian_binary("/usr/lib/cni/bridge", "containernetworking-plugins");
        debian_binary("/usr/bin/nsenter", "util-linux");
        let (images_dir, images_key) = node_images_dir();
        if !images_dir.join("SHA256SUMS").is_file() {
            panic!(
                "test fixture: node images not found at {}: build them (~2.5 min, cached) with \
                 `sudo tests/fixtures/node-images/build.sh` or `.ci/install-fixtures.sh`",
                images_dir.display()
            );
        }

        let scratch = Scratch::new("node")?;
        let dir = scratch.path().to_owned();
        static N: AtomicU64 = AtomicU64::new(0);
        let id = format!(
            "{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let netns = format!("proxy-operator-node-{id}");
        let cgroup_root = format!("proxy-operator-node-{id}");
        let teardown = Arc::new(Teardown {
            netns: netns.clone(),
            cgroup_root: cgroup_root.clone(),
            mntns: Mutex::new(None),
            sysctls_held: AtomicBool::new(false),
            done: AtomicBool::new(false),
        });
        let exit = {
            let teardown = teardown.clone();
            at_exit(move || teardown.run())
        };
        // From here on, a failure tears down what was made (Drop of the guard).
        let guard = TeardownOnError(Some(teardown.clone()));

        // The network namespace: lo, the node IP, a route for ClusterIPs from the namespace
        // itself (kube-proxy DNATs them in OUTPUT; the route only picks the source address).
        run("ip", &["netns", "add", &netns])?;
        teardown.save(&dir)?;
        let netns_path = PathBuf::from(format!("/run/netns/{netns}"));
        run("ip", &["-n", &netns, "link", "set", "lo", "up"])?;
        run(
            "ip",
            &[
                "-n",
                &netns,
                "addr",
                "add",
                &format!("{NODE_IP}/32"),
                "dev",
                "lo",
            ],
        )?;
        run(
            "ip",
            &[
                "-n",
                &netns,
                "route",
                "add",
                SERVICE_CIDR,
                "dev",
                "lo",
                "src",
                &NODE_IP.to_string(),
            ],
        )?;
        check_no_uplink(&netns_path).context("the node's network namespace has an uplink")?;

        // The mount namespace holder.
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", netns_path.display()))
            .args(["--", "unshare", "--mount", "--propagation", "private"])
            .args(["sleep", "infinity"]);
        let holder = Proc::spawn("mount-ns holder", cmd, &dir.join("holder.log"))?;
        let holder_pid = holder.pid();
        let mut procs = vec![holder];
        let own_mntns = fs::read_link("/proc/self/ns/mnt")?;
        let mntns = wait_for("the mount namespace holder", START_TIMEOUT, || {
            let ns = fs::read_link(format!("/proc/{holder_pid}/ns/mnt"))
                .ok()
                .filter(|ns| *ns != own_mntns);
            let comm = fs::read_to_string(format!("/proc/{holder_pid}/comm")).unwrap_or_default();
            let check = match (procs[0].ensure_running(), ns) {
                (Err(e), _) => Check::Failed(e),
                (Ok(()), Some(ns)) if comm.trim() == "sleep" => Check::Ready(ns),
                _ => Check::NotYet("not unshared yet".into()),
            };
            async move { check }
        })
        .await?;
        *teardown.mntns.lock().unwrap() = Some(mntns.to_string_lossy().into_owned());
        teardown.save(&dir)?;
        let mntns_path = PathBuf::from(format!("/proc/{holder_pid}/ns/mnt"));
        let mut mounts = String::new();
        for p in TMPFS_PATHS {
            mounts.push_str(&format!(
                "mkdir -p {p} && mount -t tmpfs -o mode=0755 tmpfs {p} && "
            ));
        }
        mounts.push_str("true");
        run(
            "nsenter",
            &[
                &format!("--mount={}", mntns_path.display()),
                "--",
                "sh",
                "-c",
                &mounts,
            ],
        )?;
        teardown.make_cgroups()?;
        teardown.hold_sysctls();
        phase("namespaces");

        let in_ns = |program: &Path| {
            let mut cmd = Command::new("nsenter");
            cmd.arg(format!("--net={}", netns_path.display()))
                .arg(format!("--mount={}", mntns_path.display()))
                .arg("--")
                .arg(program);
            cmd
        };

        // etcd, fresh data.
        let mut cmd = in_ns(&etcd_bin);
        cmd.arg("--name=harness")
            .arg(format!("--data-dir={}", dir.join("etcd").display()))
            .args(["--listen-client-urls=http://127.0.0.1:2379"])
            .args(["--advertise-client-urls=http://127.0.0.1:2379"])
            .args(["--listen-peer-urls=http://127.0.0.1:2380"])
            .args(["--initial-advertise-peer-urls=http://127.0.0.1:2380"])
            .args(["--initial-cluster=harness=http://127.0.0.1:2380"])
            .args([
                "--initial-cluster-state=new",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ]);
        procs.push(Proc::spawn("etcd", cmd, &dir.join("etcd.log"))?);

        // containerd.
        let cdir = scratch.subdir("containerd", 0o711)?;
        let socket = cdir.join("containerd.sock");
        let cni_conf = scratch.subdir("cni/net.d", 0o755)?;
        let images = Images {
            pause: format!("local/pause:{images_key}"),
            squid: format!("local/squid:{images_key}"),
            web: format!("local/web:{images_key}"),
        };
        write(
            &cdir.join("config.toml"),
            &containerd_config(
                &cdir,
                &socket,
                &cni_conf,
                &normalize_reference(&images.pause),
            ),
        )?;
        write(&cni_conf.join("10-harness.conflist"), &cni_config(&dir))?;
        // The images are in it already (imported once per fixture key).
        containerd_root::install(&images_dir, &images_key, &cdir.join("root"))?;
        let mut cmd = in_ns(&containerd_bin);
        cmd.arg(format!("--config={}", cdir.join("config.toml").display()));
        procs.push(Proc::spawn("containerd", cmd, &dir.join("containerd.log"))?);

        // Credentials: the serving certificate covers the node IP and the `kubernetes`
        // Service's ClusterIP (in-cluster clients) besides 127.0.0.1 (the host's relay).
        let pki_dir = scratch.subdir("pki", 0o700)?;
        let pki =
            Pki::generate_with_sans(&[NODE_IP.to_string(), KUBERNETES_SERVICE_IP.to_string()])?;
        let (kubelet_client_cert, kubelet_client_key) =
            pki.client_cert("kube-apiserver-kubelet-client", &["system:masters"])?;
        let pw = |name: &str, text: &str| -> Result<PathBuf> {
            let p = pki_dir.join(name);
            write(&p, text)?;
            Ok(p)
        };
        let ca = pw("ca.crt", &pki.ca_pem)?;
        let tls_cert = pw("apiserver.crt", &pki.serving_cert_pem)?;
        let tls_key = pw("apiserver.key", &pki.serving_key_pem)?;
        let sa_key = pw("sa.key", &pki.sa_key_pem)?;
        let sa_pub = pw("sa.pub", &pki.sa_pub_pem)?;
        let kc_cert = pw("kubelet-client.crt", &kubelet_client_cert)?;
        let kc_key = pw("kubelet-client.key", &kubelet_client_key)?;
        let users: [(&str, String, &str); 5] = [
            ("admin", ADMIN_USER.to_owned(), "system:masters"),
            (
                "controller-manager",
                "system:kube-controller-manager".into(),
                "",
            ),
            ("scheduler", "system:kube-scheduler".into(), ""),
            (
                "kubelet",
                format!("system:node:{NODE_NAME}"),
                "system:nodes",
            ),
            ("proxy", "system:kube-proxy".into(), ""),
        ];
        let mut tokens_csv = String::new();
        let mut tokens = BTreeMap::new();
        for (who, user, group) in &users {
            let token = random_hex(24);
            tokens_csv.push_str(&format!("{token},{user},{user},\"{group}\"\n"));
            tokens.insert(*who, token);
        }
        let tokens_file = pw("tokens.csv", &tokens_csv)?;
        let inner_url = format!("https://{NODE_IP}:{APISERVER_PORT}");
        let kubeconfig_for = |who: &str| -> Result<PathBuf> {
            let p = dir.join(format!("{who}.kubeconfig"));
            write(&p, &kubeconfig_yaml(&inner_url, &pki.ca_pem, &tokens[who]))?;
            Ok(p)
        };

        // kube-apiserver.
        let mut cmd = in_ns(&apiserver_bin);
        cmd.args([
            "--etcd-servers=http://127.0.0.1:2379".to_owned(),
            "--bind-address=0.0.0.0".into(),
            format!("--advertise-address={NODE_IP}"),
            format!("--secure-port={APISERVER_PORT}"),
            format!("--cert-dir={}", pki_dir.display()),
            format!("--tls-cert-file={}", tls_cert.display()),
            format!("--tls-private-key-file={}", tls_key.display()),
            format!("--client-ca-file={}", ca.display()),
            format!("--token-auth-file={}", tokens_file.display()),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            format!("--kubelet-client-certificate={}", kc_cert.display()),
            format!("--kubelet-client-key={}", kc_key.display()),
            "--kubelet-preferred-address-types=InternalIP".into(),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--service-account-key-file={}", sa_pub.display()),
            format!("--service-account-signing-key-file={}", sa_key.display()),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--allow-privileged=true".into(),
            "--enable-priority-and-fairness=false".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ]);
        let apiserver_log = dir.join("kube-apiserver.log");
        let apiserver =
            tokio::sync::Mutex::new(Proc::spawn("kube-apiserver", cmd, &apiserver_log)?);

        // The host's way in: a relay from 127.0.0.1 into the namespace.
        let relay = Relay::start(
            &netns_path,
            SocketAddrV4::new(NODE_IP, APISERVER_PORT).into(),
        )?;
        let url = format!("https://{}", relay.addr);
        let kubeconfig = dir.join("kubeconfig");
        write(
            &kubeconfig,
            &kubeconfig_yaml(&url, &pki.ca_pem, &tokens["admin"]),
        )?;
        let config = config_from_kubeconfig(&kubeconfig).await?;
        phase("spawn");

        // While the apiserver starts: containerd up (the images are in its root).
        wait_for("containerd", START_TIMEOUT, || {
            let status = ensure_all_running(&mut procs);
            let socket = socket.clone();
            async move {
                if let Err(e) = status {
                    return Check::Failed(e);
                }
                match run_output(
                    tokio::process::Command::new("ctr")
                        .arg(format!("--address={}", socket.display()))
                        .arg("version"),
                )
                .await
                {
                    Ok(_) => Check::Ready(()),
                    Err(e) => Check::NotYet(e.to_string()),
                }
            }
        })
        .await?;
        phase("containerd");

        wait_apiserver_ready(&apiserver, &config, &apiserver_log).await?;
        procs.push(apiserver.into_inner());
        phase("apiserver");

        // The rest of the control plane and the node.
        let mut cmd = in_ns(&cm_bin);
        cmd.arg(format!(
            "--kubeconfig={}",
            kubeconfig_for("controller-manager")?.display()
        ))
        .args([
            "--leader-elect=false",
            "--use-service-account-credentials=true",
        ])
        .arg(format!(
            "--service-account-private-key-file={}",
            sa_key.display()
        ))
        .arg(format!("--root-ca-file={}", ca.display()))
        .args(["--bind-address=127.0.0.1", "--v=1"]);
        procs.push(Proc::spawn(
            "kube-controller-manager",
            cmd,
            &dir.join("kube-controller-manager.log"),
        )?);
        let mut cmd = in_ns(&sched_bin);
        cmd.arg(format!(
            "--kubeconfig={}",
            kubeconfig_for("scheduler")?.display()
        ))
        .args(["--leader-elect=false", "--bind-address=127.0.0.1", "--v=1"]);
        procs.push(Proc::spawn(
            "kube-scheduler",
            cmd,
            &dir.join("kube-scheduler.log"),
        )?);

        let proxy_conf = dir.join("kube-proxy.yaml");
        write(&proxy_conf, &kube_proxy_config(&kubeconfig_for("proxy")?))?;
        let mut cmd = in_ns(&proxy_bin);
        cmd.arg(format!("--config={}", proxy_conf.display()))
            .arg("--v=1");
        procs.push(Proc::spawn("kube-proxy", cmd, &dir.join("kube-proxy.log"))?);

        // The guard again, right before anything can start a Pod.
        check_no_uplink(&netns_path).context("the node's network namespace has an uplink")?;
        let kdir = scratch.subdir("kubelet", 0o755)?;
        let resolv = kdir.join("resolv.conf");
        write(&resolv, "nameserver 127.0.0.1\n")?;
        let kubelet_conf = kdir.join("config.yaml");
        write(
            &kubelet_conf,
            &kubelet_config(
                &ca,
                &resolv,
                &socket,
                &cgroup_root,
                &kdir.join("volume-plugins"),
            ),
        )?;
        let mut cmd = in_ns(&kubelet_bin);
        cmd.arg(format!("--config={}", kubelet_conf.display()))
            .arg(format!(
                "--kubeconfig={}",
                kubeconfig_for("kubelet")?.display()
            ))
            .arg("--root-dir=/var/lib/kubelet")
            .arg(format!("--hostname-override={NODE_NAME}"))
            .arg(format!("--node-ip={NODE_IP}"))
            .arg("--v=1");
        procs.push(Proc::spawn("kubelet", cmd, &dir.join("kubelet.log"))?);
        phase("spawn node");

        let client = Client::try_from(config.clone()).context("kube client")?;
        let nodes: Api<Node> = Api::all(client.clone());
        wait_for("node Ready", START_TIMEOUT, || {
            let status = ensure_all_running(&mut procs);
            let nodes = nodes.clone();
            async move {
                if let Err(e) = status {
                    return Check::Failed(e);
                }
                match nodes.get_opt(NODE_NAME).await {
                    Ok(Some(node)) if node_ready(&node) => Check::Ready(()),
                    Ok(Some(_)) => Check::NotYet("registered, not Ready".into()),
                    Ok(None) => Check::NotYet("not registered".into()),
                    Err(e) => Check::NotYet(e.to_string()),
                }
            }
        })
        .await?;
        phase("node ready");

        // Pods need the `default` ServiceAccount (controller-manager), and in-cluster clients
        // the `kubernetes` Service (kube-proxy's rules).
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        let netns_for_check = netns_path.clone();
        wait_for(
            "default ServiceAccount and the kubernetes Service",
            START_TIMEOUT,
            || {
                let status = ensure_all_running(&mut procs);
                let sas = sas.clone();
                let netns_path = netns_for_check.clone();
                async move {
                    if let Err(e) = status {
                        return Check::Failed(e);
                    }
                    match sas.get_opt("default").await {
                        Ok(Some(_)) => {}
                        Ok(None) => return Check::NotYet("no default ServiceAccount".into()),
                        Err(e) => return Check::NotYet(e.to_string()),
                    }
                    let service = SocketAddrV4::new(KUBERNETES_SERVICE_IP, 443).into();
                    match connect_in(&netns_path, service).await {
                        Ok(_) => Check::Ready(()),
                        Err(e) => Check::NotYet(format!("connect {service} in the namespace: {e}")),
                    }
                }
            },
        )
        .await?;
        phase("service account + kube-proxy");

        std::mem::forget(guard);
        let started_in = t0.elapsed();
        tracing::info!(%url, ?started_in, ?phases, dir = %dir.display(), "node cluster ready");
        Ok(Cluster {
            procs: Mutex::new(procs),
            teardown,
            _exit: exit,
            relay,
            netns_path,
            url,
            kubeconfig,
            config,
            bin_dir,
            containerd_socket: socket,
            imported: tokio::sync::Mutex::default(),
            images,
            started_in,
            phases,
            scratch,
        })
    }

    /// A new admin client (`system:masters`) on the current tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn client(&self) -> Client {
        Client::try_from(self.config.clone()).expect("create kube::Client")
    }

    /// The admin client configuration (through the host's relay).
    pub fn config(&self) -> Config {
        self.config.clone()
    }

    /// `https://127.0.0.1:PORT`: the host's relay to the apiserver.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// An admin kubeconfig usable on the host (server = the relay).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// `kubectl --kubeconfig=...` ready for arguments.
    pub fn kubectl(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(self.bin_dir.join("kubectl"));
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display()));
        cmd
    }

    /// Runs kubectl with `args` (and `stdin`, e.g. a manifest for `apply -f -`); returns stdout,
    /// or an error carrying stderr.
    pub async fn kubectl_run(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        kubectl_run(self.kubectl(), args, stdin).await
    }

    /// Creates a namespace `<prefix>-<random>` and waits for its `default` ServiceAccount.
    pub async fn create_namespace(&self, prefix: &str) -> Result<String> {
        let name = format!("{prefix}-{}", random_hex(3));
        let client = self.client();
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("create namespace {name}"))?;
        let sas: Api<ServiceAccount> = Api::namespaced(client, &name);
        wait_for(
            "the namespace's default ServiceAccount",
            START_TIMEOUT,
            || {
                let sas = sas.clone();
                async move {
                    match sas.get_opt("default").await {
                        Ok(Some(_)) => Check::Ready(()),
                        Ok(None) => Check::NotYet("not yet".into()),
                        Err(e) => Check::NotYet(e.to_string()),
                    }
                }
            },
        )
        .await?;
        Ok(name)
    }

    /// The node's name ([`NODE_NAME`]).
    pub fn node_name(&self) -> &str {
        NODE_NAME
    }

    /// The node's IP inside the namespace ([`NODE_IP`]).
    pub fn node_ip(&self) -> Ipv4Addr {
        NODE_IP
    }

    /// The images imported at start.
    pub fn images(&self) -> &Images {
        &self.images
    }

    /// Imports an OCI archive (`oci-layout` + `index.json` in a tar, e.g. from `umoci`,
    /// `buildah push oci-archive:`) into the node's containerd as `reference` (e.g.
    /// `local/proxy-operator:dev`); Pods use it with `imagePullPolicy: Never`.
    pub async fn import_image(&self, oci_archive: &Path, reference: &str) -> Result<()> {
        // One import at a time, and an archive already imported under this name not again: two
        // tests importing the same image at once into one containerd failed with "content
        // digest … not found" (the second import's blobs "already exist", so its lease does not
        // hold them, and the first import's lease ending lets the garbage collector take them).
        let mut imported = self.imported.lock().await;
        let key = (oci_archive.to_owned(), reference.to_owned());
        if imported.contains(&key) {
            return Ok(());
        }
        // Imported under the name its index annotates, then tagged: ctr 1.6's `--index-name`
        // failed every time on some archives ("content digest <the index.json's> not found":
        // the index is not among the archive's blobs).
        let name = normalize_reference(reference);
        import(&self.containerd_socket, oci_archive).await?;
        let annotated = normalize_reference(&annotated_name(oci_archive).await?);
        if annotated != name {
            run_output(
                tokio::process::Command::new("ctr")
                    .arg(format!("--address={}", self.containerd_socket.display()))
                    .args(["--namespace=k8s.io", "images", "tag", "--force"])
                    .args([&annotated, &name]),
            )
            .await
            .with_context(|| format!("tag {annotated} as {name}"))?;
        }
        imported.insert(key);
        Ok(())
    }

    /// `program` run inside the cluster's network namespace (`nsenter --net`), e.g. `curl` to
    /// a ClusterIP or a Pod IP.
    pub fn netns_command(&self, program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("nsenter");
        cmd.arg(format!("--net={}", self.netns_path.display()))
            .arg("--")
            .arg(program);
        cmd
    }

    /// A TCP connection made from inside the network namespace (to a Pod IP, a ClusterIP, the
    /// node IP), for use on the current tokio runtime.
    pub async fn connect(&self, addr: SocketAddr) -> io::Result<tokio::net::TcpStream> {
        let stream = connect_in(&self.netns_path, addr).await?;
        tokio::net::TcpStream::from_std(stream)
    }

    /// Fails unless a route lookup to every one of a few outside addresses fails inside the
    /// namespace (no uplink). Checked at start, before the kubelet runs.
    pub fn check_no_uplink(&self) -> Result<()> {
        check_no_uplink(&self.netns_path)
    }

    /// `/run/netns/<name>`.
    pub fn netns_path(&self) -> &Path {
        &self.netns_path
    }

    /// The directory with `kubectl` and the cluster's binaries.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The scratch directory (logs: `kubelet.log`, `containerd.log`, `kube-apiserver.log`, ...).
    pub fn dir(&self) -> &Path {
        self.scratch.path()
    }

    /// How long [`Cluster::start`] took.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// How long each phase of [`Cluster::start`] took, in order.
    pub fn phases(&self) -> &[(&'static str, Duration)] {
        &self.phases
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.relay.stop();
        // The kubelet first (it would restart what goes away), then the rest.
        let mut procs = std::mem::take(&mut *self.procs.lock().unwrap());
        while let Some(mut p) = procs.pop() {
            p.kill();
        }
        self.teardown.run();
    }
}

fn ensure_all_running(procs: &mut [Proc]) -> Result<()> {
    procs.iter_mut().try_for_each(|p| p.ensure_running())
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn write(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).with_context(|| format!("write {}", path.display()))
}

/// `docker.io/library/x:latest` for `x`, as containerd's CRI names images.
fn normalize_reference(reference: &str) -> String {
    let (name, tagged) = match reference.rsplit_once('/') {
        Some((_, last)) => (reference, last.contains(':') || last.contains('@')),
        None => (
            reference,
            reference.contains(':') || reference.contains('@'),
        ),
    };
    let first = name.split('/').next().unwrap_or_default();
    let has_domain =
        name.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let mut out = match (has_domain, name.contains('/')) {
        (true, _) => name.to_owned(),
        (false, true) => format!("docker.io/{name}"),
        (false, false) => format!("docker.io/library/{name}"),
    };
    if !tagged {
        out.push_str(":latest");
    }
    out
}

/// The `org.opencontainers.image.ref.name` of an OCI archive's (first) image: the name a plain
/// `ctr images import` gives it.
async fn annotated_name(archive: &Path) -> Result<String> {
    let index = run_output(
        tokio::process::Command::new("tar")
            .arg("-xOf")
            .arg(archive)
            .arg("index.json"),
    )
    .await?;
    let index: serde_json::Value = serde_json::from_str(&index)
        .with_context(|| format!("index.json of {}", archive.display()))?;
    index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| {
            format!(
                "{} names no image (org.opencontainers.image.ref.name)",
                archive.display()
            )
        })
}

/// `ctr images import` of an OCI archive, unpacked for the CRI, named as its index annotates.
/// Tried up to three times (a failure that repeats is returned).
async fn import(socket: &Path, archive: &Path) -> Result<()> {
    const ATTEMPTS: usize = 3;
    let mut attempt = 1;
    loop {
        let result = run_output(
            tokio::process::Command::new("ctr")
                .arg(format!("--address={}", socket.display()))
                .args(["--namespace=k8s.io", "images", "import"])
                .arg(archive),
        )
        .await
        .with_context(|| format!("import {}", archive.display()));
        match result {
            Ok(_) => return Ok(()),
            Err(e) if attempt < ATTEMPTS => {
                eprintln!("[node] import attempt {attempt} failed, trying again: {e:#}");
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// A relay from a free 127.0.0.1 port into the network namespace, on plain threads (it must
/// outlive the runtime that started it, for the shared cluster).
struct Relay {
    addr: SocketAddr,
    stopped: Arc<AtomicBool>,
}

impl Relay {
    fn start(netns: &Path, target: SocketAddr) -> Result<Relay> {
        let listener = TcpListener::bind(("127.0.0.1", free_port()?)).context("bind the relay")?;
        let addr = listener.local_addr()?;
        let stopped = Arc::new(AtomicBool::new(false));
        let stop = stopped.clone();
        let netns = netns.to_owned();
        std::thread::Builder::new()
            .name("harness-node-relay".into())
            .spawn(move || {
                // The listener stays in the host's namespace; connections are made from here.
                if let Err(e) = enter_netns(&netns) {
                    tracing::error!(%e, "relay: enter the namespace");
                    return;
                }
                for client in listener.incoming() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(client) = client else { continue };
                    let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(5))
                    else {
                        continue;
                    };
                    pipe(client, server);
                }
            })?;
        Ok(Relay { addr, stopped })
    }

    fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr); // wakes the accept loop
    }
}

fn pipe(a: TcpStream, b: TcpStream) {
    let copy = |mut from: TcpStream, mut to: TcpStream| {
        std::thread::spawn(move || {
            let _ = io::copy(&mut from, &mut to);
            let _ = to.shutdown(std::net::Shutdown::Write);
        });
    };
    if let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) {
        copy(a, b2);
        copy(b, a2);
    }
}

/// What a cluster leaves on the host, and how to remove it: also written to the scratch
/// directory, so that the next harness user cleans up after a killed test process.
struct Teardown {
    netns: String,
    cgroup_root: String,
    /// `mnt:[inode]` of the private mount namespace (containerd's shims stay in it).
    mntns: Mutex<Option<String>>,
    sysctls_held: AtomicBool,
    done: AtomicBool,
}

/// Original values of the kubelet's sysctls, and how many clusters of this process hold them.
static SYSCTLS: Mutex<(usize, Vec<(String, String)>)> = Mutex::new((0, Vec::new()));

impl Teardown {
    const FILE: &'static str = "node-teardown";

    fn save(&self, dir: &Path) -> Result<()> {
        let mut text = format!("netns {}\ncgroup {}\n", self.netns, self.cgroup_root);
        if let Some(ns) = &*self.mntns.lock().unwrap() {
            text.push_str(&format!("mntns {ns}\n"));
        }
        for p in KUBELET_SYSCTLS {
            if let Ok(v) = fs::read_to_string(Path::new("/proc/sys").join(p)) {
                text.push_str(&format!("sysctl {p} {}\n", v.trim()));
            }
        }
        // Write the originals only once (the first save comes before the kubelet starts).
        let path = dir.join(Self::FILE);
        if let Ok(old) = fs::read_to_string(&path) {
            let sysctls: String = old
                .lines()
                .filter(|l| l.starts_with("sysctl "))
                .map(|l| format!("{l}\n"))
                .collect();
            text = text
                .lines()
                .filter(|l| !l.starts_with("sysctl "))
                .map(|l| format!("{l}\n"))
                .collect::<String>()
                + &sysctls;
        }
        write(&path, &text)
    }

    fn hold_sysctls(&self) {
        let mut held = SYSCTLS.lock().unwrap();
        if held.0 == 0 {
            held.1 = KUBELET_SYSCTLS
                .iter()
                .filter_map(|p| {
                    let v = fs::read_to_string(Path::new("/proc/sys").join(p)).ok()?;
                    Some((p.to_string(), v.trim().to_owned()))
                })
                .collect();
        }
        held.0 += 1;
        self.sysctls_held.store(true, Ordering::Relaxed);
    }

    fn release_sysctls(&self) {
        if !self.sysctls_held.swap(false, Ordering::Relaxed) {
            return;
        }
        // try_lock: never block process exit.
        let Ok(mut held) = SYSCTLS.try_lock() else {
            return;
        };
        held.0 -= 1;
        if held.0 == 0 {
            restore_sysctls(&held.1);
        }
    }

    /// Every mounted hierarchy, the cgroup v2 one (`unified`) included: the kubelet creates
    /// its cgroups there too.
    fn hierarchies() -> Vec<PathBuf> {
        fs::read_dir("/sys/fs/cgroup")
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.join("cgroup.procs").exists())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The kubelet wants its cgroup root to exist in every hierarchy.
    fn make_cgroups(&self) -> Result<()> {
        for h in Self::hierarchies() {
            let dir = h.join(&self.cgroup_root);
            fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
            // A new cpuset cgroup starts empty: copy its parent's CPUs and memory nodes.
            for f in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(v) = fs::read_to_string(h.join(f)) {
                    fs::write(dir.join(f), v.trim())
                        .with_context(|| format!("write {}", dir.join(f).display()))?;
                }
            }
        }
        Ok(())
    }

    /// Kills the Pods (by cgroup) and whatever is left in the mount namespace (containerd's
    /// shims), removes the cgroups, restores the sysctls, deletes the network namespace.
    /// Idempotent; blocking.
    fn run(&self) {
        if self.done.swap(true, Ordering::SeqCst) {
            return;
        }
        let mntns = self.mntns.lock().map(|m| m.clone()).unwrap_or(None);
        cleanup(&self.cgroup_root, mntns.as_deref(), &self.netns);
        self.release_sysctls();
    }
}

fn restore_sysctls(values: &[(String, String)]) {
    for (p, v) in values {
        let path = Path::new("/proc/sys").join(p);
        if fs::read_to_string(&path).is_ok_and(|now| now.trim() != v) {
            let _ = fs::write(&path, v);
        }
    }
}

fn cleanup(cgroup_root: &str, mntns: Option<&str>, netns: &str) {
    let hierarchies = Teardown::hierarchies();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut pids = Vec::new();
        for h in &hierarchies {
            collect_procs(&h.join(cgroup_root), &mut pids);
        }
        if let Some(ns) = mntns {
            pids.extend(procs_in_mntns(ns));
        }
        if pids.is_empty() || Instant::now() > deadline {
            break;
        }
        for pid in pids {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for h in &hierarchies {
        remove_cgroup_tree(&h.join(cgroup_root));
    }
    crate::netns::delete(netns);
}

fn collect_procs(dir: &Path, pids: &mut Vec<libc::pid_t>) {
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(
            text.lines()
                .filter_map(|l| l.trim().parse::<libc::pid_t>().ok()),
        );
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_procs(&e.path(), pids);
            }
        }
    }
}

fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    // rmdir only: a cgroup's files cannot (and need not) be removed.
    let _ = fs::remove_dir(dir);
}

fn procs_in_mntns(ns: &str) -> Vec<libc::pid_t> {
    let own = std::process::id() as libc::pid_t;
    fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
                .filter(|pid| *pid != own)
                .filter(|pid| {
                    fs::read_link(format!("/proc/{pid}/ns/mnt"))
                        .is_ok_and(|l| l.to_string_lossy() == ns)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Removes what a node cluster of a dead test process left (called for its scratch
/// directory before that is deleted).
pub(crate) fn sweep_stale(scratch_dir: &Path) {
    let Ok(text) = fs::read_to_string(scratch_dir.join(Teardown::FILE)) else {
        return;
    };
    let (mut netns, mut cgroup, mut mntns, mut sysctls) = (None, None, None, Vec::new());
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("netns", v)) => netns = Some(v.to_owned()),
            Some(("cgroup", v)) => cgroup = Some(v.to_owned()),
            Some(("mntns", v)) => mntns = Some(v.to_owned()),
            Some(("sysctl", v)) => {
                if let Some((p, val)) = v.split_once(' ') {
                    sysctls.push((p.to_owned(), val.to_owned()));
                }
            }
            _ => {}
        }
    }
    if let (Some(netns), Some(cgroup)) = (netns, cgroup) {
        tracing::info!(%netns, "cleaning up a node cluster of a dead test process");
        cleanup(&cgroup, mntns.as_deref(), &netns);
        // Only when no cluster of this process holds them (its kubelet needs nothing restored).
        if SYSCTLS.lock().map(|s| s.0 == 0).unwrap_or(false) {
            restore_sysctls(&sysctls);
        }
    }
}

/// Tears down on drop unless forgotten (a failed start).
struct TeardownOnError(Option<Arc<Teardown>>);

impl Drop for TeardownOnError {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            t.run();
        }
    }
}

fn containerd_config(dir: &Path, socket: &Path, cni_conf: &Path, pause: &str) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # runc cannot lower oom_score_adj without CAP_SYS_RESOURCE: every sandbox would fail.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
        socket = socket.display(),
        cni = cni_conf.display(),
    )
}

fn cni_config(dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "harness",
        "plugins": [{
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            // No NAT towards anything: the namespace has no uplink and must get none.
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": POD_CIDR}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": dir.join("cni/ipam"),
            },
        }],
    })
    .to_string()
}

fn kubelet_config(
    ca: &Path,
    resolv: &Path,
    socket: &Path,
    cgroup_root: &str,
    volume_plugins: &Path,
) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup_root}
failSwapOn: false
containerRuntimeEndpoint: unix://{socket}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
resolvConf: {resolv}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
volumePluginDir: {volume_plugins}
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 1Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
nodeStatusReportFrequency: 10s
# A changed ConfigMap reaches a Pod's volume at the next sync (default every minute): tests that
# change a mounted config (the chart's `helm upgrade` of the providers config) wait less.
syncFrequency: 10s
"#,
        socket = socket.display(),
        ca = ca.display(),
        resolv = resolv.display(),
        volume_plugins = volume_plugins.display(),
    )
}

fn kube_proxy_config(kubeconfig: &Path) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kc}
mode: iptables
hostnameOverride: {NODE_NAME}
clusterCIDR: {POD_CIDR}
bindAddress: 0.0.0.0
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Zero: leave the host-wide conntrack sysctls alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  # A Pod reaching a Service backed by a Pod on the same bridge gets its replies.
  masqueradeAll: true
  minSyncPeriod: 0s
"#,
        kc = kubeconfig.display(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_normalized_like_the_cri() {
        assert_eq!(
            normalize_reference("local/squid:abc"),
            "docker.io/local/squid:abc"
        );
        assert_eq!(
            normalize_reference("busybox"),
            "docker.io/library/busybox:latest"
        );
        assert_eq!(normalize_reference("ghcr.io/a/b:1"), "ghcr.io/a/b:1");
        assert_eq!(
            normalize_reference("localhost:5000/a"),
            "localhost:5000/a:latest"
        );
    }
}
