//! The files a qcow2 header names, read as QEMU reads it (QEMU's `docs/interop/qcow2.txt`): the
//! backing file, and the external data file (incompatible feature bit 2 with the header
//! extension `0x44415441` naming it). A plugin can write any header into its own volume
//! (upload-volume, import-image, or its guest writing a raw disk that libvirt then reads as
//! qcow2), and libvirt hands QEMU, relabelled, whatever file the header names. Pure: the caller
//! reads the first cluster of the image.

/// `QFI\xfb`.
const MAGIC: u32 = 0x5146_49fb;
/// Incompatible feature bit 2: the guest's data is in an external data file.
const INCOMPAT_DATA_FILE: u64 = 1 << 2;
/// The header extensions QEMU knows (none but the data file names a file). An unknown one is
/// refused rather than trusted to name nothing.
const EXT_END: u32 = 0;
const EXT_BACKING_FORMAT: u32 = 0xe279_2aca;
const EXT_FEATURE_TABLE: u32 = 0x6803_f857;
const EXT_BITMAPS: u32 = 0x2385_2875;
const EXT_CRYPTO_HEADER: u32 = 0x0537_be77;
const EXT_DATA_FILE: u32 = 0x4441_5441;
/// QEMU's largest cluster (`cluster_bits` 21): the header, its extensions and the backing file
/// name are all within the first cluster.
pub const MAX_HEAD: usize = 2 << 20;
/// What libvirt reads of an image to probe it (`VIR_STORAGE_MAX_HEADER`); also what the caller
/// reads first, [`head_length`] says whether more is needed.
pub const FIRST_READ: usize = 0x8200;

/// How many bytes from the start of a qcow2 image hold everything its header names, for QEMU
/// (its first cluster, at most [`MAX_HEAD`]) and for libvirt ([`FIRST_READ`]).
pub fn head_length(first: &[u8]) -> usize {
    match be32(first, 20) {
        Some(bits @ 9..=21) => (1usize << bits).clamp(FIRST_READ, MAX_HEAD),
        _ => FIRST_READ,
    }
}

/// What the header names outside the image.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct References {
    pub backing_file: Option<String>,
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The backing file of the qcow2 image starting with `head`, or why it may not be a disk: an
/// external data file, a header extension QEMU may read a file name from that is not known
/// here, or a header that does not read as QEMU's would (refused rather than guessed at).
pub fn references(head: &[u8]) -> Result<References, String> {
    let short = || "its qcow2 header is cut short".to_string();
    if be32(head, 0).ok_or_else(short)? != MAGIC {
        return Err("it does not start with a qcow2 header".into());
    }
    let version = be32(head, 4).ok_or_else(short)?;
    let cluster_bits = be32(head, 20).ok_or_else(short)?;
    if !(9..=21).contains(&cluster_bits) {
        return Err(format!(
            "its qcow2 cluster_bits {cluster_bits} is not 9 to 21"
        ));
    }
    let cluster = 1usize << cluster_bits;
    let (incompatible, header_length) = match version {
        2 => (0, 72),
        3 => (
            be64(head, 72).ok_or_else(short)?,
            be32(head, 100).ok_or_else(short)? as usize,
        ),
        other => return Err(format!("its qcow2 version {other} is not 2 or 3")),
    };
    if header_length < 72 || header_length > cluster {
        return Err(format!(
            "its qcow2 header_length {header_length} is outside the first cluster"
        ));
    }
    let backing_offset = be64(head, 8).ok_or_else(short)?;
    let backing_size = be32(head, 16).ok_or_else(short)? as usize;
    // Extensions run up to the backing file name (or the end of the first cluster).
    let end = if backing_offset == 0 {
        cluster
    } else {
        usize::try_from(backing_offset)
            .ok()
            .filter(|&o| o >= header_length && o <= cluster)
            .ok_or_else(|| {
                format!(
                    "its qcow2 backing_file_offset {backing_offset} is outside the first cluster"
                )
            })?
    };
    let mut at = header_length;
    while at + 8 <= end {
        let kind = be32(head, at).ok_or_else(short)?;
        let len = be32(head, at + 4).ok_or_else(short)? as usize;
        if kind == EXT_END {
            break;
        }
        let data = at + 8;
        if len > end - data {
            return Err(format!(
                "its qcow2 header extension {kind:#010x} runs past the header"
            ));
        }
        match kind {
            EXT_DATA_FILE => {
                let name = head.get(data..data + len).ok_or_else(short)?;
                return Err(format!(
                    "its qcow2 header names an external data file `{}`: QEMU would read and write that file on the hypervisor",
                    String::from_utf8_lossy(name)
                ));
            }
            EXT_BACKING_FORMAT | EXT_FEATURE_TABLE | EXT_BITMAPS | EXT_CRYPTO_HEADER => {}
            other => {
                return Err(format!(
                    "its qcow2 header has extension {other:#010x}, which is not known to name nothing outside the image"
                ));
            }
        }
        at = data + len.div_ceil(8) * 8;
    }
    // After the walk, which names the file where the header does.
    if incompatible & INCOMPAT_DATA_FILE != 0 {
        return Err(
            "its qcow2 header has an external data file (incompatible feature bit 2): QEMU would read and write the file it names on the hypervisor"
                .into(),
        );
    }
    libvirt_walk(head, header_length, backing_offset)?;
    if backing_offset == 0 {
        return Ok(References::default());
    }
    if backing_size == 0 || backing_size > 1023 {
        return Err(format!(
            "its qcow2 backing_file_size {backing_size} is not 1 to 1023"
        ));
    }
    let start = backing_offset as usize;
    let name = head.get(start..start + backing_size).ok_or_else(short)?;
    Ok(References {
        backing_file: Some(String::from_utf8_lossy(name).into_owned()),
    })
}

