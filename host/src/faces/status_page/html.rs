//! HTML built so that no text can become markup: every string from the cluster, a plugin or a
//! crawler enters through [`esc`] (inside [`Cell::text`] and friends); markup comes only from the
//! fixed strings of `render.rs`.

use std::fmt::Write as _;

use crate::support::printable::printable;

/// `text` with `&`, `<`, `>`, `"` and `'` escaped: safe in element content and in a quoted
/// attribute value; control characters and their escape sequences are stripped first
/// ([`printable`]: a page copied into a terminal, or a plugin's message with a bidi override).
pub fn esc(text: &str) -> String {
    let text = printable(text);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A state's CSS class: one of a fixed set, whatever the state says.
pub fn tone(state: &str) -> &'static str {
    match state {
        "Ready" | "True" | "available" | "ok" => "good",
        "Unhealthy" | "Failed" | "False" | "unhealthy" | "not loaded" => "bad",
        "leased" => "busy",
        "coolingDown" | "Deleting" | "draining" => "warn",
        _ => "idle",
    }
}

/// One table cell, already escaped.
pub struct Cell(String);

impl Cell {
    pub fn text(text: &str) -> Cell {
        Cell(esc(text))
    }

    /// Text with its full form in a tooltip (a long digest or message shown short).
    pub fn short(text: &str, keep: usize) -> Cell {
        if text.chars().count() <= keep {
            return Cell::text(text);
        }
        let short: String = text.chars().take(keep).collect();
        Cell(format!(
            "<span title=\"{}\">{}…</span>",
            esc(text),
            esc(&short)
        ))
    }

    /// A state as a coloured badge (its class from [`tone`]).
    pub fn badge(state: &str) -> Cell {
        if state.is_empty() {
            return Cell(String::new());
        }
        Cell(format!(
            "<span class=\"badge {}\">{}</span>",
            tone(state),
            esc(state)
        ))
    }

    /// Text with a tooltip (a reason with its message).
    pub fn titled(text: &str, title: &str) -> Cell {
        if title.is_empty() {
            return Cell::text(text);
        }
        Cell(format!(
            "<span title=\"{}\">{}</span>",
            esc(title),
            esc(text)
        ))
    }

    /// The escaped markup, to place inside the page's own.
    pub fn into_html(self) -> String {
        self.0
    }

    pub fn number(n: impl std::fmt::Display) -> Cell {
        Cell(esc(&n.to_string()))
    }

    /// A number with a bar `of` the largest in its column.
    pub fn bar(n: u64, of: u64) -> Cell {
        let percent = (n * 100).checked_div(of).unwrap_or(0);
        Cell(format!(
            "<span class=\"bar\" style=\"width:{percent}%\"></span>{n}"
        ))
    }
}

/// A table with a fixed header; rows of cells.
pub struct Table {
    html: String,
}

impl Table {
    /// `id` and `headers` are the page's own fixed strings.
    pub fn new(id: &'static str, headers: &[&'static str]) -> Table {
        let mut html = format!("<table id=\"{id}\"><thead><tr>");
        for h in headers {
            let _ = write!(html, "<th>{h}</th>");
        }
        html.push_str("</tr></thead><tbody>");
        Table { html }
    }

    pub fn row(&mut self, cells: impl IntoIterator<Item = Cell>) {
        self.html.push_str("<tr>");
        for Cell(cell) in cells {
            let _ = write!(self.html, "<td>{cell}</td>");
        }
        self.html.push_str("</tr>");
    }

    pub fn finish(mut self) -> String {
        self.html.push_str("</tbody></table>");
        self.html
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_never_becomes_markup() {
        for (input, output) in [
            ("plain", "plain"),
            (
                "<script>alert(1)</script>",
                "&lt;script&gt;alert(1)&lt;/script&gt;",
            ),
            ("\" onmouseover=\"x", "&quot; onmouseover=&quot;x"),
            ("' autofocus '", "&#39; autofocus &#39;"),
            ("a & b", "a &amp; b"),
            ("&lt;", "&amp;lt;"),
        ] {
            assert_eq!(esc(input), output);
        }
        assert_eq!(
            Cell::short("<b>digest-0123456789</b>", 4).0,
            "<span title=\"&lt;b&gt;digest-0123456789&lt;/b&gt;\">&lt;b&gt;d…</span>"
        );
        assert_eq!(
            Cell::badge("<i>Ready</i>").0,
            "<span class=\"badge idle\">&lt;i&gt;Ready&lt;/i&gt;</span>"
        );
    }
}
