//! A private libvirtd + virtlogd (Debian, QEMU in TCG mode) per instance.
//!
//! libvirtd running as root keeps its state in fixed system paths
//! (`/run/libvirt`, `/var/lib/libvirt`, `/etc/libvirt`, `/var/log/libvirt`).
//! To run several private instances side by side (and never touch the
//! machine's own), both daemons start in a private mount namespace in which
//! those four directories are bind mounts of directories in the instance's
//! scratch directory. The client socket goes to `<scratch>/sock/libvirt-sock`,
//! outside the bind mounts, so virsh and the `virt` crate reach it with
//! `qemu+unix:///system?socket=<path>`. `/var/cache/libvirt` (the QEMU
//! capability cache) is shared with the machine: only the very first start
//! pays the ~9 s QEMU probe.
//!
//! Needs root (mount namespaces, QEMU runs as `libvirt-qemu`).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::bins::debian_binary;
use crate::guard::EgressGuard;
use crate::process::{Check, ExitHook, Proc, Scratch, at_exit, run_output, wait_for};

const START_TIMEOUT: Duration = Duration::from_secs(120);
const VIRSH: &str = "/usr/bin/virsh";
/// libvirtd once took 30 s to stop on SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The system directories a private instance replaces (target, scratch subdirectory).
const PRIVATE_DIRS: [(&str, &str); 4] = [
    ("/run/libvirt", "run"),
    ("/var/lib/libvirt", "lib"),
    ("/etc/libvirt", "etc"),
    ("/var/log/libvirt", "log"),
];

/// A private libvirtd with a `dir` storage pool (`harness`) under its scratch
/// directory. QEMU guests must be `type='qemu'` (TCG): `/dev/kvm` does not work
/// here. Stopped on drop (guests are killed first).
pub struct Libvirtd {
    /// Held for as long as guests may run in the machine's network namespace.
    _guard: Option<std::sync::Arc<EgressGuard>>,
    libvirtd: Option<Proc>,
    virtlogd: Option<Proc>,
    socket: PathBuf,
    pool_name: String,
    pool_path: PathBuf,
    _qemu_cleanup: ExitHook,
    scratch: Scratch,
}

impl Libvirtd {
    /// Starts virtlogd and libvirtd, waits until libvirtd answers, and defines
    /// and starts the `harness` pool. ~1 s warm (the first start on a machine
    /// also probes QEMU, ~9 s).
    pub async fn start() -> Result<Libvirtd> {
        Self::start_with(None).await
    }

    /// Like [`Libvirtd::start`], but in the machine's network namespace, for guests on user-mode
    /// networks (passt needs an interface with a route to copy, which the private namespace
    /// lacks). `guard` rejects everything the guests' processes send off loopback; it is checked
    /// before libvirtd starts and held as long as this instance lives.
    pub async fn start_in_host_network(guard: std::sync::Arc<EgressGuard>) -> Result<Libvirtd> {
        guard.check()?;
        debian_binary("/usr/bin/passt", "passt");
        Self::start_with(Some(guard)).await
    }

