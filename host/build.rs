//! The git commit `proxy-operator --version` prints (`PROXY_OPERATOR_REVISION` at compile time):
//! `git rev-parse HEAD` of the checkout the crate is built in; where there is no git repository
//! (the Dockerfile's build context leaves `.git` out) the environment variable
//! `PROXY_OPERATOR_REVISION` (the Dockerfile passes its `REVISION` build argument), else
//! `unknown`. Rerun when HEAD moves (the HEAD file, the branch's ref, packed-refs) or that
//! variable changes, not on every source change.

use std::path::Path;
use std::process::Command;

const VAR: &str = "PROXY_OPERATOR_REVISION";
/// What `--version` says when neither git nor the variable tells the commit.
const UNKNOWN: &str = "unknown";

/// `git ARGS` in `dir`: its trimmed stdout, or `None` when git is missing or fails.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}

/// The commit of the checkout, and the files whose change means HEAD moved.
fn from_git(dir: &Path) -> Option<(String, Vec<String>)> {
    let commit = git(dir, &["rev-parse", "--verify", "HEAD"])?;
    let mut watch = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    // The branch HEAD names (none when detached), e.g. refs/heads/main.
    watch.extend(git(dir, &["symbolic-ref", "-q", "HEAD"]));
    let mut files = Vec::new();
    for name in &watch {
        let Some(path) = git(
            dir,
            &["rev-parse", "--path-format=absolute", "--git-path", name],
        ) else {
            continue;
        };
        // A missing file would make cargo rerun this script on every build. A branch whose
        // ref is packed (a fresh clone) gets a loose file at its next commit: its directory
        // is watched instead.
        match Path::new(&path) {
            p if p.exists() => files.push(path),
            p if name.starts_with("refs/") => files.extend(
                p.parent()
                    .filter(|d| d.is_dir())
                    .map(|d| d.display().to_string()),
            ),
            _ => {}
        }
    }
    Some((commit, files))
}

fn main() {
    println!("cargo:rerun-if-env-changed={VAR}");
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let revision = match from_git(Path::new(&dir)) {
        Some((commit, files)) => {
            for file in files {
                println!("cargo:rerun-if-changed={file}");
            }
            commit
        }
        None => {
            // No repository: nothing to watch but the variable (rerun-if-changed of this file
            // keeps cargo from rerunning the script on every source change).
            println!("cargo:rerun-if-changed=build.rs");
            std::env::var(VAR)
                .ok()
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| UNKNOWN.to_owned())
        }
    };
    println!("cargo:rustc-env={VAR}={revision}");
}
