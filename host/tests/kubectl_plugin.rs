//! `kubectl px` (the binary `kubectl-px`) as a user runs it: against the real API server, with
//! the operator binary running, the test provider's stores and real squids, through kubectl
//! itself where kubectl is the way in (plugin dispatch, completion). Each test checks what the
//! user reads: the tables, the explanations, the exit codes.

mod common;
#[path = "kubectl_plugin/fleet.rs"]
mod fleet;
#[path = "kubectl_plugin/krew.rs"]
mod krew;
#[path = "kubectl_plugin/usage.rs"]
mod usage;
#[path = "kubectl_plugin/why.rs"]
mod why;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::InstanceStore;
use common::operator_process::{OperatorProcess, OperatorSetup};
use harness::{ControlPlane, FileServer, Squid, TestNamespace};
use tokio::sync::OnceCell;

static CLUSTER: OnceCell<()> = OnceCell::const_new();

/// The shared control plane with the CRDs, namespaces and RBAC of `deploy/`.
async fn control_plane() -> &'static ControlPlane {
    let cp = ControlPlane::shared().await;
    CLUSTER
        .get_or_init(|| async {
            for file in ["crds", "namespace.yaml", "rbac.yaml"] {
                let path = format!("{}/../deploy/{file}", env!("CARGO_MANIFEST_DIR"));
                cp.kubectl_run(&["apply", "-f", &path], None)
                    .await
                    .unwrap_or_else(|e| panic!("applying deploy/{file}: {e}"));
            }
            cp.kubectl_run(
                &[
                    "wait",
                    "--for=condition=Established",
                    "--timeout=60s",
                    "crd/proxies.proxy-operator.dev",
                    "crd/proxypools.proxy-operator.dev",
                    "crd/providerhealths.proxy-operator.dev",
                ],
                None,
            )
            .await
            .expect("CRDs established");
        })
        .await;
    cp
}

/// What one run of `kubectl-px` printed and exited with.
#[derive(Debug)]
struct Ran {
    stdout: String,
    stderr: String,
    code: i32,
}

impl Ran {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {self:#?}"))
    }
}

/// `kubectl-px` for one test: the cluster of `kubeconfig`, the namespace, and the operator's
/// namespace and id (where its lease table is) through the variables a user would set.
struct Px {
    kubeconfig: PathBuf,
    namespace: String,
    operator_id: String,
    env: Vec<(String, String)>,
}

impl Px {
    fn new(cp: &ControlPlane, ns: &TestNamespace) -> Px {
        Px {
            kubeconfig: cp.kubeconfig().to_path_buf(),
            namespace: ns.name().to_string(),
            operator_id: format!("e2e-{}", ns.name()),
            env: Vec::new(),
        }
    }

    fn with_env(mut self, name: &str, value: &str) -> Px {
        self.env.push((name.into(), value.into()));
        self
    }

    async fn run(&self, args: &[&str]) -> Ran {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-px"));
        command
            .args(["-n", &self.namespace])
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("PROXY_OPERATOR_NAMESPACE", &self.namespace)
            .env("PROXY_OPERATOR_ID", &self.operator_id)
            .env_remove("NO_COLOR")
            .env_remove("DISCOVERY_URL")
            .env_remove("DISCOVERY_CA_FILE")
            .env_remove("DISCOVERY_TOKEN")
            .env_remove("DISCOVERY_TOKEN_FILE");
        for (name, value) in &self.env {
            command.env(name, value);
        }
        let out = command.output().await.expect("running kubectl-px");
        Ran {
            stdout: String::from_utf8(out.stdout).expect("UTF-8"),
            stderr: String::from_utf8(out.stderr).expect("UTF-8"),
            code: out.status.code().unwrap_or(-1),
        }
    }

