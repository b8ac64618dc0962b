//! Sizes: parsing Kubernetes quantities into bytes and the Go build's "pretty" rounding of a
//! filesystem's size (docs/configuration.md, `--pv-capacity filesystem`).

const KI: u128 = 1024;
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// Why a quantity could not be read as a byte count.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not the Kubernetes quantity grammar.
    #[error("{0:?} is not a valid quantity")]
    Syntax(String),
    /// Negative sizes make no sense for storage.
    #[error("{0:?} is negative")]
    Negative(String),
    /// Larger than any disk (more than 2^64 bytes).
    #[error("{0:?} is too large")]
    TooLarge(String),
}

/// Parses a Kubernetes quantity (`1Gi`, `500M`, `1.5Gi`, `1e9`, `100m`) into bytes, rounding a
/// fractional byte count up, as Kubernetes does for storage. Hand-written: k8s-openapi keeps a
/// quantity as text, and the crates that parse one go through a decimal type without the exact
/// integer rounding and the refusal of what no disk holds (`1e30`) that this needs.
pub fn parse_bytes(quantity: &str) -> Result<u64, QuantityError> {
    let s = quantity.trim();
    let err = || QuantityError::Syntax(quantity.to_owned());
    if s.is_empty() || s.len() > 64 {
        return Err(err());
    }
    let (negative, s) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let number_end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_end);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return Err(err());
    }
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    // value = mantissa / 10^frac_digits * multiplier
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 30 {
        return Err(QuantityError::TooLarge(quantity.to_owned()));
    }
    let mantissa: u128 = if digits.is_empty() { 0 } else { digits.parse().map_err(|_| err())? };
    let mut scale_down: u32 = frac_part.len() as u32;
    let (numerator, denominator_pow10): (u128, u32) = match suffix {
        "" => (1, 0),
        "Ki" => (KI, 0),
        "Mi" => (KI.pow(2), 0),
        "Gi" => (KI.pow(3), 0),
        "Ti" => (KI.pow(4), 0),
        "Pi" => (KI.pow(5), 0),
        "Ei" => (KI.pow(6), 0),
        "m" => (1, 3),
        "k" => (10u128.pow(3), 0),
        "M" => (10u128.pow(6), 0),
        "G" => (10u128.pow(9), 0),
        "T" => (10u128.pow(12), 0),
        "P" => (10u128.pow(15), 0),
        "E" => (10u128.pow(18), 0),
        exp if exp.starts_with(['e', 'E']) => {
            let e: i32 = exp[1..].parse().map_err(|_| err())?;
            if !(-30..=30).contains(&e) {
                return Err(QuantityError::TooLarge(quantity.to_owned()));
            }
            if e >= 0 { (10u128.pow(e as u32), 0) } else { (1, (-e) as u32) }
        }
        _ => return Err(err()),
    };
    scale_down += denominator_pow10;
    if mantissa != 0 && negative {
        return Err(QuantityError::Negative(quantity.to_owned()));
    }
    let scaled = mantissa.checked_mul(numerator).ok_or_else(|| QuantityError::TooLarge(quantity.to_owned()))?;
    let divisor = 10u128.checked_pow(scale_down).ok_or_else(|| QuantityError::TooLarge(quantity.to_owned()))?;
    let bytes = scaled.div_ceil(divisor);
    u64::try_from(bytes).map_err(|_| QuantityError::TooLarge(quantity.to_owned()))
}

/// The Go build's capacity: round a filesystem size down to whole GiB from 10 GiB on, to whole
/// MiB from 10 MiB on, else keep it.
pub fn round_down_pretty(bytes: u64) -> u64 {
    if bytes / GIB >= 10 {
        bytes / GIB * GIB
    } else if bytes / MIB >= 10 {
        bytes / MIB * MIB
    } else {
        bytes
    }
}

/// Formats a byte count the way Go's `resource.Quantity` prints BinarySI values: the largest
/// binary suffix that divides it exactly (`49Gi`, `2047Mi`, `1536`).
pub fn format_binary_si(bytes: u64) -> String {
    const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let mut value = bytes;
    let mut index = 0;
    while value != 0 && value.is_multiple_of(1024) && index < SUFFIXES.len() - 1 {
        value /= 1024;
        index += 1;
    }
    format!("{value}{}", SUFFIXES[index])
}

/// A byte count for people: binary units, exact values without decimals (`1 EiB`, `512 B`),
/// others rounded to one decimal (`64.6 GiB`); zero is plain `0`. Used wherever a size reaches a
/// user (events, errors, logs), where twenty-digit byte counts cannot be read at a glance.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes == 0 {
        return "0".to_owned();
    }
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let bytes = u128::from(bytes);
    let mut index = 0;
    while index + 1 < UNITS.len() && bytes >= KI.pow(index as u32 + 2) {
        index += 1;
    }
    loop {
        let unit = KI.pow(index as u32 + 1);
        if bytes.is_multiple_of(unit) {
            return format!("{} {}", bytes / unit, UNITS[index]);
        }
        let tenths = (bytes * 10 + unit / 2) / unit;
        // 1023.96 KiB rounds to 1024.0 KiB: say 1.0 MiB instead.
        if tenths >= 10 * 1024 && index + 1 < UNITS.len() {
            index += 1;
            continue;
        }
        return format!("{}.{} {}", tenths / 10, tenths % 10, UNITS[index]);
    }
}

/// Displays a byte count with [`format_size`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size(pub u64);

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&format_size(self.0))
    }
}

