//! The release's pieces for the tests that check it (deploy/release.rs, cluster_e2e/release.rs):
//! the operator's test image (the Dockerfile's `prebuilt` target with the binary cargo built for
//! the test), its manifest digest, and `.ci/release.sh` run with that image instead of a full
//! Dockerfile build (`RELEASE_IMAGE_ARCHIVE`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The operator's image as an OCI archive, built from the Dockerfile's `prebuilt` target by
/// `tests/fixtures/operator-image/build.sh` with `binary` (the operator cargo built for the
/// test: the runtime stage of the user's image; docs/image.md). Cached by the binary's hash:
/// `make test` and `make e2e-cluster` build and check it first.
pub fn operator_image_archive(binary: &str) -> PathBuf {
    let script = repo().join("tests/fixtures/operator-image/build.sh");
    // Where cargo's dep-info of the binary is (build.sh checks the build context against it):
    // the build directory, as `make test-image-of-build` says.
    let build_dir = std::env::var_os("CARGO_BUILD_BUILD_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"));
    // The binary as `make test-image-of-build` packages it: a hard link where no dep-info lies
    // beside it, so build.sh reads rustc's in the build directory. The `.d` a `cargo build`
    // (make dev's) leaves beside target/debug/proxy-operator names .git/HEAD, which the image's
    // context leaves out (docs/image.md). One link per process: suites run side by side.
    let packaged = repo().join(format!("target/test-image/release-{}", std::process::id()));
    std::fs::create_dir_all(packaged.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(&packaged);
    if std::fs::hard_link(binary, &packaged).is_err() {
        std::fs::copy(binary, &packaged).unwrap();
    }
    let out = Command::new(&script)
        .env("OPERATOR_BINARY", &packaged)
        .env("PLUGINS_DIR", repo().join("target/plugins"))
        .env("CARGO_BUILD_BUILD_DIR", build_dir)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
    let _ = std::fs::remove_file(&packaged);
    assert!(
        out.status.success(),
        "building the operator image failed (run .ci/install-fixtures.sh):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    PathBuf::from(
        stdout
            .lines()
            .last()
            .expect("build.sh prints the archive path")
            .trim(),
    )
}

/// The digest of the image manifest an OCI archive's index names (`sha256:…`): what a
/// registry keeps when the archive is pushed as it is, and what `image: NAME@DIGEST` pins.
pub fn manifest_digest(archive: &Path) -> String {
    let out = Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg("index.json")
        .output()
        .expect("tar");
    assert!(
        out.status.success(),
        "no index.json in {}",
        archive.display()
    );
    let index: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let digest = index["manifests"][0]["digest"].as_str().unwrap().to_owned();
    assert!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "{digest}"
    );
    digest
}

/// `.ci/release.sh VERSION` (as `make release VERSION=…` runs it) into `dist` (empty), with
/// `archive` as the release's image; `env`: more variables, e.g. `IMAGE_REPOSITORY`.
pub fn release(version: &str, dist: &Path, archive: Option<&Path>, env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(repo().join(".ci/release.sh"));
    command
        .arg(version)
        .env("DIST", dist)
        .env_remove("VERSION")
        .env_remove("RELEASE_IMAGE_ARCHIVE")
        .env_remove("IMAGE_REPOSITORY");
    if let Some(archive) = archive {
        command.env("RELEASE_IMAGE_ARCHIVE", archive);
    }
    command.envs(env.iter().copied());
    command.output().expect(".ci/release.sh")
}

/// `release` of the workspace's version that must succeed: the artifacts are in `dist`.
pub fn released(dist: &Path, archive: &Path, env: &[(&str, &str)]) {
    let version = env!("CARGO_PKG_VERSION");
    let out = release(version, dist, Some(archive), env);
    assert!(
        out.status.success(),
        ".ci/release.sh {version}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