    async fn start_with(guard: Option<std::sync::Arc<EgressGuard>>) -> Result<Libvirtd> {
        let private_network = guard.is_none();
        let libvirtd_bin = debian_binary("/usr/sbin/libvirtd", "libvirt-daemon");
        let virtlogd_bin = debian_binary("/usr/sbin/virtlogd", "libvirt-daemon-log");
        debian_binary("/usr/bin/virsh", "libvirt-clients");
        debian_binary("/usr/bin/qemu-system-x86_64", "qemu-system-x86");
        if unsafe { libc::geteuid() } != 0 {
            bail!("Libvirtd needs root (private mount namespace, QEMU as libvirt-qemu)");
        }

        let scratch = Scratch::new("libvirtd")?;
        let dir = scratch.path().to_owned();
        for (_, sub) in PRIVATE_DIRS {
            scratch.subdir(sub, 0o755)?;
        }
        let (qemu_uid, qemu_gid) = crate::squid::user_ids("libvirt-qemu")
            .context("look up user libvirt-qemu (Debian package libvirt-daemon-system)")?;
        let lib_qemu = scratch.subdir("lib/qemu", 0o750)?;
        std::os::unix::fs::chown(&lib_qemu, Some(qemu_uid), Some(qemu_gid))?;
        scratch.subdir("lib/images", 0o711)?;
        scratch.subdir("lib/boot", 0o711)?;
        scratch.subdir("log/qemu", 0o755)?;
        for sub in [
            "etc/qemu",
            "etc/storage",
            "etc/hooks",
            "etc/nwfilter",
            "etc/secrets",
        ] {
            scratch.subdir(sub, 0o755)?;
        }
        // The machine's daemon configuration (qemu.conf, virtlogd.conf, ...),
        // without its domains, networks and pools.
        for entry in std::fs::read_dir("/etc/libvirt").context("read /etc/libvirt")? {
            let entry = entry?;
            if entry.file_type()?.is_file() && entry.path().extension() == Some("conf".as_ref()) {
                let to = dir.join("etc").join(entry.file_name());
                std::fs::copy(entry.path(), &to)
                    .with_context(|| format!("copy {}", entry.path().display()))?;
            }
        }
        let sock_dir = scratch.subdir("sock", 0o755)?;
        let conf = dir.join("etc/libvirtd.conf");
        std::fs::write(
            &conf,
            format!(
                "# proxy-operator test harness: private instance
unix_sock_dir = \"{}\"
unix_sock_group = \"root\"
unix_sock_ro_perms = \"0777\"
unix_sock_rw_perms = \"0770\"
auth_unix_ro = \"none\"
auth_unix_rw = \"none\"
",
                sock_dir.display()
            ),
        )?;
        let mut binds = Vec::new();
        for (target, sub) in PRIVATE_DIRS {
            std::fs::create_dir_all(target).with_context(|| format!("create {target}"))?;
            binds.push((cstring(&dir.join(sub))?, cstring(Path::new(target))?));
        }

        let run = dir.join("run");
        let qemu_run = run.join("qemu");
        let qemu_cleanup = at_exit(move || kill_qemu(&qemu_run));

        let mut cmd = Command::new(virtlogd_bin);
        cmd.arg("--pid-file").arg(run.join("virtlogd.pid"));
        private_mounts(&mut cmd, binds.clone(), private_network);
        let mut virtlogd = Proc::spawn("virtlogd", cmd, &dir.join("virtlogd.log"))?;
        let virtlogd_sock = run.join("virtlogd-sock");
        wait_for("virtlogd socket", START_TIMEOUT, || {
            let exited = virtlogd.ensure_running().err();
            let ready = virtlogd_sock.exists();
            async move {
                match (exited, ready) {
                    (Some(e), _) => Check::Failed(e),
                    (None, true) => Check::Ready(()),
                    (None, false) => Check::NotYet("no virtlogd-sock yet".into()),
                }
            }
        })
        .await?;

        let mut cmd = Command::new(libvirtd_bin);
        cmd.arg("-f")
            .arg(&conf)
            .arg("--pid-file")
            .arg(run.join("libvirtd.pid"));
        private_mounts(&mut cmd, binds, private_network);
        let libvirtd = Proc::spawn("libvirtd", cmd, &dir.join("libvirtd.log"))?;

        let mut lv = Libvirtd {
            _guard: guard,
            libvirtd: Some(libvirtd),
            virtlogd: Some(virtlogd),
            socket: sock_dir.join("libvirt-sock"),
            pool_name: "harness".into(),
            pool_path: scratch.subdir("pool", 0o755)?,
            _qemu_cleanup: qemu_cleanup,
            scratch,
        };
        let uri = lv.uri();
        let socket = lv.socket.clone();
        let libvirtd = lv.libvirtd.as_mut().unwrap();
        wait_for("libvirtd answering", START_TIMEOUT, || {
            let exited = libvirtd.ensure_running().err();
            let has_socket = socket.exists();
            let uri = uri.clone();
            async move {
                if let Some(e) = exited {
                    return Check::Failed(e);
                }
                if !has_socket {
                    return Check::NotYet("no libvirt-sock yet".into());
                }
                match run_output(tokio::process::Command::new(VIRSH).args(["-c", &uri, "version"]))
                    .await
                {
                    Ok(_) => Check::Ready(()),
                    Err(e) => Check::NotYet(format!("{e:#}")),
                }
            }
        })
        .await?;

        let path = lv.pool_path.display().to_string();
        let name = lv.pool_name.clone();
        lv.virsh_run(&["pool-define-as", &name, "dir", "--target", &path])
            .await?;
        lv.virsh_run(&["pool-start", &name]).await?;
        Ok(lv)
    }

