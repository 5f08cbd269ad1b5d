//! The text formats of the CPU interface files (`cpu.shares`, `cpu.cfs_quota_us`,
//! `cpu.cfs_period_us`, `cpu.max`, `cpu.weight`, `cpuset.*`) and their parsed values.
//!
//! Parsing is strict and pure: anything outside what the kernel can show is an error naming the
//! text, which the scan keeps next to the cgroup instead of failing.

use std::fmt;

use crate::cpuset::{CpuSet, ParseError};

/// Smallest and largest `cpu.shares` the kernel keeps (`MIN_SHARES`, `MAX_SHARES`).
pub const SHARES_RANGE: (u64, u64) = (2, 262_144);
/// Range of v2 `cpu.weight`.
pub const WEIGHT_RANGE: (u64, u64) = (1, 10_000);
/// Range of a CFS period in microseconds (1 ms ..= 1 s).
pub const PERIOD_RANGE: (u64, u64) = (1_000, 1_000_000);

/// Why the text of an interface file is not a value the kernel could show.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("{text:?} is not a whole number")]
    NotANumber { text: String },
    #[error("{text:?} is outside {min}..={max}")]
    OutOfRange { text: String, min: i64, max: i64 },
    #[error("{text:?} is not of the form {expected}")]
    Malformed {
        text: String,
        expected: &'static str,
    },
    #[error(transparent)]
    CpuList(#[from] ParseError),
}

/// A CFS bandwidth quota per period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quota {
    /// No limit (v1 `-1`, v2 `max`).
    Unlimited,
    /// At most this many microseconds of CPU time per period.
    Micros(u64),
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Quota::Unlimited => f.write_str("max"),
            Quota::Micros(us) => write!(f, "{us}"),
        }
    }
}

/// The v2 `cpu.max` pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CpuMax {
    pub quota: Quota,
    pub period_us: u64,
}

impl fmt::Display for CpuMax {
    /// The form `cpu.max` shows and accepts: `max 100000` or `200000 100000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.quota, self.period_us)
    }
}

fn parse_int(text: &str) -> Result<i64, ValueError> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ValueError::NotANumber {
            text: text.to_string(),
        });
    }
    text.parse().map_err(|_| ValueError::NotANumber {
        text: text.to_string(),
    })
}

fn parse_in_range(text: &str, (min, max): (u64, u64)) -> Result<u64, ValueError> {
    let text = text.trim();
    let value = parse_int(text)?;
    if value < min as i64 || value > max as i64 {
        return Err(ValueError::OutOfRange {
            text: text.to_string(),
            min: min as i64,
            max: max as i64,
        });
    }
    Ok(value as u64)
}

/// v1 `cpu.shares`.
pub fn parse_shares(text: &str) -> Result<u64, ValueError> {
    parse_in_range(text, SHARES_RANGE)
}

/// v2 `cpu.weight`.
pub fn parse_weight(text: &str) -> Result<u64, ValueError> {
    parse_in_range(text, WEIGHT_RANGE)
}

/// v1 `cpu.cfs_period_us`.
pub fn parse_cfs_period(text: &str) -> Result<u64, ValueError> {
    parse_in_range(text, PERIOD_RANGE)
}

/// v1 `cpu.cfs_quota_us`: `-1` or a positive number of microseconds.
pub fn parse_cfs_quota(text: &str) -> Result<Quota, ValueError> {
    let text = text.trim();
    match parse_int(text)? {
        -1 => Ok(Quota::Unlimited),
        us if us > 0 => Ok(Quota::Micros(us as u64)),
        _ => Err(ValueError::Malformed {
            text: text.to_string(),
            expected: "-1 or a positive number of microseconds",
        }),
    }
}

