//! `capacity::parse_bytes`, `format_binary_si` and `round_down_pretty`.
//!
//! Input: the whole input as text is the quantity; its first 8 bytes (zero-padded, little endian)
//! are also a byte count for the formatting and rounding properties.
#![no_main]

use hostpath_provisioner::deciding::capacity::{format_binary_si, parse_bytes, round_down_pretty};
use libfuzzer_sys::fuzz_target;

fn check_count(x: u64) {
    let formatted = format_binary_si(x);
    assert_eq!(parse_bytes(&formatted), Ok(x), "format_binary_si({x}) = {formatted:?} does not parse back");
    assert_eq!(parse_bytes(&x.to_string()), Ok(x), "{x} as plain digits does not parse back");
    let rounded = round_down_pretty(x);
    assert!(rounded <= x, "round_down_pretty({x}) = {rounded} rounds up");
    assert_eq!(round_down_pretty(rounded), rounded, "round_down_pretty is not idempotent at {x}");
    // Never more than one unit (GiB or MiB) below the input.
    assert!(x - rounded < 1 << 30, "round_down_pretty({x}) = {rounded} loses a GiB or more");
}

fuzz_target!(|data: &[u8]| {
    let mut raw = [0u8; 8];
    let n = data.len().min(8);
    raw[..n].copy_from_slice(&data[..n]);
    check_count(u64::from_le_bytes(raw));

    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(bytes) = parse_bytes(text) else { return };
    // Whatever parses is a byte count that formats and parses back unchanged.
    assert_eq!(parse_bytes(&format!("{bytes}")), Ok(bytes), "{text:?} -> {bytes} does not re-parse");
    check_count(bytes);
    // Surrounding whitespace does not change the value.
    assert_eq!(parse_bytes(&format!(" {text}\t")), Ok(bytes), "{text:?} changes value with whitespace");
});
