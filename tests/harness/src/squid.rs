//! squid (Debian) on a free loopback port: a real CONNECT proxy for the health engine.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::net::TcpStream;

use crate::bins::debian_binary;
use crate::process::{Check, Proc, Scratch, free_port, run_output, wait_for};

const START_TIMEOUT: Duration = Duration::from_secs(30);
const STOP_GRACE: Duration = Duration::from_secs(10);

/// squid listening on `127.0.0.1:PORT`, allowing everything (including CONNECT to
/// any port) from localhost and nothing else. No cache. Runs in the foreground
/// (`-N`) in its own scratch directory (owned by `proxy`, squid's user).
///
/// [`Squid::stop`] and [`Squid::start_again`] keep the port, for "proxy down →
/// Unhealthy → proxy back → Healthy" tests. Stopped on drop.
pub struct Squid {
    proc: Option<Proc>,
    port: u16,
    conf: PathBuf,
    service_name: String,
    scratch: Scratch,
}

impl Squid {
    /// Starts squid and waits until it accepts connections (~0.1 s).
    pub async fn start() -> Result<Squid> {
        Squid::start_with("").await
    }

    /// Like `start`, with `extra` appended to the harness's squid.conf (e.g.
    /// `tcp_outgoing_address 127.0.0.2`, so what squid connects to sees another address than
    /// its clients).
    pub async fn start_with(extra: &str) -> Result<Squid> {
        Squid::start_configured(OPEN_ACCESS, extra).await
    }

    /// Like `start`, but squid requires HTTP basic auth as the providers configure it (the
    /// helper `basic_ncsa_auth` and a password file, empty until [`Squid::set_passwords`]); a
    /// request without accepted credentials gets 407.
    pub async fn start_requiring_login() -> Result<Squid> {
        Squid::start_requiring_login_with("").await
    }

    /// [`Squid::start_requiring_login`] with `extra` appended to its squid.conf (e.g.
    /// `tcp_outgoing_address 127.0.0.3`, so the site tells which squid carried a request).
    pub async fn start_requiring_login_with(extra: &str) -> Result<Squid> {
        let helper = debian_binary("/usr/lib/squid/basic_ncsa_auth", "squid");
        let access = format!(
            "auth_param basic program {} {{dir}}/passwd
auth_param basic children 2 startup=1 idle=1
auth_param basic realm harness
auth_param basic credentialsttl 5 seconds
acl loopback src 127.0.0.0/8
acl logged_in proxy_auth REQUIRED
http_access deny !loopback
http_access allow logged_in
http_access deny all
",
            helper.display()
        );
        Squid::start_configured(&access, extra).await
    }

    /// squid from a provider's own squid.conf (as its Pod or VM would run it), on a free
    /// loopback port: only the lines that say where squid runs are replaced (`http_port`, its
    /// logs, pid file, host name and DNS); every `acl` and `http_access` line is the provider's.
    /// `hosts` is squid's `hosts_file` (names the test resolves, e.g. to 169.254.169.254); no
    /// other name resolves (DNS goes to 127.0.0.1, where nothing answers). The access log is
    /// on, in [`Squid::access_log`].
    pub async fn start_from_provider_conf(conf: &str, hosts: &str) -> Result<Squid> {
        const PLACED_BY_THE_HARNESS: [&str; 7] = [
            "http_port ",
            "cache_log ",
            "pid_filename ",
            "coredump_dir ",
            "access_log ",
            "visible_hostname ",
            "dns_nameservers ",
        ];
        let kept: String = conf
            .lines()
            .filter(|l| !PLACED_BY_THE_HARNESS.iter().any(|p| l.starts_with(p)))
            .map(|l| format!("{l}\n"))
            .collect();
        if kept.lines().count() + 1 >= conf.lines().count() {
            bail!("not a provider's squid.conf (no http_port or logs to place):\n{conf}");
        }
        Squid::start_built(|port, dir| {
            std::fs::write(format!("{dir}/hosts"), hosts)?;
            Ok(format!(
                "{kept}# placed by the harness\nhttp_port 127.0.0.1:{port}\nhosts_file {dir}/hosts\n{}",
                config_tail(dir)
            ))
        })
        .await
    }

