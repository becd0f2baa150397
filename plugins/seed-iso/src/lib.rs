//! A cloud-init **NoCloud seed ISO**, built in memory.
//!
//! [`build`] takes a flat list of files (`user-data`, `meta-data`, `vendor-data`,
//! `network-config`, …) and a volume id (`cidata` for NoCloud) and returns the bytes of an
//! ISO 9660 image as `genisoimage -volid cidata -joliet -rock` would make it:
//!
//! - 2048-byte sectors; sectors 0–15 are the (empty) system area;
//! - sector 16: primary volume descriptor (ISO 9660 level 2 names, e.g. `USER_DATA.;1`);
//! - sector 17: Joliet supplementary volume descriptor (UCS-2 level 3, names exactly as given);
//! - sector 18: volume descriptor set terminator;
//! - sectors 19–22: L and M path tables of the primary and of the Joliet tree (one root entry);
//! - then the primary root directory, the Joliet root directory and the file data, each file
//!   starting on its own sector, its bytes copied unchanged.
//!
//! The primary tree carries Rock Ridge (RRIP 1991A over SUSP): `SP` and `ER` in the root's `.`
//! entry, `PX` on every entry (files 0644, the directory 0755, uid/gid 0) and `NM` with the exact
//! name, so Linux mounts (and blkid/cloud-init) see `user-data`, not `USER_DATA.;1`. Every
//! multi-byte field that ECMA-119 records "both-byte order" is written both ways. All
//! timestamps are fixed (1970-01-01 00:00:00 UTC), so the same input gives the same bytes.
//!
//! ## Why this is hand-written
//!
//! The kvm provider runs as a `wasm32-wasip2` component with a size budget (plugins ship in a
//! ConfigMap) and must produce the same seed for the same Proxy. The image a NoCloud seed needs
//! is tiny and fixed in shape (one directory, a handful of small files), a few hundred lines
//! here, tested against real readers (isoinfo, bsdtar, xorriso, blkid). There is one maintained
//! pure-Rust writer with Rock Ridge and Joliet on crates.io, `hadris-iso` (2.5.0 checked; it
//! does build for wasm32-wasip2), but it brings about 40 crates (chrono, rand/getrandom,
//! tracing, heapless, zerocopy, bytemuck, syn, …) for reading, El Torito, partition tables and
//! streaming that a seed never uses, and its writer stamps records with the current time
//! (`SystemTime::now`/`Utc::now`), so the same Proxy would not get the same seed. Other ISO
//! crates (`cdfs`, `iso9660_simple`) only read. So this crate has no dependencies, no
//! `unsafe`, and needs only `core` + `alloc`.

#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;

use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

/// Bytes in one logical sector (and logical block) of the image.
pub const SECTOR: usize = 2048;

/// The longest file name accepted (the Joliet limit, in UCS-2 characters).
pub const MAX_NAME_LEN: usize = 64;

/// The longest volume id accepted (the primary volume descriptor's field).
pub const MAX_VOLUME_ID_LEN: usize = 32;

/// Why [`build`] refused its input. The `Display` text names the offending field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeedError {
    /// `files[index].name` is not a usable file name.
    InvalidFileName {
        index: usize,
        name: String,
        reason: &'static str,
    },
    /// Two entries of `files` have the same name.
    DuplicateFileName { index: usize, name: String },
    /// `files[index]` is larger than one ISO 9660 extent can hold (4 GiB − 1).
    FileTooLarge { index: usize, name: String },
    /// `volume_id` is not usable.
    InvalidVolumeId {
        volume_id: String,
        reason: &'static str,
    },
}

impl fmt::Display for SeedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SeedError::InvalidFileName {
                index,
                name,
                reason,
            } => write!(f, "files[{index}].name {name:?}: {reason}"),
            SeedError::DuplicateFileName { index, name } => write!(
                f,
                "files[{index}].name {name:?}: duplicate file name (each name may appear once)"
            ),
            SeedError::FileTooLarge { index, name } => write!(
                f,
                "files[{index}] {name:?}: larger than an ISO 9660 file can be (4 GiB - 1 bytes)"
            ),
            SeedError::InvalidVolumeId { volume_id, reason } => {
                write!(f, "volume_id {volume_id:?}: {reason}")
            }
        }
    }
}

