//! moto, the AWS emulator the AWS SDKs test with, in server mode on a free loopback port: the
//! EC2 Query API and STS for the aws provider's tests. It keeps state (instances, security
//! groups, tags), checks request shapes and pages `DescribeInstances` by `MaxResults`; it does
//! not check signatures (a recording server proves the host's SigV4) and boots nothing.
//!
//! Installed by `.ci/install-fixtures.sh` into a venv keyed by tests/fixtures/moto/requirements.txt
//! (`$PROXY_OPERATOR_MOTO`, default `~/.cache/proxy-operator/moto`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Result, bail};

use crate::process::{Proc, Scratch, free_port};

const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A moto server; stopped on drop.
pub struct Moto {
    proc: Proc,
    port: u16,
    _scratch: Scratch,
}

/// The moto venv, checked to hold what tests/fixtures/moto/requirements.txt asks for.
pub fn venv() -> Result<PathBuf> {
    let venv = std::env::var_os("PROXY_OPERATOR_MOTO")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/proxy-operator/moto")
        });
    let fix = "run .ci/install-fixtures.sh (it installs tests/fixtures/moto/requirements.txt into that venv)";
    let program = venv.join("bin/moto_server");
    if !program.exists() {
        bail!("{} is missing: {fix}", program.display());
    }
    let wanted = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/moto/requirements.txt"),
    )?;
    let installed = std::fs::read(venv.join("requirements.txt")).unwrap_or_default();
    if wanted != installed {
        bail!(
            "{} holds another moto than tests/fixtures/moto/requirements.txt: {fix}",
            venv.display()
        );
    }
    Ok(venv)
}

impl Moto {
    /// Starts `moto_server -H 127.0.0.1 -p PORT` and waits until it answers (~2 s).
    pub async fn start() -> Result<Moto> {
        let venv = venv()?;
        let scratch = Scratch::new("moto")?;
        let port = free_port()?;
        let mut cmd = Command::new(venv.join("bin/moto_server"));
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .current_dir(scratch.path())
            // moto answers with its own test account whatever keys are set around it.
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY");
        let log = scratch.path().join("moto.log");
        let mut proc = Proc::spawn("moto", cmd, &log)?;
        let http = reqwest::Client::new();
        proc.wait_http_ok(
            &http,
            &format!("http://127.0.0.1:{port}/moto-api/data.json"),
            START_TIMEOUT,
        )
        .await?;
        Ok(Moto {
            proc,
            port,
            _scratch: scratch,
        })
    }

    /// `http://127.0.0.1:PORT`: the endpoint of every service moto serves.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The last lines of moto's log (its request log), for a failing test's message.
    pub fn log_tail(&self, lines: usize) -> String {
        self.proc.log_tail(lines)
    }
}
