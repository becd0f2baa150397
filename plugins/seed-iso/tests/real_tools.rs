//! The seed ISO checked with real readers: isoinfo (Debian `genisoimage`), bsdtar (Debian
//! `libarchive-tools`), xorriso (Debian `xorriso`; libisofs, a strict SUSP/Rock Ridge parser,
//! run with warnings fatal) and blkid (util-linux, what cloud-init's NoCloud uses to find
//! `cidata`).
//! A missing tool fails the test with the command that installs it; nothing is skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

use seed_iso::{SeedError, build};

const INSTALL: &str = "apt-get install -y genisoimage libarchive-tools xorriso util-linux";

fn tool(name: &str, package: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin"] {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "`{name}` is not installed; it comes with the Debian package `{package}`: run `{INSTALL}`"
    );
}

fn run(cmd: &mut Command) -> Vec<u8> {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).expect("tool output is UTF-8")
}

/// A scratch file that removes itself.
struct Scratch(PathBuf);

impl Scratch {
    fn write(tag: &str, bytes: &[u8]) -> Scratch {
        let p =
            std::env::temp_dir().join(format!("seed-iso-test-{}-{tag}.iso", std::process::id()));
        std::fs::write(&p, bytes).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A scratch directory that removes itself.
struct ScratchDir(PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn user_data() -> Vec<u8> {
    // 5000 bytes (three sectors), every byte value, invalid UTF-8 included.
    let mut v = b"#cloud-config\n# \xff\xfe not UTF-8 \xc3\x28\r\n".to_vec();
    let mut x = 0x1234_5678u32;
    while v.len() < 5000 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        v.push((x >> 24) as u8);
    }
    v
}

const META_DATA: &[u8] = b"instance-id: proxy-abc123\nlocal-hostname: proxy-abc123\n";
const VENDOR_DATA: &[u8] =
    b"#!/bin/sh\nset -eu\napt-get install -y qemu-guest-agent\nsystemctl enable --now qemu-guest-agent\n";

fn seed() -> (Vec<u8>, Vec<(&'static str, Vec<u8>)>) {
    let files = vec![
        ("user-data", user_data()),
        ("meta-data", META_DATA.to_vec()),
        ("vendor-data", VENDOR_DATA.to_vec()),
        ("network-config", Vec::new()),
    ];
    let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, d)| (*n, d.as_slice())).collect();
    (build(&refs, "cidata").unwrap(), files)
}

#[test]
fn isoinfo_sees_cidata_with_rock_ridge_and_joliet() {
    let isoinfo = tool("isoinfo", "genisoimage");
    let (iso, _) = seed();
    assert_eq!(iso.len() % 2048, 0);
    let f = Scratch::write("d", &iso);
    let d = text(run(Command::new(&isoinfo).arg("-d").arg("-i").arg(&f.0)));
    assert!(d.contains("Volume id: cidata\n"), "{d}");
    assert!(d.contains("Logical block size is: 2048"), "{d}");
    assert!(
        d.contains(&format!("Volume size is: {}", iso.len() / 2048)),
        "{d}"
    );
    assert!(d.contains("Rock Ridge signatures version 1 found"), "{d}");
    assert!(d.contains("Joliet with UCS level 3 found"), "{d}");
}

#[test]
fn isoinfo_lists_exact_names_in_rock_ridge_and_joliet() {
    let isoinfo = tool("isoinfo", "genisoimage");
    let (iso, files) = seed();
    let f = Scratch::write("l", &iso);
    for (mode, expect_perms) in [("-R", true), ("-J", false)] {
        let l = text(run(Command::new(&isoinfo)
            .args([mode, "-l", "-i"])
            .arg(&f.0)));
        for (name, data) in &files {
            let line = l
                .lines()
                .find(|line| {
                    line.ends_with(&format!(" {name} ")) || line.ends_with(&format!(" {name}"))
                })
                .unwrap_or_else(|| panic!("{mode}: no entry {name:?} in\n{l}"));
            assert!(
                line.contains(&format!(" {} ", data.len())),
                "{mode}: size of {name}: {line}"
            );
            if expect_perms {
                assert!(
                    line.starts_with("-rw-r--r--"),
                    "{mode}: mode of {name}: {line}"
                );
            }
        }
        if expect_perms {
            assert!(l.contains("dr-xr-xr-x") || l.contains("drwxr-xr-x"), "{l}");
        }
    }
    // The plain ISO 9660 names are the level-2 mapping.
    let plain = text(run(Command::new(&isoinfo).args(["-l", "-i"]).arg(&f.0)));
    for id in [
        "USER_DATA.;1",
        "META_DATA.;1",
        "VENDOR_DATA.;1",
        "NETWORK_CONFIG.;1",
    ] {
        assert!(plain.contains(id), "{id} in\n{plain}");
    }
}

#[test]
fn isoinfo_extracts_every_file_byte_for_byte() {
    let isoinfo = tool("isoinfo", "genisoimage");
    let (iso, files) = seed();
    let f = Scratch::write("x", &iso);
    for mode in ["-R", "-J"] {
        for (name, data) in &files {
            let got = run(Command::new(&isoinfo)
                .args([mode, "-i"])
                .arg(&f.0)
                .args(["-x", &format!("/{name}")]));
            assert!(
                got == *data,
                "{mode} /{name}: {} bytes back, {} put in",
                got.len(),
                data.len()
            );
        }
    }
}

#[test]
fn bsdtar_lists_and_extracts_byte_for_byte() {
    let bsdtar = tool("bsdtar", "libarchive-tools");
    let (iso, files) = seed();
    let f = Scratch::write("t", &iso);
    let list = text(run(Command::new(&bsdtar).arg("-tf").arg(&f.0)));
    let mut names: Vec<&str> = list.lines().filter(|l| *l != ".").collect();
    names.sort();
    let mut want: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
    want.sort();
    assert_eq!(names, want, "bsdtar -t:\n{list}");
    let verbose = text(run(Command::new(&bsdtar).arg("-tvf").arg(&f.0)));
    for line in verbose.lines().filter(|l| !l.ends_with(" .")) {
        assert!(line.starts_with("-rw-r--r--"), "{line}");
    }
    for (name, data) in &files {
        let got = run(Command::new(&bsdtar).arg("-xOf").arg(&f.0).arg(name));
        assert!(
            got == *data,
            "{name}: {} bytes back, {} put in",
            got.len(),
            data.len()
        );
    }
}

#[test]
fn xorriso_extracts_the_tree_without_warnings() {
    use std::os::unix::fs::PermissionsExt;
    let xorriso = tool("xorriso", "xorriso");
    let (iso, files) = seed();
    let f = Scratch::write("xorriso", &iso);
    let dir = std::env::temp_dir().join(format!("seed-iso-test-{}-xorriso", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let _cleanup = ScratchDir(dir.clone());
    let out = Command::new(&xorriso)
        .args([
            "-report_about",
            "WARNING",
            "-abort_on",
            "WARNING",
            "-osirrox",
            "on",
            "-indev",
        ])
        .arg(&f.0)
        .args(["-extract", "/"])
        .arg(&dir)
        .output()
        .expect("running xorriso");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "xorriso failed ({}): {stderr}",
        out.status
    );
    for word in ["WARNING", "SORRY", "FAILURE", "FATAL"] {
        assert!(!stderr.contains(word), "xorriso complained: {stderr}");
    }
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut want: Vec<String> = files.iter().map(|(n, _)| n.to_string()).collect();
    want.sort();
    assert_eq!(names, want);
    for (name, data) in &files {
        let p = dir.join(name);
        assert!(std::fs::read(&p).unwrap() == *data, "{name} differs");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o644, "{name} mode");
    }
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o755, "root directory mode");
}

