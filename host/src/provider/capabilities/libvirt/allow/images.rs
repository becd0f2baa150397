//! The images behind a domain's disks, as libvirt reads them: a qcow2 file names its backing
//! file in its own header, which a plugin can write (upload-volume), so a disk passes only when
//! its format is the volume's and every backing file in its chain is the plugin's own volume in
//! a granted pool. The walk is pure; the caller looks each volume up.

use roxmltree::Document;

use super::qcow2;

/// Backing files deeper than this are refused (a base image has none; an overlay has one).
const MAX_CHAIN: usize = 8;

/// The granted pool whose directory holds `path` directly (no `..`, `//` or subdirectory),
/// when the file is one of this provider instance's volumes (its name has `prefix`).
pub(super) fn pool_of<'p>(
    path: &str,
    pools: &'p [(String, String)],
    prefix: &str,
) -> Option<&'p str> {
    let (dir, file) = path.rsplit_once('/')?;
    if file.len() <= prefix.len() || !file.starts_with(prefix) || file == "." || file == ".." {
        return None;
    }
    pools
        .iter()
        .find(|(_, p)| p.trim_end_matches('/') == dir && !dir.is_empty())
        .map(|(name, _)| name.as_str())
}

/// A disk of a domain definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disk {
    pub path: String,
    /// The granted pool it is in.
    pub pool: String,
    /// `<driver type>`, `raw` when not given.
    pub format: String,
}

/// What libvirt has for a volume: its format and its backing file, if any; for a qcow2 volume,
/// the first bytes of the file ([`super::qcow2::head_length`]), read by the caller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeImage {
    pub format: Option<String>,
    pub backing: Option<String>,
    pub head: Option<Vec<u8>>,
}

fn child<'a, 'i>(node: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    node.children().find(|n| n.has_tag_name(name))
}

/// Reads a volume's XML (`virStorageVolGetXMLDesc`).
pub fn volume_image(xml: &str) -> VolumeImage {
    let Ok(doc) = Document::parse(xml) else {
        return VolumeImage::default();
    };
    let root = doc.root_element();
    let format = child(root, "target")
        .and_then(|t| child(t, "format"))
        .and_then(|f| f.attribute("type"))
        .map(str::to_string);
    let backing = child(root, "backingStore")
        .and_then(|b| child(b, "path"))
        .and_then(|p| p.text())
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty());
    VolumeImage {
        format,
        backing,
        head: None,
    }
}

