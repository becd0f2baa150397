//! Timestamps as cloud APIs write them, for `instance.created-at`.

/// Seconds since the Unix epoch of an RFC 3339 timestamp: `2026-11-30T19:30:00Z` (Kubernetes),
/// `2026-11-30T11:22:33.123-08:00` (Compute Engine); fractions are dropped. By hand: a date crate
/// for this one format would be a large part of a plugin.
pub fn unix_seconds(timestamp: &str) -> Option<i64> {
    let b = timestamp.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' {
        return None;
    }
    let number = |s: &str| s.parse::<i64>().ok();
    let (year, month, day) = (
        number(&timestamp[0..4])?,
        number(&timestamp[5..7])?,
        number(&timestamp[8..10])?,
    );
    let (hour, minute, second) = (
        number(&timestamp[11..13])?,
        number(&timestamp[14..16])?,
        number(&timestamp[17..19])?,
    );
    let mut rest = &timestamp[19..];
    if let Some(fraction) = rest.strip_prefix('.') {
        rest = fraction.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    let offset = match rest {
        "Z" => 0,
        _ if rest.len() == 6 && (rest.starts_with('+') || rest.starts_with('-')) => {
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            sign * (number(&rest[1..3])? * 3600 + number(&rest[4..6])? * 60)
        }
        _ => return None,
    };
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    Some(days * 86_400 + hour * 3600 + minute * 60 + second - offset)
}

#[cfg(test)]
mod tests {
    use super::unix_seconds;

    #[test]
    fn kubernetes_and_compute_timestamps() {
        assert_eq!(unix_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(unix_seconds("2000-03-01T00:00:00Z"), Some(951_868_800));
        assert_eq!(unix_seconds("2026-11-30T19:30:00Z"), Some(1_796_067_000));
        assert_eq!(unix_seconds("1970-01-01T00:00:00.5+01:00"), Some(-3600));
        assert_eq!(
            unix_seconds("2026-11-30T11:22:33.123-08:00"),
            Some(1_796_066_553)
        );
        assert_eq!(unix_seconds("2026-11-30 19:30:00"), None);
        assert_eq!(unix_seconds("2026-11-30"), None);
    }
}