impl core::error::Error for SeedError {}

/// Builds a seed ISO holding `files` (name, bytes) in its root directory, labelled `volume_id`.
///
/// Names: 1–64 ASCII characters, none of `/ \ * : ; ?`, no spaces or control characters, not
/// `.` or `..`, each used once. Volume id: 1–32 ASCII letters, digits, `_` or `-` (NoCloud
/// looks for `cidata` or `CIDATA`). Directories list files sorted by name; file data is laid
/// out in the order of `files`. The same input (in the same order) gives the same bytes.
pub fn build(files: &[(&str, &[u8])], volume_id: &str) -> Result<Vec<u8>, SeedError> {
    validate_volume_id(volume_id)?;
    for (index, (name, data)) in files.iter().enumerate() {
        validate_name(index, name)?;
        if u32::try_from(data.len()).is_err() {
            return Err(SeedError::FileTooLarge {
                index,
                name: name.to_string(),
            });
        }
        if files[..index].iter().any(|(other, _)| other == name) {
            return Err(SeedError::DuplicateFileName {
                index,
                name: name.to_string(),
            });
        }
    }

    // Primary (ISO 9660) names, unique, and both trees' orders.
    let iso_names = primary_names(files);
    let mut iso_order: Vec<usize> = (0..files.len()).collect();
    iso_order.sort_by(|&a, &b| iso_names[a].sort_key().cmp(&iso_names[b].sort_key()));
    let mut joliet_order: Vec<usize> = (0..files.len()).collect();
    joliet_order.sort_by(|&a, &b| files[a].0.as_bytes().cmp(files[b].0.as_bytes()));

    // Layout. Record lengths do not depend on extents, so size the directories first.
    const PVD_LBA: usize = 16;
    const L_PATH_LBA: u32 = 19;
    const M_PATH_LBA: u32 = 20;
    const JL_PATH_LBA: u32 = 21;
    const JM_PATH_LBA: u32 = 22;
    const ISO_ROOT_LBA: u32 = 23;
    let iso_records = |root: (u32, u32), extents: &[(u32, u32)]| -> Vec<Vec<u8>> {
        let mut records = vec![
            dir_record(root.0, root.1, FLAG_DIR, &[0], &root_dot_su()),
            dir_record(root.0, root.1, FLAG_DIR, &[1], &px(DIR_MODE, 2)),
        ];
        for &i in &iso_order {
            let mut su = rr(RR_PX | RR_NM).to_vec();
            su.extend_from_slice(&px(FILE_MODE, 1));
            su.extend_from_slice(&nm(files[i].0));
            records.push(dir_record(
                extents[i].0,
                extents[i].1,
                0,
                iso_names[i].identifier.as_bytes(),
                &su,
            ));
        }
        records
    };
    let joliet_records = |root: (u32, u32), extents: &[(u32, u32)]| -> Vec<Vec<u8>> {
        let mut records = vec![
            dir_record(root.0, root.1, FLAG_DIR, &[0], &[]),
            dir_record(root.0, root.1, FLAG_DIR, &[1], &[]),
        ];
        for &i in &joliet_order {
            records.push(dir_record(
                extents[i].0,
                extents[i].1,
                0,
                &ucs2(files[i].0),
                &[],
            ));
        }
        records
    };
    let placeholder = vec![(0u32, 0u32); files.len()];
    let iso_root_sectors = dir_sectors(&iso_records((0, 0), &placeholder));
    let joliet_root_lba = ISO_ROOT_LBA + iso_root_sectors;
    let joliet_root_sectors = dir_sectors(&joliet_records((0, 0), &placeholder));
    let mut next = joliet_root_lba + joliet_root_sectors;
    let mut extents = Vec::with_capacity(files.len());
    for (_, data) in files {
        let len = data.len() as u32; // checked above
        let sectors = sectors_for(data.len());
        extents.push((if len == 0 { 0 } else { next }, len));
        next += sectors;
    }
    let total_sectors = next;
    let iso_root = (ISO_ROOT_LBA, iso_root_sectors * SECTOR as u32);
    let joliet_root = (joliet_root_lba, joliet_root_sectors * SECTOR as u32);

    let mut image = vec![0u8; total_sectors as usize * SECTOR];
    let sector = |lba: u32| lba as usize * SECTOR;

    // Volume descriptors.
    let pvd = volume_descriptor(&Descriptor {
        joliet: false,
        volume_id,
        total_sectors,
        root: iso_root,
        l_path: L_PATH_LBA,
        m_path: M_PATH_LBA,
    });
    image[PVD_LBA * SECTOR..][..SECTOR].copy_from_slice(&pvd);
    let svd = volume_descriptor(&Descriptor {
        joliet: true,
        volume_id,
        total_sectors,
        root: joliet_root,
        l_path: JL_PATH_LBA,
        m_path: JM_PATH_LBA,
    });
    image[(PVD_LBA + 1) * SECTOR..][..SECTOR].copy_from_slice(&svd);
    let term = &mut image[(PVD_LBA + 2) * SECTOR..][..7];
    term[0] = 255;
    term[1..6].copy_from_slice(b"CD001");
    term[6] = 1;

    // Path tables: one entry each, the root.
    for (lba, root_lba, big_endian) in [
        (L_PATH_LBA, ISO_ROOT_LBA, false),
        (M_PATH_LBA, ISO_ROOT_LBA, true),
        (JL_PATH_LBA, joliet_root_lba, false),
        (JM_PATH_LBA, joliet_root_lba, true),
    ] {
        let entry = path_table_root(root_lba, big_endian);
        image[sector(lba)..][..entry.len()].copy_from_slice(&entry);
    }

    // Directories.
    write_dir(
        &mut image[sector(ISO_ROOT_LBA)..],
        &iso_records(iso_root, &extents),
    );
    write_dir(
        &mut image[sector(joliet_root_lba)..],
        &joliet_records(joliet_root, &extents),
    );

    // File data.
    for ((_, data), (lba, len)) in files.iter().zip(&extents) {
        if *len > 0 {
            image[sector(*lba)..][..data.len()].copy_from_slice(data);
        }
    }
    Ok(image)
}

