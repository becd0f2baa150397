//! A local kube-apiserver + etcd for development, in the foreground.
//!
//!     cargo run -p proxy-operator-harness --bin dev-cluster -- [--node] [--kubeconfig PATH]
//!
//! `--node` starts a real single-node cluster instead (kubelet, containerd, kube-proxy, ... in a
//! network namespace with no uplink, `harness::Cluster`; as root).
//!
//! Writes an admin kubeconfig (default `target/dev-cluster-<pid>.kubeconfig`, one per run, so two
//! runs on one checkout never share one), prints how to use it, and stops everything on Ctrl-C
//! (or SIGTERM), removing the kubeconfig only if it is still the one this run wrote.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use harness::ControlPlane;

const USAGE: &str = "usage: dev-cluster [--node] [--kubeconfig PATH]

Starts etcd + kube-apiserver on free 127.0.0.1 ports (RBAC on, admin user in
system:masters), writes a kubeconfig (default target/dev-cluster-<pid>.kubeconfig)
and runs until Ctrl-C.
--node: a real single-node cluster (controller-manager, scheduler, kubelet,
kube-proxy, containerd) in a network namespace with no uplink; the apiserver is
reached through a 127.0.0.1 relay. Needs root.
Binaries: $PROXY_OPERATOR_K8S_BIN or the cache filled by tests/fixtures/k8s/build.sh.";

#[tokio::main]
async fn main() -> Result<()> {
    let mut kubeconfig: Option<PathBuf> = None;
    let mut node = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--kubeconfig" => {
                kubeconfig = Some(args.next().context("--kubeconfig needs a path")?.into())
            }
            s if s.starts_with("--kubeconfig=") => {
                kubeconfig = Some(s["--kubeconfig=".len()..].into())
            }
            "--node" => node = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown argument {other:?}\n\n{USAGE}"),
        }
    }
    let kubeconfig = match kubeconfig {
        Some(p) => normalised(&p)?,
        None => default_kubeconfig()?,
    };
    // Held until exit: a second run told to use the same file is refused instead of taking it.
    let claim = claim(&kubeconfig)?;

    if node {
        return run_node(&kubeconfig, claim).await;
    }
    eprintln!("starting etcd + kube-apiserver ...");
    let cp = match ControlPlane::start().await {
        Ok(cp) => cp,
        Err(e) => {
            // Nothing written yet: the empty file is ours to remove.
            let _ = std::fs::remove_file(&kubeconfig);
            return Err(e);
        }
    };
    let written = std::fs::read(cp.kubeconfig())?;
    claim.write(&written)?;
    let kubectl = cp.bin_dir().join("kubectl");
    // Listen before saying "ready": a SIGTERM right after the message must stop the cluster,
    // not kill the process with the default action.
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut interrupt) = (
        signal(SignalKind::terminate())?,
        signal(SignalKind::interrupt())?,
    );
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

    tokio::select! {
        _ = interrupt.recv() => {}
        _ = term.recv() => {}
    }
    eprintln!("\nstopping ...");
    cp.stop().await;
    drop(cp);
    // Only what this run wrote: someone may have replaced the file since.
    if std::fs::read(&kubeconfig).is_ok_and(|now| now == written) {
        let _ = std::fs::remove_file(&kubeconfig);
        eprintln!("stopped; removed {}", kubeconfig.display());
    } else {
        eprintln!(
            "stopped; {} was changed by someone else, left alone",
            kubeconfig.display()
        );
    }
    drop(claim);
    Ok(())
}