    /// Replaces the password file of a [`Squid::start_requiring_login`] squid (lines
    /// `user:crypt-hash`); squid's helper reads it again on its next check.
    pub fn set_passwords(&self, lines: &str) -> Result<()> {
        replace_password_file(&self.scratch.path().join("passwd"), lines)?;
        chown_to_proxy(self.scratch.path())
    }

    async fn start_configured(access: &str, extra: &str) -> Result<Squid> {
        Squid::start_built(|port, dir| {
            std::fs::write(format!("{dir}/passwd"), "")?;
            let access = access.replace("{dir}", dir);
            Ok(config(port, dir, &access) + extra)
        })
        .await
    }

    /// Starts squid with the config `build` writes for its port and scratch directory.
    async fn start_built(build: impl FnOnce(u16, &str) -> Result<String>) -> Result<Squid> {
        let squid = debian_binary("/usr/sbin/squid", "squid");
        let scratch = Scratch::new("squid")?;
        let dir = scratch.path();
        let port = free_port()?;
        let conf = dir.join("squid.conf");
        let dir_text = dir.display().to_string();
        std::fs::write(&conf, build(port, &dir_text)?)
            .with_context(|| format!("write {}", conf.display()))?;
        chown_to_proxy(dir)?;
        // Validate first: a config error is clearer from `-k parse` than from a dead process.
        run_output(
            tokio::process::Command::new(&squid)
                .arg("-k")
                .arg("parse")
                .arg("-f")
                .arg(&conf),
        )
        .await
        .context("squid -k parse")?;
        let service_name = format!(
            "harness{}x{}",
            std::process::id(),
            dir.file_name().unwrap().to_string_lossy().replace('-', "x")
        );
        let mut s = Squid {
            proc: None,
            port,
            conf,
            service_name,
            scratch,
        };
        s.start_again().await?;
        Ok(s)
    }

    /// `127.0.0.1:PORT`
    pub fn addr(&self) -> SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// PID of the running squid.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(Proc::pid)
    }

    pub fn is_running(&mut self) -> bool {
        self.proc.as_mut().is_some_and(|p| p.try_exited().is_none())
    }

    /// Stops squid in order (SIGTERM; squid closes its port at once and exits
    /// ~2 s later; SIGKILL after 10 s) and waits for the exit.
    pub async fn stop(&mut self) -> Result<()> {
        if let Some(mut proc) = self.proc.take() {
            proc.stop(STOP_GRACE).await;
        }
        let addr = self.addr();
        wait_for("squid port closed", START_TIMEOUT, || async move {
            match TcpStream::connect(addr).await {
                Ok(_) => Check::NotYet(format!("{addr} still accepts connections")),
                Err(_) => Check::Ready(()),
            }
        })
        .await
    }

    /// SIGKILLs squid (an abrupt failure, and faster than [`Squid::stop`], which
    /// waits ~2 s for squid's orderly shutdown; the port closes at once either way).
    pub fn kill(&mut self) {
        if let Some(mut proc) = self.proc.take() {
            proc.kill();
        }
    }

    /// Starts squid again on the same port (after [`Squid::stop`]) and waits until
    /// it accepts connections.
    pub async fn start_again(&mut self) -> Result<()> {
        if self.is_running() {
            bail!("squid is already running (pid {:?})", self.pid());
        }
        let squid = debian_binary("/usr/sbin/squid", "squid");
        let mut cmd = Command::new(squid);
        cmd.arg("-N")
            .arg("-n")
            .arg(&self.service_name)
            .arg("-f")
            .arg(&self.conf);
        let log = self.scratch.path().join("squid.out");
        self.proc = Some(Proc::spawn("squid", cmd, &log)?);
        let addr = self.addr();
        let proc = self.proc.as_mut().unwrap();
        let cache_log = self.scratch.path().join("cache.log");
        wait_for("squid listening", START_TIMEOUT, || {
            let exited = proc.ensure_running().err();
            let cache_log = cache_log.clone();
            async move {
                if let Some(e) = exited {
                    return Check::Failed(e.context(format!(
                        "cache.log:\n{}",
                        crate::process::log_tail(&cache_log, 20)
                    )));
                }
                match TcpStream::connect(addr).await {
                    Ok(_) => Check::Ready(()),
                    Err(e) => Check::NotYet(e.to_string()),
                }
            }
        })
        .await
    }

    /// The access log (`access.log` in the scratch directory).
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.scratch.path().join("access.log")).unwrap_or_default()
    }

    /// The scratch directory (squid.conf, cache.log, access.log).
    pub fn dir(&self) -> &std::path::Path {
        self.scratch.path()
    }
}