    /// `qemu+unix:///system?socket=<socket>`: for virsh and the `virt` crate.
    pub fn uri(&self) -> String {
        format!("qemu+unix:///system?socket={}", self.socket.display())
    }

    /// The libvirtd client socket (read-write).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Name of the `dir` pool made at start (`harness`).
    pub fn pool_name(&self) -> &str {
        &self.pool_name
    }

    /// Target directory of the pool.
    pub fn pool_path(&self) -> &Path {
        &self.pool_path
    }

    /// The scratch directory (logs: `libvirtd.log`, `virtlogd.log`, `log/qemu/`).
    pub fn dir(&self) -> &Path {
        self.scratch.path()
    }

    /// Defines and starts another `dir` pool under the scratch directory.
    pub async fn define_pool(&self, name: &str) -> Result<PathBuf> {
        let path = self.scratch.subdir(&format!("pool-{name}"), 0o755)?;
        let target = path.display().to_string();
        self.virsh_run(&["pool-define-as", name, "dir", "--target", &target])
            .await?;
        self.virsh_run(&["pool-start", name]).await?;
        Ok(path)
    }

    /// Defines and starts a libvirt network `name`: a bridge without addresses, DHCP or NAT. It
    /// exists only in libvirtd's private network namespace, so guests on it reach nothing.
    pub async fn define_isolated_network(&self, name: &str) -> Result<()> {
        let xml_path = self.scratch.path().join(format!("net-{name}.xml"));
        // Bridge names are at most 15 bytes; the namespace is private, so no clash is possible.
        std::fs::write(
            &xml_path,
            format!(
                "<network><name>{name}</name><bridge name='pxbr-{}'/></network>",
                &name[..name.len().min(9)]
            ),
        )?;
        let xml = xml_path.display().to_string();
        self.virsh_run(&["net-define", &xml]).await?;
        self.virsh_run(&["net-start", name]).await?;
        Ok(())
    }

    /// `virsh -c <uri>` ready for arguments.
    pub fn virsh(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(VIRSH);
        cmd.arg("-c").arg(self.uri());
        cmd
    }

    /// Runs virsh with `args`; returns stdout, or an error carrying stderr.
    pub async fn virsh_run(&self, args: &[&str]) -> Result<String> {
        run_output(self.virsh().args(args)).await
    }

    pub fn libvirtd_pid(&self) -> Option<u32> {
        self.libvirtd.as_ref().map(Proc::pid)
    }
}

impl Drop for Libvirtd {
    fn drop(&mut self) {
        kill_qemu(&self.scratch.path().join("run/qemu"));
        if let Some(mut p) = self.libvirtd.take() {
            p.stop_blocking(STOP_GRACE);
        }
        if let Some(mut p) = self.virtlogd.take() {
            p.stop_blocking(STOP_GRACE);
        }
    }
}

/// Runs the command in a new mount namespace (and, with `private_network`, a new network
/// namespace) with `binds` (source, target) bind-mounted.
fn private_mounts(cmd: &mut Command, binds: Vec<(CString, CString)>, private_network: bool) {
    // SAFETY: only async-signal-safe syscalls on data prepared before fork.
    unsafe {
        cmd.pre_exec(move || {
            // A network namespace of its own too: guests and libvirt networks can reach nothing
            // but each other, whatever a test VM tries to send.
            let flags = if private_network {
                libc::CLONE_NEWNS | libc::CLONE_NEWNET
            } else {
                libc::CLONE_NEWNS
            };
            if libc::unshare(flags) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            for (src, dst) in &binds {
                if libc::mount(
                    src.as_ptr(),
                    dst.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        })
    };
}

fn cstring(p: &Path) -> Result<CString> {
    Ok(CString::new(p.as_os_str().as_bytes())?)
}

/// SIGKILLs the QEMU processes whose pid files are in `qemu_run_dir`
/// (libvirtd's `/run/libvirt/qemu`). QEMU outlives libvirtd otherwise.
fn kill_qemu(qemu_run_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(qemu_run_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension() != Some("pid".as_ref()) {
            continue;
        }
        let Some(pid) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains("qemu") {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Called for stale scratch directories of dead harness processes.
pub(crate) fn kill_stale_qemu(scratch_dir: &Path) {
    kill_qemu(&scratch_dir.join("run/qemu"));
}
