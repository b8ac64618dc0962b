//! `layout::accept_delete_path` and `layout::normalise` against the fixed pool root
//! `/var/hpvolumes`, compared with an independent model of docs/architecture.md, deletion rules.
//!
//! Input: text `path\npv_name`.
#![no_main]

use hostpath_provisioner::deciding::layout;
use hostpath_provisioner_fuzz::{check_accepted, default_pool, fields, model_accept, model_components};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let f = fields(text, 2);
    let (path, pv) = (f[0], f[1]);
    let pools = default_pool();

    // normalise agrees with the model and is idempotent.
    match layout::normalise(path) {
        Ok(p) => {
            let s = p.to_str().expect("normalised UTF-8 stays UTF-8");
            let comps = model_components(path).unwrap_or_else(|| panic!("normalise accepted {path:?}"));
            assert_eq!(s, format!("/{}", comps.join("/")), "normalise({path:?})");
            assert_eq!(layout::normalise(s).as_ref(), Ok(&p), "normalise is not idempotent on {path:?}");
        }
        Err(_) => assert!(model_components(path).is_none(), "normalise refused {path:?}"),
    }

    match layout::accept_delete_path(path, pv, &pools) {
        Ok(accepted) => check_accepted(path, pv, &accepted, &pools),
        Err(refusal) => {
            assert_eq!(model_accept(path, pv, &pools), None, "refused {path:?} for {pv:?}: {refusal}");
            let _ = refusal.to_string();
        }
    }
});
