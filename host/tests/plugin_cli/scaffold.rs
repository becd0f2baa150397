//! Issue #19: a new author's path, as docs/plugin-authoring.md ("From nothing to a hot-loaded
//! provider") walks it: `plugin new` → `cargo build` → `plugin test` against `plugin dev-api` →
//! the component uploaded into the plugins ConfigMap of a running operator, which serves it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use kube::api::Api;
use proxy_operator::api::ProviderHealth;

use super::common::operator_process::{OperatorProcess, OperatorSetup};
use super::{LIFECYCLE_CHECKS, operator};

/// A child process stopped when the test ends, whether it passes or not.
struct Child(std::process::Child);
impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `plugin dev-api` on a free port, and its base URL (the first line it prints).
fn dev_api() -> (Child, String) {
    let mut api = Child(
        Command::new(env!("CARGO_BIN_EXE_proxy-operator"))
            .args(["plugin", "dev-api", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting plugin dev-api"),
    );
    let mut first_line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(api.0.stdout.take().unwrap()),
        &mut first_line,
    )
    .unwrap();
    let url = first_line
        .trim()
        .strip_prefix("dev API listening on ")
        .unwrap_or_else(|| panic!("dev-api printed {first_line:?}"))
        .to_string();
    (api, url)
}

/// The target directory this test binary was built in: the scaffold's build shares it, so its
/// dependencies (the SDK, wit-bindgen, serde) are compiled once.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_BIN_EXE_proxy-operator"))
                .ancestors()
                .nth(2)
                .expect("<target>/debug/proxy-operator")
                .to_path_buf()
        })
}

/// `plugin new hetzner` into `dir`, built as the README says; returns the crate and component.
fn new_and_build(dir: &Path, api_url: &str) -> (PathBuf, PathBuf) {
    let crate_dir = dir.join("hetzner");
    let created = operator(&[
        "plugin",
        "new",
        "hetzner",
        "--dir",
        crate_dir.to_str().unwrap(),
        "--api-url",
        api_url,
    ]);
    assert!(created.status.success(), "{created:?}");
    for file in [
        "Cargo.toml",
        "src/lib.rs",
        "src/api.rs",
        "README.md",
        "instance.yaml",
    ] {
        assert!(crate_dir.join(file).is_file(), "{file} generated");
    }
    // What a new author starts from passes the same formatting check as this repository.
    let fmt = Command::new(env!("CARGO"))
        .args(["fmt", "--check"])
        .current_dir(&crate_dir)
        .output()
        .expect("running cargo fmt");
    assert!(
        fmt.status.success(),
        "the generated crate is not rustfmt-clean: {}",
        String::from_utf8_lossy(&fmt.stdout)
    );
    let target = target_dir();
    let build = Command::new(env!("CARGO"))
        .args(["build", "--release", "--target", "wasm32-wasip2"])
        .current_dir(&crate_dir)
        .env("CARGO_TARGET_DIR", &target)
        // Offline, as issue #19 asks: everything comes from the lock file and the local cache.
        .env("CARGO_NET_OFFLINE", "true")
        .output()
        .expect("running cargo build");
    assert!(
        build.status.success(),
        "cargo build: {}",
        String::from_utf8_lossy(&build.stderr)
    );
    let component = target.join("wasm32-wasip2/release/hetzner_provider.wasm");
    let size = std::fs::metadata(&component).unwrap().len();
    assert!(
        size < 512 << 10,
        "{size} bytes: the release profile keeps it small"
    );
    (crate_dir, component)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_provider_builds_passes_plugin_test_as_generated_and_is_hot_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let (_api, api_url) = dev_api();
    let (crate_dir, component) = {
        let (dir, api_url) = (dir.path().to_path_buf(), api_url.clone());
        tokio::task::spawn_blocking(move || new_and_build(&dir, &api_url))
            .await
            .unwrap()
    };
    let instance_yaml = crate_dir.join("instance.yaml");
    let tested = operator(&[
        "plugin",
        "test",
        component.to_str().unwrap(),
        "--config",
        instance_yaml.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&tested.stdout);
    assert!(
        tested.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&tested.stderr)
    );
    let passed = |name: &str| {
        stdout
            .lines()
            .any(|l| l.starts_with("ok ") && l.split_whitespace().nth(1) == Some(name))
    };
    for name in LIFECYCLE_CHECKS.iter().chain(&[
        "describe-schema",
        "validate-config-accepts-config",
        "bad-config/missing-apiUrl",
        "bad-config/unknown-field",
    ]) {
        assert!(passed(name), "no passing line for {name}:\n{stdout}");
    }
    assert!(
        stdout
            .lines()
            .last()
            .unwrap()
            .starts_with("PASS hetzner 0.1.0"),
        "{stdout}"
    );

    hot_load(dir.path(), &crate_dir, &component).await;
}