#[test]
fn blkid_reports_the_cidata_label() {
    let blkid = tool("blkid", "util-linux");
    let (iso, _) = seed();
    let f = Scratch::write("b", &iso);
    let out = text(run(Command::new(&blkid)
        .args(["-p", "-o", "export"])
        .arg(&f.0)));
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.contains(&"LABEL=cidata"), "{out}");
    assert!(lines.contains(&"TYPE=iso9660"), "{out}");
    // The default output, as an operator would read it.
    let plain = text(run(Command::new(&blkid).arg("-p").arg(&f.0)));
    assert!(
        plain.contains(r#"LABEL="cidata""#) && plain.contains(r#"TYPE="iso9660""#),
        "{plain}"
    );
}

#[test]
fn many_files_spill_the_directories_over_several_sectors() {
    let isoinfo = tool("isoinfo", "genisoimage");
    let names: Vec<String> = (0..60)
        .map(|i| format!("file-{i:02}-with-a-rather-long-name-for-the-directory"))
        .collect();
    let datas: Vec<Vec<u8>> = (0..60).map(|i| vec![i as u8; i * 37]).collect();
    let files: Vec<(&str, &[u8])> = names
        .iter()
        .zip(&datas)
        .map(|(n, d)| (n.as_str(), d.as_slice()))
        .collect();
    let iso = build(&files, "cidata").unwrap();
    let f = Scratch::write("many", &iso);
    let l = text(run(Command::new(&isoinfo)
        .args(["-R", "-l", "-i"])
        .arg(&f.0)));
    for n in &names {
        assert!(l.contains(&format!(" {n}")), "{n} in\n{l}");
    }
    for (i, (n, d)) in files.iter().enumerate().step_by(7) {
        let got = run(Command::new(&isoinfo)
            .args(["-R", "-i"])
            .arg(&f.0)
            .args(["-x", &format!("/{n}")]));
        assert!(got == *d, "file {i}");
    }
}

