//! Child processes and scratch directories that never outlive the test process.
//!
//! * Every child is spawned from one long-lived thread (`harness-spawner`) with
//!   `PR_SET_PDEATHSIG = SIGKILL`. The death signal fires when the *thread* that
//!   forked the child exits, so forking from a test's own thread would kill a
//!   shared control plane as soon as the first test finished.
//! * Each child gets its own process group, so Ctrl-C in a terminal reaches only
//!   the harness (which then stops its children in order).
//! * [`Proc`]'s `Drop` stops the child (SIGTERM, SIGKILL after a grace period).
//!   Children still alive at `exit()` (e.g. a process-wide shared instance, which
//!   is never dropped) are SIGKILLed by an `atexit` hook; on abort or SIGKILL of
//!   the test process the kernel delivers the death signal.
//! * [`Scratch`] directories live under `$TMPDIR/proxy-operator-harness/` and
//!   are named after the owning PID: they are removed on drop, at exit, and—if
//!   the owner died without either—by the next harness user.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

/// Default time a child gets between SIGTERM and SIGKILL.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send>;
type Hook = Box<dyn FnMut() + Send>;

/// PIDs of live children (each also leads its own process group).
static LIVE: Mutex<Option<HashSet<u32>>> = Mutex::new(None);
/// Cleanups to run at `exit()`, keyed by registration id.
static EXIT_HOOKS: Mutex<BTreeMap<u64, Hook>> = Mutex::new(BTreeMap::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn spawner() -> &'static mpsc::Sender<Job> {
    static TX: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("harness-spawner".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .expect("start the harness-spawner thread");
        // SAFETY: registering a plain `extern "C" fn` with no captured state.
        unsafe { libc::atexit(cleanup_at_exit) };
        tx
    })
}

extern "C" fn cleanup_at_exit() {
    // try_lock: never block process exit on a lock another thread holds.
    if let Ok(mut live) = LIVE.try_lock()
        && let Some(pids) = live.take()
    {
        for pid in pids {
            kill_group(pid, libc::SIGKILL);
        }
    }
    let hooks = EXIT_HOOKS
        .try_lock()
        .map(|mut hooks| std::mem::take(&mut *hooks))
        .unwrap_or_default();
    for (_, mut hook) in hooks {
        hook();
    }
}

fn kill_group(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(-(pid as libc::pid_t), sig);
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Runs `hook` at process exit unless the returned guard is dropped first.
pub(crate) fn at_exit(hook: impl FnMut() + Send + 'static) -> ExitHook {
    spawner(); // make sure the atexit handler is installed
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    EXIT_HOOKS.lock().unwrap().insert(id, Box::new(hook));
    ExitHook(id)
}

/// Unregisters an [`at_exit`] hook when dropped (without running it).
#[derive(Debug)]
pub(crate) struct ExitHook(u64);

impl Drop for ExitHook {
    fn drop(&mut self) {
        EXIT_HOOKS.lock().unwrap().remove(&self.0);
    }
}

/// A child process started by the harness. Its stdout and stderr go to a log file.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
    exited: Option<ExitStatus>,
}

impl Proc {
    /// Spawns `cmd` (stdin from /dev/null, stdout+stderr appended to `log`) on the
    /// spawner thread with `PR_SET_PDEATHSIG = SIGKILL` and its own process group.
    pub fn spawn(name: &str, cmd: Command, log: &Path) -> Result<Proc> {
        let out = open_log(log)?;
        let err = out.try_clone()?;
        Proc::spawn_to(name, cmd, out, err, log)
    }

    /// [`Proc::spawn`] with stdout to a file of its own (created or truncated), for a program
    /// whose output is its result; stderr still goes to `log`.
    pub fn spawn_with_stdout(name: &str, cmd: Command, stdout: &Path, log: &Path) -> Result<Proc> {
        let out = File::create(stdout).with_context(|| format!("create {}", stdout.display()))?;
        Proc::spawn_to(name, cmd, out, open_log(log)?, log)
    }

