//! `config::parse_switch` (the on/off settings such as `REQUIRE_MOUNTPOINT`) and
//! `config::split_kubeconfig_paths` (the `KUBECONFIG` path list) on arbitrary text.
//!
//! Input: bytes; the whole input is the switch value (when UTF-8) and the path list.
#![no_main]

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use hostpath_provisioner::config::{SWITCH_SPELLINGS, parse_switch, split_kubeconfig_paths};
use libfuzzer_sys::fuzz_target;

/// The spellings a switch accepts, written independently of the parser.
const TRUE: [&str; 4] = ["true", "yes", "on", "1"];
const FALSE: [&str; 4] = ["false", "no", "off", "0"];

fn model_switch(value: &str) -> Option<bool> {
    let word = value.trim().to_ascii_lowercase();
    if TRUE.contains(&word.as_str()) {
        Some(true)
    } else if FALSE.contains(&word.as_str()) {
        Some(false)
    } else {
        None
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(value) = std::str::from_utf8(data) {
        match parse_switch("REQUIRE_MOUNTPOINT", value) {
            Ok(on) => {
                assert_eq!(model_switch(value), Some(on), "{value:?} read as {on}");
                // Accepted spellings round-trip: the canonical word of the value reads the same.
                assert_eq!(parse_switch("REQUIRE_MOUNTPOINT", if on { "true" } else { "false" }).ok(), Some(on));
                assert_eq!(parse_switch("REQUIRE_MOUNTPOINT", &value.to_ascii_uppercase()).ok(), Some(on));
            }
            Err(error) => {
                assert_eq!(model_switch(value), None, "{value:?} refused though it is a usual spelling");
                let message = error.to_string();
                assert!(message.starts_with("REQUIRE_MOUNTPOINT: invalid value "), "{message}");
                assert!(message.ends_with(SWITCH_SPELLINGS), "{message}");
                // One line: the value is quoted with Debug, so a newline in it is escaped.
                assert!(!message.contains('\n'), "{message:?}");
            }
        }
    }

    // The path list: no empty entry, no ':' inside an entry, and joining the entries with ':'
    // gives back the input without its empty entries (nothing lost or invented).
    let paths = split_kubeconfig_paths(OsStr::from_bytes(data));
    let mut expected: Vec<PathBuf> = Vec::new();
    for piece in data.split(|b| *b == b':').filter(|p| !p.is_empty()) {
        expected.push(PathBuf::from(OsStr::from_bytes(piece)));
    }
    assert_eq!(paths, expected);
    for path in &paths {
        let bytes = path.as_os_str().as_bytes();
        assert!(!bytes.is_empty() && !bytes.contains(&b':'), "{path:?}");
    }
});
