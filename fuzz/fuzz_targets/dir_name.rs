//! `layout::dir_name`: whatever directory we would create is a single safe component that the
//! deletion rules recognise as this claim's volume.
//!
//! Input: text `name\nuid`; both `use_naming_prefix` settings are tried.
#![no_main]

use hostpath_provisioner::deciding::layout::{self, AcceptedPath, NameError};
use hostpath_provisioner::filesystem::VolumeDirName;
use hostpath_provisioner_fuzz::{POOL_ROOT, default_pool, fields, model_is_dns_subdomain, model_is_uid};
use libfuzzer_sys::fuzz_target;

fn check(name: &str, uid: &str, prefix: bool) {
    let result = layout::dir_name(name, uid, prefix);
    let dir = match result {
        Ok(dir) => dir,
        Err(NameError::BadUid(u)) => {
            assert!(!model_is_uid(uid), "valid UID {uid:?} refused");
            assert_eq!(u, uid);
            return;
        }
        Err(NameError::BadClaimName(n)) => {
            assert!(prefix && model_is_uid(uid), "claim name checked when it is not used");
            assert!(!model_is_dns_subdomain(name), "valid claim name {name:?} refused");
            assert_eq!(n, name);
            return;
        }
        Err(other) => panic!("dir_name never reads a namespace or a pattern: {other}"),
    };
    assert!(model_is_uid(uid), "accepted UID {uid:?}");
    assert!(!prefix || model_is_dns_subdomain(name), "accepted claim name {name:?}");
    assert!(dir.len() <= layout::MAX_DIR_NAME_BYTES, "{} bytes: {dir:?}", dir.len());
    assert!(!dir.contains('/') && !dir.contains('\0'), "{dir:?}");
    assert!(dir != "." && dir != "..", "{dir:?}");
    assert!(VolumeDirName::new(&dir).is_ok(), "{dir:?} is not a VolumeDirName");
    let pv = layout::pv_name(uid);
    assert!(layout::matches_layout(&dir, &pv), "{dir:?} does not match the layouts of {pv}");
    assert_eq!(layout::dir_name(name, uid, prefix).as_ref(), Ok(&dir), "not deterministic");
    if !prefix {
        assert_eq!(dir, pv);
    } else {
        let full = format!("{name}-{pv}");
        if full.len() <= layout::MAX_DIR_NAME_BYTES {
            assert_eq!(dir, full, "a name that fits is kept whole");
        } else {
            assert!(dir.ends_with(&format!("-{pv}")), "{dir:?} lost its -pvc-<uid> suffix");
        }
    }
    // Whatever we write, we can delete.
    let accepted = layout::accept_delete_path(&format!("{POOL_ROOT}/{dir}"), &pv, &default_pool());
    assert_eq!(
        accepted,
        Ok(AcceptedPath { pool: "legacy".into(), root: POOL_ROOT.into(), dir_name: dir, marked: false })
    );
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let f = fields(text, 2);
    check(f[0], f[1], false);
    check(f[0], f[1], true);
});
