//! Network namespaces with no uplink: the node cluster's, and a test's own for a program that
//! must reach nothing but what the test hands it (a browser calls home on its own).
//!
//! A thread enters a namespace with `setns(2)` (only that thread moves); a socket made there
//! stays in that namespace wherever it is used afterwards, so a listener bound inside can be
//! served from the test's runtime, and a connection made inside reaches the namespace's
//! addresses.

use std::fs;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::process::{ExitHook, at_exit};

/// Outside addresses whose route lookup must fail inside a namespace with no uplink.
const OUTSIDE: &[Ipv4Addr] = &[
    Ipv4Addr::new(1, 1, 1, 1),
    Ipv4Addr::new(8, 8, 8, 8),
    Ipv4Addr::new(192, 168, 1, 1),
    Ipv4Addr::new(172, 17, 0, 1),
];

/// Names of [`Netns`]es: `proxy-operator-ns-<kind>-<pid>-<n>` (the pid tells whose it is).
const PREFIX: &str = "proxy-operator-ns-";

/// A network namespace of this process with only `lo` (up) and no route off it. Deleted on
/// drop and at exit; one left by a killed test process is deleted by the next [`Netns::create`].
pub struct Netns {
    name: String,
    path: PathBuf,
    _exit: ExitHook,
}

impl Netns {
    /// `ip netns add`, `lo` up, then the no-uplink guard: fails (and deletes it) if a route
    /// lookup to an outside address succeeds in it.
    pub fn create(kind: &str) -> Result<Netns> {
        sweep_dead();
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let name = format!("{PREFIX}{kind}-{}-{n}", std::process::id());
        run("ip", &["netns", "add", &name])?;
        let exit = {
            let name = name.clone();
            at_exit(move || delete(&name))
        };
        let netns = Netns {
            path: PathBuf::from(format!("/run/netns/{name}")),
            name,
            _exit: exit,
        };
        run("ip", &["-n", &netns.name, "link", "set", "lo", "up"])?;
        netns
            .check_no_uplink()
            .with_context(|| format!("the network namespace {} has an uplink", netns.name))?;
        Ok(netns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `program` run inside the namespace (`nsenter --net`; nsenter execs it, so the child is
    /// the program itself).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.path.display()))
            .arg("--")
            .arg(program);
        cmd
    }

    /// A listener bound to `addr` inside the namespace, for the current tokio runtime.
    pub async fn listen(&self, addr: SocketAddr) -> io::Result<tokio::net::TcpListener> {
        let listener = in_netns_async(&self.path, move || {
            let listener = TcpListener::bind(addr)?;
            listener.set_nonblocking(true)?;
            Ok(listener)
        })
        .await?;
        tokio::net::TcpListener::from_std(listener)
    }

    /// A connection made from inside the namespace, for the current tokio runtime.
    pub async fn connect(&self, addr: SocketAddr) -> io::Result<tokio::net::TcpStream> {
        tokio::net::TcpStream::from_std(connect_in(&self.path, addr).await?)
    }

    /// Fails unless a route lookup to every one of a few outside addresses fails inside.
    pub fn check_no_uplink(&self) -> Result<()> {
        check_no_uplink(&self.path)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        delete(&self.name);
    }
}

/// Removes the namespace `/run/netns/<name>` (as `ip netns delete` does: the bind mount and its
/// file; the namespace itself ends with its last process).
pub(crate) fn delete(name: &str) {
    let path = format!("/run/netns/{name}");
    if Path::new(&path).exists() {
        if let Ok(c) = std::ffi::CString::new(path.clone()) {
            // SAFETY: umount2 with a valid C string.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = fs::remove_file(&path);
    }
}

/// Deletes the [`Netns`]es of processes that are gone (killed before their drop or exit hook).
fn sweep_dead() {
    let Ok(entries) = fs::read_dir("/run/netns") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        // `<kind>-<pid>-<n>`: the pid is the second part from the end.
        let pid = rest.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            delete(&name);
        }
    }
}

/// Runs `f` on a fresh thread that has entered the network namespace at `netns` (a thread's
/// namespace is its own; the thread ends with `f`, so no pool thread is left inside).
pub(crate) fn in_netns<T: Send + 'static>(
    netns: &Path,
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let netns = netns.to_owned();
    std::thread::spawn(move || {
        enter_netns(&netns)?;
        f()
    })
    .join()
    .map_err(|_| io::Error::other("netns thread panicked"))?
}

/// [`in_netns`] without blocking the caller's runtime thread.
async fn in_netns_async<T: Send + 'static>(
    netns: &Path,
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let netns = netns.to_owned();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(in_netns(&netns, f));
    });
    rx.await
        .map_err(|_| io::Error::other("netns thread gone"))?
}

/// Moves the calling thread into the network namespace at `netns`.
pub(crate) fn enter_netns(netns: &Path) -> io::Result<()> {
    let file = fs::File::open(netns)?;
    // SAFETY: setns(2) on a valid fd; it affects only the calling thread.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A nonblocking connection to `addr` made from inside `netns`.
pub(crate) async fn connect_in(netns: &Path, addr: SocketAddr) -> io::Result<TcpStream> {
    in_netns_async(netns, move || {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_nonblocking(true)?;
        Ok(s)
    })
    .await
}

/// The no-uplink guard: fails unless a route lookup to every one of [`OUTSIDE`] fails in
/// `netns`.
pub(crate) fn check_no_uplink(netns: &Path) -> Result<()> {
    let routed = in_netns(netns, || {
        let mut routed = Vec::new();
        for ip in OUTSIDE {
            // A UDP connect only looks the route up; it sends nothing.
            let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
            if s.connect((*ip, 53)).is_ok() {
                routed.push(*ip);
            }
        }
        Ok(routed)
    })
    .context("route lookups in the namespace")?;
    if !routed.is_empty() {
        bail!(
            "NO-UPLINK GUARD: {} has a route to {routed:?}; nothing in it may reach any \
             network but its own",
            netns.display()
        );
    }
    Ok(())
}

pub(crate) fn run(program: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("run {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