fn validate_volume_id(volume_id: &str) -> Result<(), SeedError> {
    let reason = if volume_id.is_empty() {
        Some("must not be empty")
    } else if volume_id.len() > MAX_VOLUME_ID_LEN {
        Some("longer than 32 characters (the ISO 9660 volume identifier field)")
    } else if !volume_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        Some("only ASCII letters, digits, '_' and '-' are allowed (NoCloud wants \"cidata\")")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(SeedError::InvalidVolumeId {
            volume_id: volume_id.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

fn validate_name(index: usize, name: &str) -> Result<(), SeedError> {
    let reason = if name.is_empty() {
        Some("must not be empty")
    } else if name.contains('/') {
        Some("must not contain '/' (the seed has a flat root directory)")
    } else if name.chars().count() > MAX_NAME_LEN {
        Some("longer than 64 characters (the Joliet limit)")
    } else if name == "." || name == ".." {
        Some("'.' and '..' are not file names")
    } else if !name.is_ascii() {
        Some("only ASCII characters are allowed")
    } else if name
        .bytes()
        .any(|b| !b.is_ascii_graphic() || b"\\*:;?".contains(&b))
    {
        Some("must not contain spaces, control characters or any of \\ * : ; ?")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(SeedError::InvalidFileName {
            index,
            name: name.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

/// An ISO 9660 level 2 file identifier: `BASE.EXT;1`, d-characters only.
struct IsoName {
    base: String,
    ext: String,
    identifier: String,
}

impl IsoName {
    fn new(base: String, ext: String) -> Self {
        let identifier = alloc::format!("{base}.{ext};1");
        IsoName {
            base,
            ext,
            identifier,
        }
    }

    /// ECMA-119 9.3: by name then extension, each padded with spaces (all d-characters sort
    /// after a space, so plain comparison of the unpadded strings is the same thing).
    fn sort_key(&self) -> (&[u8], &[u8]) {
        (self.base.as_bytes(), self.ext.as_bytes())
    }
}

/// Level 2 allows 30 characters for name + extension.
const ISO_NAME_LEN: usize = 30;

fn d_chars(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// Primary-tree names for `files`, made unique after mapping (e.g. `user-data` and `user_data`
/// both map to `USER_DATA`; the second becomes `USER_DATA_1`). Rock Ridge and Joliet carry the
/// real names.
fn primary_names(files: &[(&str, &[u8])]) -> Vec<IsoName> {
    let mut names: Vec<IsoName> = Vec::with_capacity(files.len());
    for (name, _) in files {
        let (base, ext) = match name.rfind('.') {
            Some(dot) => (d_chars(&name[..dot]), d_chars(&name[dot + 1..])),
            None => (d_chars(name), String::new()),
        };
        let ext: String = ext.chars().take(8).collect();
        let room = ISO_NAME_LEN - ext.len();
        let mut candidate = IsoName::new(base.chars().take(room).collect(), ext.clone());
        let mut n = 1usize;
        while names
            .iter()
            .any(|other| other.identifier == candidate.identifier)
        {
            let suffix = alloc::format!("_{n}");
            let keep = room.saturating_sub(suffix.len());
            let short: String = base.chars().take(keep).collect();
            candidate = IsoName::new(alloc::format!("{short}{suffix}"), ext.clone());
            n += 1;
        }
        names.push(candidate);
    }
    names
}

fn ucs2(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(u16::to_be_bytes).collect()
}

fn sectors_for(len: usize) -> u32 {
    len.div_ceil(SECTOR) as u32
}

fn both16(buf: &mut [u8], v: u16) {
    buf[..2].copy_from_slice(&v.to_le_bytes());
    buf[2..4].copy_from_slice(&v.to_be_bytes());
}

fn both32(buf: &mut [u8], v: u32) {
    buf[..4].copy_from_slice(&v.to_le_bytes());
    buf[4..8].copy_from_slice(&v.to_be_bytes());
}

fn both32_vec(v: u32) -> [u8; 8] {
    let mut b = [0u8; 8];
    both32(&mut b, v);
    b
}

/// Directory record recording date: 1970-01-01 00:00:00, GMT offset 0.
const RECORD_DATE: [u8; 7] = [70, 1, 1, 0, 0, 0, 0];
/// Volume descriptor dates (17 bytes each).
const VD_DATE_SET: &[u8; 17] = b"1970010100000000\0";
const VD_DATE_UNSET: &[u8; 17] = b"0000000000000000\0";

const FLAG_DIR: u8 = 0x02;
const FILE_MODE: u32 = 0o100_644;
const DIR_MODE: u32 = 0o040_755;

fn dir_record(extent: u32, size: u32, flags: u8, id: &[u8], su: &[u8]) -> Vec<u8> {
    let pad = usize::from(id.len().is_multiple_of(2));
    let mut len = 33 + id.len() + pad + su.len();
    len += len % 2;
    assert!(len <= 255, "directory record too long ({len})");
    let mut r = vec![0u8; len];
    r[0] = len as u8;
    both32(&mut r[2..10], extent);
    both32(&mut r[10..18], size);
    r[18..25].copy_from_slice(&RECORD_DATE);
    r[25] = flags;
    both16(&mut r[28..32], 1);
    r[32] = id.len() as u8;
    r[33..33 + id.len()].copy_from_slice(id);
    let su_at = 33 + id.len() + pad;
    r[su_at..su_at + su.len()].copy_from_slice(su);
    r
}

/// Sectors a directory needs: a record may not cross a sector boundary.
fn dir_sectors(records: &[Vec<u8>]) -> u32 {
    let mut sectors = 1u32;
    let mut used = 0usize;
    for r in records {
        if used + r.len() > SECTOR {
            sectors += 1;
            used = 0;
        }
        used += r.len();
    }
    sectors
}

fn write_dir(out: &mut [u8], records: &[Vec<u8>]) {
    let mut sector_start = 0usize;
    let mut at = 0usize;
    for r in records {
        if at - sector_start + r.len() > SECTOR {
            sector_start += SECTOR;
            at = sector_start;
        }
        out[at..at + r.len()].copy_from_slice(r);
        at += r.len();
    }
}

fn path_table_root(root_lba: u32, big_endian: bool) -> [u8; 10] {
    let mut e = [0u8; 10];
    e[0] = 1; // length of directory identifier
    if big_endian {
        e[2..6].copy_from_slice(&root_lba.to_be_bytes());
        e[6..8].copy_from_slice(&1u16.to_be_bytes());
    } else {
        e[2..6].copy_from_slice(&root_lba.to_le_bytes());
        e[6..8].copy_from_slice(&1u16.to_le_bytes());
    }
    // e[8] = 0: the root's identifier; e[9]: padding to an even length.
    e
}

struct Descriptor<'a> {
    joliet: bool,
    volume_id: &'a str,
    total_sectors: u32,
    root: (u32, u32),
    l_path: u32,
    m_path: u32,
}

/// Fills `field` with `text` padded with spaces: ASCII for the primary descriptor, UCS-2
/// big-endian for Joliet (an odd-length field keeps a trailing 0 byte).
fn text_field(field: &mut [u8], text: &str, joliet: bool) {
    if joliet {
        let mut units = text.encode_utf16().chain(core::iter::repeat(0x20));
        for pair in field.chunks_exact_mut(2) {
            pair.copy_from_slice(&units.next().unwrap_or(0x20).to_be_bytes());
        }
    } else {
        field.fill(b' ');
        field[..text.len()].copy_from_slice(text.as_bytes());
    }
}

fn volume_descriptor(d: &Descriptor<'_>) -> Vec<u8> {
    let mut v = vec![0u8; SECTOR];
    v[0] = if d.joliet { 2 } else { 1 };
    v[1..6].copy_from_slice(b"CD001");
    v[6] = 1;
    text_field(&mut v[8..40], "", d.joliet); // system identifier
    // Joliet volume identifiers hold 16 UCS-2 characters.
    let vol_id: String = d
        .volume_id
        .chars()
        .take(if d.joliet { 16 } else { 32 })
        .collect();
    text_field(&mut v[40..72], &vol_id, d.joliet);
    both32(&mut v[80..88], d.total_sectors);
    if d.joliet {
        v[88..91].copy_from_slice(b"%/E"); // UCS-2 level 3
    }
    both16(&mut v[120..124], 1); // volume set size
    both16(&mut v[124..128], 1); // volume sequence number
    both16(&mut v[128..132], SECTOR as u16);
    both32(&mut v[132..140], 10); // path table size: one root entry
    v[140..144].copy_from_slice(&d.l_path.to_le_bytes());
    v[148..152].copy_from_slice(&d.m_path.to_be_bytes());
    let root = dir_record(d.root.0, d.root.1, FLAG_DIR, &[0], &[]);
    v[156..190].copy_from_slice(&root);
    text_field(&mut v[190..318], "", d.joliet); // volume set
    text_field(&mut v[318..446], "", d.joliet); // publisher
    text_field(&mut v[446..574], "", d.joliet); // data preparer
    text_field(&mut v[574..702], "PROXY-OPERATOR SEED-ISO", d.joliet); // application
    text_field(&mut v[702..739], "", d.joliet); // copyright file
    text_field(&mut v[739..776], "", d.joliet); // abstract file
    text_field(&mut v[776..813], "", d.joliet); // bibliographic file
    v[813..830].copy_from_slice(VD_DATE_SET); // creation
    v[830..847].copy_from_slice(VD_DATE_SET); // modification
    v[847..864].copy_from_slice(VD_DATE_UNSET); // expiration
    v[864..881].copy_from_slice(VD_DATE_UNSET); // effective
    v[881] = 1; // file structure version
    v
}

// --- Rock Ridge (RRIP 1991A) over SUSP -------------------------------------------------------

const RR_PX: u8 = 0x01;
const RR_NM: u8 = 0x08;

const ER_ID: &str = "RRIP_1991A";
const ER_DESCRIPTOR: &str =
    "THE ROCK RIDGE INTERCHANGE PROTOCOL PROVIDES SUPPORT FOR POSIX FILE SYSTEM SEMANTICS";
const ER_SOURCE: &str = "PLEASE CONTACT THE DISC PUBLISHER FOR SPECIFICATION SOURCE";

/// The root `.` entry's system use area: SP (SUSP in use), RR, PX, ER (Rock Ridge in use).
fn root_dot_su() -> Vec<u8> {
    let mut su = vec![b'S', b'P', 7, 1, 0xBE, 0xEF, 0];
    su.extend_from_slice(&rr(RR_PX));
    su.extend_from_slice(&px(DIR_MODE, 2));
    let len = 8 + ER_ID.len() + ER_DESCRIPTOR.len() + ER_SOURCE.len();
    su.extend_from_slice(&[
        b'E',
        b'R',
        len as u8,
        1,
        ER_ID.len() as u8,
        ER_DESCRIPTOR.len() as u8,
        ER_SOURCE.len() as u8,
        1,
    ]);
    su.extend_from_slice(ER_ID.as_bytes());
    su.extend_from_slice(ER_DESCRIPTOR.as_bytes());
    su.extend_from_slice(ER_SOURCE.as_bytes());
    su
}

/// RR: which Rock Ridge entries follow (RRIP 1991A; older readers look for it).
fn rr(flags: u8) -> [u8; 5] {
    [b'R', b'R', 5, 1, flags]
}

/// PX: POSIX mode, links, uid 0, gid 0 (the 1991A form, 36 bytes).
fn px(mode: u32, links: u32) -> Vec<u8> {
    let mut e = vec![b'P', b'X', 36, 1];
    e.extend_from_slice(&both32_vec(mode));
    e.extend_from_slice(&both32_vec(links));
    e.extend_from_slice(&both32_vec(0));
    e.extend_from_slice(&both32_vec(0));
    e
}

/// NM: the file's real name.
fn nm(name: &str) -> Vec<u8> {
    let mut e = vec![b'N', b'M', (5 + name.len()) as u8, 1, 0];
    e.extend_from_slice(name.as_bytes());
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primary_names_are_unique_d_characters() {
        let files: [(&str, &[u8]); 4] = [
            ("user-data", b""),
            ("user_data", b""),
            ("a-very-long-name-that-goes-on-and-on-and-on.config", b""),
            (
                "a-very-long-name-that-goes-on-and-on-and-on-and.config",
                b"",
            ),
        ];
        let names = primary_names(&files);
        let ids: Vec<&str> = names.iter().map(|n| n.identifier.as_str()).collect();
        assert_eq!(ids[0], "USER_DATA.;1");
        assert_eq!(ids[1], "USER_DATA_1.;1");
        assert_eq!(ids[2], "A_VERY_LONG_NAME_THAT_GO.CONFIG;1");
        assert_eq!(ids[3], "A_VERY_LONG_NAME_THAT__1.CONFIG;1");
        for n in &names {
            assert!(
                n.base.len() + n.ext.len() <= ISO_NAME_LEN,
                "{}",
                n.identifier
            );
        }
    }

    #[test]
    fn root_dot_record_fits() {
        let r = dir_record(23, 2048, FLAG_DIR, &[0], &root_dot_su());
        assert!(r.len() <= 255 && r.len().is_multiple_of(2));
    }
}