/// How a pool's room for a new volume is counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CapacityAccounting {
    /// Free space now, minus the reserve: volumes that have not filled up yet leave room that
    /// later writes may take back (the Go build's way).
    #[default]
    Free,
    /// Also what is promised: the pool's size minus its reserve minus the requests of its live
    /// volumes, so the sum of the requests never exceeds the pool.
    Requests,
}

impl CapacityAccounting {
    /// Accepted values.
    pub const ALL: [CapacityAccounting; 2] = [CapacityAccounting::Free, CapacityAccounting::Requests];

    /// The setting's value.
    pub fn as_str(self) -> &'static str {
        match self {
            CapacityAccounting::Free => "free",
            CapacityAccounting::Requests => "requests",
        }
    }

    /// Parses a setting's value.
    pub fn parse(value: &str) -> Option<CapacityAccounting> {
        Self::ALL.into_iter().find(|a| a.as_str().eq_ignore_ascii_case(value.trim()))
    }
}

/// What a pool holds and has promised, for deciding whether a new volume fits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolRoom {
    /// Bytes free for unprivileged writers now.
    pub available: u64,
    /// The filesystem's size.
    pub total: u64,
    /// The reserve.
    pub reserved: u64,
    /// Sum of the requests of the pool's live volumes, when counted ([`CapacityAccounting::Requests`]).
    pub promised: Option<u64>,
}

impl PoolRoom {
    /// Bytes a new volume may take: free space after the reserve, and with requests accounting
    /// no more than the size after the reserve less what is promised.
    pub fn room(&self) -> u64 {
        let free = self.available.saturating_sub(self.reserved);
        match self.promised {
            None => free,
            Some(promised) => free.min(self.total.saturating_sub(self.reserved).saturating_sub(promised)),
        }
    }
}

/// A pool without room for a claim's request (after its reserve, and what is promised).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "not enough {} in pool {pool} on node {node}: the claim requests {}, {} available (reserve {}{})",
    if .promised.is_some() { "unpromised space" } else { "free space" },
    Size(*.requested),
    Size(*.available),
    Size(*.reserved),
    .promised.map(|p| format!("; {} promised to the pool's volumes", Size(p))).unwrap_or_default()
)]
pub struct ShortOfSpace {
    /// Pool name.
    pub pool: String,
    /// Node name.
    pub node: String,
    /// Requested bytes.
    pub requested: u64,
    /// Bytes a new volume may take ([`PoolRoom::room`]).
    pub available: u64,
    /// The reserve.
    pub reserved: u64,
    /// With requests accounting, the requests of the pool's live volumes.
    pub promised: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_binary_units_with_at_most_one_decimal() {
        let cases = [
            (0, "0"),
            (1, "1 B"),
            (512, "512 B"),
            (1023, "1023 B"),
            (1024, "1 KiB"),
            (1536, "1.5 KiB"),
            (1025, "1.0 KiB"),
            (10 * MIB, "10 MiB"),
            (GIB + GIB / 2, "1.5 GiB"),
            (69_409_710_080, "64.6 GiB"),
            (1 << 60, "1 EiB"),
            (u64::MAX, "16.0 EiB"),
            (1024 * 1024 - 1, "1.0 MiB"),
            (GIB - 1, "1.0 GiB"),
            (3 * (1 << 40), "3 TiB"),
        ];
        for (bytes, want) in cases {
            assert_eq!(format_size(bytes), want, "{bytes}");
            assert_eq!(Size(bytes).to_string(), want);
        }
    }

    #[test]
    fn go_rounding_matches_the_go_unit_tests() {
        assert_eq!(round_down_pretty(2 * GIB), 2 * GIB);
        assert_eq!(round_down_pretty(2 * GIB + 2), 2 * GIB);
        assert_eq!(round_down_pretty(2 * GIB - 2), 2047 * MIB);
        assert_eq!(round_down_pretty(20 * GIB - 2), 19 * GIB);
        assert_eq!(round_down_pretty(5 * MIB + 3), 5 * MIB + 3);
    }

    #[test]
    fn binary_si_formatting_matches_go() {
        assert_eq!(format_binary_si(2 * GIB), "2Gi");
        assert_eq!(format_binary_si(2047 * MIB), "2047Mi");
        assert_eq!(format_binary_si(49 * GIB), "49Gi");
        assert_eq!(format_binary_si(1536), "1536");
        assert_eq!(format_binary_si(0), "0");
    }

    #[test]
    fn quantities_parse_to_bytes() {
        let cases = [
            ("1Gi", GIB),
            ("200Mi", 200 * MIB),
            ("1Mi", MIB),
            ("1G", 1_000_000_000),
            ("500M", 500_000_000),
            ("1.5Gi", GIB + GIB / 2),
            ("1e3", 1000),
            ("1E3", 1000),
            ("1500m", 2),
            ("100m", 1),
            ("0", 0),
            ("12345", 12345),
            (" 1Ki ", 1024),
            ("+1k", 1000),
            ("0.1", 1),
        ];
        for (q, want) in cases {
            assert_eq!(parse_bytes(q), Ok(want), "{q}");
        }
    }

    #[test]
    fn bad_quantities_are_errors_not_panics() {
        for q in ["", "Gi", "1.2.3", "1Qi", "1 Gi", "1e", "1e99", "-1Gi", "1Gii", ".", "99999999999999999999Ei"] {
            assert!(parse_bytes(q).is_err(), "{q}");
        }
    }
}
