//! Instants as Go's RFC 3339 parser reads them from a JSON record.
//!
//! An instant is whole seconds since the Unix epoch plus nanoseconds, with
//! no range limit worth the name (Go keeps year 0000, which 64-bit
//! nanoseconds cannot reach). The accepted shape is the plain path's
//! (`golang/gotime.py`, measured against the reference):
//! `YYYY-MM-DDTH[H]:MM:SS[.,]fraction?(Z|±HH:MM)` with an uppercase `T` and
//! `Z`, a comma or a period before the fraction, more than nine fraction
//! digits truncated, offset hours up to 24 and minutes up to 60, seconds
//! below 60, and a real calendar day.

pub const NS: i64 = 1_000_000_000;

/// An instant in UTC: `sec` since the epoch and `nsec` in `0..NS`. The
/// derived order is the order in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Instant {
    pub sec: i64,
    pub nsec: u32,
}

impl Instant {
    pub fn from_nanos(ns: i128) -> Instant {
        let ns_per = NS as i128;
        Instant {
            sec: ns.div_euclid(ns_per) as i64,
            nsec: ns.rem_euclid(ns_per) as u32,
        }
    }

    pub fn nanos(self) -> i128 {
        self.sec as i128 * NS as i128 + self.nsec as i128
    }
}

/// Go's zero time, 0001-01-01T00:00:00Z: a record carrying it has no event time.
pub const ZERO_TIME: Instant = Instant { sec: -62_135_596_800, nsec: 0 };

/// Days since 1970-01-01 in the proleptic Gregorian calendar.
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let doy = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day since 1970-01-01 (the inverse of [`days_from_civil`]).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let doe = days - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = mp + if mp < 10 { 3 } else { -9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

const DAYS_IN_MONTH: [i64; 12] = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];

/// Go refuses to write a year outside 0000-9999 as RFC 3339.
pub fn printable(t: Instant) -> bool {
    let first = days_from_civil(0, 1, 1) * 86_400;
    let past = days_from_civil(10_000, 1, 1) * 86_400;
    first <= t.sec && t.sec < past
}

/// A cursor over the ASCII shape; every step fails on anything unexpected.
struct Shape<'a> {
    s: &'a [u8],
    i: usize,
}

impl Shape<'_> {
    fn digits(&mut self, n: usize) -> Option<i64> {
        let part = self.s.get(self.i..self.i + n)?;
        let mut v = 0i64;
        for &b in part {
            if !b.is_ascii_digit() {
                return None;
            }
            v = v * 10 + (b - b'0') as i64;
        }
        self.i += n;
        Some(v)
    }

    fn byte(&mut self, want: u8) -> Option<()> {
        (self.s.get(self.i) == Some(&want)).then(|| self.i += 1)
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn peek_digit(&self, at: usize) -> bool {
        self.s.get(self.i + at).is_some_and(|b| b.is_ascii_digit())
    }
}

/// An RFC 3339 instant, or None where Go's parser refuses it.
pub fn parse(raw: &[u8]) -> Option<Instant> {
    let mut p = Shape { s: raw, i: 0 };
    let year = p.digits(4)?;
    p.byte(b'-')?;
    let month = p.digits(2)?;
    p.byte(b'-')?;
    let day = p.digits(2)?;
    p.byte(b'T')?;
    let hour = if p.peek_digit(1) { p.digits(2)? } else { p.digits(1)? };
    p.byte(b':')?;
    let minute = p.digits(2)?;
    p.byte(b':')?;
    let sec = p.digits(2)?;
    let mut nanos = 0i64;
    if matches!(p.peek(), Some(b'.' | b',')) && p.peek_digit(1) {
        p.i += 1;
        let mut n = 0;
        while p.peek_digit(0) {
            if n < 9 {
                nanos = nanos * 10 + (raw[p.i] - b'0') as i64;
            }
            n += 1;
            p.i += 1;
        }
        for _ in n..9 {
            nanos *= 10;
        }
    }
    let offset = match p.peek()? {
        b'Z' => {
            p.i += 1;
            0
        }
        sign @ (b'+' | b'-') => {
            p.i += 1;
            let off_h = p.digits(2)?;
            p.byte(b':')?;
            let off_m = p.digits(2)?;
            if off_h > 24 || off_m > 60 {
                return None;
            }
            let off = off_h * 3600 + off_m * 60;
            if sign == b'+' {
                off
            } else {
                -off
            }
        }
        _ => return None,
    };
    if p.i != raw.len() {
        return None;
    }
    if !(1..=12).contains(&month) || hour > 23 || minute > 59 || sec > 59 {
        return None;
    }
    let limit = if month == 2 && is_leap(year) { 29 } else { DAYS_IN_MONTH[month as usize - 1] };
    if !(1..=limit).contains(&day) {
        return None;
    }
    let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + sec - offset;
    Some(Instant { sec: secs, nsec: nanos as u32 })
}

/// A UTC time to the microsecond, within the years Python's `datetime` has
/// (the event log's stored times, written as its Python path writes them).
pub struct Utc {
    year: i64,
    month: i64,
    day: i64,
    second_of_day: i64,
    micros: i64,
}

