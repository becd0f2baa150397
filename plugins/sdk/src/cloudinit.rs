//! cloud-init data from several parts: one part as it is, several as one MIME multipart (each
//! part typed from its first line, as cloud-init's own table does), which cloud-init runs part by
//! part. Used for vendor-data, which providers compose from their own scripts and the user's.

/// Combines `parts` (empty ones skipped): none gives `None`, one is used byte for byte, more
/// become a [`multipart`].
pub fn combine(parts: &[&[u8]]) -> Option<Vec<u8>> {
    let parts: Vec<&[u8]> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
    match parts.as_slice() {
        [] => None,
        [one] => Some(one.to_vec()),
        many => Some(multipart(many)),
    }
}

/// The MIME type cloud-init gives a part starting like `data` (its own "starts with" table).
pub fn part_content_type(data: &[u8]) -> &'static str {
    let first_line = data.split(|b| *b == b'\n').next().unwrap_or_default();
    let first_line = first_line.strip_suffix(b"\r").unwrap_or(first_line);
    const TABLE: &[(&[u8], &str)] = &[
        (b"#cloud-config-archive", "text/cloud-config-archive"),
        (b"#cloud-config-jsonp", "text/cloud-config-jsonp"),
        (b"#cloud-config", "text/cloud-config"),
        (b"#cloud-boothook", "text/cloud-boothook"),
        (b"#include-once", "text/x-include-once-url"),
        (b"#include", "text/x-include-url"),
        (b"#part-handler", "text/part-handler"),
        (b"#upstart-job", "text/upstart-job"),
        (b"## template: jinja", "text/jinja2"),
        (b"#!", "text/x-shellscript"),
    ];
    TABLE
        .iter()
        .find(|(prefix, _)| first_line.starts_with(prefix))
        .map_or("text/plain", |(_, mime)| mime)
}

