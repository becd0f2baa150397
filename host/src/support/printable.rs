//! Text from somebody else (a plugin's message, a condition, an event) made safe to print on a
//! terminal or a page: every control character goes, and with it the rest of the escape
//! sequence it starts, so an OSC 52 sequence cannot write the reader's clipboard, a CSI
//! sequence cannot move the cursor or repaint what was printed before, and a carriage return
//! cannot overwrite a line (docs/security.md, "What a reader is shown").

/// `text` without control characters: C0 (U+0000–U+001F) and DEL, C1 (U+0080–U+009F), the
/// Unicode bidirectional overrides and isolates (they reorder what a reader sees, as in
/// "Trojan source"), and the whole of every escape sequence one of them starts (ESC `[` … final
/// byte, ESC `]`/`P`/`X`/`^`/`_` … BEL or ST, ESC and one character; the C1 forms CSI, OSC, DCS,
/// SOS, PM and APC alike). A tab, newline or carriage return becomes one space: a message stays
/// on its own line and in its own column. Everything else, non-ASCII text included, is kept.
pub fn printable(text: &str) -> String {
    if !text.chars().any(is_control) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\t' | '\n' | '\r' => out.push(' '),
            '\x1b' => match chars.next() {
                Some('[') => skip_csi(&mut chars),
                Some(']' | 'P' | 'X' | '^' | '_') => skip_string(&mut chars),
                // ESC and one character (`ESC c` resets the terminal, `ESC 7` saves the
                // cursor, …); ESC at the end is dropped alone.
                Some(_) | None => {}
            },
            '\u{9b}' => skip_csi(&mut chars),
            '\u{90}' | '\u{98}' | '\u{9d}' | '\u{9e}' | '\u{9f}' => skip_string(&mut chars),
            c if is_control(c) => {}
            c => out.push(c),
        }
    }
    out
}

fn is_control(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A CSI sequence's parameter and intermediate bytes, up to and with its final byte
/// (U+0040–U+007E); a character outside the sequence's alphabet ends it too (and is dropped:
/// a broken sequence is not text either).
fn skip_csi(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    for c in chars.by_ref() {
        if !('\u{20}'..='\u{3f}').contains(&c) {
            return;
        }
    }
}

/// A control string (OSC, DCS, SOS, PM, APC) up to its terminator: BEL, ESC `\` or ST (U+009C).
/// Unterminated, it runs to the end of the text: a terminal would swallow the same.
fn skip_string(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    while let Some(c) = chars.next() {
        match c {
            '\x07' | '\u{9c}' => return,
            '\x1b' => {
                if chars.peek() == Some(&'\\') {
                    chars.next();
                }
                return;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn control_characters_and_their_sequences_are_stripped() {
        // (what a plugin says, what a reader is shown)
        let cases = [
            ("plain text: quota 429", "plain text: quota 429"),
            (
                "non-ASCII stays: zürich, 東京, 🙂",
                "non-ASCII stays: zürich, 東京, 🙂",
            ),
            ("", ""),
            // OSC 52: writes the reader's clipboard; with BEL and with ST.
            ("ok\x1b]52;c;Y3VybCBldmlsLnNo\x07 done", "ok done"),
            ("ok\x1b]52;c;Y3VybCBldmlsLnNo\x1b\\ done", "ok done"),
            // OSC 8 hyperlink (a link that says one thing and goes elsewhere).
            (
                "\x1b]8;;https://evil.example/\x1b\\docs\x1b]8;;\x1b\\",
                "docs",
            ),
            // OSC 0: the window title.
            ("\x1b]0;root@prod\x07x", "x"),
            // CSI: colour, cursor up and erase line (repaint what was printed above).
            ("\x1b[31mred\x1b[0m", "red"),
            ("Ready\x1b[1A\x1b[2KFailed", "ReadyFailed"),
            ("\x1b[?1049h", ""),
            // Two-character escapes: reset, save cursor; a lone ESC at the end.
            ("a\x1bcb\x1b7c\x1b", "abc"),
            // Carriage return, newline, tab: one space each (no overwriting, no new line).
            ("fine\rEVIL", "fine EVIL"),
            ("line one\nline two\tend", "line one line two end"),
            // Other C0 and DEL.
            ("bell\x07 nul\0 bs\x08 del\x7f", "bell nul bs del"),
            // C1: CSI, OSC (ST-terminated), DCS, NEL, and a lone ST.
            ("\u{9b}31mred", "red"),
            ("\u{9d}52;c;eHg=\u{9c}after", "after"),
            ("\u{90}qpayload\x1b\\after", "after"),
            ("a\u{85}b\u{9c}c", "abc"),
            // Bidirectional overrides and isolates.
            ("evil\u{202e}txt.exe\u{202c}", "eviltxt.exe"),
            ("a\u{2066}b\u{2069}", "ab"),
            // Unterminated OSC: the rest is swallowed, as a terminal would.
            ("ok\x1b]52;c;never ends", "ok"),
        ];
        for (said, shown) in cases {
            assert_eq!(printable(said), shown, "{said:?}");
            assert!(!printable(said).chars().any(|c| c.is_control()), "{said:?}");
        }
    }
}
