//! How `kubectl px` is installed and reached: the krew manifest and its packing script, kubectl
//! finding the binary on PATH (and not shadowing it, as it would `kubectl-proxy`), kubectl's
//! completion asking `kubectl_complete-px`, the completion scripts, colour on a terminal.

use std::path::Path;

use serde_json::Value;

use super::{World, control_plane, proxy_yaml};

fn manifest() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/krew/px.yaml");
    proxy_operator::support::yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The manifest krew reads: its kind, the plugin's name (`kubectl px`), this release's version,
/// the homepage (the chart's `home`), and for each of the four platforms an archive whose
/// `kubectl-px` is the binary linked and whose LICENSE is installed beside it (krew's checklist).
#[test]
fn the_krew_manifest_names_the_binary_for_every_platform() {
    let manifest = manifest();
    assert_eq!(
        manifest["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(manifest["kind"], "Plugin");
    assert_eq!(manifest["metadata"]["name"], "px");
    let spec = &manifest["spec"];
    assert_eq!(spec["version"], format!("v{}", env!("CARGO_PKG_VERSION")));
    assert!(!spec["shortDescription"].as_str().unwrap().is_empty());
    // The chart's `home:` line (Chart.yaml is flat YAML there).
    let chart = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/proxy-operator/Chart.yaml"),
    )
    .unwrap();
    let home = chart
        .lines()
        .find_map(|l| l.strip_prefix("home: "))
        .expect("Chart.yaml has home");
    assert!(
        spec["homepage"].as_str().unwrap().starts_with("https://"),
        "{spec:#}"
    );
    assert_eq!(spec["homepage"], home, "krew's homepage, the chart's home");
    let mut platforms: Vec<String> = Vec::new();
    for platform in spec["platforms"].as_array().unwrap() {
        let labels = &platform["selector"]["matchLabels"];
        let (os, arch) = (
            labels["os"].as_str().unwrap(),
            labels["arch"].as_str().unwrap(),
        );
        platforms.push(format!("{os}/{arch}"));
        assert_eq!(platform["bin"], "kubectl-px", "{os}/{arch}");
        assert_eq!(
            platform["uri"],
            format!("BASE_URL/kubectl-px_{os}_{arch}.tar.gz"),
            "{os}/{arch}"
        );
        assert_eq!(platform["sha256"], format!("SHA256_{os}_{arch}"));
        assert_eq!(
            platform["files"],
            serde_json::json!([{"from": "kubectl-px", "to": "."}, {"from": "LICENSE", "to": "."}])
        );
    }
    platforms.sort();
    assert_eq!(
        platforms,
        ["darwin/amd64", "darwin/arm64", "linux/amd64", "linux/arm64"]
    );
}

/// `deploy/krew/package.sh` packs the built binary: the archive holds `kubectl-px` at its root,
/// byte for byte, and the project's LICENSE (Apache-2.0), and its manifest keeps this platform
/// only, with the archive's sha256.
#[test]
fn the_packing_script_writes_an_archive_and_its_manifest() {
    let out = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/krew/package.sh");
    let ran = std::process::Command::new(script)
        .env("KUBECTL_PX", env!("CARGO_BIN_EXE_kubectl-px"))
        .env("OUT", out.path())
        .output()
        .unwrap();
    assert!(ran.status.success(), "{ran:?}");
    let archive = out.path().join("kubectl-px_linux_amd64.tar.gz");
    let listing = std::process::Command::new("tar")
        .arg("tzf")
        .arg(&archive)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(listing.stdout).unwrap(),
        "kubectl-px\nLICENSE\n"
    );
    let unpacked = tempfile::tempdir().unwrap();
    assert!(
        std::process::Command::new("tar")
            .arg("xzf")
            .arg(&archive)
            .arg("-C")
            .arg(unpacked.path())
            .status()
            .unwrap()
            .success()
    );
    assert!(
        std::fs::read(unpacked.path().join("kubectl-px")).unwrap()
            == std::fs::read(env!("CARGO_BIN_EXE_kubectl-px")).unwrap()
    );
    let license = std::fs::read_to_string(unpacked.path().join("LICENSE")).unwrap();
    assert_eq!(
        license,
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../LICENSE")).unwrap()
    );
    assert!(
        license.contains("Apache License\n                           Version 2.0, January 2004")
    );
    let manifest: Value = proxy_operator::support::yaml::from_str(
        &std::fs::read_to_string(out.path().join("px.yaml")).unwrap(),
    )
    .unwrap();
    let platforms = manifest["spec"]["platforms"].as_array().unwrap();
    assert_eq!(platforms.len(), 1, "{manifest:#}");
    let sum = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(std::fs::read(&archive).unwrap()))
    };
    assert_eq!(platforms[0]["sha256"], sum);
    assert_eq!(platforms[0]["uri"], format!("file://{}", archive.display()));
    assert_eq!(
        manifest["spec"]["version"],
        format!("v{}", env!("CARGO_PKG_VERSION"))
    );
}

/// A directory for PATH with kubectl, `kubectl-px` and its completion link, as a user's.
fn path_with_plugin(dir: &Path, kubectl_dir: &Path) -> String {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_kubectl-px"), bin.join("kubectl-px")).unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_kubectl-px"),
        bin.join("kubectl_complete-px"),
    )
    .unwrap();
    format!("{}:{}:/usr/bin:/bin", bin.display(), kubectl_dir.display())
}

