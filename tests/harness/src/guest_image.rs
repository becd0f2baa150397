//! The proxy VM guest image: Debian bookworm with cloud-init (NoCloud), squid in Debian's
//! default configuration and qemu-guest-agent, built from Debian packages only by
//! `tests/fixtures/guest-image/build.sh` into the fixture cache:
//!
//! ```text
//! <cache root>/guest-image-<first 16 hex of sha256(build.sh)>/
//!   root.qcow2  vmlinuz  initrd.img  SHA256SUMS  packages.txt
//! ```
//!
//! The script is the image's only input from the repository, so its hash is the cache key:
//! [`BUILD_SCRIPT`] embeds it and [`guest_image_key`] hashes those exact bytes as the script
//! hashes itself (`sha256sum < build.sh`); a unit test runs `build.sh --print-dir` and compares.
//!
//! How to boot it (seen working under TCG, see `shared/fixtures.md`): direct kernel boot with
//! [`KERNEL_CMDLINE`], `root.qcow2` (or an overlay on it) as the first virtio disk, a NoCloud
//! seed (volume id `cidata`) as another disk, `<features><acpi/>…</features>`. squid starts
//! after cloud-init, so the squid.conf that user-data or vendor-data writes is the one it
//! reads; give it `visible_hostname proxyvm` and `dns_nameservers 127.0.0.1` or it stalls on DNS.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use crate::bins::fixtures_cache_root;

/// `tests/fixtures/guest-image/build.sh`, compiled in: the cache key always matches the
/// script this harness was built with.
pub const BUILD_SCRIPT: &[u8] = include_bytes!("../../fixtures/guest-image/build.sh");

/// The kernel command line for direct kernel boot: the root file system is the whole first
/// virtio disk, the console is the serial port, the NIC is `eth0` (ifupdown + DHCP).
pub const KERNEL_CMDLINE: &str = "root=/dev/vda rw console=ttyS0 net.ifnames=0";

/// The guest's host name (`/etc/hostname`, `127.0.1.1` in `/etc/hosts`).
pub const HOSTNAME: &str = "proxyvm";

/// The built image: paths and the digests `SHA256SUMS` records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestImage {
    /// The cache directory holding the files.
    pub dir: PathBuf,
    /// `root.qcow2`: ext4 without a partition table (`root=/dev/vda`), zstd-compressed.
    pub root: PathBuf,
    /// `vmlinuz` (Debian's linux-image-cloud-amd64).
    pub kernel: PathBuf,
    /// `initrd.img` (initramfs-tools, with the virtio modules).
    pub initrd: PathBuf,
    /// Hex sha256 of `root.qcow2`.
    pub root_sha256: String,
    /// Hex sha256 of `vmlinuz`.
    pub kernel_sha256: String,
    /// Hex sha256 of `initrd.img`.
    pub initrd_sha256: String,
}

/// The cache key: the first 16 hex digits of sha256(build.sh).
pub fn guest_image_key() -> String {
    hex::encode(Sha256::digest(BUILD_SCRIPT))[..16].to_owned()
}

/// `<cache root>/guest-image-<key>`, where `build.sh` puts the image.
pub fn guest_image_dir() -> PathBuf {
    fixtures_cache_root().join(format!("guest-image-{}", guest_image_key()))
}

/// The guest image from the fixture cache.
///
/// # Panics
/// If it has not been built, naming the command that builds it.
pub fn guest_image() -> GuestImage {
    let dir = guest_image_dir();
    match GuestImage::load(&dir) {
        Ok(image) => image,
        Err(e) => panic!(
            "test fixture `guest image` not found at {}: {e:#}; build it (~4 min, cached \
             afterwards; needs root and the Debian mirror of the apt sources) with \
             `tests/fixtures/guest-image/build.sh` or `.ci/install-fixtures.sh`",
            dir.display()
        ),
    }
}

impl GuestImage {
    /// Reads `dir/SHA256SUMS` and checks that the three files exist.
    pub fn load(dir: &Path) -> Result<GuestImage> {
        let sums_path = dir.join("SHA256SUMS");
        let sums = std::fs::read_to_string(&sums_path)
            .with_context(|| format!("read {}", sums_path.display()))?;
        let digest = |name: &str| -> Result<(PathBuf, String)> {
            let sha = sums
                .lines()
                .find_map(|line| {
                    let (sha, file) = line.split_once("  ")?;
                    (file == name).then_some(sha)
                })
                .with_context(|| format!("{} lists no {name}", sums_path.display()))?;
            if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
                bail!("{}: bad digest for {name}: {sha}", sums_path.display());
            }
            let path = dir.join(name);
            if !path.is_file() {
                bail!("{} is missing", path.display());
            }
            Ok((path, sha.to_ascii_lowercase()))
        };
        let (root, root_sha256) = digest("root.qcow2")?;
        let (kernel, kernel_sha256) = digest("vmlinuz")?;
        let (initrd, initrd_sha256) = digest("initrd.img")?;
        Ok(GuestImage {
            dir: dir.to_owned(),
            root,
            kernel,
            initrd,
            root_sha256,
            kernel_sha256,
            initrd_sha256,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/guest-image/build.sh"
    );

    fn print_dir(fixtures: Option<&str>) -> String {
        let mut cmd = std::process::Command::new("bash");
        cmd.arg(SCRIPT).arg("--print-dir");
        if let Some(root) = fixtures {
            cmd.env(crate::bins::FIXTURES_ENV, root);
        }
        let out = cmd.output().expect("run build.sh --print-dir");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim_end().to_owned()
    }

    #[test]
    fn the_script_computes_the_same_directory() {
        // The script hashes the file on disk, the harness the bytes compiled in.
        assert_eq!(BUILD_SCRIPT, std::fs::read(SCRIPT).unwrap().as_slice());
        assert_eq!(
            print_dir(None),
            guest_image_dir().display().to_string(),
            "build.sh --print-dir and guest_image_dir() disagree"
        );
        assert_eq!(
            print_dir(Some("/nonexistent/fixtures")),
            format!("/nonexistent/fixtures/guest-image-{}", guest_image_key())
        );
    }

    #[test]
    fn key_is_16_hex_digits() {
        let key = guest_image_key();
        assert_eq!(key.len(), 16);
        assert!(key.chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn load_reads_sha256sums_and_names_what_is_missing() {
        let dir = std::env::temp_dir().join(format!("guest-image-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b, c) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));
        std::fs::write(
            dir.join("SHA256SUMS"),
            format!("{a}  root.qcow2\n{b}  vmlinuz\n{c}  initrd.img\n"),
        )
        .unwrap();
        for f in ["root.qcow2", "vmlinuz"] {
            std::fs::write(dir.join(f), "x").unwrap();
        }
        let err = GuestImage::load(&dir).unwrap_err().to_string();
        assert!(err.contains("initrd.img is missing"), "{err}");
        std::fs::write(dir.join("initrd.img"), "x").unwrap();
        let image = GuestImage::load(&dir).unwrap();
        assert_eq!(image.root, dir.join("root.qcow2"));
        assert_eq!(
            (image.root_sha256, image.kernel_sha256, image.initrd_sha256),
            (a, b, c)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
