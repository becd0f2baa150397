//! `make dev-cluster` (the `dev-cluster` binary) run twice on one checkout: each run has its own
//! kubeconfig, prints it as a normalised path, and removes only what it wrote.

use std::path::{Component, Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

struct DevCluster {
    child: Child,
    kubeconfig: PathBuf,
}

impl DevCluster {
    /// Starts the binary with `target` as its cargo target directory; returns once it printed
    /// its kubeconfig, or what it said on stderr when it exited instead.
    async fn start(target: &Path, args: &[&str]) -> Result<DevCluster, String> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dev-cluster"))
            .args(args)
            .env("CARGO_TARGET_DIR", target)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starting dev-cluster");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut stderr = child.stderr.take().unwrap();
        let printed = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(path) = line.trim().strip_prefix("kubeconfig:") {
                    return Some(PathBuf::from(path.trim()));
                }
            }
            None
        })
        .await
        .expect("dev-cluster printed its kubeconfig or exited within 60 s");
        let Some(kubeconfig) = printed else {
            let mut said = String::new();
            tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut said)
                .await
                .unwrap();
            let status = child.wait().await.unwrap();
            return Err(format!("{status}: {said}"));
        };
        // Keep draining both pipes so the child never blocks on a full one.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
        });
        Ok(DevCluster { child, kubeconfig })
    }

    /// SIGTERM, as Ctrl-C would; waits for the exit.
    async fn stop(mut self) {
        let pid = self.child.id().unwrap() as libc::pid_t;
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("dev-cluster stops within 30 s")
            .unwrap();
        assert!(status.success(), "dev-cluster exited with {status}");
    }
}

fn normalised(path: &Path) -> bool {
    path.is_absolute()
        && path
            .components()
            .all(|c| !matches!(c, Component::ParentDir | Component::CurDir))
}

fn server_of(kubeconfig: &Path) -> String {
    let text = std::fs::read_to_string(kubeconfig).unwrap();
    text.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("server:")
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no server in {}: {text}", kubeconfig.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dev_clusters_on_one_checkout_keep_their_own_kubeconfig() {
    let scratch = std::env::temp_dir().join(format!("dev-cluster-test-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    // A target directory given with `..` in it, as the default one used to be printed.
    let target = scratch.join("sub/../target");

    let first = DevCluster::start(&target, &[]).await.unwrap();
    let second = DevCluster::start(&target, &[]).await.unwrap();
    for run in [&first, &second] {
        assert!(
            normalised(&run.kubeconfig),
            "printed path is not normalised: {}",
            run.kubeconfig.display()
        );
        assert!(run.kubeconfig.exists(), "{}", run.kubeconfig.display());
    }
    assert_ne!(
        first.kubeconfig, second.kubeconfig,
        "one kubeconfig per run"
    );
    assert_ne!(server_of(&first.kubeconfig), server_of(&second.kubeconfig));
    let (first_path, second_path) = (first.kubeconfig.clone(), second.kubeconfig.clone());
    first.stop().await;
    assert!(!first_path.exists(), "the first run removed its kubeconfig");
    assert!(
        second_path.exists(),
        "the second run's kubeconfig is still there"
    );
    second.stop().await;
    assert!(!second_path.exists());

    // Both told to use the same file: the second refuses (the first's printed
    // `export KUBECONFIG=…` must keep pointing at the first cluster), naming the way out.
    let shared = scratch.join("shared.kubeconfig");
    let shared_arg = format!("--kubeconfig={}", shared.display());
    let first = DevCluster::start(&target, &[&shared_arg]).await.unwrap();
    let first_server = server_of(&shared);
    let refused = DevCluster::start(&target, &[&shared_arg])
        .await
        .err()
        .expect("a second dev-cluster on the same kubeconfig is refused");
    assert!(
        refused.contains("another dev-cluster") && refused.contains("--kubeconfig"),
        "{refused}"
    );
    assert_eq!(
        server_of(&shared),
        first_server,
        "the first run's file is untouched"
    );
    first.stop().await;
    assert!(!shared.exists(), "the first run removed its kubeconfig");
    // Free again: a new run may use it.
    DevCluster::start(&target, &[&shared_arg])
        .await
        .unwrap()
        .stop()
        .await;
    assert!(!shared.exists());

    let _ = std::fs::remove_dir_all(&scratch);
}