/// kubectl runs `kubectl-px` for `kubectl px` (a plugin named `kubectl-proxy` never runs: kubectl
/// serves its own `kubectl proxy` first), lists it without a warning, and completes `kubectl
/// px` through `kubectl_complete-px`: commands, then the namespace's Proxies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_runs_and_completes_the_plugin() {
    let world = World::start("px-kubectl").await;
    let ns = world.ns.name().to_string();
    world
        .apply(&proxy_yaml(&ns, "egress-1", "nowhere", 3128))
        .await;
    world
        .apply(&proxy_yaml(&ns, "other", "nowhere", 3128))
        .await;
    let path = path_with_plugin(world.dir.path(), world.cp.bin_dir());
    let kubectl = |args: &[&str]| {
        let out = std::process::Command::new(world.cp.bin_dir().join("kubectl"))
            .args(args)
            .env("PATH", &path)
            .env("KUBECONFIG", world.cp.kubeconfig())
            .env("HOME", world.dir.path())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (code, listed, warnings) = kubectl(&["plugin", "list"]);
    assert_eq!(code, Some(0), "{listed}{warnings}");
    assert!(listed.contains("/kubectl-px\n"), "{listed}");
    assert!(!warnings.contains("warning"), "{warnings}");

    let (code, out, err) = kubectl(&["px", "-n", &ns, "status", "-o", "json"]);
    assert_eq!(code, Some(0), "{err}");
    let status: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status["proxies"].as_array().unwrap().len(), 2, "{status:#}");
    let (code, out, _) = kubectl(&["px", "--help"]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains("Usage: kubectl px [OPTIONS] <COMMAND>"),
        "{out}"
    );

    let (_, commands, _) = kubectl(&["__complete", "px", ""]);
    let commands: Vec<&str> = commands.lines().collect();
    for name in ["status", "why", "lease", "drain", "recycle", "scale", ":4"] {
        assert!(commands.contains(&name), "{commands:?}");
    }
    let (_, proxies, err) = kubectl(&["__complete", "px", "-n", &ns, "why", "eg"]);
    assert_eq!(proxies, "egress-1\n:4\n", "{err}");
    let (_, outcomes, _) = kubectl(&["__complete", "px", "report", "0123", "b"]);
    assert_eq!(outcomes, "blocked\n:4\n");
}

/// `kubectl-px completions bash`, sourced in bash, completes commands and their flags.
#[test]
fn the_bash_completion_script_completes_commands_and_flags() {
    let script = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-px"))
        .args(["completions", "bash"])
        .output()
        .unwrap();
    assert!(script.status.success(), "{script:?}");
    let script = String::from_utf8(script.stdout).unwrap();
    let complete = |words: &[&str]| -> String {
        let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
        let driver = format!(
            "COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             _kubectl__px kubectl-px \"${{COMP_WORDS[COMP_CWORD]}}\" \
             \"${{COMP_WORDS[COMP_CWORD-1]}}\"; echo \"${{COMPREPLY[*]}}\"",
            words = quoted.join(" ")
        );
        let out = std::process::Command::new("bash")
            .args(["-c", &format!("{script}\n{driver}")])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let commands = complete(&["kubectl-px", ""]);
    for name in [
        "status", "why", "lease", "release", "report", "drain", "recycle", "scale",
    ] {
        assert!(commands.split(' ').any(|w| w == name), "{commands}");
    }
    assert_eq!(complete(&["kubectl-px", "lease", "--sess"]), "--session");
    assert_eq!(
        complete(&["kubectl-px", "status", "--all-n"]),
        "--all-namespaces"
    );
}

/// Colour only on a terminal (run under `script`, a pseudo-terminal), never with `NO_COLOR`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn colour_on_a_terminal_only_and_never_with_no_color() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-colour").await.unwrap();
    cp.kubectl_run(
        &["apply", "-f", "-"],
        Some(&proxy_yaml(ns.name(), "p", "nowhere", 3128)),
    )
    .await
    .unwrap();
    let on_a_terminal = |no_color: Option<&str>| {
        let command = format!(
            "{} -n {} status",
            env!("CARGO_BIN_EXE_kubectl-px"),
            ns.name()
        );
        let mut script = std::process::Command::new("script");
        script
            .args(["-qec", &command, "/dev/null"])
            .env("KUBECONFIG", cp.kubeconfig())
            .env_remove("NO_COLOR");
        if let Some(value) = no_color {
            script.env("NO_COLOR", value);
        }
        let out = script.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let coloured = on_a_terminal(None);
    assert!(coloured.contains("\x1b[1mPROXY\x1b[0m"), "{coloured:?}");
    // No operator here: the phase is not known yet, in yellow.
    assert!(coloured.contains("\x1b[33m-\x1b[0m"), "{coloured:?}");
    let plain = on_a_terminal(Some("1"));
    assert!(
        plain.contains("PROXY") && !plain.contains('\x1b'),
        "{plain:?}"
    );
    // Set but empty is unset (no-color.org).
    assert!(on_a_terminal(Some("")).contains('\x1b'));
}
