//! Tables and times as `kubectl px` prints them: columns padded to their widest cell, three
//! spaces apart as kubectl's, colour only when asked (a terminal without `NO_COLOR`). Pure.

use crate::support::printable::printable;

/// How a cell reads at a glance; only a coloured table shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    Plain,
    Good,
    Warn,
    Bad,
    Dim,
}

impl Tone {
    fn ansi(self) -> Option<&'static str> {
        match self {
            Tone::Plain => None,
            Tone::Good => Some("32"),
            Tone::Warn => Some("33"),
            Tone::Bad => Some("31"),
            Tone::Dim => Some("2"),
        }
    }
}

/// `text` in `tone`, when `colour`.
pub fn paint(text: &str, tone: Tone, colour: bool) -> String {
    match tone.ansi() {
        Some(code) if colour && !text.is_empty() => format!("\x1b[{code}m{text}\x1b[0m"),
        _ => text.to_string(),
    }
}

/// A header in bold, when `colour`.
pub fn bold(text: &str, colour: bool) -> String {
    if colour {
        format!("\x1b[1m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    pub text: String,
    pub tone: Tone,
}

impl Cell {
    /// A cell of `text` without its control characters ([`printable`]): a cell's text is a
    /// plugin's or the cluster's, and only [`paint`] adds escape sequences.
    pub fn new(text: impl Into<String>, tone: Tone) -> Self {
        Cell {
            text: printable(&text.into()),
            tone,
        }
    }
}

impl From<String> for Cell {
    fn from(text: String) -> Self {
        Cell::new(text, Tone::Plain)
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Self {
        Cell::new(text, Tone::Plain)
    }
}

/// A table: upper-case headers, one row per object.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<Cell>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Self {
        Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<Cell>) {
        debug_assert_eq!(row.len(), self.headers.len(), "one cell per column");
        self.rows.push(row);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Drops the first column (NAMESPACE when one namespace is shown).
    pub fn without_first_column(mut self) -> Self {
        self.headers.remove(0);
        for row in &mut self.rows {
            row.remove(0);
        }
        self
    }

    /// The lines, each ending in `\n`; no trailing spaces.
    pub fn render(&self, colour: bool) -> String {
        let width = |text: &str| text.chars().count();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                widths[i] = widths[i].max(width(&cell.text));
            }
        }
        let line = |cells: Vec<(String, usize)>| {
            let last = cells.len().saturating_sub(1);
            let mut out = String::new();
            for (i, (shown, len)) in cells.into_iter().enumerate() {
                out.push_str(&shown);
                if i < last {
                    out.push_str(&" ".repeat(widths[i] - len + 3));
                }
            }
            out.truncate(out.trim_end().len());
            out.push('\n');
            out
        };
        let mut out = line(
            self.headers
                .iter()
                .map(|h| (bold(h, colour), width(h)))
                .collect(),
        );
        for row in &self.rows {
            out.push_str(&line(
                row.iter()
                    .map(|c| (paint(&c.text, c.tone, colour), width(&c.text)))
                    .collect(),
            ));
        }
        out
    }
}

/// How long ago `from_ms` was, as kubectl's AGE column: `45s`, `12m`, `5h`, `3d`.
pub fn age(from_ms: u64, now_ms: u64) -> String {
    short_duration(now_ms.saturating_sub(from_ms) / 1000)
}

/// `in 4m` or `3m ago`.
pub fn relative(at_ms: u64, now_ms: u64) -> String {
    if at_ms >= now_ms {
        format!("in {}", short_duration((at_ms - now_ms).div_ceil(1000)))
    } else {
        format!("{} ago", short_duration((now_ms - at_ms) / 1000))
    }
}

fn short_duration(seconds: u64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 120 * 60 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// Milliseconds since the epoch as RFC 3339 (UTC), as the discovery API writes times.
pub fn rfc3339(ms: u64) -> String {
    k8s_openapi::jiff::Timestamp::from_millisecond(ms as i64)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// A Kubernetes time in milliseconds since the epoch.
pub fn millis(time: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> u64 {
    time.0.as_millisecond().max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_and_colour_does_not_shift_them() {
        let mut table = Table::new(&["NAME", "PHASE"]);
        table.push(vec!["egress-1".into(), Cell::new("Ready", Tone::Good)]);
        table.push(vec!["e".into(), Cell::new("Unhealthy", Tone::Bad)]);
        assert_eq!(
            table.render(false),
            "NAME       PHASE\negress-1   Ready\ne          Unhealthy\n"
        );
        let coloured = table.render(true);
        assert!(coloured.contains("\x1b[32mReady\x1b[0m"), "{coloured:?}");
        assert!(coloured.contains("\x1b[1mNAME\x1b[0m       \x1b[1mPHASE"));
        let plain: String = coloured
            .replace("\x1b[32m", "")
            .replace("\x1b[31m", "")
            .replace("\x1b[1m", "")
            .replace("\x1b[0m", "");
        assert_eq!(plain, table.render(false));
    }

    #[test]
    fn an_empty_last_cell_leaves_no_trailing_space() {
        let mut table = Table::new(&["A", "B"]);
        table.push(vec!["x".into(), "".into()]);
        assert_eq!(table.render(false), "A   B\nx\n");
        assert_eq!(table.without_first_column().render(false), "B\n\n");
    }

    #[test]
    fn times_read_as_kubectl_writes_them() {
        let table = [
            (0, "0s"),
            (45_000, "45s"),
            (119_999, "119s"),
            (120_000, "2m"),
            (3_600_000, "60m"),
            (7_200_000, "2h"),
            (47 * 3_600_000, "47h"),
            (48 * 3_600_000, "2d"),
        ];
        for (ms, expected) in table {
            assert_eq!(age(1_000_000_000 - ms, 1_000_000_000), expected, "{ms}");
        }
        assert_eq!(relative(1_000_240_000, 1_000_000_000), "in 4m");
        assert_eq!(relative(1_000_000_500, 1_000_000_000), "in 1s");
        assert_eq!(relative(999_820_000, 1_000_000_000), "3m ago");
        assert_eq!(rfc3339(1_764_494_647_412), "2025-11-30T09:24:07.412Z");
    }
}
