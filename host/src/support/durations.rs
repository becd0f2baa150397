//! Durations as users write them in flags and specs (`30s`, `5m`, `1h 30m`, `500ms`, `7d`, or
//! ISO 8601's `PT5M`): jiff's "friendly" format, since jiff is here already through k8s-openapi
//! (one duration parser in the build, not a second crate for it). Days and weeks count 24 and
//! 168 hours; months and years are refused (their length depends on the date).

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Span, SpanRelativeTo};

/// Parses `text`; the error says what was wrong and shows the forms accepted.
pub fn parse(text: &str) -> Result<Duration, String> {
    let signed = text.parse::<SignedDuration>().or_else(|plain| {
        // Days and weeks are calendar units to SignedDuration; as a Span they are 24 h and 7 d.
        text.parse::<Span>()
            .map_err(|_| plain.to_string())?
            .to_duration(SpanRelativeTo::days_are_24_hours())
            .map_err(|e| e.to_string())
    });
    let signed = signed
        .map_err(|e| format!("`{text}` is not a duration such as 30s, 5m, 1h 30m or 7d: {e}"))?;
    Duration::try_from(signed)
        .map_err(|_| format!("`{text}` is negative: a duration here is 0s or more"))
}

/// `d` as [`parse`] reads it back, e.g. `1h 30m`.
pub fn format(d: Duration) -> String {
    match SignedDuration::try_from(d) {
        Ok(signed) => format!("{signed:#}"),
        Err(_) => format!("{}s", d.as_secs()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("0s", 0)]
    #[case("10s", 10)]
    #[case("300s", 300)]
    #[case("5m", 300)]
    #[case("1h", 3600)]
    #[case("1h 30m", 5400)]
    #[case("1h30m", 5400)]
    #[case("2 hours", 7200)]
    #[case("24h", 86_400)]
    #[case("1d", 86_400)]
    #[case("7d", 604_800)]
    #[case("1w", 604_800)]
    #[case("PT5M", 300)]
    fn what_users_write_is_read(#[case] text: &str, #[case] secs: u64) {
        assert_eq!(parse(text), Ok(Duration::from_secs(secs)));
        assert_eq!(
            parse(&format(Duration::from_secs(secs))),
            Ok(Duration::from_secs(secs))
        );
    }

    #[test]
    fn milliseconds_are_kept() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(format(Duration::from_millis(1500)), "1s 500ms");
    }

    #[rstest]
    #[case("", "not a duration")]
    #[case("5", "not a duration")]
    #[case("abc", "not a duration")]
    #[case("1mo", "not a duration")]
    #[case("1y", "not a duration")]
    #[case("-5s", "negative")]
    #[case("-1d", "negative")]
    fn the_error_says_what_is_wrong(#[case] text: &str, #[case] expected: &str) {
        let error = parse(text).unwrap_err();
        assert!(error.contains(expected), "{text}: {error}");
        assert!(error.contains(&format!("`{text}`")), "{error}");
    }
}