/// Why `disk` may not be used, or `None`; `image_at` answers what libvirt has at a path (`None`
/// when no volume is there).
/// A backing file passes when it is a volume named with `prefix` directly in one of `pools`
/// (name, directory).
pub fn chain_problem<E>(
    disk: &Disk,
    pools: &[(String, String)],
    prefix: &str,
    mut image_at: impl FnMut(&str) -> Result<Option<VolumeImage>, E>,
) -> Result<Option<String>, E> {
    let Some(top) = image_at(&disk.path)? else {
        return Ok(Some(format!(
            "the disk `{}` is not a volume libvirt knows in pool {}; create it before defining the domain",
            disk.path, disk.pool
        )));
    };
    let format = top.format.clone().unwrap_or_else(|| "raw".into());
    // libvirt names an ISO 9660 file (a seed) `iso`; QEMU reads it as raw bytes.
    let same = format == disk.format || (disk.format == "raw" && format == "iso");
    if !same {
        return Ok(Some(format!(
            "the disk `{}` is given as <driver type='{}'> but the volume is {format} as libvirt reads it; give type='{format}'",
            disk.path, disk.format
        )));
    }
    let mut image = top;
    let mut path = disk.path.clone();
    for _ in 0..MAX_CHAIN {
        // Only a qcow2 image is parsed by QEMU for a backing file; raw bytes name nothing.
        if image.format.as_deref() != Some("qcow2") {
            return Ok(None);
        }
        // Its header as QEMU and libvirt read it: nothing but a backing file, and that one
        // only where libvirt sees it too (its view is what is checked below).
        let header = match image.head.as_deref().map(qcow2::references) {
            Some(Ok(references)) => references,
            Some(Err(why)) => {
                return Ok(Some(format!(
                    "the qcow2 image `{path}` (disk `{}`) may not be a disk: {why}; make qcow2 volumes with create-volume (libvirt writes their headers), and upload only raw data",
                    disk.path
                )));
            }
            None => {
                return Ok(Some(format!(
                    "the header of the qcow2 image `{path}` (disk `{}`) was not read",
                    disk.path
                )));
            }
        };
        if header.backing_file.is_some() != image.backing.is_some() {
            return Ok(Some(format!(
                "the qcow2 image `{path}` (disk `{}`) names a backing file {:?} in its header where libvirt reads {:?}; a header the two read differently may not be a disk",
                disk.path, header.backing_file, image.backing
            )));
        }
        let Some(backing) = image.backing else {
            return Ok(None);
        };
        if pool_of(&backing, pools, prefix).is_none() {
            return Ok(Some(format!(
                "the qcow2 disk `{}` has a backing file `{backing}` (named in its header) that is not a volume of this provider instance in a granted pool; make overlays with create-volume and a <backingStore> of your own volume",
                disk.path
            )));
        }
        match image_at(&backing)? {
            Some(next) => {
                image = next;
                path = backing;
            }
            None => {
                return Ok(Some(format!(
                    "the backing file `{backing}` of disk `{}` is not a volume libvirt knows",
                    disk.path
                )));
            }
        }
    }
    Ok(Some(format!(
        "the disk `{}` has more than {MAX_CHAIN} backing files",
        disk.path
    )))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const P: &str = "/pool/kvm-a.0123456789ab.";

    const PREFIX: &str = "kvm-a.0123456789ab.";

    /// A format given for the disk, the volumes libvirt has, and what the refusal says.
    type Case<'a> = (&'a str, Vec<(&'a str, VolumeImage)>, Option<&'a str>);

    /// A volume as libvirt reads it, a qcow2 one with the header that says so.
    fn image(format: &str, backing: Option<&str>) -> VolumeImage {
        let head = (format == "qcow2").then(|| {
            qcow2::build::Header {
                backing: backing.map(str::to_string),
                ..qcow2::build::Header::plain()
            }
            .bytes()
        });
        VolumeImage {
            format: Some(format.into()),
            backing: backing.map(str::to_string),
            head,
        }
    }

    /// A qcow2 volume whose header is `header` while libvirt reads `backing`.
    fn with_header(backing: Option<&str>, header: qcow2::build::Header) -> VolumeImage {
        VolumeImage {
            head: Some(header.bytes()),
            ..image("qcow2", backing)
        }
    }

    fn problem(format: &str, volumes: &[(&str, VolumeImage)]) -> Option<String> {
        let volumes: HashMap<String, VolumeImage> = volumes
            .iter()
            .map(|(p, i)| (p.to_string(), i.clone()))
            .collect();
        let disk = Disk {
            path: format!("{P}root"),
            pool: "default".into(),
            format: format.into(),
        };
        let pools = [("default".to_string(), "/pool".to_string())];
        chain_problem::<()>(&disk, &pools, PREFIX, |path| Ok(volumes.get(path).cloned())).unwrap()
    }

    #[test]
    fn chains_of_own_volumes_pass_and_others_are_refused() {
        let root = format!("{P}root");
        let base = format!("{P}base");
        let cases: Vec<Case<'_>> = vec![
            ("raw", vec![(&root, image("raw", None))], None),
            ("raw", vec![(&root, image("iso", None))], None),
            (
                "qcow2",
                vec![
                    (&root, image("qcow2", Some(&base))),
                    (&base, image("raw", None)),
                ],
                None,
            ),
            (
                "qcow2",
                vec![
                    (&root, image("qcow2", Some(&base))),
                    (&base, image("qcow2", None)),
                ],
                None,
            ),
            (
                "qcow2",
                vec![(&root, image("qcow2", Some("/etc/shadow")))],
                Some("backing file `/etc/shadow`"),
            ),
            (
                "qcow2",
                vec![(&root, image("qcow2", Some("/pool/victim.qcow2")))],
                Some("not a volume of this provider instance"),
            ),
            // Two levels down, still checked.
            (
                "qcow2",
                vec![
                    (&root, image("qcow2", Some(&base))),
                    (&base, image("qcow2", Some("/dev/sda"))),
                ],
                Some("`/dev/sda`"),
            ),
            (
                "raw",
                vec![(&root, image("qcow2", Some("/etc/shadow")))],
                Some("is qcow2 as libvirt reads it"),
            ),
            (
                "qcow2",
                vec![(&root, image("raw", None))],
                Some("is raw as libvirt reads it"),
            ),
            ("raw", vec![], Some("is not a volume libvirt knows")),
            (
                "qcow2",
                vec![(&root, image("qcow2", Some(&base)))],
                Some("is not a volume libvirt knows"),
            ),
            // An external data file, in the disk or further down the chain.
            (
                "qcow2",
                vec![(
                    &root,
                    with_header(
                        None,
                        qcow2::build::Header {
                            incompatible: 1 << 2,
                            ..qcow2::build::Header::plain()
                        },
                    ),
                )],
                Some("may not be a disk: its qcow2 header has an external data file"),
            ),
            (
                "qcow2",
                vec![
                    (&root, image("qcow2", Some(&base))),
                    (
                        &base,
                        with_header(
                            None,
                            qcow2::build::Header {
                                extensions: vec![(0x4441_5441, b"/dev/sda".to_vec())],
                                ..qcow2::build::Header::plain()
                            },
                        ),
                    ),
                ],
                Some("external data file `/dev/sda`"),
            ),
            // libvirt and the header disagree on the backing file.
            (
                "qcow2",
                vec![(
                    &root,
                    with_header(
                        None,
                        qcow2::build::Header {
                            backing: Some("/etc/shadow".into()),
                            ..qcow2::build::Header::plain()
                        },
                    ),
                )],
                Some("where libvirt reads None"),
            ),
            (
                "qcow2",
                vec![(
                    &root,
                    VolumeImage {
                        head: None,
                        ..image("qcow2", None)
                    },
                )],
                Some("was not read"),
            ),
            // A loop in the chain ends at the bound.
            (
                "qcow2",
                vec![(&root, image("qcow2", Some(&root)))],
                Some("more than 8 backing files"),
            ),
        ];
        for (format, volumes, refused) in cases {
            match (problem(format, &volumes), refused) {
                (None, None) => {}
                (Some(m), Some(says)) => assert!(m.contains(says), "{m}"),
                (got, want) => panic!("{format} {volumes:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn the_volume_xml_libvirt_answers_is_read() {
        let xml = "<volume type='file'><name>r</name><target><path>/pool/r</path><format type='qcow2'/></target>\
                   <backingStore><path>/pool/b</path><format type='raw'/></backingStore></volume>";
        assert_eq!(
            volume_image(xml),
            VolumeImage {
                head: None,
                ..image("qcow2", Some("/pool/b"))
            }
        );
        assert_eq!(
            volume_image("<volume><target><format type='raw'/></target><backingStore/></volume>"),
            image("raw", None)
        );
        assert_eq!(volume_image("<volume"), VolumeImage::default());
    }
}
