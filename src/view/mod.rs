//! How the services show what a log holds, shared by the inspector, the audit
//! and the daemon: text that is safe to print whatever a writer (or a forger)
//! put in a record ([`escape_controls`]), times ([`time`]), a record as JSON and a
//! refused caller as text ([`record`]).

pub mod record;
pub mod time;

use std::borrow::Cow;

/// `s` with every control character (C0, DEL, C1: ESC, newline, NUL, …) written
/// as its Rust escape (`\u{1b}`, `\n`, `\0`), so that a field printed to a terminal
/// can neither send it escape sequences nor forge a line of output. Text without
/// control characters (nearly all) is returned as it is.
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_hidden) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else if is_hidden(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A character that changes how text around it is shown without being seen
/// itself: a control character, or a format character of the kinds a forger uses
/// — bidirectional overrides and isolates (which reorder a line on screen), zero
/// width spaces and joiners, the byte order mark, soft hyphen, interlinear marks.
pub fn is_hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{061C}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
        )
}

/// `writeln!` for one line of a text report: the line is formatted whole, then its
/// control characters are escaped (the fields are the only source of them: no
/// format string of a report holds one), then the newline ends it.
#[macro_export]
#[doc(hidden)]
macro_rules! text_line {
    ($out:expr, $($arg:tt)*) => {{
        let line = format!($($arg)*);
        writeln!($out, "{}", $crate::view::escape_controls(&line))
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Proves: escapes, newlines, NUL, DEL and C1 controls are written as escapes,
    /// printable text (non-ASCII included) is kept as it is.
    #[test]
    fn control_characters_are_escaped_and_printable_text_is_kept() {
        assert_eq!(escape_controls("plain ümlaut ✓"), "plain ümlaut ✓");
        assert!(matches!(escape_controls("plain"), Cow::Borrowed(_)));
        assert_eq!(escape_controls("a\x1b[31mred\nforged\0\x7f\u{9b}"), "a\\u{1b}[31mred\\nforged\\u{0}\\u{7f}\\u{9b}");
        assert_eq!(escape_controls("txt\u{202E}gpj.exe"), "txt\\u{202e}gpj.exe", "a bidi override");
        assert_eq!(escape_controls("a\u{200B}b\u{FEFF}"), "a\\u{200b}b\\u{feff}");
    }
}
