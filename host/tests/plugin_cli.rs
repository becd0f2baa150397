//! `proxy-operator plugin …` as a plugin author runs it: the real binary, a real component, a real
//! loopback instance store.

mod common;
#[path = "plugin_cli/scaffold.rs"]
mod scaffold;

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
    assert_eq!(out["witVersion"], "0.2.0");
    assert_eq!(out["loads"], true);
    assert_eq!(out["describe"]["name"], "test");
    assert_eq!(
        out["describe"]["capabilities"],
        json!(["log", "http", "kube"])
    );
    assert_eq!(
        out["exports"],
        json!(["proxy-operator:provider/provider@0.2.0"])
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
        stderr
            .contains("config: Additional properties are not allowed ('endpiont' was unexpected)"),
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

/// `validate` runs the plugin's JSON Schema first, as the operator does at start: a config the
/// plugin's own parser would take (`null` for an optional string) but the schema refuses is
/// refused here too, not only later on hot load.
#[test]
fn validate_checks_the_json_schema_as_the_operator_does() {
    let plugin = plugin_path("test");
    let dir = tempfile::tempdir().unwrap();
    let null = write(
        dir.path(),
        "null.yaml",
        "config:\n  endpoint: http://127.0.0.1:1\n  checkFailsWith: null\n",
    );
    let output = operator(&[
        "plugin",
        "validate",
        plugin.to_str().unwrap(),
        "--config",
        &null,
    ]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("config.checkFailsWith: null is not of type \"string\"")
            && stderr.contains("JSON Schema of the `test` plugin"),
        "{stderr}"
    );
}

/// `validate --providers-config` binds every entry as the operator does at start and reports
/// each; one bad entry fails the whole run, naming its index, entry and field.
#[test]
fn validate_takes_a_whole_providers_config() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "providers.yaml",
        "providers:\n- {name: good, type: test, config: {endpoint: \"memory:1\"}}\n- {name: schema, type: test, config: {endpoint: \"memory:1\", checkFailsWith: 7}}\n- {name: plugin, type: test, config: {endpoint: \"ftp://x\"}}\n- {name: missing, type: nosuch, config: {}}\n",
    );
    let plugins = plugins_dir();
    let output = operator(&[
        "plugin",
        "validate",
        "--providers-config",
        &config,
        "--plugins-dir",
        plugins.to_str().unwrap(),
    ]);
    assert!(!output.status.success(), "one bad entry fails the run");
    let out: Value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    assert_eq!(out["valid"], false);
    let entries = out["providers"].as_array().unwrap();
    assert_eq!(entries.len(), 4);
    assert_eq!(entries[0]["valid"], true, "{out}");
    let error = |i: usize| entries[i]["error"].as_str().unwrap_or_default().to_string();
    assert!(
        error(1).contains("providers[1] (schema).config.checkFailsWith: 7 is not of type"),
        "{}",
        error(1)
    );
    assert!(
        error(2).contains(
            "providers[2] (plugin): the `test` plugin rejected its config: config.endpoint"
        ),
        "{}",
        error(2)
    );
    assert!(
        error(3).contains("providers[3] (missing).type"),
        "{}",
        error(3)
    );

    let good = write(
        dir.path(),
        "good.yaml",
        "providers:\n- {name: good, type: test, config: {endpoint: \"memory:1\"}}\n",
    );
    let out = json_out(&operator(&[
        "plugin",
        "validate",
        "--providers-config",
        &good,
        "--plugins-dir",
        plugins.to_str().unwrap(),
    ]));
    assert_eq!(out["valid"], true);
}