/// v2 `cpu.max`: `max PERIOD` or `QUOTA PERIOD`.
pub fn parse_cpu_max(text: &str) -> Result<CpuMax, ValueError> {
    let text = text.trim();
    let malformed = || ValueError::Malformed {
        text: text.to_string(),
        expected: "'max PERIOD' or 'QUOTA PERIOD'",
    };
    let mut fields = text.split_ascii_whitespace();
    let (Some(quota), Some(period), None) = (fields.next(), fields.next(), fields.next()) else {
        return Err(malformed());
    };
    let quota = if quota == "max" {
        Quota::Unlimited
    } else {
        match parse_int(quota) {
            Ok(us) if us > 0 => Quota::Micros(us as u64),
            _ => return Err(malformed()),
        }
    };
    let period_us = parse_in_range(period, PERIOD_RANGE).map_err(|_| malformed())?;
    Ok(CpuMax { quota, period_us })
}

/// `cpuset.cpus`, `cpuset.mems` and their effective variants. Empty text is the empty set.
pub fn parse_cpuset(text: &str) -> Result<CpuSet, ValueError> {
    Ok(CpuSet::parse(text)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_accept_the_kernel_range_only() {
        assert_eq!(parse_shares("1024\n"), Ok(1024));
        assert_eq!(parse_shares("2"), Ok(2));
        assert!(matches!(
            parse_shares("-5"),
            Err(ValueError::OutOfRange { .. })
        ));
        assert!(matches!(
            parse_shares("1"),
            Err(ValueError::OutOfRange { .. })
        ));
        assert!(matches!(
            parse_shares("garbage"),
            Err(ValueError::NotANumber { .. })
        ));
        assert!(matches!(
            parse_shares(""),
            Err(ValueError::NotANumber { .. })
        ));
        assert!(matches!(
            parse_shares("99999999999999999999999"),
            Err(ValueError::NotANumber { .. })
        ));
        let err = parse_shares("-5").unwrap_err();
        assert_eq!(err.to_string(), "\"-5\" is outside 2..=262144");
    }

    #[test]
    fn cfs_quota_is_minus_one_or_positive() {
        assert_eq!(parse_cfs_quota("-1\n"), Ok(Quota::Unlimited));
        assert_eq!(parse_cfs_quota("150000"), Ok(Quota::Micros(150_000)));
        assert!(parse_cfs_quota("0").is_err());
        assert!(parse_cfs_quota("-2").is_err());
        assert!(parse_cfs_quota("1.5").is_err());
        assert_eq!(parse_cfs_period("100000\n"), Ok(100_000));
        assert!(parse_cfs_period("10").is_err());
    }

    #[test]
    fn cpu_max_has_two_fields() {
        assert_eq!(
            parse_cpu_max("max 100000\n"),
            Ok(CpuMax {
                quota: Quota::Unlimited,
                period_us: 100_000
            })
        );
        assert_eq!(
            parse_cpu_max("200000 100000"),
            Ok(CpuMax {
                quota: Quota::Micros(200_000),
                period_us: 100_000
            })
        );
        for bad in [
            "garbage",
            "max",
            "1 2 3",
            "-1 100000",
            "max 0",
            "",
            "0 100000",
        ] {
            let err = parse_cpu_max(bad).unwrap_err();
            assert!(err.to_string().contains("QUOTA PERIOD"), "{bad:?}: {err}");
        }
        let shown = CpuMax {
            quota: Quota::Unlimited,
            period_us: 100_000,
        };
        assert_eq!(shown.to_string(), "max 100000");
    }

    #[test]
    fn weight_range() {
        assert_eq!(parse_weight("100\n"), Ok(100));
        assert!(parse_weight("0").is_err());
        assert!(parse_weight("10001").is_err());
    }

    #[test]
    fn cpusets_parse_with_the_empty_set() {
        assert_eq!(parse_cpuset("0-2,4\n").unwrap().to_string(), "0-2,4");
        assert!(parse_cpuset("\n").unwrap().is_empty());
        assert!(matches!(parse_cpuset("x"), Err(ValueError::CpuList(_))));
    }
}
