//! Unix milliseconds ⇄ RFC 3339 in UTC (`YYYY-MM-DDTHH:MM:SS.mmmZ`), for human
//! output and `--since/--until` (humantime: real calendar validation, no
//! arithmetic of our own).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The last instant RFC 3339 can write (`9999-12-31T23:59:59.999Z`), in Unix ms.
pub const RFC3339_MS_MAX: u64 = 253_402_300_799_999;

/// Total: every `u64` formats. A time no RFC 3339 year can hold (a tampered or
/// garbled record: the forensic tools exist for those) is written as its number,
/// `unix-ms:N (after 9999-12-31)`, never a panic.
pub fn format_ms(ms: u64) -> String {
    if ms > RFC3339_MS_MAX {
        return format!("unix-ms:{ms} (after 9999-12-31)");
    }
    let mut out = String::with_capacity(24);
    let at = humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms));
    // `Display` of humantime's timestamp fails only past year 9999 (excluded above);
    // a formatting error is still never a panic here.
    if std::fmt::write(&mut out, format_args!("{at}")).is_err() {
        return format!("unix-ms:{ms}");
    }
    out
}

/// Accepts Unix milliseconds, `YYYY-MM-DD` (midnight UTC), or RFC 3339 in UTC
/// (`YYYY-MM-DDTHH:MM:SS[.fff]Z`). A date that does not exist (`2026-02-30`) or
/// lies before 1970 is an error, never a wrapped-around instant.
pub fn parse_time(s: &str) -> Result<u64, String> {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().map_err(|e| format!("{s:?}: {e}"));
    }
    if s.get(..4).and_then(|y| y.parse::<u32>().ok()).is_some_and(|y| y < 1970) {
        return Err(format!("{s:?} is before 1970"));
    }
    let full = if s.len() == 10 { format!("{s}T00:00:00Z") } else { s.to_owned() };
    if !full.ends_with('Z') {
        return Err(format!("{s:?}: give the time in UTC, ending in Z"));
    }
    let t = humantime::parse_rfc3339(&full)
        .map_err(|e| format!("{s:?} is not Unix ms, YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS[.fff]Z: {e}"))?;
    let since = t.duration_since(UNIX_EPOCH).map_err(|_| format!("{s:?} is before 1970"))?;
    u64::try_from(since.as_millis()).map_err(|_| format!("{s:?} is out of range"))
}

/// The wall clock now, in ms since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants_format_and_parse_back() {
        assert_eq!(format_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_ms(1_767_225_600_250), "2026-01-01T00:00:00.250Z");
        assert_eq!(format_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        for ms in [0, 1_767_225_600_250, 951_782_400_000, 4_102_444_799_999] {
            assert_eq!(parse_time(&format_ms(ms)), Ok(ms));
        }
        assert_eq!(parse_time("2026-01-01"), Ok(1_767_225_600_000));
        assert_eq!(parse_time("2026-01-01T00:00:01Z"), Ok(1_767_225_601_000));
        assert_eq!(parse_time("2026-01-01T00:00:01.5Z"), Ok(1_767_225_601_500));
        assert!(parse_time("yesterday").is_err() && parse_time("2026-13-01").is_err());
    }

    /// Proves: every u64 formats (a record's `time_ms` is whatever its writer, or a
    /// forger, put there), the last writable instant as RFC 3339, anything later
    /// as its number.
    #[test]
    fn every_u64_formats_without_panicking() {
        assert_eq!(format_ms(RFC3339_MS_MAX), "9999-12-31T23:59:59.999Z");
        assert_eq!(format_ms(RFC3339_MS_MAX + 1), "unix-ms:253402300800000 (after 9999-12-31)");
        assert_eq!(format_ms(u64::MAX), "unix-ms:18446744073709551615 (after 9999-12-31)");
        for shift in 0..64 {
            let _ = format_ms(1u64 << shift);
            let _ = format_ms(u64::MAX >> shift);
        }
    }

    #[test]
    fn impossible_dates_and_dates_before_1970_are_errors() {
        assert!(parse_time("2026-02-30").is_err(), "February has no 30th");
        assert!(parse_time("2025-02-29").is_err(), "2025 is no leap year");
        assert!(parse_time("2024-02-29").is_ok());
        assert!(parse_time("1969-12-31").unwrap_err().contains("before 1970"));
        assert!(parse_time("2026-01-01T00:00:00+02:00").is_err(), "UTC only");
    }
}