impl Drop for Squid {
    fn drop(&mut self) {
        // Nothing to flush: skip squid's ~2 s orderly shutdown.
        self.kill();
    }
}

/// Replaces a squid password file so that `basic_ncsa_auth` reads it again: written beside and
/// renamed (never half-written), with a modification time later than the old file's, because
/// the helper compares whole seconds and would miss a change within the same second.
pub fn replace_password_file(path: &std::path::Path, lines: &str) -> Result<()> {
    let previous = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let staged = path.with_extension("new");
    std::fs::write(&staged, lines).with_context(|| format!("write {}", staged.display()))?;
    let now = std::time::SystemTime::now();
    let modified = match previous {
        Some(before) if before + std::time::Duration::from_secs(1) > now => {
            before + std::time::Duration::from_secs(1)
        }
        _ => now,
    };
    std::fs::File::options()
        .write(true)
        .open(&staged)?
        .set_modified(modified)?;
    std::fs::rename(&staged, path).with_context(|| format!("rename to {}", path.display()))
}

/// Who may use the harness squid by default: anyone on loopback.
const OPEN_ACCESS: &str = "acl loopback src 127.0.0.0/8
http_access allow loopback
http_access deny all
";

fn config(port: u16, dir: &str, access: &str) -> String {
    format!(
        "# proxy-operator test harness: loopback only, no cache, CONNECT to any port.
http_port 127.0.0.1:{port}
{access}cache deny all
shutdown_lifetime 0 seconds
{}",
        config_tail(dir)
    )
}

/// Where the harness's squid keeps its files, and what keeps it quick and quiet on loopback.
fn config_tail(dir: &str) -> String {
    format!(
        "pid_filename {dir}/squid.pid
cache_log {dir}/cache.log
access_log stdio:{dir}/access.log
netdb_filename none
coredump_dir {dir}
pinger_enable off
visible_hostname harness-squid
dns_nameservers 127.0.0.1
"
    )
}

/// squid drops privileges to `proxy`, which must be able to write its directory.
fn chown_to_proxy(dir: &std::path::Path) -> Result<()> {
    if unsafe { libc::geteuid() } != 0 {
        return Ok(()); // squid keeps running as the invoking user
    }
    let (uid, gid) = user_ids("proxy").context("look up user `proxy` (Debian package squid)")?;
    for entry in std::fs::read_dir(dir)? {
        std::os::unix::fs::chown(entry?.path(), Some(uid), Some(gid))?;
    }
    std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
    Ok(())
}

/// uid and gid of a local user.
pub fn user_ids(name: &str) -> Result<(u32, u32)> {
    let cname = std::ffi::CString::new(name)?;
    // SAFETY: getpwnam returns a pointer to static storage or null; read at once.
    let pw = unsafe { libc::getpwnam(cname.as_ptr()) };
    if pw.is_null() {
        bail!("no user {name}");
    }
    // SAFETY: non-null pointer from getpwnam.
    Ok(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}