/// `run` gets the `kube` capability from a kubeconfig, with the operator's grant checks: the
/// test provider keeps its instance as a labelled ConfigMap in the granted namespace of a real
/// API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_reaches_a_cluster_through_the_kubeconfig() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let cp = harness::ControlPlane::shared().await;
    let ns = cp.namespace("px-plugin-run").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let plugin = plugin_path("test").display().to_string();
    let entry = write(
        dir.path(),
        "entry.yaml",
        &format!(
            "name: dev\ntype: test\nconfig: {{endpoint: \"kube:\"}}\ngrants: {{kube: {{namespace: {}, kinds: [v1/ConfigMap]}}}}\n",
            ns.name()
        ),
    );
    let kubeconfig = cp.kubeconfig().display().to_string();
    let listed = json_out(&operator(&[
        "plugin",
        "run",
        &plugin,
        "--config",
        &entry,
        "--kubeconfig",
        &kubeconfig,
        "list",
    ]));
    assert_eq!(listed, json!([]));
    let maps: kube::Api<ConfigMap> = kube::Api::namespaced(ns.client(), ns.name());
    let mut foreign = ConfigMap::default();
    foreign.metadata.name = Some("someone-elses".into());
    maps.create(&Default::default(), &foreign).await.unwrap();
    let got = operator(&[
        "plugin",
        "run",
        &plugin,
        "--config",
        &entry,
        "--kubeconfig",
        &kubeconfig,
        "get",
        "someone-elses",
    ]);
    assert!(
        !got.status.success(),
        "another's object is not there for the plugin"
    );
    assert!(
        String::from_utf8_lossy(&got.stderr).contains("not found"),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    // Without a kubeconfig the error says how to give one.
    let missing = std::process::Command::new(env!("CARGO_BIN_EXE_proxy-operator"))
        .args(["plugin", "run", &plugin, "--config", &entry, "list"])
        .env("LOG_LEVEL", "warn")
        .env("KUBECONFIG", dir.path().join("no-such-kubeconfig"))
        .env("HOME", dir.path())
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("--kubeconfig"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
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
        "proxy_operator::lifecycle::gc=trace",
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

/// The check names every passing `plugin test` run prints, in order after the bad configs.
pub(crate) const LIFECYCLE_CHECKS: &[&str] = &[
    "check-reasons",
    "check-healthy",
    "create",
    "create-idempotent",
    "get-after-create",
    "list-shows-owner",
    "delete",
    "delete-twice",
    "get-after-delete-is-not-found",
    "list-after-delete-omits-it",
];

/// The conformance suite, as a library (what `plugin test` runs), against the test provider and
/// its loopback instance store, and against the Python and JavaScript examples on the same store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_test_provider_and_the_python_and_js_examples_are_conformant() {
    let store = InstanceStore::start().await;
    let grants: proxy_operator::provider::capabilities::Grants =
        serde_json::from_value(json!({"http": {"allow": [format!("http://{}", store.addr)]}}))
            .unwrap();
    let (engine, _) = engine_with(test_options()).await;
    let report = assert_conformant(
        &engine,
        "test",
        json!({"endpoint": store.url()}),
        grants.clone(),
        None,
    )
    .await;
    let names: Vec<&str> = report.checks.iter().map(|c| c.name.as_str()).collect();
    for name in LIFECYCLE_CHECKS {
        assert!(names.contains(name), "{name} ran: {names:?}");
    }
    assert!(names.contains(&"bad-config/missing-endpoint"), "{names:?}");
    assert!(store.ids().is_empty(), "the suite leaves nothing behind");

    // CPython's heap and start-up need more than the Rust provider's small limits.
    let (engine, _) = engine_with(proxy_operator::provider::plugins::EngineOptions {
        memory_limit: 256 << 20,
        cpu_budget: std::time::Duration::from_secs(10),
        ..test_options()
    })
    .await;
    assert_conformant(
        &engine,
        "python-example",
        json!({"endpoint": store.url()}),
        grants.clone(),
        None,
    )
    .await;
    assert!(store.ids().is_empty());

    // SpiderMonkey, pre-initialised with the app, fits the operator's default limits (128 MiB,
    // 2 s of CPU a call); it also passes under the tests' 64 MiB and 500 ms here, with no margin
    // measured for a loaded machine.
    let defaults = proxy_operator::provider::plugins::EngineOptions::default();
    let (engine, _) = engine_with(proxy_operator::provider::plugins::EngineOptions {
        memory_limit: defaults.memory_limit,
        cpu_budget: defaults.cpu_budget,
        ..test_options()
    })
    .await;
    assert_conformant(
        &engine,
        "js-example",
        json!({"endpoint": store.url()}),
        grants,
        None,
    )
    .await;
    assert!(store.ids().is_empty());
}

/// A provider that breaks the contract fails `plugin test` with a non-zero exit, and `--json`
/// says which checks failed: the test provider's `memory:` endpoint hands out synthetic
/// instances without owners that never go away.
#[test]
fn plugin_test_fails_a_provider_that_breaks_the_contract_and_says_why_in_json() {
    let plugin = plugin_path("test");
    let dir = tempfile::tempdir().unwrap();
    let entry = write(
        dir.path(),
        "entry.yaml",
        "config: {endpoint: \"memory:1\"}\n",
    );
    let output = operator(&[
        "plugin",
        "test",
        plugin.to_str().unwrap(),
        "--config",
        &entry,
        "--json",
    ]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let report: Value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    assert_eq!(report["plugin"], "test");
    assert_eq!(report["passed"], false);
    let outcome = |name: &str| {
        let check = report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no check {name}: {report}"));
        (
            check["outcome"].as_str().unwrap().to_string(),
            check["detail"].as_str().unwrap().to_string(),
        )
    };
    assert_eq!(outcome("create").0, "pass");
    let (got, detail) = outcome("get-after-create");
    assert_eq!(got, "fail");
    assert!(detail.contains("no owner"), "{detail}");
    let (got, detail) = outcome("get-after-delete-is-not-found");
    assert_eq!(got, "fail");
    assert!(detail.contains("still returns an instance"), "{detail}");
    assert_eq!(outcome("check-reasons").0, "pass");
}

/// `plugin test --spec` creates the instance the author describes (a provider that needs a zone or
/// options), and a run that cannot start at all (no component) exits 2 naming the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_test_takes_a_spec_and_exits_2_when_it_cannot_run() {
    let store = InstanceStore::start().await;
    let plugin = plugin_path("test").display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let entry = write(
        dir.path(),
        "entry.yaml",
        &format!(
            "type: test\nconfig: {{endpoint: \"{}\"}}\ngrants: {{http: {{allow: [\"http://{}\"]}}}}\n",
            store.url(),
            store.addr
        ),
    );
    let spec = write(
        dir.path(),
        "spec.yaml",
        "name: px-author-spec\nowner: {namespace: crawlers, name: p, uid: u-1, operatorId: op}\nzone: zone-b\n",
    );
    let args = [
        "plugin", "test", &plugin, "--config", &entry, "--spec", &spec,
    ];
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let output = tokio::task::spawn_blocking(move || {
        operator(&args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains("ok   create") && stdout.contains("provider id px-author-spec"),
        "{stdout}"
    );
    assert!(store.ids().is_empty(), "deleted at the end");

    let missing = dir.path().join("missing.wasm");
    let output = operator(&[
        "plugin",
        "test",
        missing.to_str().unwrap(),
        "--config",
        &entry,
    ]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("missing.wasm"),
        "{output:?}"
    );
}

/// The body of the first function `fn name(` (Rust, by braces), `def name(` (Python, by
/// indentation) or method `name(` at the start of a line (JavaScript, by braces) in `text`.
fn function_body<'a>(text: &'a str, name: &str) -> &'a str {
    if let Some(start) = text.find(&format!("def {name}(")) {
        let indent = text[..start].rsplit('\n').next().unwrap_or("").len();
        let body = &text[start..];
        let mut end = body.len();
        let mut offset = 0;
        for (i, line) in body.split_inclusive('\n').enumerate() {
            let leading = line.len() - line.trim_start().len();
            if i > 0 && !line.trim().is_empty() && leading <= indent {
                end = offset;
                break;
            }
            offset += line.len();
        }
        return &body[..end];
    }
    let method = format!("{name}(");
    let start = text
        .find(&format!("fn {name}("))
        .or_else(|| {
            let mut offset = 0;
            text.split_inclusive('\n').find_map(|line| {
                let at = offset + line.len() - line.trim_start().len();
                offset += line.len();
                line.trim_start().starts_with(&method).then_some(at)
            })
        })
        .unwrap_or_else(|| panic!("no function {name}"));
    let open = start + text[start..].find('{').unwrap();
    let mut depth = 0;
    for (i, c) in text[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &text[start..open + i + 1];
                }
            }
            _ => {}
        }
    }
    &text[start..]
}

