//! Debian's headless Chromium, run in a network namespace of the test's own (no uplink, so its
//! calls home go nowhere; the fixture notes): the flags that keep it quiet, a scratch profile
//! and home, and one run until it exits.

use std::time::Duration;

use anyhow::{Result, bail};

use crate::bins::debian_binary;
use crate::netns::Netns;
use crate::process::{Check, Proc, Scratch, wait_for};

/// The flags the fixture notes give for a headless Chromium that stays quiet (it still tries to
/// reach Google for the time and component updates: the namespace has no uplink).
pub const QUIET: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--metrics-recording-only",
    "--hide-scrollbars",
];

/// Runs Chromium in `netns` on `url` with `args` (e.g. `--dump-dom`, `--screenshot=…`) until it
/// exits, within `timeout`; its standard output. An error carries its log (without the D-Bus
/// complaints: there is no D-Bus here, and it needs none).
pub async fn run(netns: &Netns, args: &[&str], url: &str, timeout: Duration) -> Result<String> {
    let dir = Scratch::new("chromium")?;
    let mut cmd = netns.command(debian_binary("/usr/bin/chromium", "chromium"));
    cmd.args(QUIET)
        .arg(format!(
            "--user-data-dir={}",
            dir.path().join("profile").display()
        ))
        .args(args)
        .arg(url)
        // Whatever it writes in a home directory stays in the scratch directory.
        .env("HOME", dir.path())
        .env("XDG_CONFIG_HOME", dir.path().join("config"))
        .env("XDG_CACHE_HOME", dir.path().join("cache"));
    let (out, log) = (dir.path().join("out"), dir.path().join("chromium.log"));
    let mut browser = Proc::spawn_with_stdout("chromium", cmd, &out, &log)?;
    let exited = wait_for("chromium to exit", timeout, || {
        let exited = browser.try_exited();
        async move {
            match exited {
                Some(status) => Check::Ready(status),
                None => Check::NotYet("running".into()),
            }
        }
    })
    .await;
    let log_tail = || {
        let log = browser.log_tail(200);
        let lines: Vec<&str> = log.lines().filter(|l| !l.contains("dbus/")).collect();
        lines.join("\n")
    };
    match exited {
        Ok(status) if status.success() => Ok(std::fs::read_to_string(&out)?),
        Ok(status) => bail!("chromium ended {status}:\n{}", log_tail()),
        Err(e) => bail!("{e:#}\n{}", log_tail()),
    }
}
