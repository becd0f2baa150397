//! `make release VERSION=…` (.ci/release.sh), with the test image as the release's image (the
//! full Dockerfile build is make release's own and `make test-dockerfile`'s, docs/image.md):
//! dist/ holds the image archive, install.yaml (the kustomization's objects, the image pinned by
//! the archive's digest), the chart, a CycloneDX SBOM of the binary, the LICENSE and SHA256SUMS
//! over them, each read as a user would; a wrong VERSION is refused naming the fix. And
//! `--version` names the commit the binary was built from. cluster_e2e/install_yaml.rs applies
//! install.yaml to a real cluster.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::helm::{helm, key};
use super::release_parts::{manifest_digest, operator_image_archive, release, released};
use super::{kustomize, repo, yaml_objects};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const REPOSITORY: &str = "registry.example/team/proxy-operator";

fn by_key(objects: Vec<Value>) -> BTreeMap<String, Value> {
    objects.into_iter().map(|o| (key(&o), o)).collect()
}

/// install.yaml is `kubectl kustomize deploy/` with only the operator's image changed: pinned
/// to the release's repository and the archive's digest.
fn check_install_yaml(dist: &Path, digest: &str) {
    let text = std::fs::read_to_string(dist.join("install.yaml")).unwrap();
    let installed = by_key(yaml_objects(&text));
    let mut expected = by_key(kustomize(&repo().join("deploy")));
    let deployment = expected
        .get_mut("Deployment/proxy-operator/proxy-operator")
        .expect("deploy/ has the operator's Deployment");
    let container = &mut deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "proxy-operator:dev");
    container["image"] = format!("{REPOSITORY}@{digest}").into();
    assert_eq!(
        installed.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "install.yaml's objects"
    );
    for (k, object) in &expected {
        assert_eq!(&installed[k], object, "{k} in install.yaml");
    }
    let crds = installed
        .keys()
        .filter(|k| k.starts_with("CustomResourceDefinition/"))
        .count();
    assert_eq!(
        crds,
        proxy_operator::api::crd_manifests().len(),
        "the CRDs are in install.yaml"
    );
}

/// The packaged chart renders the release's image and version, the CRDs inside it, and carries
/// the project's LICENSE (a file, not the repository's link).
fn check_chart(dist: &Path) {
    let package = dist.join(format!("proxy-operator-{VERSION}.tgz"));
    let license = Command::new("tar")
        .arg("-xzOf")
        .arg(&package)
        .arg("proxy-operator/LICENSE")
        .output()
        .unwrap();
    assert!(
        license.status.success(),
        "no proxy-operator/LICENSE in the chart package: {}",
        String::from_utf8_lossy(&license.stderr)
    );
    assert_eq!(
        license.stdout,
        std::fs::read(repo().join("LICENSE")).unwrap(),
        "the chart's LICENSE"
    );
    let rendered = helm(&[
        "template",
        "proxy-operator",
        package.to_str().unwrap(),
        "--namespace",
        "proxy-operator",
    ]);
    assert!(rendered.status.success());
    let objects = by_key(yaml_objects(&String::from_utf8(rendered.stdout).unwrap()));
    let deployment = &objects["Deployment/proxy-operator/proxy-operator"];
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("{REPOSITORY}:v{VERSION}").as_str()
    );
    assert_eq!(
        deployment["metadata"]["labels"]["helm.sh/chart"],
        format!("proxy-operator-{VERSION}").as_str()
    );
    let crds = objects
        .keys()
        .filter(|k| k.starts_with("CustomResourceDefinition/"))
        .count();
    assert_eq!(
        crds,
        proxy_operator::api::crd_manifests().len(),
        "the CRDs are in the package, not links"
    );
    assert!(
        objects.contains_key("ValidatingAdmissionPolicy/proxy-operator-quota"),
        "the quota's admission policy is in the package, not a link"
    );
}