/// libvirt's own walk of the extensions (`qcow2GetExtensions`, over the [`FIRST_READ`] bytes it
/// reads): it steps by the unpadded length and, without a backing file, up to the end of what
/// it read, so it can find a data file name QEMU's walk steps over; libvirt would then hand
/// that file to QEMU.
fn libvirt_walk(head: &[u8], start: usize, extension_end: u64) -> Result<(), String> {
    let buf = &head[..head.len().min(FIRST_READ)];
    let size = buf.len() as u64;
    // libvirt's `size_t` arithmetic: `extension_end - 8` wraps when there is no backing file.
    let (limit, end) = (size.wrapping_sub(8), extension_end.wrapping_sub(8));
    let mut offset = start as u64;
    while offset < limit && offset < end {
        let at = offset as usize;
        let (Some(magic), Some(len)) = (be32(buf, at), be32(buf, at + 4)) else {
            break;
        };
        offset += 8;
        if offset + u64::from(len) > size {
            break;
        }
        match magic {
            EXT_DATA_FILE => {
                return Err(
                    "its qcow2 header names an external data file where libvirt reads one: libvirt would hand QEMU the file it names on the hypervisor"
                        .into(),
                );
            }
            EXT_END => return Ok(()),
            _ => offset += u64::from(len),
        }
    }
    Ok(())
}

/// Writes qcow2 headers for the tests: version 3, 64 KiB clusters.
#[cfg(test)]
pub(crate) mod build {
    pub struct Header {
        pub incompatible: u64,
        pub backing: Option<String>,
        /// (type, data) of each extension, in order.
        pub extensions: Vec<(u32, Vec<u8>)>,
    }

    impl Header {
        pub fn plain() -> Header {
            Header {
                incompatible: 0,
                backing: None,
                extensions: Vec::new(),
            }
        }

        pub fn bytes(&self) -> Vec<u8> {
            let mut h = vec![0u8; 104];
            h[0..4].copy_from_slice(&super::MAGIC.to_be_bytes());
            h[4..8].copy_from_slice(&3u32.to_be_bytes());
            h[20..24].copy_from_slice(&16u32.to_be_bytes());
            h[72..80].copy_from_slice(&self.incompatible.to_be_bytes());
            h[96..100].copy_from_slice(&4u32.to_be_bytes());
            h[100..104].copy_from_slice(&104u32.to_be_bytes());
            for (kind, data) in &self.extensions {
                h.extend_from_slice(&kind.to_be_bytes());
                h.extend_from_slice(&(data.len() as u32).to_be_bytes());
                h.extend_from_slice(data);
                h.resize(h.len().div_ceil(8) * 8, 0);
            }
            h.extend_from_slice(&[0; 8]);
            if let Some(backing) = &self.backing {
                let offset = h.len() as u64;
                h[8..16].copy_from_slice(&offset.to_be_bytes());
                h[16..20].copy_from_slice(&(backing.len() as u32).to_be_bytes());
                h.extend_from_slice(backing.as_bytes());
            }
            h
        }
    }
}

