//! Telling a site's block from its answer, on plain-HTTP responses the gateway can read: a
//! status the pool names, or a text the pool names in the start of the body (a captcha page
//! answered with 200). Squid's own error pages are never a site's block.
//!
//! The body is looked at only when the pool names patterns, and only its first
//! [`SNIFFED_BODY`] bytes as they are relayed: a copy into a bounded buffer, no other per-byte
//! work on the relay.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// How much of a response body the patterns are looked for in.
pub const SNIFFED_BODY: usize = 32 * 1024;

/// Whether a response is the site blocking the proxy. `body`: the start of the body as sent
/// (only needed when `patterns` is not empty).
pub fn is_block(
    status: u16,
    from_squid: bool,
    statuses: &[u16],
    patterns: &[String],
    body: &[u8],
) -> bool {
    if from_squid {
        return false;
    }
    statuses.contains(&status) || patterns.iter().any(|p| contains_ignoring_case(body, p))
}

/// `needle` in `haystack`, ASCII letters compared without case. A plain scan: at most
/// [`SNIFFED_BODY`] bytes by a few short patterns, once per response.
fn contains_ignoring_case(haystack: &[u8], needle: &str) -> bool {
    let needle = needle.as_bytes();
    !needle.is_empty()
        && haystack
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

/// A reader that keeps a copy of the first `limit` bytes read through it.
pub struct Sniffed<'a, R> {
    inner: R,
    kept: &'a mut Vec<u8>,
    limit: usize,
}

impl<'a, R> Sniffed<'a, R> {
    /// `kept` may already hold the body's first bytes (read with the head).
    pub fn new(inner: R, kept: &'a mut Vec<u8>, limit: usize) -> Self {
        kept.truncate(limit);
        Sniffed { inner, kept, limit }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Sniffed<'_, R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        let room = this.limit.saturating_sub(this.kept.len());
        if room > 0 && matches!(polled, Poll::Ready(Ok(()))) {
            let new = &buf.filled()[before..];
            this.kept.extend_from_slice(&new[..new.len().min(room)]);
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[test]
    fn statuses_and_body_patterns_make_a_block_and_squid_pages_never_do() {
        let statuses = [403, 429];
        let patterns = vec!["captcha".to_string(), "Access Denied".to_string()];
        // status, from squid, patterns, body, a block
        type Case<'a> = (u16, bool, &'a [String], &'a [u8], bool);
        let cases: &[Case] = &[
            (429, false, &[], b"", true),
            (200, false, &[], b"<h1>CAPTCHA</h1>", false),
            (
                200,
                false,
                &patterns,
                b"<h1>Please solve the CAPTCHA</h1>",
                true,
            ),
            (200, false, &patterns, b"<p>access denied</p>", true),
            (200, false, &patterns, b"<p>welcome</p>", false),
            (404, false, &patterns, b"", false),
            // Squid's own refusal (its ACLs) says nothing of the site.
            (403, true, &patterns, b"Access Denied", false),
        ];
        for (status, from_squid, patterns, body, block) in cases {
            assert_eq!(
                is_block(*status, *from_squid, &statuses, patterns, body),
                *block,
                "{status} squid={from_squid} {:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[tokio::test]
    async fn a_sniffed_reader_keeps_only_the_start_and_passes_everything_on() {
        let body = vec![b'x'; 100];
        let mut kept = b"head".to_vec();
        let mut all = Vec::new();
        Sniffed::new(&body[..], &mut kept, 10)
            .read_to_end(&mut all)
            .await
            .unwrap();
        assert_eq!(all, body);
        assert_eq!(kept, b"headxxxxxx");
    }
}