#[test]
fn output_is_deterministic_and_independent_of_nothing_else() {
    let (a, _) = seed();
    let (b, _) = seed();
    assert!(a == b);
}

#[test]
fn empty_file_list_is_a_valid_empty_volume() {
    let blkid = tool("blkid", "util-linux");
    let iso = build(&[], "cidata").unwrap();
    let f = Scratch::write("empty", &iso);
    let out = text(run(Command::new(&blkid)
        .args(["-p", "-o", "export"])
        .arg(&f.0)));
    assert!(out.lines().any(|l| l == "LABEL=cidata"), "{out}");
}

#[test]
fn bad_file_names_are_refused_naming_the_field() {
    let cases: [(&str, &str); 7] = [
        ("", "must not be empty"),
        ("a/b", "must not contain '/'"),
        (".", "not file names"),
        ("..", "not file names"),
        ("has space", "must not contain spaces"),
        ("ünïcode", "only ASCII"),
        ("x;1", "must not contain"),
    ];
    for (name, reason) in cases {
        let err = build(&[("meta-data", b"x"), (name, b"y")], "cidata").unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, SeedError::InvalidFileName { index: 1, .. }),
            "{name:?}: {err:?}"
        );
        assert!(
            msg.starts_with(&format!("files[1].name {name:?}: ")),
            "{msg}"
        );
        assert!(msg.contains(reason), "{name:?}: {msg}");
    }
    let long = "a".repeat(65);
    let msg = build(&[(long.as_str(), b"")], "cidata")
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("files[0].name ") && msg.contains("longer than 64"),
        "{msg}"
    );
    // 64 is fine.
    build(&[("b".repeat(64).as_str(), b"")], "cidata").unwrap();
}

#[test]
fn duplicate_names_are_refused_naming_the_field() {
    let err = build(
        &[
            ("user-data", b"a"),
            ("meta-data", b"b"),
            ("user-data", b"c"),
        ],
        "cidata",
    )
    .unwrap_err();
    assert_eq!(
        err,
        SeedError::DuplicateFileName {
            index: 2,
            name: "user-data".into()
        }
    );
    let msg = err.to_string();
    assert!(
        msg.starts_with(r#"files[2].name "user-data": duplicate"#),
        "{msg}"
    );
}

#[test]
fn bad_volume_ids_are_refused_naming_the_field() {
    let long = "c".repeat(33);
    for (id, reason) in [
        (long.as_str(), "longer than 32"),
        ("", "must not be empty"),
        ("ci data", "only ASCII letters"),
        ("cid/ata", "only ASCII letters"),
    ] {
        let err = build(&[("meta-data", b"")], id).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, SeedError::InvalidVolumeId { .. }), "{err:?}");
        assert!(msg.starts_with(&format!("volume_id {id:?}: ")), "{msg}");
        assert!(msg.contains(reason), "{msg}");
    }
    build(&[("meta-data", b"")], &"C".repeat(32)).unwrap();
    build(&[("meta-data", b"")], "CIDATA").unwrap();
}