#[cfg(test)]
mod tests {
    use super::build::Header;
    use super::*;

    fn refused(header: &Header) -> String {
        references(&header.bytes()).unwrap_err()
    }

    #[test]
    fn a_plain_header_and_a_backing_file_are_read() {
        assert_eq!(
            references(&Header::plain().bytes()),
            Ok(References::default())
        );
        let overlay = Header {
            backing: Some("/pool/base".into()),
            extensions: vec![(EXT_BACKING_FORMAT, b"qcow2".to_vec())],
            ..Header::plain()
        };
        assert_eq!(
            references(&overlay.bytes())
                .unwrap()
                .backing_file
                .as_deref(),
            Some("/pool/base")
        );
        assert_eq!(head_length(&overlay.bytes()), 65536);
        assert_eq!(head_length(&Header::plain().bytes()[..20]), FIRST_READ);
        assert_eq!(head_length(b"QFI"), FIRST_READ);
    }

    #[test]
    fn external_data_files_are_refused_by_the_bit_or_the_extension() {
        let bit = Header {
            incompatible: INCOMPAT_DATA_FILE,
            ..Header::plain()
        };
        assert!(refused(&bit).contains("incompatible feature bit 2"));
        // The name alone, without the bit, is refused too (the bit can be set later).
        let name = Header {
            extensions: vec![
                (EXT_FEATURE_TABLE, vec![0; 48]),
                (EXT_DATA_FILE, b"/etc/shadow".to_vec()),
            ],
            ..Header::plain()
        };
        assert!(refused(&name).contains("external data file `/etc/shadow`"));
        let unknown = Header {
            extensions: vec![(0x1234_5678, b"/etc/shadow".to_vec())],
            ..Header::plain()
        };
        assert!(refused(&unknown).contains("extension 0x12345678"));
        // Hidden from QEMU's padded walk inside a known extension, found by libvirt's unpadded
        // one: a 3-byte backing format name, then (where libvirt looks next) a data file name.
        let mut payload = b"raw".to_vec();
        payload.extend_from_slice(&EXT_DATA_FILE.to_be_bytes());
        payload.extend_from_slice(&4u32.to_be_bytes());
        payload.extend_from_slice(b"/etc");
        let mut h = Header {
            extensions: vec![(EXT_BACKING_FORMAT, payload)],
            ..Header::plain()
        }
        .bytes();
        // The length says 3: libvirt steps 3 bytes, QEMU 8.
        h[108..112].copy_from_slice(&3u32.to_be_bytes());
        assert!(references(&h).is_err());
        let err = libvirt_walk(&h, 104, 0).unwrap_err();
        assert!(err.contains("where libvirt reads one"), "{err}");
    }

    #[test]
    fn headers_that_do_not_read_as_qemus_are_refused() {
        let good = Header {
            backing: Some("/pool/base".into()),
            ..Header::plain()
        }
        .bytes();
        let with = |at: usize, bytes: &[u8]| {
            let mut h = good.clone();
            h[at..at + bytes.len()].copy_from_slice(bytes);
            references(&h).unwrap_err()
        };
        assert!(with(0, b"QFI\0").contains("does not start with a qcow2 header"));
        assert!(with(4, &4u32.to_be_bytes()).contains("version 4"));
        assert!(with(20, &30u32.to_be_bytes()).contains("cluster_bits 30"));
        assert!(with(100, &70000u32.to_be_bytes()).contains("header_length"));
        assert!(with(8, &u64::MAX.to_be_bytes()).contains("backing_file_offset"));
        assert!(with(16, &5000u32.to_be_bytes()).contains("backing_file_size"));
        // An extension longer than the space before the backing file name.
        let long = Header {
            backing: Some("/pool/base".into()),
            extensions: vec![(EXT_BACKING_FORMAT, b"raw".to_vec())],
            ..Header::plain()
        };
        let mut h = long.bytes();
        h[108..112].copy_from_slice(&4000u32.to_be_bytes());
        assert!(references(&h).unwrap_err().contains("runs past the header"));
        for cut in [0, 3, 50, 103] {
            assert!(references(&good[..cut]).is_err(), "cut at {cut}");
        }
        // The backing file name cut off by the read.
        assert!(
            references(&good[..good.len() - 1])
                .unwrap_err()
                .contains("cut short")
        );
    }
}
