//! A small disk image a VM really boots from under TCG, to prove that a provider's own domain XML
//! starts a guest: a FAT file system (no partition table) with SYSLINUX in its boot sector,
//! Debian's kernel and an initramfs whose `/init` (busybox) prints a line on the serial console
//! and powers the machine off. SeaBIOS boots it from the virtio disk in ~10 s; the domain then
//! shuts off, which is what a test waits for. A guest that fails to boot panics and, with
//! `panic=-1`, reboots: it never shuts off.
//!
//! Built from Debian's `busybox-static`, `syslinux`, `mtools`, `dosfstools` and the kernel that
//! `.ci/install-fixtures.sh` keeps in the fixture cache.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::bins::{debian_binary, fixtures_cache_root};
use crate::process::run_output;

/// What the guest prints on its serial console once `/init` runs.
pub const BOOTED_MESSAGE: &str = "proxy-operator test guest: booted";

/// Size of the FAT image in KiB: the kernel (~8 MiB) and initramfs (~2 MiB) with room to spare.
const DISK_KIB: &str = "32768";

/// Debian's kernel, as `.ci/install-fixtures.sh` extracts it.
pub fn guest_kernel() -> Result<PathBuf> {
    let path = fixtures_cache_root().join("guest-kernel/vmlinuz");
    if !path.is_file() {
        bail!(
            "test fixture {} not found: `.ci/install-fixtures.sh` downloads Debian's kernel there",
            path.display()
        );
    }
    Ok(path)
}

/// Builds the disk in `dir` and returns its path (`dir/boot.img`, raw).
pub async fn build(dir: &Path) -> Result<PathBuf> {
    let kernel = guest_kernel()?;
    let busybox = debian_binary("/bin/busybox", "busybox-static");
    let bsdtar = debian_binary("/usr/bin/bsdtar", "libarchive-tools");
    let mkfs = debian_binary("/usr/sbin/mkfs.fat", "dosfstools");
    let mcopy = debian_binary("/usr/bin/mcopy", "mtools");
    let syslinux = debian_binary("/usr/bin/syslinux", "syslinux");

    let root = dir.join("initramfs");
    for sub in ["bin", "proc", "dev"] {
        std::fs::create_dir_all(root.join(sub))?;
    }
    std::fs::copy(&busybox, root.join("bin/busybox")).context("copy busybox")?;
    let init = root.join("init");
    std::fs::write(
        &init,
        format!(
            "#!/bin/busybox sh\n\
             /bin/busybox mount -t devtmpfs dev /dev\n\
             exec >/dev/console 2>&1\n\
             /bin/busybox echo '{BOOTED_MESSAGE}'\n\
             /bin/busybox poweroff -f\n"
        ),
    )?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755))?;
    // The kernel unpacks an uncompressed newc cpio as well as a compressed one.
    let initrd = dir.join("initrd");
    run_output(
        tokio::process::Command::new(&bsdtar)
            .args(["--format", "newc", "-cf"])
            .arg(&initrd)
            .arg("-C")
            .arg(&root)
            .arg("."),
    )
    .await?;

    let config = dir.join("syslinux.cfg");
    std::fs::write(
        &config,
        "DEFAULT linux\nPROMPT 0\nTIMEOUT 0\nLABEL linux\n  KERNEL vmlinuz\n  APPEND initrd=initrd console=ttyS0 panic=-1 quiet\n",
    )?;
    let image = dir.join("boot.img");
    let _ = std::fs::remove_file(&image);
    run_output(
        tokio::process::Command::new(&mkfs)
            .arg("-C")
            .arg(&image)
            .arg(DISK_KIB),
    )
    .await?;
    let staged_kernel = dir.join("vmlinuz");
    std::fs::copy(&kernel, &staged_kernel)?;
    run_output(
        tokio::process::Command::new(&mcopy)
            .arg("-i")
            .arg(&image)
            .arg(&staged_kernel)
            .arg(&initrd)
            .arg(&config)
            .arg("::"),
    )
    .await?;
    run_output(
        tokio::process::Command::new(&syslinux)
            .arg("--install")
            .arg(&image),
    )
    .await?;
    Ok(image)
}
