//! A local kube-apiserver + etcd for development, in the foreground.
//!
//!     cargo run -p proxy-operator-harness --bin dev-cluster -- [--kubeconfig PATH]
//!
//! Writes an admin kubeconfig (default `./target/dev-cluster.kubeconfig`),
//! prints how to use it, and stops everything on Ctrl-C (or SIGTERM).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use harness::ControlPlane;

const USAGE: &str = "usage: dev-cluster [--kubeconfig PATH]

Starts etcd + kube-apiserver on free 127.0.0.1 ports (RBAC on, admin user in
system:masters), writes a kubeconfig and runs until Ctrl-C.
Binaries: $PROXY_OPERATOR_K8S_BIN or the cache filled by tests/fixtures/k8s/build.sh.";

#[tokio::main]
async fn main() -> Result<()> {
    let mut kubeconfig: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--kubeconfig" => {
                kubeconfig = Some(args.next().context("--kubeconfig needs a path")?.into())
            }
            s if s.starts_with("--kubeconfig=") => {
                kubeconfig = Some(s["--kubeconfig=".len()..].into())
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown argument {other:?}\n\n{USAGE}"),
        }
    }
    let kubeconfig = match kubeconfig {
        Some(p) => p,
        None => default_kubeconfig()?,
    };
    let kubeconfig = std::path::absolute(&kubeconfig)?;

    eprintln!("starting etcd + kube-apiserver ...");
    let cp = ControlPlane::start().await?;
    cp.write_kubeconfig(&kubeconfig)?;
    let kubectl = cp.bin_dir().join("kubectl");
    println!(
        "
dev cluster ready in {:.1} s: {url}
  kubeconfig:  {kc}
  kubectl:     {kubectl}
  logs:        {dir}

Use it:
  export KUBECONFIG={kc}
  {kubectl} get ns
  kubectl apply -f deploy/crds/          # any kubectl works with this kubeconfig
  cargo run -p proxy-operator -- ...     # the operator reads $KUBECONFIG

No controller-manager, scheduler or kubelet: Pods stay Pending, no garbage
collection. Ctrl-C stops the cluster (its data is discarded).",
        cp.started_in().as_secs_f64(),
        url = cp.url(),
        kc = kubeconfig.display(),
        kubectl = kubectl.display(),
        dir = cp.dir().display(),
    );

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    eprintln!("\nstopping ...");
    cp.stop().await;
    drop(cp);
    let _ = std::fs::remove_file(&kubeconfig);
    eprintln!("stopped; removed {}", kubeconfig.display());
    Ok(())
}

/// `<workspace>/target/dev-cluster.kubeconfig` (the workspace of this crate).
fn default_kubeconfig() -> Result<PathBuf> {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    std::fs::create_dir_all(&target)?;
    Ok(target.join("dev-cluster.kubeconfig"))
}
