//! `proxy-operator plugin …` as a plugin author runs it: the real binary, a real component, a real
//! loopback instance store.

mod common;

use std::path::Path;
use std::process::Output;

use common::*;
use serde_json::{Value, json};

fn operator(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_proxy-operator"))
        .args(args)
        .env("LOG_LEVEL", "warn")
        .output()
        .expect("running proxy-operator")
}

fn json_out(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "exit {:?}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn inspect_shows_version_exports_capabilities_and_digest() {
    let plugin = plugin_path("test");
    let out = json_out(&operator(&["plugin", "inspect", plugin.to_str().unwrap()]));
    assert_eq!(out["kind"], "component");
    assert_eq!(out["witVersion"], "0.1.0");
    assert_eq!(out["loads"], true);
    assert_eq!(out["describe"]["name"], "test");
    assert_eq!(
        out["describe"]["capabilities"],
        json!(["log", "http", "kube"])
    );
    assert_eq!(
        out["exports"],
        json!(["proxy-operator:provider/provider@0.1.0"])
    );
    let bytes = std::fs::read(&plugin).unwrap();
    assert_eq!(out["size"], bytes.len());
    use sha2::Digest;
    assert_eq!(out["sha256"], hex::encode(sha2::Sha256::digest(&bytes)));
}

/// With a providers-config entry, inspect says per capability what is declared, granted and
/// therefore usable: a grant the plugin does not declare gets it nothing.
#[test]
fn inspect_shows_declared_against_granted_capabilities() {
    let plugin = plugin_path("test");
    let dir = tempfile::tempdir().unwrap();
    let entry = write(
        dir.path(),
        "entry.yaml",
        "config: {endpoint: \"memory:1\"}\ngrants:\n  http: {allow: [\"http://127.0.0.1:*\"]}\n  libvirt: {hosts: [{name: hv1, address: 127.0.0.1, user: virt, pools: [default]}]}\n",
    );
    let out = json_out(&operator(&[
        "plugin",
        "inspect",
        plugin.to_str().unwrap(),
        "--config",
        &entry,
    ]));
    let capabilities = &out["capabilities"];
    assert_eq!(
        capabilities["http"],
        json!({"declared": true, "granted": true, "usable": true})
    );
    assert_eq!(
        capabilities["kube"],
        json!({"declared": true, "granted": false, "usable": false})
    );
    assert_eq!(
        capabilities["libvirt"],
        json!({"declared": false, "granted": true, "usable": false})
    );
    assert_eq!(capabilities["log"]["usable"], true);
}

#[test]
fn inspect_explains_a_core_module() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("core.wasm");
    std::fs::write(&path, wat::parse_str("(module)").unwrap()).unwrap();
    let output = operator(&["plugin", "inspect", path.to_str().unwrap()]);
    // It prints what it found, and exits non-zero: the file cannot load.
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let out: Value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    assert_eq!(out["kind"], "core module");
    assert_eq!(out["loads"], false);
    assert!(
        out["error"].as_str().unwrap().contains("wasm32-wasip2"),
        "{out}"
    );
}

#[test]
fn validate_accepts_a_good_config_and_names_the_field_of_a_bad_one() {
    let plugin = plugin_path("test");
    let dir = tempfile::tempdir().unwrap();
    let good = write(
        dir.path(),
        "good.yaml",
        "config:\n  endpoint: http://127.0.0.1:1\n",
    );
    let out = json_out(&operator(&[
        "plugin",
        "validate",
        plugin.to_str().unwrap(),
        "--config",
        &good,
    ]));
    assert_eq!(out["valid"], true);

    let bad = write(
        dir.path(),
        "bad.yaml",
        "config:\n  endpiont: http://127.0.0.1:1\n",
    );
    let output = operator(&[
        "plugin",
        "validate",
        plugin.to_str().unwrap(),
        "--config",
        &bad,
    ]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("config.endpiont: unknown field `endpiont`, expected `endpoint`"),
        "{stderr}"
    );

    let wrong_type = write(dir.path(), "kvm.yaml", "type: kvm\nconfig: {}\n");
    let output = operator(&[
        "plugin",
        "validate",
        plugin.to_str().unwrap(),
        "--config",
        &wrong_type,
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("type `kvm` does not match the plugin"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_calls_each_function_against_real_capabilities() {
    let store = InstanceStore::start().await;
    let plugin = plugin_path("test").display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let instance = write(
        dir.path(),
        "instance.yaml",
        &format!(
            "name: dev\ntype: test\nconfig:\n  endpoint: {}\ngrants:\n  http:\n    allow: [\"http://{}\"]\n",
            store.url(),
            store.addr
        ),
    );
    let spec = write(
        dir.path(),
        "spec.yaml",
        "name: px-cli\nowner: {namespace: crawlers, name: p, uid: u-1, operatorId: op}\nuserData: \"#cloud-config\\n\"\n",
    );
    let run = |args: &[&str]| {
        let mut all = vec![
            "plugin",
            "run",
            plugin.as_str(),
            "--config",
            instance.as_str(),
        ];
        all.extend_from_slice(args);
        let args: Vec<String> = all.iter().map(|s| s.to_string()).collect();
        async move {
            tokio::task::spawn_blocking(move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                operator(&args)
            })
            .await
            .unwrap()
        }
    };
    let created = json_out(&run(&["create", "--spec", &spec]).await);
    assert_eq!(created["providerId"], "px-cli");
    assert_eq!(created["state"], "running");
    assert_eq!(
        json_out(&run(&["get", "px-cli"]).await)["providerId"],
        "px-cli"
    );
    assert_eq!(json_out(&run(&["list"]).await).as_array().unwrap().len(), 1);
    assert_eq!(json_out(&run(&["check"]).await)[0]["ok"], true);
    json_out(&run(&["delete", "px-cli"]).await);
    assert!(store.state.instances.lock().unwrap().is_empty());

    let missing = run(&["get", "px-cli"]).await;
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("not found"));
}

/// The operator's logs when stderr is a file or a pipe (a container's log, `2> file`): plain text,
/// no ANSI colour codes.
#[test]
fn logs_to_a_pipe_have_no_colour_codes() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_proxy-operator"))
        .args(["run", "--providers-config", "/nonexistent/providers.yaml"])
        .env("LOG_LEVEL", "info")
        .env_remove("NO_COLOR")
        .output()
        .expect("running proxy-operator");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("ERROR"), "an error was logged: {stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "ANSI escape codes in a pipe: {stderr:?}"
    );
}

/// A `LOG_LEVEL` that is not a log filter is refused at start, naming the variable, rather than
/// silently replaced by `info`.
#[test]
fn an_invalid_log_level_is_refused_naming_the_variable() {
    for bad in ["info,proxy_operator=loud", "warning", "debug,[{"] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_proxy-operator"))
            .args(["crds"])
            .env("LOG_LEVEL", bad)
            .output()
            .expect("running proxy-operator");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success(),
            "{bad}: accepted; stderr: {stderr}"
        );
        assert!(
            stderr.contains("LOG_LEVEL") && stderr.contains(bad),
            "{bad}: {stderr}"
        );
        assert!(output.stdout.is_empty(), "{bad}: nothing done");
    }
    // Good ones still work.
    for good in [
        "info",
        "warn,proxy_operator=debug",
        "proxy_operator::gc=trace",
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_proxy-operator"))
            .args(["crds"])
            .env("LOG_LEVEL", good)
            .output()
            .expect("running proxy-operator");
        assert!(
            output.status.success(),
            "{good}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