/// The SBOM describes the operator binary at this version with what it links (its normal
/// dependencies: wasmtime at the workspace's pin, kube, rustls), not the test-only ones.
fn check_sbom(dist: &Path) {
    let text =
        std::fs::read_to_string(dist.join(format!("proxy-operator-{VERSION}.cdx.json"))).unwrap();
    let sbom: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(sbom["specVersion"], "1.5");
    let component = &sbom["metadata"]["component"];
    assert_eq!(component["name"], "proxy-operator", "{component}");
    assert_eq!(component["version"], VERSION, "{component}");
    let components: BTreeMap<&str, &str> = sbom["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap(),
                c["version"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        components.get("wasmtime"),
        Some(&"48.0.8"),
        "{components:?}"
    );
    for linked in ["kube-client", "rustls", "tokio", "wasmtime-wasi"] {
        assert!(components.contains_key(linked), "{linked} in the SBOM");
    }
    // The default image's binary has no libvirt (the kvm variant's has).
    for left_out in ["virt", "virt-sys"] {
        assert!(
            !components.contains_key(left_out),
            "{left_out}: the default image's binary is built without libvirt"
        );
    }
    for test_only in ["criterion", "rstest", "proxy-operator-harness", "wat"] {
        assert!(
            !components.contains_key(test_only),
            "{test_only}: a dev-dependency in the SBOM"
        );
    }
}

#[test]
fn make_release_writes_the_image_install_yaml_chart_sbom_and_their_sums() {
    let archive = operator_image_archive(env!("CARGO_BIN_EXE_proxy-operator"));
    let dist = tempfile::tempdir().unwrap();
    released(dist.path(), &archive, &[("IMAGE_REPOSITORY", REPOSITORY)]);

    let sums = std::fs::read_to_string(dist.path().join("SHA256SUMS")).unwrap();
    let check = Command::new("sha256sum")
        .args(["--check", "--strict", "SHA256SUMS"])
        .current_dir(dist.path())
        .output()
        .unwrap();
    assert!(check.status.success(), "{sums}");
    let summed: BTreeSet<&str> = sums
        .lines()
        .filter_map(|l| l.split_once("  "))
        .map(|(_, f)| f)
        .collect();
    let files: BTreeSet<String> = std::fs::read_dir(dist.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| f != "SHA256SUMS")
        .collect();
    let image = format!("proxy-operator-{VERSION}.oci.tar");
    let expected: BTreeSet<String> = [
        "install.yaml".to_owned(),
        image.clone(),
        format!("proxy-operator-{VERSION}.tgz"),
        format!("proxy-operator-{VERSION}.cdx.json"),
        "LICENSE".to_owned(),
    ]
    .into();
    assert_eq!(files, expected);
    assert_eq!(
        std::fs::read(dist.path().join("LICENSE")).unwrap(),
        std::fs::read(repo().join("LICENSE")).unwrap()
    );
    assert_eq!(summed, files.iter().map(String::as_str).collect(), "{sums}");

    let digest = manifest_digest(&dist.path().join(&image));
    assert_eq!(
        digest,
        manifest_digest(&archive),
        "the image archive as given"
    );
    check_install_yaml(dist.path(), &digest);
    check_chart(dist.path());
    check_sbom(dist.path());
}

/// What `make release` refuses, before it builds anything, and how it says what to do.
#[test]
fn make_release_refuses_a_version_that_is_not_the_workspaces_naming_the_fix() {
    for (version, says) in [
        ("", "VERSION is missing: make release VERSION="),
        ("v1.0", "VERSION must be x.y.z"),
        (
            "9.8.7",
            "set version = \"9.8.7\" under [workspace.package] in Cargo.toml",
        ),
    ] {
        let dist = tempfile::tempdir().unwrap();
        let out = release(version, &dist.path().join("dist"), None, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{version:?} accepted");
        assert!(stderr.contains(says), "{version:?}: {stderr}");
        assert!(
            !dist.path().join("dist").exists(),
            "{version:?}: dist/ made"
        );
    }
    let out = release(
        VERSION,
        &tempfile::tempdir().unwrap().path().join("dist"),
        None,
        &[("IMAGE_REPOSITORY", "registry.example/x:v1")],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("IMAGE_REPOSITORY must be an image name"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `proxy-operator --version` and `kubectl px --version`: the version and the commit the
/// binaries were built from, `git rev-parse HEAD` of this checkout (host/build.rs), or where
/// the checkout has no git, what PROXY_OPERATOR_REVISION says, else `unknown`.
#[test]
fn version_names_the_version_and_the_git_commit_built_from() {
    let head = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(repo())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8(o.stdout).unwrap().trim().to_owned());
    let commit = head.unwrap_or_else(|| {
        std::env::var("PROXY_OPERATOR_REVISION")
            .ok()
            .filter(|r| !r.trim().is_empty())
            .unwrap_or_else(|| "unknown".to_owned())
    });
    for (binary, name) in [
        (env!("CARGO_BIN_EXE_proxy-operator"), "proxy-operator"),
        (env!("CARGO_BIN_EXE_kubectl-px"), "kubectl-px"),
    ] {
        let out = Command::new(binary).arg("--version").output().unwrap();
        assert!(out.status.success());
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            format!("{name} {VERSION} (commit {commit})\n"),
            "{binary} --version"
        );
    }
}