    /// Runs `args` until `done` holds for what it printed (90 s at most).
    async fn until(&self, args: &[&str], what: &str, done: impl Fn(&Ran) -> bool) -> Ran {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let ran = self.run(args).await;
            if done(&ran) {
                return ran;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; last `kubectl px {}`: {ran:#?}",
                args.join(" ")
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// The test's namespace, the test provider's stores, squid, the loopback health target, and
/// the operator binary running with them.
struct World {
    cp: &'static ControlPlane,
    ns: TestNamespace,
    store: InstanceStore,
    squid: Squid,
    target: FileServer,
    dir: tempfile::TempDir,
}

impl World {
    async fn start(prefix: &str) -> World {
        let cp = control_plane().await;
        World {
            cp,
            ns: cp.namespace(prefix).await.unwrap(),
            store: InstanceStore::start().await,
            squid: Squid::start().await.unwrap(),
            target: FileServer::start().await.unwrap(),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// The operator with `providers` (entries of a providers config) and further flags.
    async fn operator(&self, providers: &str, extra: &[&str]) -> OperatorProcess {
        let config = self.dir.path().join("providers.yaml");
        std::fs::write(&config, format!("providers:\n{providers}")).unwrap();
        let config = config.to_str().unwrap().to_string();
        let target = self.target.addr().to_string();
        // As deploy/ runs it: the discovery API over TLS (`kubectl px lease` trusts its CA,
        // `World::discovery_ca`), /metrics and /status for a token RBAC allows (`kubectl px
        // status --metrics-url` sends the kubeconfig's).
        let tls = self.dir.path().join("discovery-tls");
        std::fs::create_dir_all(&tls).unwrap();
        let files = common::test_ca::TestCa::new("px CA").write(&tls, &["localhost"]);
        let mut operator = OperatorProcess::start_with(OperatorSetup {
            extra: extra.iter().map(|f| f.to_string()).collect(),
            discovery_tls: Some((files.cert, files.key)),
            metrics_insecure: false,
            ..OperatorProcess::setup(self.cp, &self.ns, self.dir.path(), &config, &target)
        });
        operator.wait_leading().await;
        operator
    }

    /// The CA of the operator's discovery API (`Self::operator`).
    fn discovery_ca(&self) -> String {
        let ca = self.dir.path().join("discovery-tls/ca.crt");
        ca.to_str().unwrap().to_string()
    }

    async fn apply(&self, yaml: &str) {
        self.cp
            .kubectl_run(&["apply", "-f", "-"], Some(yaml))
            .await
            .unwrap();
    }

    fn px(&self) -> Px {
        Px::new(self.cp, &self.ns)
    }

    /// `kubectl px` for leasing from `operator`: its discovery URL and CA, and the operator's
    /// static token in the Secret where deploy/ puts it (the operator's namespace is the test's).
    async fn leasing_px(&self, operator: &OperatorProcess) -> Px {
        let token = format!("--from-literal=token={}", common::operator_process::TOKEN);
        let secret = [
            "-n",
            self.ns.name(),
            "create",
            "secret",
            "generic",
            "proxy-operator-discovery",
            &token,
        ];
        self.cp.kubectl_run(&secret, None).await.unwrap();
        let url = format!("https://localhost:{}", operator.discovery.port());
        self.px()
            .with_env("DISCOVERY_URL", &url)
            .with_env("DISCOVERY_CA_FILE", &self.discovery_ca())
    }
}

fn proxy_yaml(ns: &str, name: &str, provider: &str, port: u16) -> String {
    format!(
        "apiVersion: proxy-operator.dev/v1alpha1\nkind: Proxy\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  provider: {provider}\n  port: {port}\n"
    )
}

/// The admin kubeconfig with another user's bearer token.
fn kubeconfig_with_token(cp: &ControlPlane, token: &str, path: &Path) {
    let text = std::fs::read_to_string(cp.kubeconfig()).unwrap();
    assert!(
        text.contains(cp.token()),
        "the harness kubeconfig carries its token"
    );
    std::fs::write(path, text.replace(cp.token(), token)).unwrap();
}