impl Utc {
    /// The time `us` microseconds after the epoch, or None outside years
    /// 0001-9999 (where the Python path reads the row as damaged).
    pub fn of(us: i64) -> Option<Utc> {
        let secs = us.div_euclid(1_000_000);
        let micros = us.rem_euclid(1_000_000);
        if secs < days_from_civil(1, 1, 1) * 86_400 || secs >= days_from_civil(10_000, 1, 1) * 86_400 {
            return None;
        }
        let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
        Some(Utc { year, month, day, second_of_day: secs.rem_euclid(86_400), micros })
    }

    /// As msgspec writes an aware UTC `datetime`: the fraction only when
    /// there is one, always six digits.
    pub fn write(&self, out: &mut Vec<u8>) {
        let s = self.second_of_day;
        digits(out, self.year, 4);
        out.push(b'-');
        digits(out, self.month, 2);
        out.push(b'-');
        digits(out, self.day, 2);
        out.push(b'T');
        digits(out, s / 3600, 2);
        out.push(b':');
        digits(out, s / 60 % 60, 2);
        out.push(b':');
        digits(out, s % 60, 2);
        if self.micros != 0 {
            out.push(b'.');
            digits(out, self.micros, 6);
        }
        out.push(b'Z');
    }
}

/// `v` (not negative) in `width` decimal digits, zero-padded (at most six).
fn digits(out: &mut Vec<u8>, mut v: i64, width: usize) {
    let mut buf = [b'0'; 6];
    for d in buf[..width].iter_mut().rev() {
        *d = b'0' + (v % 10) as u8;
        v /= 10;
    }
    out.extend_from_slice(&buf[..width]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(s: &str) -> Option<i128> {
        parse(s.as_bytes()).map(Instant::nanos)
    }

    #[test]
    fn the_usual_shape() {
        assert_eq!(ns("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(ns("2026-05-02T10:00:00.5Z"), Some(1_777_716_000_500_000_000));
        assert_eq!(ns("1970-01-01T00:00:01,123456789999Z"), Some(1_123_456_789));
    }

    #[test]
    fn gos_lenient_corners_are_accepted() {
        assert_eq!(ns("1970-01-01T01:00:00+24:00"), Some(-23 * 3600 * NS as i128));
        assert_eq!(ns("1970-01-01T1:00:00Z"), Some(3600 * NS as i128));
        assert_eq!(ns("0000-01-01T00:00:00Z"), Some(days_from_civil(0, 1, 1) as i128 * 86_400 * NS as i128));
        assert!(ns("2024-02-29T00:00:00-00:60").is_some());
    }

    #[test]
    fn what_go_refuses() {
        for bad in [
            "2026-05-02t10:00:00Z", "2026-05-02T10:00:00z", "2026-05-02 10:00:00Z",
            "2026-05-02T10:00:60Z", "2026-05-02T10:00:00+0200", "2026-05-02T10:00:00+02",
            "2026-02-30T10:00:00Z", "2025-02-29T00:00:00Z", "2026-05-02T24:00:00Z",
            "2026-05-02T10:00:00+25:00", "2026-05-02T10:00:00.Z", "2026-05-02T123:00:00Z",
            "2026-05-02T10:00:00Z ", "", "2026-13-01T00:00:00Z",
        ] {
            assert_eq!(ns(bad), None, "{bad}");
        }
    }

    #[test]
    fn printable_years() {
        assert!(printable(parse(b"0000-01-01T00:00:00Z").unwrap()));
        assert!(!printable(parse(b"0000-01-01T00:00:00+00:01").unwrap()));
        assert!(printable(parse(b"9999-12-31T23:59:59Z").unwrap()));
        assert!(!printable(parse(b"9999-12-31T23:59:59-00:01").unwrap()));
        assert_eq!(parse(b"0001-01-01T01:00:00+01:00"), Some(ZERO_TIME));
    }

    #[test]
    fn civil_dates_round_trip() {
        for days in [-719_528, -1, 0, 59, 60, 11_016, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    fn written(us: i64) -> Option<String> {
        Utc::of(us).map(|t| {
            let mut out = Vec::new();
            t.write(&mut out);
            String::from_utf8(out).unwrap()
        })
    }

    #[test]
    fn times_are_written_as_msgspec_writes_them() {
        assert_eq!(written(0).as_deref(), Some("1970-01-01T00:00:00Z"));
        assert_eq!(written(1).as_deref(), Some("1970-01-01T00:00:00.000001Z"));
        assert_eq!(written(-1).as_deref(), Some("1969-12-31T23:59:59.999999Z"));
        assert_eq!(written(1_796_544_599_477_460).as_deref(), Some("2026-12-06T08:09:59.477460Z"));
        let first = days_from_civil(1, 1, 1) * 86_400 * 1_000_000;
        let past = days_from_civil(10_000, 1, 1) * 86_400 * 1_000_000;
        assert_eq!(written(first).as_deref(), Some("0001-01-01T00:00:00Z"));
        assert_eq!(written(past - 1).as_deref(), Some("9999-12-31T23:59:59.999999Z"));
        assert_eq!(written(first - 1), None);
        assert_eq!(written(past), None);
    }
}