    fn spawn_to(name: &str, mut cmd: Command, out: File, err: File, log: &Path) -> Result<Proc> {
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let parent = std::process::id();
        // SAFETY: the closure only calls async-signal-safe functions.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died before prctl took effect.
                if libc::getppid() as u32 != parent {
                    libc::_exit(1);
                }
                Ok(())
            })
        };
        let display = format!("{cmd:?}");
        let (tx, rx) = mpsc::channel();
        spawner()
            .send(Box::new(move || {
                let spawned = cmd.spawn();
                if let Ok(child) = &spawned {
                    LIVE.lock()
                        .unwrap()
                        .get_or_insert_with(HashSet::new)
                        .insert(child.id());
                }
                let _ = tx.send(spawned);
            }))
            .map_err(|_| anyhow!("harness-spawner thread is gone"))?;
        let child = rx
            .recv()
            .context("harness-spawner thread is gone")?
            .with_context(|| format!("start {name}: {display}"))?;
        tracing::debug!(name, pid = child.id(), log = %log.display(), "started");
        Ok(Proc {
            name: name.to_owned(),
            child,
            log: log.to_owned(),
            exited: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The exit status, if the process has exited (reaps it).
    pub fn try_exited(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.exited = Some(status);
            forget_live(self.child.id());
        }
        self.exited
    }

    /// Fails with the log tail if the process has exited.
    pub fn ensure_running(&mut self) -> Result<()> {
        match self.try_exited() {
            None => Ok(()),
            Some(status) => bail!(
                "{} exited ({status}); last lines of {}:\n{}",
                self.name,
                self.log.display(),
                self.log_tail(40)
            ),
        }
    }

    /// The last `lines` lines of the log file (at most 64 KiB are read).
    /// Waits until `url` answers 2xx (a readiness endpoint of this process); fails at once if
    /// the process exits, and after `timeout` with the last answer; either way with its log.
    pub async fn wait_http_ok(
        &mut self,
        http: &reqwest::Client,
        url: &str,
        timeout: Duration,
    ) -> Result<()> {
        let what = format!("{} at {url}", self.name);
        let waited = wait_for(&what, timeout, || {
            let exited = self.try_exited();
            let asked = http.get(url).send();
            async move {
                if let Some(status) = exited {
                    return Check::Failed(anyhow::anyhow!("exited ({status})"));
                }
                match asked.await {
                    Ok(r) if r.status().is_success() => Check::Ready(()),
                    Ok(r) => {
                        let status = r.status();
                        Check::NotYet(format!("{status}: {}", r.text().await.unwrap_or_default()))
                    }
                    Err(e) => Check::NotYet(e.to_string()),
                }
            }
        })
        .await;
        waited.map_err(|e| anyhow::anyhow!("{e:#}:\n{}", self.log_tail(40)))
    }

    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    pub fn signal(&self, sig: libc::c_int) {
        if self.exited.is_none() {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        }
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL. Blocks the calling thread.
    pub fn stop_blocking(&mut self, grace: Duration) -> ExitStatus {
        if let Some(status) = self.exited {
            return status;
        }
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + grace;
        let mut pause = Duration::from_millis(2);
        while Instant::now() < deadline {
            if let Some(status) = self.try_exited() {
                self.reap_group();
                return status;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
        self.kill()
    }

    /// Async variant of [`Proc::stop_blocking`]: polls without blocking the runtime.
    pub async fn stop(&mut self, grace: Duration) -> ExitStatus {
        if let Some(status) = self.exited {
            return status;
        }
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + grace;
        let mut pause = Duration::from_millis(2);
        while Instant::now() < deadline {
            if let Some(status) = self.try_exited() {
                self.reap_group();
                return status;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
        tracing::warn!(name = self.name, grace = ?grace, "did not stop on SIGTERM; SIGKILL");
        self.kill()
    }

    /// SIGKILL the process and its process group, and reap it.
    pub fn kill(&mut self) -> ExitStatus {
        if let Some(status) = self.exited {
            return status;
        }
        kill_group(self.child.id(), libc::SIGKILL);
        let status = self.child.wait().expect("wait for a SIGKILLed child");
        self.exited = Some(status);
        forget_live(self.child.id());
        status
    }

    /// Kills whatever is left in the child's process group (helpers it forked).
    fn reap_group(&self) {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL) };
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.exited.is_none() {
            self.stop_blocking(DEFAULT_GRACE);
        }
    }
}

fn open_log(log: &Path) -> Result<File> {
    File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("open log file {}", log.display()))
}

fn forget_live(pid: u32) {
    if let Some(live) = LIVE.lock().unwrap().as_mut() {
        live.remove(&pid);
    }
}

/// The last `lines` lines of a text file (at most 64 KiB are read).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(mut file) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut buf = Vec::new();
    let _ = file.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A scratch directory under `$TMPDIR/proxy-operator-harness/`, mode 0755 (the
/// fixtures drop privileges to `proxy` / `libvirt-qemu`, which must reach it).
/// Removed on drop and at process exit.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
    keep: bool,
    _exit: ExitHook,
}

impl Scratch {
    /// Creates `<root>/<kind>-<pid>-<n>`. Sweeps directories of dead owners first
    /// (once per process).
    pub fn new(kind: &str) -> Result<Scratch> {
        static SWEPT: OnceLock<()> = OnceLock::new();
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let root = scratch_root();
        fs::create_dir_all(&root).with_context(|| format!("create {}", root.display()))?;
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755))?;
        SWEPT.get_or_init(|| sweep_stale(&root));
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = root.join(format!("{kind}-{}-{n}", std::process::id()));
        if path.exists() {
            fs::remove_dir_all(&path)?;
        }
        fs::create_dir(&path).with_context(|| format!("create {}", path.display()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
        let for_hook = path.clone();
        let keep = std::env::var_os("PROXY_OPERATOR_KEEP_SCRATCH").is_some();
        let exit = at_exit(move || {
            if !keep {
                let _ = fs::remove_dir_all(&for_hook);
            }
        });
        Ok(Scratch {
            path,
            keep,
            _exit: exit,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `path/name`, creating it as a directory with `mode`.
    pub fn subdir(&self, name: &str, mode: u32) -> Result<PathBuf> {
        let p = self.path.join(name);
        fs::create_dir_all(&p).with_context(|| format!("create {}", p.display()))?;
        fs::set_permissions(&p, fs::Permissions::from_mode(mode))?;
        Ok(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("[harness] keeping {}", self.path.display());
        } else {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// `$TMPDIR/proxy-operator-harness`.
pub fn scratch_root() -> PathBuf {
    std::env::temp_dir().join("proxy-operator-harness")
}

/// Removes scratch directories whose owner PID is gone, running the registered
/// stale-directory cleaners (e.g. killing QEMU processes of a dead libvirtd) first.
fn sweep_stale(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = owner_pid(&name) else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let path = entry.path();
        crate::libvirtd::kill_stale_qemu(&path);
        crate::node::sweep_stale(&path);
        tracing::debug!(dir = %path.display(), "removing stale scratch directory");
        let _ = fs::remove_dir_all(&path);
    }
}

fn owner_pid(name: &OsStr) -> Option<u32> {
    let name = name.to_str()?;
    let mut parts = name.rsplitn(3, '-');
    let _n = parts.next()?;
    parts.next()?.parse().ok()
}

/// A free TCP port on 127.0.0.1 that no other harness process holds and the kernel never
/// hands out by itself.
///
/// The port is picked below the kernel's ephemeral range (`ip_local_port_range`): a port
/// found free by binding `:0` and released could be given by the kernel to the next `:0` bind
/// or outgoing connection anywhere on the machine before the server it was meant for binds it
/// (CI 2026-12-05: etcd lost its port to another suite's listener). Suites run side by side,
/// so each port is also claimed with a lock file (`flock`, released when this process exits).
/// The ports `make dev`'s VMs are published on ([`crate::stack::PORT_RANGE`]) are never given.
pub fn free_port() -> Result<u16> {
    static CLAIMED: Mutex<Vec<(u16, File)>> = Mutex::new(Vec::new());
    static RANGE: OnceLock<(u16, u16)> = OnceLock::new();
    let (low, high) = *RANGE.get_or_init(harness_port_range);
    let published = crate::stack::PORT_RANGE.0..=crate::stack::PORT_RANGE.1;
    let dir = scratch_root().join("ports");
    let mut claimed = CLAIMED.lock().unwrap_or_else(|e| e.into_inner());
    if claimed.is_empty() {
        fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let span = u32::from(high - low) + 1;
    // Processes start at different places so they seldom try the same ports first.
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    for step in 0..span {
        let port = low + ((start + step) % span) as u16;
        if published.contains(&port) || claimed.iter().any(|(p, _)| *p == port) {
            continue;
        }
        let path = dir.join(port.to_string());
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("open {}", path.display()))?;
        if lock.try_lock().is_err() {
            continue; // another harness process holds it
        }
        // Not in use by anything else now (a server of a process that died, another program).
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            claimed.push((port, lock));
            return Ok(port);
        }
    }
    bail!("no free loopback port in {low}-{high} (every port is held or in use)")
}

/// The kernel's ephemeral port range (`ip_local_port_range`): where it picks the port of a
/// `:0` bind or an outgoing connection.
fn ephemeral_port_range() -> Option<(u16, u16)> {
    let text = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut bounds = text.split_whitespace().map(|n| n.parse::<u16>().ok());
    Some((bounds.next()??, bounds.next()??))
}

/// The ports [`free_port`] hands out: 20000 up to just below the kernel's ephemeral range, or
/// above it when that leaves too few.
fn harness_port_range() -> (u16, u16) {
    const FIRST: u16 = 20_000;
    const ENOUGH: u16 = 2_000;
    match ephemeral_port_range().unwrap_or((32_768, 60_999)) {
        (low, _) if low >= FIRST + ENOUGH => (FIRST, low - 1),
        (_, high) if high <= u16::MAX - ENOUGH => (high + 1, u16::MAX),
        // The whole port space is ephemeral: the lock files still keep harness processes apart.
        _ => (FIRST, u16::MAX),
    }
}

/// What a readiness check found.
pub enum Check<T> {
    Ready(T),
    /// Not yet; the reason is reported if the deadline passes.
    NotYet(String),
    /// Give up now (e.g. the process exited).
    Failed(anyhow::Error),
}

/// Polls `check` (10 ms, growing to 200 ms between tries) until it is ready,
/// fails, or `timeout` passes.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Check<T>>,
{
    let start = Instant::now();
    let mut pause = Duration::from_millis(10);
    loop {
        let reason = match check().await {
            Check::Ready(v) => {
                tracing::debug!(what, elapsed = ?start.elapsed(), "ready");
                return Ok(v);
            }
            Check::Failed(e) => return Err(e.context(format!("waiting for {what}"))),
            Check::NotYet(reason) => reason,
        };
        if start.elapsed() >= timeout {
            bail!("{what}: not ready after {timeout:?}: {reason}");
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// Runs a command to completion and returns its stdout; fails with stderr on a
/// non-zero exit.
pub async fn run_output(cmd: &mut tokio::process::Command) -> Result<String> {
    let display = format!("{:?}", cmd.as_std());
    let out = cmd
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("run {display}"))?;
    if !out.status.success() {
        bail!(
            "{display} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("{display}: stdout is not UTF-8"))
}

/// A loopback TCP relay to `target` that holds every chunk for `delay` before passing it on,
/// both ways: a slow link. Runs on the current tokio runtime until it ends.
pub async fn delaying_relay(
    target: std::net::SocketAddr,
    delay: Duration,
) -> Result<std::net::SocketAddr> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .context("bind the delaying relay")?;
    let addr = listener.local_addr()?;
    async fn slow_copy(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        delay: Duration,
    ) {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0 {
                break;
            }
            tokio::time::sleep(delay).await;
            if to.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    }
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(target).await else {
                    return;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::join!(
                    slow_copy(client_read, server_write, delay),
                    slow_copy(server_read, client_write, delay)
                );
            });
        }
    });
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_parses_scratch_names() {
        assert_eq!(owner_pid(OsStr::new("squid-1234-0")), Some(1234));
        assert_eq!(owner_pid(OsStr::new("control-plane-77-12")), Some(77));
        assert_eq!(owner_pid(OsStr::new("junk")), None);
    }

    #[test]
    fn free_ports_are_outside_the_ephemeral_range_and_claimed_against_other_processes() {
        let (ephemeral_low, ephemeral_high) = ephemeral_port_range().unwrap();
        let ports: Vec<u16> = (0..50).map(|_| free_port().unwrap()).collect();
        let distinct: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            ports.len(),
            "a port handed out twice: {ports:?}"
        );
        for port in &ports {
            assert!(
                !(ephemeral_low..=ephemeral_high).contains(port),
                "{port} is in the kernel's ephemeral range {ephemeral_low}-{ephemeral_high}"
            );
            assert!(!(crate::stack::PORT_RANGE.0..=crate::stack::PORT_RANGE.1).contains(port));
            // Free now: its server can bind it.
            std::net::TcpListener::bind(("127.0.0.1", *port)).unwrap();
            // Another open of the claim (as another process would) cannot take it.
            let claim = File::open(scratch_root().join("ports").join(port.to_string())).unwrap();
            assert!(claim.try_lock().is_err(), "{port}'s claim is not held");
        }
    }
}