/// The last step of the walk-through: the entry of `instance.yaml` in the providers config of a
/// running `proxy-operator run`, the component uploaded with the documented gzip + kubectl
/// commands; the operator loads it and its ProviderHealth turns Ready from the plugin's check.
async fn hot_load(dir: &Path, crate_dir: &Path, component: &Path) {
    let cp = harness::ControlPlane::shared().await;
    let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds");
    cp.apply_crds(crds).await.unwrap();
    let ns = cp.namespace("px-plugin-new").await.unwrap();
    let entry: serde_json::Value = proxy_operator::support::yaml::from_str(
        &std::fs::read_to_string(crate_dir.join("instance.yaml")).unwrap(),
    )
    .unwrap();
    let config = dir.join("providers.yaml");
    std::fs::write(
        &config,
        serde_json::json!({ "providers": [entry] }).to_string(),
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("no-builtins")).unwrap();
    // The operator loads plugins only from the ConfigMap; no Proxy here, so nothing is probed.
    let mut operator = OperatorProcess::start_with(OperatorSetup {
        plugins_dir: dir.join("no-builtins"),
        operator_id: format!("plugin-new-{}", ns.name()),
        extra: ["--plugins-configmap", "provider-plugins"]
            .into_iter()
            .chain(["--provider-check-interval", "1s"])
            .map(String::from)
            .collect(),
        ..OperatorProcess::setup(cp, &ns, dir, config.to_str().unwrap(), "127.0.0.1:9")
    });

    // gzip -9 -c …/hetzner_provider.wasm > hetzner.wasm.gz
    let gz = dir.join("hetzner.wasm.gz");
    let gzip = Command::new("gzip")
        .args(["-9", "-c"])
        .arg(component)
        .output()
        .expect("running gzip");
    assert!(gzip.status.success(), "{gzip:?}");
    std::fs::write(&gz, gzip.stdout).unwrap();
    // kubectl -n NS create configmap provider-plugins --from-file=hetzner.wasm.gz
    //   --dry-run=client -o yaml | kubectl apply -f -
    let from_file = format!("--from-file={}", gz.display());
    let manifest = cp
        .kubectl_run(
            &[
                "-n",
                ns.name(),
                "create",
                "configmap",
                "provider-plugins",
                &from_file,
                "--dry-run=client",
                "-o",
                "yaml",
            ],
            None,
        )
        .await
        .unwrap();
    cp.kubectl_run(&["apply", "-f", "-"], Some(&manifest))
        .await
        .unwrap();

    let health: Api<ProviderHealth> = Api::all(ns.client());
    let ready = |ph: Option<&ProviderHealth>| {
        ph.and_then(|ph| ph.status.as_ref()).is_some_and(|status| {
            status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True" && c.reason == "Ok")
        })
    };
    let waited = tokio::time::timeout(
        Duration::from_secs(90),
        kube::runtime::wait::await_condition(health.clone(), "hetzner-dev", ready),
    )
    .await;
    assert!(
        matches!(waited, Ok(Ok(_))),
        "ProviderHealth hetzner-dev not Ready ({:?}, operator exited: {:?}):\n{}",
        health
            .get_opt("hetzner-dev")
            .await
            .ok()
            .flatten()
            .and_then(|ph| ph.status),
        operator.proc.try_exited(),
        operator.proc.log_tail(40)
    );
    let _ = health.delete("hetzner-dev", &Default::default()).await;
}