/// Builds a `multipart/mixed` message of `parts`, each typed by [`part_content_type`]. Text parts
/// go as 8bit, anything that is not UTF-8 (e.g. gzip) as base64. A part that is already a MIME
/// entity (starts with `Content-Type:`) is nested as it is. The boundary is derived from the
/// content and never occurs in it, so the same parts give the same bytes.
pub fn multipart(parts: &[&[u8]]) -> Vec<u8> {
    let mut seed = 0u64;
    for part in parts {
        seed ^= crate::hash::fnv1a(part);
    }
    let mut boundary = format!("==proxy-operator-{seed:016x}==");
    let mut n = 0u32;
    while parts.iter().any(|p| contains(p, boundary.as_bytes())) {
        n += 1;
        boundary = format!("==proxy-operator-{seed:016x}-{n}==");
    }
    let mut out = Vec::new();
    out.extend_from_slice(
        format!("Content-Type: multipart/mixed; boundary=\"{boundary}\"\nMIME-Version: 1.0\n\n")
            .as_bytes(),
    );
    for (i, part) in parts.iter().enumerate() {
        out.extend_from_slice(format!("--{boundary}\n").as_bytes());
        if is_mime_entity(part) {
            out.extend_from_slice(part);
        } else {
            let filename = format!("part-{:03}", i + 1);
            match std::str::from_utf8(part) {
                Ok(text) => {
                    out.extend_from_slice(
                        format!(
                            "Content-Type: {}; charset=\"utf-8\"\nMIME-Version: 1.0\nContent-Transfer-Encoding: 8bit\nContent-Disposition: attachment; filename=\"{filename}\"\n\n",
                            part_content_type(part)
                        )
                        .as_bytes(),
                    );
                    out.extend_from_slice(text.as_bytes());
                }
                Err(_) => {
                    let mime = if part.starts_with(&[0x1f, 0x8b]) {
                        "application/x-gzip"
                    } else {
                        "application/octet-stream"
                    };
                    out.extend_from_slice(
                        format!(
                            "Content-Type: {mime}\nMIME-Version: 1.0\nContent-Transfer-Encoding: base64\nContent-Disposition: attachment; filename=\"{filename}\"\n\n"
                        )
                        .as_bytes(),
                    );
                    out.extend_from_slice(base64_lines(part).as_bytes());
                }
            }
        }
        out.push(b'\n');
    }
    out.extend_from_slice(format!("--{boundary}--\n").as_bytes());
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn is_mime_entity(part: &[u8]) -> bool {
    part.len() >= 13 && part[..13].eq_ignore_ascii_case(b"content-type:")
}

/// Base64 (RFC 4648, with padding) in 76-character lines.
pub fn base64_lines(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len() * 4 / 3 + data.len() / 57 + 4);
    for (i, chunk) in data.chunks(3).enumerate() {
        if i > 0 && i % 19 == 0 {
            out.push('\n');
        }
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(ALPHABET[(n >> 18) as usize & 63] as char);
        out.push(ALPHABET[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 {
            ALPHABET[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if chunk.len() > 2 {
            ALPHABET[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combine_skips_empty_parts() {
        assert_eq!(combine(&[]), None);
        assert_eq!(combine(&[b"", b""]), None);
        assert_eq!(combine(&[b"", b"#!/bin/sh\n"]).unwrap(), b"#!/bin/sh\n");
        assert!(
            combine(&[b"#!/bin/sh\n", b"#cloud-config\n"])
                .unwrap()
                .starts_with(b"Content-Type: multipart/mixed;")
        );
    }

    #[test]
    fn boundary_never_occurs_in_a_part() {
        let a: &[u8] = b"#!/bin/sh\n";
        let seed = crate::hash::fnv1a(a) ^ crate::hash::fnv1a(b"x");
        let trap = format!("#!/bin/sh\n# ==proxy-operator-{seed:016x}==\n");
        let parts: [&[u8]; 2] = [trap.as_bytes(), b"x"];
        let seed = crate::hash::fnv1a(parts[0]) ^ crate::hash::fnv1a(parts[1]);
        let trap2 = format!("# ==proxy-operator-{seed:016x}==\n");
        let with_trap = [trap.as_bytes(), trap2.as_bytes()];
        let out = String::from_utf8(multipart(&with_trap)).unwrap();
        let boundary = out.split('"').nth(1).unwrap();
        assert!(!trap.contains(boundary) && !trap2.contains(boundary));
    }

    #[test]
    fn binary_and_mime_parts() {
        let gzip: &[u8] = &[0x1f, 0x8b, 0x08, 0x00, 0xff, 0xfe];
        let mime: &[u8] = b"Content-Type: multipart/mixed; boundary=\"inner\"\n\n--inner\nContent-Type: text/cloud-config\n\n#cloud-config\n--inner--\n";
        let out = String::from_utf8(multipart(&[gzip, mime])).unwrap();
        assert!(out.contains("Content-Type: application/x-gzip\nMIME-Version: 1.0\nContent-Transfer-Encoding: base64\n"));
        assert!(out.contains("\n\nH4sIAP/+\n"));
        assert!(
            out.contains(&format!("--\n{}", std::str::from_utf8(mime).unwrap()))
                || out.contains(std::str::from_utf8(mime).unwrap())
        );
    }

    #[test]
    fn content_types() {
        assert_eq!(part_content_type(b"#!/bin/sh\n"), "text/x-shellscript");
        assert_eq!(part_content_type(b"#cloud-config\r\n"), "text/cloud-config");
        assert_eq!(
            part_content_type(b"#cloud-config-archive\n"),
            "text/cloud-config-archive"
        );
        assert_eq!(
            part_content_type(b"#cloud-boothook\n"),
            "text/cloud-boothook"
        );
        assert_eq!(
            part_content_type(b"#include\nhttp://x\n"),
            "text/x-include-url"
        );
        assert_eq!(part_content_type(b"hello"), "text/plain");
    }

    #[test]
    fn base64_vectors() {
        assert_eq!(base64_lines(b""), "");
        assert_eq!(base64_lines(b"f"), "Zg==");
        assert_eq!(base64_lines(b"fo"), "Zm8=");
        assert_eq!(base64_lines(b"foobar"), "Zm9vYmFy");
        let long = base64_lines(&[0u8; 60]);
        assert_eq!(long.lines().next().unwrap().len(), 76);
        assert_eq!(long.len(), 80 + 1);
    }
}
