//! Unix milliseconds ⇄ `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC), for human output and
//! `--since/--until`. Pure; the civil-date arithmetic is the standard days-from-civil
//! algorithm (proleptic Gregorian calendar).

pub fn format_ms(ms: u64) -> String {
    let (days, rem) = ((ms / 86_400_000) as i64, ms % 86_400_000);
    let (y, m, d) = civil_from_days(days);
    let (h, min, s, milli) = (rem / 3_600_000, rem / 60_000 % 60, rem / 1000 % 60, rem % 1000);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{milli:03}Z")
}

/// Accepts Unix milliseconds, or `YYYY-MM-DDTHH:MM:SS[.fff]Z`, or `YYYY-MM-DD`.
pub fn parse_time(s: &str) -> Result<u64, String> {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().map_err(|e| format!("{s:?}: {e}"));
    }
    let bad = || format!("{s:?} is not Unix ms, YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS[.fff]Z");
    let num = |a: usize, b: usize| s.get(a..b).and_then(|t| t.parse::<u64>().ok()).ok_or_else(bad);
    let (y, m, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    if s.get(4..5) != Some("-") || s.get(7..8) != Some("-") || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return Err(bad());
    }
    let mut ms = days_from_civil(y as i64, m as u32, d as u32) as u64 * 86_400_000;
    if s.len() > 10 {
        let rest = s.strip_suffix('Z').ok_or_else(bad)?;
        if rest.get(10..11) != Some("T") {
            return Err(bad());
        }
        ms += num(11, 13)? * 3_600_000 + num(14, 16)? * 60_000 + num(17, 19)? * 1000;
        if rest.len() > 19 {
            let frac = rest.get(20..).filter(|f| rest.get(19..20) == Some(".") && !f.is_empty() && f.len() <= 3);
            let frac = frac.ok_or_else(bad)?;
            ms += frac.parse::<u64>().map_err(|_| bad())? * 10u64.pow(3 - frac.len() as u32);
        }
    }
    Ok(ms)
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
}
