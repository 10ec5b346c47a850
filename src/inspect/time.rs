//! Unix milliseconds ⇄ RFC 3339 in UTC (`YYYY-MM-DDTHH:MM:SS.mmmZ`), for human
//! output and `--since/--until` (humantime: real calendar validation, no
//! arithmetic of our own).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn format_ms(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
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

    #[test]
    fn impossible_dates_and_dates_before_1970_are_errors() {
        assert!(parse_time("2026-02-30").is_err(), "February has no 30th");
        assert!(parse_time("2025-02-29").is_err(), "2025 is no leap year");
        assert!(parse_time("2024-02-29").is_ok());
        assert!(parse_time("1969-12-31").unwrap_err().contains("before 1970"));
        assert!(parse_time("2026-01-01T00:00:00+02:00").is_err(), "UTC only");
    }
}
