//! Escaping for the places text from a record lands that no template engine covers: the
//! terminal and Markdown (HTML is askama's: the report's templates escape every value). Names,
//! ids and host fields come from imported files too, so none of them is trusted: on a terminal
//! an ESC byte starts a control sequence (window title, screen clear, OSC 52 clipboard write),
//! in Markdown `<script>` is raw HTML that renderers pass through.

use std::borrow::Cow;
use std::fmt::Write;

/// Text made safe for a terminal: every control character except newline and tab (C0, DEL,
/// C1 — ESC, CSI, OSC, BEL, carriage return, backspace...) is shown as a visible `\u{..}`
/// escape, so printed data can never move the cursor, retitle the window or touch the
/// clipboard.
pub fn terminal(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_unsafe_control(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn is_unsafe_control(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

/// One line of Markdown text: HTML-significant characters become entities (Markdown passes raw
/// HTML through), Markdown punctuation is backslash-escaped (no imported emphasis, links,
/// headings, table cells or code spans), and line breaks and other control characters become
/// visible escapes so a value cannot start a new block.
pub fn markdown(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    // A list marker or an ordered-list number at the start would open a nested list.
    let leading_digits = text.chars().take_while(char::is_ascii_digit).count();
    for (i, c) in text.chars().enumerate() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\\' | '`' | '*' | '_' | '{' | '}' | '[' | ']' | '(' | ')' | '#' | '|' | '~' => {
                out.push('\\');
                out.push(c);
            }
            '-' | '+' if i == 0 => {
                out.push('\\');
                out.push(c);
            }
            '.' if i == leading_digits && i > 0 => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// One table cell of Markdown hvlab wrote itself around values (code spans, `_` in ioctl names
/// meant as they are): pipes escaped so the row keeps its columns, HTML-significant characters
/// as entities and line breaks and other control characters as visible escapes, as
/// [`markdown`] does; other Markdown punctuation is kept. A value standing alone takes
/// [`markdown`].
pub fn markdown_cell(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '|' => out.push_str("\\|"),
            c if c.is_control() => {
                let _ = write!(out, "\\\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// At most this many columns of padding: a name longer than this is printed whole but does not
/// widen the table (Rust's formatter refuses widths past `u16::MAX`, and a 65,536-character
/// imported name must not panic).
pub const MAX_COLUMN: usize = 64;

/// The column width for values of these lengths, bounded by [`MAX_COLUMN`].
pub fn column_width(lengths: impl IntoIterator<Item = usize>) -> usize {
    lengths.into_iter().max().unwrap_or(0).min(MAX_COLUMN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_escapes_esc_osc_csi_and_keeps_newlines() {
        let hostile = "a\x1b]0;owned\x07b\x1b[2J\u{9b}c\r\n\td\x7f";
        let safe = terminal(hostile);
        assert!(!safe.chars().any(is_unsafe_control), "{safe}");
        assert!(safe.contains("\\u{1b}]0;owned\\u{7}b"), "{safe}");
        assert!(safe.contains("\\u{9b}c\\u{d}\n\td\\u{7f}"), "{safe}");
        assert!(matches!(terminal("plain µs ×"), Cow::Borrowed(_)));
    }

    #[test]
    fn markdown_escapes_markup_and_block_breaks() {
        let md = markdown("<script>alert(1)</script> *x* [l](u) | a\n# h");
        assert!(!md.contains('<') && !md.contains('>'), "{md}");
        assert!(!md.contains('\n'), "{md}");
        assert!(md.contains("\\*x\\*") && md.contains("\\|"), "{md}");
    }

    #[test]
    fn a_cell_keeps_its_columns_and_its_code_spans() {
        let cell = markdown_cell("`KVM_IOEVENTFD` a|b <script>\nx");
        assert_eq!(cell, "`KVM_IOEVENTFD` a\\|b &lt;script&gt;\\\\u{a}x");
    }

    #[test]
    fn columns_never_exceed_the_bound() {
        assert_eq!(column_width([3, 70_000]), MAX_COLUMN);
        assert_eq!(column_width([3, 5]), 5);
        assert_eq!(column_width(std::iter::empty()), 0);
    }
}