/// Every check reason a provider in `plugins/` (and the scaffold) can return is one of the
/// documented set the conformance suite checks (`proxy_operator::provider::conformance::CHECK_REASONS`),
/// and docs/plugin-authoring.md lists exactly that set. A reason is a quoted CamelCase word in
/// the functions that build check targets.
#[test]
fn providers_use_only_documented_check_reasons() {
    use proxy_operator::provider::conformance::{CHECK_REASONS, is_check_reason};
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // Not scanned, on purpose: the hostile provider returns bad reasons to test the host's bounds,
    // and the test provider's `checkFailsWith` returns whatever a ProviderHealth test asks for.
    let sources: &[(&str, &[&str])] = &[
        ("plugins/aws/src/lib.rs", &["check"]),
        ("plugins/gcp/src/lib.rs", &["check"]),
        ("plugins/kubernetes/src/lib.rs", &["check"]),
        ("plugins/kvm/src/lib.rs", &["check_host"]),
        ("plugins/kvm/src/outcome.rs", &["check_reason"]),
        ("plugins/test-provider/src/lib.rs", &["check"]),
        ("plugins/upstream/src/lib.rs", &["check"]),
        ("plugins/examples/python/app.py", &["check"]),
        ("plugins/examples/js/app.js", &["check"]),
        ("host/src/faces/cli/scaffold/api.rs.tmpl", &["check"]),
    ];
    // Quoted words that are not reasons: object kinds the check lists.
    let not_reasons = ["Pod", "ConfigMap"];
    let mut found = Vec::new();
    for (file, functions) in sources {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        for function in *functions {
            let body = function_body(&text, function);
            for literal in body.split('"').skip(1).step_by(2) {
                let camel = literal.starts_with(|c: char| c.is_ascii_uppercase())
                    && literal.chars().all(|c| c.is_ascii_alphanumeric())
                    && literal.chars().any(|c| c.is_ascii_lowercase());
                if camel && !not_reasons.contains(&literal) {
                    assert!(
                        is_check_reason(literal),
                        "{file} {function}: `{literal}` is not a documented check reason"
                    );
                    found.push(literal.to_string());
                }
            }
        }
    }
    assert!(found.len() >= 10, "the scan sees the reasons: {found:?}");

    let docs = std::fs::read_to_string(root.join("docs/plugin-authoring.md")).unwrap();
    let section = docs
        .split("## Check reasons")
        .nth(1)
        .expect("docs/plugin-authoring.md has a \"Check reasons\" section");
    let documented: Vec<&str> = section
        .lines()
        .skip_while(|l| !l.starts_with("| `"))
        .take_while(|l| l.starts_with("| `"))
        .filter_map(|l| l.split('`').nth(1))
        .collect();
    let constant: Vec<&str> = CHECK_REASONS.iter().map(|(r, _)| *r).collect();
    assert_eq!(
        documented, constant,
        "the docs' table and CHECK_REASONS agree"
    );
}

