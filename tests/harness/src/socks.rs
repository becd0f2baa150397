//! Real SOCKS5 servers from Debian on free loopback ports, standing in for a vendor's SOCKS5
//! proxies: dante (`danted`, package `dante-server`) without a login, and microsocks (package
//! `microsocks`) requiring an RFC 1929 username and password.
//!
//! Why two: dante's `socksmethod: username` checks the password against the machine's own
//! accounts (`/etc/passwd` and shadow, or PAM), so a test of a login would have to add a system
//! user to the machine; microsocks takes the login on its command line. Both allow CONNECT from
//! loopback only; dante only to loopback too (microsocks has no destination rules).

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::net::TcpStream;

use crate::bins::debian_binary;
use crate::process::{Check, Proc, Scratch, free_port, wait_for};

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A SOCKS5 server on `127.0.0.1:PORT`; killed on drop.
pub struct SocksServer {
    proc: Proc,
    port: u16,
    scratch: Scratch,
}

impl SocksServer {
    /// dante on a free loopback port, no login (`socksmethod: none`), CONNECT from and to
    /// 127.0.0.0/8 only; its log is `sockd.log` in [`SocksServer::dir`].
    pub async fn dante() -> Result<SocksServer> {
        let danted = debian_binary("/usr/sbin/danted", "dante-server");
        let scratch = Scratch::new("dante")?;
        let dir = scratch.path().to_path_buf();
        let port = free_port()?;
        let conf = dir.join("sockd.conf");
        std::fs::write(
            &conf,
            format!(
                "logoutput: {log}\n\
                 internal: 127.0.0.1 port = {port}\n\
                 external: 127.0.0.1\n\
                 socksmethod: none\n\
                 clientmethod: none\n\
                 user.privileged: root\n\
                 user.unprivileged: nobody\n\
                 client pass {{ from: 127.0.0.0/8 to: 0.0.0.0/0 }}\n\
                 socks pass {{ from: 127.0.0.0/8 to: 127.0.0.0/8 command: connect }}\n\
                 socks block {{ from: 0.0.0.0/0 to: 0.0.0.0/0 log: error }}\n",
                log = dir.join("sockd.log").display()
            ),
        )
        .with_context(|| format!("write {}", conf.display()))?;
        let mut cmd = Command::new(danted);
        cmd.arg("-f")
            .arg(&conf)
            .arg("-p")
            .arg(dir.join("sockd.pid"))
            .arg("-N")
            .arg("1");
        SocksServer::started("danted", cmd, port, scratch).await
    }

    /// microsocks on a free loopback port, requiring `username` and `password` (RFC 1929).
    pub async fn microsocks_with_login(username: &str, password: &str) -> Result<SocksServer> {
        let microsocks = debian_binary("/usr/bin/microsocks", "microsocks");
        let scratch = Scratch::new("microsocks")?;
        let port = free_port()?;
        let mut cmd = Command::new(microsocks);
        cmd.args(["-i", "127.0.0.1", "-p", &port.to_string()])
            .args(["-u", username, "-P", password]);
        SocksServer::started("microsocks", cmd, port, scratch).await
    }

    async fn started(name: &str, cmd: Command, port: u16, scratch: Scratch) -> Result<Self> {
        let log = scratch.path().join(format!("{name}.out"));
        let mut proc = Proc::spawn(name, cmd, &log)?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let running = &mut proc;
        wait_for(&format!("{name} listening"), START_TIMEOUT, || {
            let exited = running.ensure_running().err();
            async move {
                if let Some(e) = exited {
                    return Check::Failed(e);
                }
                match TcpStream::connect(addr).await {
                    Ok(_) => Check::Ready(()),
                    Err(e) => Check::NotYet(e.to_string()),
                }
            }
        })
        .await?;
        Ok(SocksServer {
            proc,
            port,
            scratch,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `socks5://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("socks5://127.0.0.1:{}", self.port)
    }

    /// The scratch directory (config, logs).
    pub fn dir(&self) -> &std::path::Path {
        self.scratch.path()
    }

    /// The server's own log so far (dante's `sockd.log` and what either printed).
    pub fn log(&self) -> String {
        let read = |name: &str| std::fs::read_to_string(self.dir().join(name)).unwrap_or_default();
        format!("{}{}", read("sockd.log"), self.proc.log_tail(50))
    }
}

impl Drop for SocksServer {
    fn drop(&mut self) {
        self.proc.kill();
    }
}
