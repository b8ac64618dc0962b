//! `config::Args::try_parse_from` and `Args::validate` on arbitrary command lines: never a panic,
//! and a configuration that validates is usable (its pool root accepts the volumes we create).
//!
//! Input: text, one argument per line (fuzz/run.sh clears the settings' env vars, which clap
//! also reads).
#![no_main]

use clap::Parser;
use hostpath_provisioner::config::{Args, LEGACY_POOL};
use hostpath_provisioner::deciding::capacity::parse_bytes;
use hostpath_provisioner::deciding::layout::{self, AcceptedPath};
use hostpath_provisioner::deciding::settings::ProvisionOnNodePolicy;
use hostpath_provisioner_fuzz::{UID, model_components, model_is_dns_subdomain};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let argv = std::iter::once("hostpath-provisioner").chain(text.split('\n'));
    let args = match Args::try_parse_from(argv) {
        Ok(args) => args,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let raw = args.clone();
    let config = match args.validate() {
        Ok(config) => config,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };

    assert!(model_is_dns_subdomain(&config.node_name), "node name {:?}", config.node_name);
    assert_eq!(config.pools.len(), 1);
    let pool = &config.pools[0];
    assert_eq!(pool.name, LEGACY_POOL);
    let root = pool.root.to_str().expect("a root from a String is UTF-8");
    let comps = model_components(root).unwrap_or_else(|| panic!("root {root:?} is not absolute without '..'"));
    assert!(!comps.is_empty(), "pool root is /");
    assert_eq!(root, format!("/{}", comps.join("/")), "pool root is not normalised");
    assert!(config.dir_mode <= 0o7777, "dir mode {:o}", config.dir_mode);
    assert!(config.max_concurrency >= 1);
    assert!(!config.provisioner_name.trim().is_empty());
    assert_eq!(config.provisioner_name, raw.provisioner_name);
    // Publishing capacity needs a CSIDriver named like the provisioner.
    assert!(
        !config.publish_capacity || model_is_dns_subdomain(&config.provisioner_name),
        "{:?}",
        config.provisioner_name
    );
    assert_eq!(config.use_naming_prefix, raw.use_naming_prefix);
    assert_eq!(Ok(config.reserved_bytes), parse_bytes(&raw.reserved_space));
    if let ProvisionOnNodePolicy::Namespaces(list) = &config.provision_on_node {
        assert!(!list.is_empty() && list.iter().all(|n| model_is_dns_subdomain(n)), "{list:?}");
    }

    // A volume created under the configured root is accepted for deletion there.
    let pv = layout::pv_name(UID);
    let accepted = layout::accept_delete_path(&format!("{root}/{pv}"), &pv, &config.pools);
    assert_eq!(
        accepted,
        Ok(AcceptedPath { pool: LEGACY_POOL.into(), root: config.pools[0].root.clone(), dir_name: pv, marked: false })
    );
});