#[test]
fn function_bodies_end_where_the_function_ends() {
    let python = "class P:\n    def check(self):\n        return \"Ok\"\n\n    def list(self):\n        return \"Later\"\n";
    let body = function_body(python, "check");
    assert!(
        body.contains("\"Ok\"") && !body.contains("Later"),
        "{body:?}"
    );
    let js = "export const provider = {\n  list(c) {\n    return \"Later\";\n  },\n  check(c) {\n    if (c) { return \"Ok\"; }\n    return `${c}`;\n  },\n  get(c) { return \"Later\"; },\n};\n";
    let body = function_body(js, "check");
    assert!(
        body.starts_with("check(c) {") && body.ends_with("`;\n  }") && !body.contains("Later"),
        "{body:?}"
    );
    let rust = "fn check() -> X {\n    let m = format!(\"{}\", 1);\n    \"Ok\"\n}\nfn other() { \"Later\" }\n";
    let body = function_body(rust, "check");
    assert!(
        body.ends_with("\"Ok\"\n}") && !body.contains("Later"),
        "{body:?}"
    );
}

/// `plugin test` of a provider granted `kube` uses the cluster of `$KUBECONFIG`: the kubernetes
/// provider passes through the CLI against the real API server, as it does as a library.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_test_passes_the_kubernetes_provider_against_the_cluster_of_kubeconfig() {
    let cp = harness::ControlPlane::shared().await;
    let ns = cp.namespace("px-cli-k8s").await.unwrap();
    let plugin = plugin_path("kubernetes").display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let entry = write(
        dir.path(),
        "entry.yaml",
        &format!(
            "type: kubernetes\nconfig: {{image: \"registry.example/squid:6\"}}\ngrants:\n  kube: {{namespace: {}, kinds: [v1/Pod, v1/ConfigMap, v1/Service, networking.k8s.io/v1/NetworkPolicy], images: [\"registry.example/squid:6\"]}}\n",
            ns.name()
        ),
    );
    let stdout = plugin_test_passes_against(cp, plugin, entry).await;
    assert!(stdout.contains("ok   list-shows-owner"), "{stdout}");
}

