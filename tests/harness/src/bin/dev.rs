//! `make dev`: the product doing its job on this machine, for real. Starts a control plane, a
//! local hypervisor (sshd + libvirtd behind the egress guard), the operator with the built
//! plugins, applies a kvm Proxy with no cloud-init, shows each phase until it is Ready, then
//! prints what to try and runs until Ctrl-C, which deletes the Proxy (the operator removes the
//! VM) and stops everything.
//!
//! With `DEV_ONCE=1` it leases the proxy and sends a request through it itself, prints the
//! response status, tears everything down and exits 0; any failure exits non-zero naming the
//! phase that failed. CI runs this mode.
//!
//! Environment: `PROXY_OPERATOR_BIN` (default `target/debug/proxy-operator`),
//! `PROXY_OPERATOR_PLUGINS_DIR` (default `target/plugins`), `DEV_FIRMWARE` (`uefi`, the
//! provider's default, or `bios`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use harness::stack::{Phases, SITE_BODY, Stack, StackOptions};

/// A kvm Proxy under TCG with a cached image is Ready in well under this.
const READY_TIMEOUT: Duration = Duration::from_secs(300);

fn repo_path(env: &str, default: &str) -> PathBuf {
    std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(default)
    })
}

#[tokio::main]
async fn main() {
    let once = std::env::var("DEV_ONCE").is_ok_and(|v| v == "1");
    let firmware = match std::env::var("DEV_FIRMWARE").as_deref() {
        Ok("bios") => "bios",
        Ok("uefi") | Err(_) => "uefi",
        Ok(other) => {
            eprintln!("make dev: DEV_FIRMWARE={other:?} is not uefi or bios");
            std::process::exit(2);
        }
    };
    let options = StackOptions {
        operator_bin: repo_path("PROXY_OPERATOR_BIN", "target/debug/proxy-operator"),
        plugins_dir: repo_path("PROXY_OPERATOR_PLUGINS_DIR", "target/plugins"),
        firmware,
    };
    let mut phases = Phases::new();
    let mut phase = "start";
    let result = run(&options, &mut phases, once, &mut phase).await;
    match result {
        Ok(()) => {
            eprintln!("make dev: done in {:.1} s", phases.elapsed());
        }
        Err(e) => {
            eprintln!(
                "make dev: FAILED in phase `{phase}` after {:.1} s: {e:#}",
                phases.elapsed()
            );
            std::process::exit(1);
        }
    }
}

async fn run(
    options: &StackOptions,
    phases: &mut Phases,
    once: bool,
    phase: &mut &'static str,
) -> Result<()> {
    *phase = "start the stack";
    let mut stack = Stack::start(options, phases).await?;
    let result = drive(&mut stack, phases, once, phase).await;
    // The stack's directory goes with it: the operator's log is kept, whatever happened.
    match stack.keep_operator_log(&repo_path("DEV_LOG_DIR", "target/dev-logs")) {
        Ok(kept) => eprintln!("make dev: the operator's log is kept in {}", kept.display()),
        Err(e) => eprintln!("make dev: cannot keep the operator's log: {e:#}"),
    }
    result
}

/// What `make dev` does with a started stack: a Proxy Ready, then (once) leased and used.
async fn drive(
    stack: &mut Stack,
    phases: &mut Phases,
    once: bool,
    phase: &mut &'static str,
) -> Result<()> {
    *phase = "apply the Proxy";
    stack.apply_proxy().await?;
    phases.done("Proxy crawlers/egress-1 applied (spec.provider: kvm-home, no cloud-init)");
    *phase = "wait for Ready";
    let status = stack.wait_ready(phases, READY_TIMEOUT).await?;
    let address = format!(
        "http://{}:{}",
        status["address"].as_str().unwrap_or_default(),
        status["port"].as_u64().unwrap_or_default()
    );
    if !once {
        println!("{}", stack.instructions(&address));
        tokio::signal::ctrl_c().await.context("wait for Ctrl-C")?;
        eprintln!("\nmake dev: stopping; deleting the Proxy (the operator removes its VM)");
        *phase = "delete the Proxy";
        stack.delete_proxy(Duration::from_secs(60)).await?;
        phases.done("Proxy deleted, VM removed");
        return Ok(());
    }
    *phase = "lease the proxy";
    let lease = stack.lease().await?;
    let proxy_url = lease["proxyUrl"]
        .as_str()
        .context("the lease has no proxyUrl")?
        .to_string();
    // The lease's URL carries the proxy's password: shown without it.
    let shown = harness::stack::without_password(&proxy_url);
    phases.done(&format!(
        "leased {shown} (lease {})",
        lease["id"].as_str().unwrap_or("?")
    ));
    *phase = "request through the proxy";
    let (status, body) = stack.get_through(&proxy_url).await?;
    println!("GET {} through {shown}: HTTP {status}", stack.site_url());
    if status != 200 || body != SITE_BODY {
        bail!("expected HTTP 200 with the site's body, got HTTP {status}: {body:?}");
    }
    *phase = "a request without the proxy's credentials";
    let bare = harness::stack::without_credentials(&proxy_url);
    let (status, _) = stack.get_through(&bare).await?;
    println!(
        "GET {} through {bare} (no credentials): HTTP {status}",
        stack.site_url()
    );
    if status != 407 {
        bail!("the proxy should require its credentials (HTTP 407), got HTTP {status}");
    }
    phases.done("request through the leased proxy answered 200 with the site's body");
    *phase = "a request through the gateway";
    // The gateway shares no exclusively leased proxy: the lease ends first.
    stack
        .release(lease["id"].as_str().context("the lease has no id")?)
        .await?;
    let through_gateway = stack.gateway_url(&format!("provider-{}", harness::stack::PROVIDER));
    let shown = harness::stack::without_password(&through_gateway);
    let (status, body) = stack.get_through(&through_gateway).await?;
    println!(
        "GET {} through the gateway {shown}: HTTP {status}",
        stack.site_url()
    );
    if status != 200 || body != SITE_BODY {
        bail!(
            "expected HTTP 200 with the site's body through the gateway, got HTTP {status}: {body:?}"
        );
    }
    phases.done("request through the gateway answered 200 with the site's body");
    *phase = "delete the Proxy";
    stack.delete_proxy(Duration::from_secs(60)).await?;
    phases.done("Proxy deleted, VM removed");
    Ok(())
}