/// `--node`: the single-node cluster, until Ctrl-C or SIGTERM.
async fn run_node(kubeconfig: &Path, claim: Claim) -> Result<()> {
    eprintln!(
        "starting a single-node cluster (etcd, apiserver, controller-manager, scheduler, kubelet, kube-proxy, containerd) ..."
    );
    let cluster = match harness::Cluster::start().await {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_file(kubeconfig);
            return Err(e);
        }
    };
    let written = std::fs::read(cluster.kubeconfig())?;
    claim.write(&written)?;
    use tokio::signal::unix::{SignalKind, signal};
    let (mut term, mut interrupt) = (
        signal(SignalKind::terminate())?,
        signal(SignalKind::interrupt())?,
    );
    let kubectl = cluster.bin_dir().join("kubectl");
    let phases: Vec<String> = cluster
        .phases()
        .iter()
        .map(|(name, d)| format!("{name} {:.1} s", d.as_secs_f64()))
        .collect();
    let images = cluster.images();
    println!(
        "
node cluster ready in {:.1} s ({phases}): {url}
  kubeconfig:  {kc}
  kubectl:     {kubectl}
  logs:        {dir}
  images:      {pause} {squid} {web} (imagePullPolicy: Never)
  netns:       {netns} (run a command in it: nsenter --net={netns} CMD)

Use it:
  export KUBECONFIG={kc}
  {kubectl} get nodes -o wide

Ctrl-C stops the cluster (its data is discarded).",
        cluster.started_in().as_secs_f64(),
        phases = phases.join(", "),
        url = cluster.url(),
        kc = kubeconfig.display(),
        kubectl = kubectl.display(),
        dir = cluster.dir().display(),
        pause = images.pause,
        squid = images.squid,
        web = images.web,
        netns = cluster.netns_path().display(),
    );
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = term.recv() => {}
    }
    eprintln!("\nstopping ...");
    drop(cluster);
    if std::fs::read(kubeconfig).is_ok_and(|now| now == written) {
        let _ = std::fs::remove_file(kubeconfig);
        eprintln!("stopped; removed {}", kubeconfig.display());
    }
    drop(claim);
    Ok(())
}

/// `<target>/dev-cluster-<pid>.kubeconfig`, where `<target>` is `$CARGO_TARGET_DIR` or the
/// workspace's `target/`. Files of runs that are gone (killed before they could clean up) are
/// removed on the way.
fn default_kubeconfig() -> Result<PathBuf> {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    std::fs::create_dir_all(&target)?;
    let target = target.canonicalize()?;
    for entry in std::fs::read_dir(&target)?.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix("dev-cluster-"))
            .and_then(|n| n.strip_suffix(".kubeconfig"))
            .and_then(|n| n.parse::<libc::pid_t>().ok());
        // kill(pid, 0) fails with ESRCH when no such process exists.
        if let Some(pid) = pid
            && unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(target.join(format!("dev-cluster-{}.kubeconfig", std::process::id())))
}

/// `path` absolute and without `.` or `..`, as it is printed: its directory resolved (it must
/// exist), the file name kept.
fn normalised(path: &Path) -> Result<PathBuf> {
    let absolute = std::path::absolute(path)?;
    let (Some(dir), Some(name)) = (absolute.parent(), absolute.file_name()) else {
        bail!("--kubeconfig {}: not a file path", path.display());
    };
    let dir = dir.canonicalize().with_context(|| {
        format!(
            "--kubeconfig {}: directory {}",
            path.display(),
            dir.display()
        )
    })?;
    Ok(dir.join(name))
}

/// The kubeconfig file, locked (`flock`) for as long as this run lives.
struct Claim(File);

/// Opens and locks `path`; refuses when another dev-cluster holds it.
fn claim(path: &Path) -> Result<Claim> {
    loop {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            bail!(
                "another dev-cluster is running with {}; stop it, or give this one its own file \
                 with --kubeconfig PATH (without the flag each run gets its own)",
                path.display()
            );
        }
        // The holder may have removed the file between our open and our lock: lock the file
        // that is at the path now.
        let same = std::fs::metadata(path)
            .is_ok_and(|m| m.ino() == file.metadata().map(|f| f.ino()).unwrap_or(0));
        if same {
            return Ok(Claim(file));
        }
    }
}

impl Claim {
    fn write(&self, bytes: &[u8]) -> Result<()> {
        let mut file = &self.0;
        file.set_len(0)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        Ok(())
    }
}