/// `proxy-operator plugin test` passes the upstream provider (proxies that exist already, its
/// records kept as ConfigMaps) against the real API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_test_passes_the_upstream_provider() {
    let cp = harness::ControlPlane::shared().await;
    let ns = cp.namespace("px-cli-upstream").await.unwrap();
    let plugin = plugin_path("upstream").display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let entry = write(
        dir.path(),
        "entry.yaml",
        &format!(
            "type: upstream\nconfig: {{upstreams: [{{url: \"http://127.0.0.1:3128\"}}]}}\ngrants:\n  kube: {{namespace: {}, kinds: [v1/ConfigMap]}}\n",
            ns.name()
        ),
    );
    let stdout = plugin_test_passes_against(cp, plugin, entry).await;
    assert!(stdout.contains("PASS upstream"), "{stdout}");
}

/// `proxy-operator plugin test` passes the aws provider against moto's EC2 (harness::Moto),
/// with static keys the host signs each request with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_test_passes_the_aws_provider_against_moto() {
    let moto = harness::Moto::start().await.unwrap();
    let plugin = plugin_path("aws").display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let id = write(dir.path(), "access-key-id", "AKIDPROXYOPERATOR\n");
    let secret = write(dir.path(), "secret-access-key", "proxy-operator-secret\n");
    let url = moto.url();
    let entry = write(
        dir.path(),
        "entry.yaml",
        &format!(
            "type: aws\nconfig: {{region: eu-west-1, amis: {{eu-west-1: ami-12c6146b}}, endpoint: \"{url}\"}}\ngrants:\n  http:\n    allow: [\"{url}\"]\n    credentials:\n    - url: \"{url}\"\n      valueFrom: {{awsCredentials: {{region: eu-west-1, accessKeyIdFrom: {{file: {id}}}, secretAccessKeyFrom: {{file: {secret}}}}}}}\n"
        ),
    );
    let output = plugin_test(plugin, entry, None).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}\n{}",
        String::from_utf8_lossy(&output.stderr),
        moto.log_tail(20)
    );
    assert!(stdout.contains("PASS aws"), "{stdout}");
    assert!(stdout.contains("ok   list-shows-owner"), "{stdout}");
}

/// `proxy-operator plugin test PLUGIN --config ENTRY` with `$KUBECONFIG` naming `cp`'s cluster,
/// asserted to pass; its standard output.
async fn plugin_test_passes_against(
    cp: &harness::ControlPlane,
    plugin: String,
    entry: String,
) -> String {
    let output = plugin_test(plugin, entry, Some(cp.kubeconfig().to_path_buf())).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout.into_owned()
}

/// `proxy-operator plugin test PLUGIN --config ENTRY`, with `$KUBECONFIG` set when given.
async fn plugin_test(
    plugin: String,
    entry: String,
    kubeconfig: Option<std::path::PathBuf>,
) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_proxy-operator"));
        command
            .args(["plugin", "test", &plugin, "--config", &entry])
            .env("LOG_LEVEL", "warn");
        if let Some(kubeconfig) = kubeconfig {
            command.env("KUBECONFIG", kubeconfig);
        }
        command.output().unwrap()
    })
    .await
    .unwrap()
}
