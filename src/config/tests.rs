//! Tests of the configuration: every setting's parsing and refusal.

use super::*;

fn parse(args: &[&str]) -> Result<Config, ConfigError> {
    let mut argv = vec!["hostpath-provisioner"];
    argv.extend_from_slice(args);
    Args::try_parse_from(argv).expect("clap parse").validate()
}

fn parse_on_node(args: &[&str]) -> Result<Config, ConfigError> {
    let mut all = vec!["--node-name", "n"];
    all.extend_from_slice(args);
    parse(&all)
}

/// A pool as validation leaves it: counted the default way (free space).
fn counted(pool: PoolPath) -> PoolPath {
    PoolPath { accounting: Some(CapacityAccounting::Free), ..pool }
}

#[test]
fn capacity_accounting_is_free_unless_asked_and_a_pool_can_differ() {
    let c = parse_on_node(&["--pv-dir", "/p", "--pool", "ssd=/mnt/ssd,accounting=requests"]).unwrap();
    let by_name = |name: &str| c.pools.iter().find(|p| p.name == name).unwrap().accounting;
    assert_eq!(by_name("legacy"), Some(CapacityAccounting::Free));
    assert_eq!(by_name("ssd"), Some(CapacityAccounting::Requests));
    let c = parse_on_node(&["--pv-dir", "/p", "--capacity-accounting", "requests", "--pool", "hdd=/h,accounting=free"])
        .unwrap();
    let by_name = |name: &str| c.pools.iter().find(|p| p.name == name).unwrap().accounting;
    assert_eq!(
        (by_name("legacy"), by_name("hdd")),
        (Some(CapacityAccounting::Requests), Some(CapacityAccounting::Free))
    );
    for bad in [
        &["--pv-dir", "/p", "--capacity-accounting", "promised"][..],
        &["--pv-dir", "/p", "--pool", "a=/a,accounting=x"],
    ] {
        assert!(parse_on_node(bad).is_err(), "{bad:?}");
    }
    // The PVs' capacities are what is summed: with the filesystem's size on every PV, refused.
    let err = parse_on_node(&["--pv-dir", "/p", "--capacity-accounting", "requests", "--pv-capacity", "filesystem"])
        .unwrap_err();
    assert!(err.to_string().contains("CAPACITY_ACCOUNTING") && err.to_string().contains("PV_CAPACITY"), "{err}");
}

#[test]
fn minimal_go_style_settings_work() {
    let c = parse(&["--node-name", "node-a", "--pv-dir", "/var/hpvolumes/"]).unwrap();
    assert_eq!(c.node_name, "node-a");
    assert_eq!(c.pools, vec![counted(PoolPath::local("legacy", "/var/hpvolumes"))]);
    assert_eq!(c.provisioner_name, "kubevirt.io/hostpath-provisioner");
    assert_eq!(c.dir_mode, 0o777);
    assert_eq!(c.pv_capacity, PvCapacity::Request);
    assert!(!c.use_naming_prefix);
    assert_eq!(c.metrics_addr, Some("0.0.0.0:8080".parse().unwrap()));
}

#[test]
fn reaping_volumes_of_removed_nodes_is_off_unless_given_a_duration() {
    let off = parse(&["--node-name", "n", "--pv-dir", "/p"]).unwrap();
    assert_eq!(off.reap_volumes_of_removed_nodes, None);
    for (value, secs) in [("24h", 86_400), ("90m", 5_400), ("1h 30m", 5_400), ("PT2H", 7_200), ("3s", 3)] {
        let c = parse(&["--node-name", "n", "--pv-dir", "/p", "--reap-volumes-of-removed-nodes", value]).unwrap();
        assert_eq!(c.reap_volumes_of_removed_nodes, Some(std::time::Duration::from_secs(secs)), "{value}");
    }
    for bad in ["0s", "-1h", "soon", "24"] {
        let flag = format!("--reap-volumes-of-removed-nodes={bad}");
        let err = parse(&["--node-name", "n", "--pv-dir", "/p", &flag]).unwrap_err();
        assert!(err.to_string().contains("REAP_VOLUMES_OF_REMOVED_NODES"), "{bad}: {err}");
    }
}

/// The node daemon never releases claims (the `release-claims-of-removed-nodes` subcommand
/// does, with rights no node pod holds): the variable left on the DaemonSet by an earlier install
/// is kept, to be reported, whatever its value; it never stops the daemon from starting.
#[test]
fn releasing_claims_on_the_node_is_only_noted_as_ignored_whatever_its_value() {
    let off = parse(&["--node-name", "n", "--pv-dir", "/p"]).unwrap();
    assert_eq!(off.release_claims_setting_ignored, None);
    let explicit_off =
        parse(&["--node-name", "n", "--pv-dir", "/p", "--release-claims-of-removed-nodes", "off"]).unwrap();
    assert_eq!(explicit_off.release_claims_setting_ignored, None);
    for value in ["1h", "0s", "24"] {
        let flag = format!("--release-claims-of-removed-nodes={value}");
        let set = parse(&["--node-name", "n", "--pv-dir", "/p", &flag]).unwrap();
        assert_eq!(set.release_claims_setting_ignored.as_deref(), Some(value));
        assert_eq!(set.reap_volumes_of_removed_nodes, None, "one does not turn on the other");
    }
}

#[test]
fn naming_prefix_follows_the_go_rule() {
    for (value, want) in [("true", true), ("TRUE", true), ("True", true), ("1", false), ("yes", false), ("", false)] {
        let c = parse(&["--node-name", "n", "--pv-dir", "/p", "--use-naming-prefix", value]).unwrap();
        assert_eq!(c.use_naming_prefix, want, "{value:?}");
    }
}

#[test]
fn missing_node_or_dir_names_the_setting() {
    let e = parse(&["--pv-dir", "/p"]).unwrap_err().to_string();
    assert!(e.contains("NODE_NAME"), "{e}");
    let e = parse(&["--node-name", "n"]).unwrap_err().to_string();
    assert!(e.contains("PV_DIR"), "{e}");
    assert!(parse(&["--node-name", "n", "--pool", "ssd=/mnt/ssd"]).is_ok(), "pools stand in for PV_DIR");
}

#[test]
fn invalid_values_name_the_setting_and_accepted_values() {
    let cases: [(&[&str], &str); 6] = [
        (&["--pv-dir", "relative"], "PV_DIR"),
        (&["--pv-dir", "/"], "PV_DIR"),
        (&["--pv-dir", "/a/../b"], "PV_DIR"),
        (&["--pv-dir", "/p", "--dir-mode", "999"], "DIR_MODE"),
        (&["--pv-dir", "/p", "--metrics-addr", "nope"], "METRICS_ADDR"),
        (&["--pv-dir", "/p", "--provision-on-node", "Bad_NS"], "PROVISION_ON_NODE"),
    ];
    for (args, setting) in cases {
        let mut all = vec!["--node-name", "n"];
        all.extend_from_slice(args);
        let e = parse(&all).unwrap_err().to_string();
        assert!(e.starts_with(setting), "{args:?}: {e}");
    }
}

#[test]
fn pools_come_from_flags_env_style_lists_and_pv_dir() {
    let c = parse_on_node(&[
        "--pv-dir",
        "/var/hpvolumes",
        "--pool",
        "ssd=/mnt/ssd",
        "--pool",
        "nfs=/mnt/nfs/,shared",
        "--pool",
        "hdd=/mnt/hdd,reserve=10Gi,scratch=/mnt/scratch",
    ])
    .unwrap();
    assert_eq!(
        c.pools,
        vec![
            counted(PoolPath::local("legacy", "/var/hpvolumes")),
            counted(PoolPath::local("ssd", "/mnt/ssd")),
            counted(PoolPath::shared("nfs", "/mnt/nfs")),
            counted(PoolPath { reserve: Some(10 << 30), ..PoolPath::local("hdd", "/mnt/hdd") }),
            counted(PoolPath::local("scratch", "/mnt/scratch")),
        ]
    );
    assert_eq!(c.default_pool.as_deref(), Some("legacy"));
    let only = parse_on_node(&["--pool", "ssd=/mnt/ssd"]).unwrap();
    assert_eq!(only.default_pool.as_deref(), Some("ssd"), "a single pool is the default");
    let two = parse_on_node(&["--pool", "ssd=/mnt/ssd,hdd=/mnt/hdd"]).unwrap();
    assert_eq!(two.default_pool, None, "classes must name one of several pools");
}

#[test]
fn a_name_given_for_several_roots_is_one_pool_over_several_disks() {
    let c = parse_on_node(&["--pool", "data=/mnt/disk1,reserve=1Gi", "--pool", "data=/mnt/disk2,mountpoint"]).unwrap();
    assert_eq!(
        c.pools,
        vec![
            counted(PoolPath { reserve: Some(1 << 30), ..PoolPath::local("data", "/mnt/disk1") }),
            counted(PoolPath { require_mountpoint: true, ..PoolPath::local("data", "/mnt/disk2") }),
        ],
        "each root keeps its own options"
    );
    assert_eq!(c.default_pool.as_deref(), Some("data"), "one pool, so the default");
    // PV_DIR is the first root of the legacy pool; more may be added.
    let legacy = parse_on_node(&["--pv-dir", "/var/hpvolumes", "--pool", "legacy=/mnt/disk2"]).unwrap();
    assert_eq!(legacy.pools.iter().filter(|p| p.name == "legacy").count(), 2);
    assert_eq!(legacy.default_pool.as_deref(), Some("legacy"));
    // A shared pool is one filesystem: one root.
    let e = parse_on_node(&["--pool", "nfs=/mnt/a,shared", "--pool", "nfs=/mnt/b,shared"]).unwrap_err().to_string();
    assert!(e.starts_with("STORAGE_POOLS") && e.contains("shared pool with one root"), "{e}");
}

#[test]
fn a_pool_may_require_its_own_mount_point() {
    let c = parse_on_node(&["--pool", "claimed=/mnt/claimed,mountpoint,reserve=1Gi,plain=/mnt/plain"]).unwrap();
    assert_eq!(
        c.pools,
        vec![
            counted(PoolPath {
                require_mountpoint: true,
                reserve: Some(1 << 30),
                ..PoolPath::local("claimed", "/mnt/claimed")
            }),
            counted(PoolPath::local("plain", "/mnt/plain")),
        ]
    );
    assert!(!c.require_mountpoint, "the option of one pool is not the setting for all");
    let shared = parse_on_node(&["--pool", "nfs=/mnt/nfs,shared,mountpoint"]).unwrap();
    assert!(shared.pools[0].shared && shared.pools[0].require_mountpoint);
}

#[test]
fn bad_pools_are_refused_naming_the_setting() {
    for bad in [
        "ssd",
        "=/x",
        "Bad_Name=/x",
        "ssd=relative",
        "ssd=/",
        "ssd=/a/../b",
        "shared",
        "ssd=/x,fast",
        "reserve=1Gi",
        "mountpoint",
        "ssd=/x,mountpoint=yes",
        "ssd=/x,reserve=lots",
        "ssd=/x,shared,ssd=/y",
        "ssd=/x,ssd=/y,shared",
        "ssd=/x,ssd=/x",
        "a=/x,b=/x/y",
        "a=/x,a=/x/y",
    ] {
        let e = parse_on_node(&["--pv-dir", "/var/hpvolumes", "--pool", bad]).unwrap_err().to_string();
        assert!(e.starts_with("STORAGE_POOLS"), "{bad}: {e}");
    }
}

#[test]
fn lease_settings_are_checked() {
    let c = parse_on_node(&["--pv-dir", "/p", "--namespace", "hpp", "--node-lease-seconds", "9"]).unwrap();
    assert_eq!((c.namespace.as_str(), c.node_lease.as_secs()), ("hpp", 9));
    let e = parse_on_node(&["--pv-dir", "/p", "--node-lease-seconds", "1"]).unwrap_err().to_string();
    assert!(e.starts_with("NODE_LEASE_SECONDS"), "{e}");
    let e = parse_on_node(&["--pv-dir", "/p", "--namespace", "Not A Namespace"]).unwrap_err().to_string();
    assert!(e.starts_with("POD_NAMESPACE"), "{e}");
}

#[test]
fn go_style_listen_addresses_and_policies_parse() {
    let c = parse(&[
        "--node-name",
        "n",
        "--pv-dir",
        "/p",
        "--health-addr",
        ":9000",
        "--metrics-addr",
        "",
        "--provision-on-node",
        "vms, db",
        "--dir-mode",
        "0750",
        "--reserved-space",
        "1Gi",
    ])
    .unwrap();
    assert_eq!(c.health_addr, Some("0.0.0.0:9000".parse().unwrap()));
    assert_eq!(c.metrics_addr, None);
    assert_eq!(c.provision_on_node, ProvisionOnNodePolicy::Namespaces(vec!["vms".into(), "db".into()]));
    assert_eq!(c.dir_mode, 0o750);
    assert_eq!(c.reserved_bytes, 1 << 30);
}

#[test]
fn switches_accept_the_usual_spellings_in_any_case() {
    for (value, want) in [
        ("true", true),
        ("TRUE", true),
        ("yes", true),
        ("Yes", true),
        ("on", true),
        ("ON", true),
        ("1", true),
        (" true ", true),
        ("false", false),
        ("No", false),
        ("off", false),
        ("0", false),
    ] {
        assert_eq!(parse_switch("REQUIRE_MOUNTPOINT", value).ok(), Some(want), "{value:?}");
    }
}

#[test]
fn switches_refuse_other_spellings_naming_the_setting_on_one_line() {
    for value in ["", "enabled", "y", "2", "truee", "t", "-1", "on\noff"] {
        let e = parse_switch("REQUIRE_MOUNTPOINT", value).unwrap_err().to_string();
        assert!(e.starts_with("REQUIRE_MOUNTPOINT: "), "{value:?}: {e}");
        assert!(e.contains(SWITCH_SPELLINGS), "{e}");
        assert!(!e.contains('\n'), "one line: {e:?}");
    }
}

#[test]
fn require_mountpoint_yes_1_and_on_turn_the_check_on() {
    for value in ["yes", "1", "on", "True"] {
        let c = parse_on_node(&["--pv-dir", "/p", "--require-mountpoint", value]).unwrap();
        assert!(c.require_mountpoint, "{value:?}");
    }
    assert!(parse_on_node(&["--pv-dir", "/p", "--require-mountpoint"]).unwrap().require_mountpoint);
    assert!(!parse_on_node(&["--pv-dir", "/p"]).unwrap().require_mountpoint, "off by default");
    assert!(!parse_on_node(&["--pv-dir", "/p"]).unwrap().pv_finalizer, "off by default: rollback stays possible");
    assert!(parse_on_node(&["--pv-dir", "/p", "--pv-finalizer", "yes"]).unwrap().pv_finalizer);
    let e = parse_on_node(&["--pv-dir", "/p", "--pv-finalizer", "maybe"]).unwrap_err().to_string();
    assert!(e.starts_with("PV_FINALIZER"), "{e}");
    let e = parse_on_node(&["--pv-dir", "/p", "--require-mountpoint", "enabled"]).unwrap_err().to_string();
    assert!(e.starts_with("REQUIRE_MOUNTPOINT"), "{e}");
}

#[test]
fn typed_settings_are_refused_by_validate_naming_the_env_var() {
    let cases: [(&str, &str, &str); 7] = [
        ("--log-format", "xml", "LOG_FORMAT"),
        ("--pv-capacity", "all", "PV_CAPACITY"),
        ("--max-concurrency", "many", "MAX_CONCURRENCY"),
        ("--max-concurrency", "0", "MAX_CONCURRENCY"),
        ("--node-lease-seconds", "-5", "NODE_LEASE_SECONDS"),
        ("--peer-service", "Peers_Service", "PEER_SERVICE"),
        ("--peer-service", "a.b", "PEER_SERVICE"),
    ];
    for (flag, value, setting) in cases {
        let flag_value = format!("{flag}={value}");
        let argv = ["hostpath-provisioner", "--node-name", "n", "--pv-dir", "/p", &flag_value];
        let args = Args::try_parse_from(argv).unwrap_or_else(|e| panic!("{flag} {value}: clap refused it itself: {e}"));
        let e = args.validate().unwrap_err().to_string();
        assert!(e.starts_with(&format!("{setting}: ")), "{flag} {value}: {e}");
        assert!(!e.contains('\n'), "one line: {e:?}");
    }
    assert_eq!(parse_on_node(&["--pv-dir", "/p"]).unwrap().peer_service, None, "renewed Leases unless set");
    let c = parse_on_node(&["--pv-dir", "/p", "--peer-service", " hpp-peers "]).unwrap();
    assert_eq!(c.peer_service.as_deref(), Some("hpp-peers"));
    let c = parse_on_node(&["--pv-dir", "/p", "--log-format", "JSON", "--pv-capacity", "Filesystem"]).unwrap();
    assert_eq!((c.log_format, c.pv_capacity), (LogFormat::Json, PvCapacity::Filesystem));
}

#[test]
fn publish_capacity_is_off_by_default_and_needs_a_provisioner_name_that_is_an_object_name() {
    assert!(!parse_on_node(&["--pv-dir", "/p"]).unwrap().publish_capacity, "opt-in");
    let c =
        parse_on_node(&["--pv-dir", "/p", "--publish-capacity", "--provisioner-name", "hostpath.example.org"]).unwrap();
    assert!(c.publish_capacity);
    let e = parse_on_node(&["--pv-dir", "/p", "--publish-capacity", "yes"]).unwrap_err().to_string();
    assert!(e.starts_with("PUBLISH_CAPACITY: "), "{e}");
    assert!(e.contains("hostpath.example.org") && e.contains("CSIDriver"), "says what to do: {e}");
    assert!(e.contains("\"kubevirt.io/hostpath-provisioner\""), "names the value: {e}");
    assert!(!e.contains('\n'), "one line: {e:?}");
    assert!(parse_on_node(&["--pv-dir", "/p", "--publish-capacity", "off"]).is_ok(), "off needs nothing");
    let e = parse_on_node(&["--pv-dir", "/p", "--publish-capacity", "sometimes"]).unwrap_err().to_string();
    assert!(e.starts_with("PUBLISH_CAPACITY: ") && e.contains(SWITCH_SPELLINGS), "{e}");
}

#[test]
fn block_volumes_are_off_by_default_and_their_device_directory_is_absolute() {
    assert_eq!(parse_on_node(&["--pv-dir", "/p"]).unwrap().block_device_dir, None, "opt-in");
    let c = parse_on_node(&["--pv-dir", "/p", "--block-volumes"]).unwrap();
    assert_eq!(c.block_device_dir.as_deref(), Some(std::path::Path::new("/dev/hostpath-provisioner")));
    let c = parse_on_node(&["--pv-dir", "/p", "--block-volumes", "on", "--block-device-dir", "/dev/hpp-test"]).unwrap();
    assert_eq!(c.block_device_dir.as_deref(), Some(std::path::Path::new("/dev/hpp-test")));
    let e = parse_on_node(&["--pv-dir", "/p", "--block-volumes", "maybe"]).unwrap_err().to_string();
    assert!(e.starts_with("BLOCK_VOLUMES: ") && e.contains(SWITCH_SPELLINGS), "{e}");
    let e =
        parse_on_node(&["--pv-dir", "/p", "--block-volumes", "--block-device-dir", "dev/x"]).unwrap_err().to_string();
    assert!(e.starts_with("BLOCK_DEVICE_DIR: "), "{e}");
}

#[test]
fn a_capacity_provisioner_name_lets_the_first_name_keep_its_slash_and_must_name_an_object() {
    let c =
        parse_on_node(&["--pv-dir", "/p", "--publish-capacity", "--capacity-provisioner-name", "hostpath.example.org"])
            .unwrap();
    assert!(c.publish_capacity);
    assert_eq!(c.provisioner_name, "kubevirt.io/hostpath-provisioner");
    assert_eq!(c.capacity_provisioner_name.as_deref(), Some("hostpath.example.org"));
    assert_eq!(parse_on_node(&["--pv-dir", "/p"]).unwrap().capacity_provisioner_name, None, "opt-in");
    for refused in ["example.org/hostpath", "Hostpath.Example.org", "kubevirt.io/hostpath-provisioner"] {
        let e = parse_on_node(&["--pv-dir", "/p", "--capacity-provisioner-name", refused]).unwrap_err().to_string();
        assert!(e.starts_with("CAPACITY_PROVISIONER_NAME: ") && e.contains(refused), "{e}");
    }
    let same = ["--pv-dir", "/p", "--provisioner-name", "hostpath.example.org"];
    let e = parse_on_node(&[&same[..], &["--capacity-provisioner-name", "hostpath.example.org"]].concat())
        .unwrap_err()
        .to_string();
    assert!(e.contains("other than PROVISIONER_NAME"), "{e}");
}

#[test]
fn rust_log_that_does_not_parse_is_refused_naming_it() {
    use std::ffi::OsStr;
    assert!(log_filter(None).is_ok());
    assert!(log_filter(Some(OsStr::new(""))).is_ok());
    assert!(log_filter(Some(OsStr::new("info,hostpath_provisioner=debug"))).is_ok());
    for bad in ["info,hostpath_provisioner=loud", "=debug", "[{"] {
        let e = log_filter(Some(OsStr::new(bad))).unwrap_err().to_string();
        assert!(e.starts_with("RUST_LOG: "), "{bad:?}: {e}");
        assert!(!e.contains('\n'), "one line: {e:?}");
    }
}

#[test]
fn kubeconfig_lists_split_like_kubectl() {
    use std::ffi::OsStr;
    let split = |s: &str| split_kubeconfig_paths(OsStr::new(s));
    assert_eq!(split("/a"), vec![PathBuf::from("/a")]);
    assert_eq!(split("/a:/b"), vec![PathBuf::from("/a"), PathBuf::from("/b")]);
    assert_eq!(split(":/a::/b:"), vec![PathBuf::from("/a"), PathBuf::from("/b")]);
    assert!(split("").is_empty());
    let c = parse_on_node(&["--pv-dir", "/p", "--kubeconfig", "/etc/a.yaml:/etc/b.yaml"]).unwrap();
    assert_eq!(c.kubeconfig, vec![PathBuf::from("/etc/a.yaml"), PathBuf::from("/etc/b.yaml")]);
}

fn kubeconfig_file(dir: &std::path::Path, name: &str, current: &str, server: &str, extra_context: &str) -> PathBuf {
    let path = dir.join(name);
    let text = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: {current}\n\
         clusters:\n- name: shared\n  cluster:\n    server: {server}\n\
         users:\n- name: admin\n  user:\n    token: t-{name}\n\
         contexts:\n- name: {current}\n  context:\n    cluster: shared\n    user: admin\n\
         - name: {extra_context}\n  context:\n    cluster: shared\n    user: admin\n"
    );
    std::fs::write(&path, text).expect("write kubeconfig");
    path
}

#[test]
fn kubeconfig_lists_merge_and_the_first_file_wins() {
    let dir = tempfile::tempdir().expect("temp dir");
    let first = kubeconfig_file(dir.path(), "first", "ctx-first", "https://first:6443", "only-first");
    let second = kubeconfig_file(dir.path(), "second", "ctx-second", "https://second:6443", "only-second");
    let missing = dir.path().join("missing");
    let merged = read_kubeconfigs(&[missing.clone(), first, second]).expect("merged");
    assert_eq!(merged.current_context.as_deref(), Some("ctx-first"));
    let servers: Vec<_> = merged.clusters.iter().filter_map(|c| c.cluster.as_ref()?.server.clone()).collect();
    assert_eq!(servers, vec!["https://first:6443".to_owned()], "conflicting cluster: first file wins");
    let contexts: Vec<_> = merged.contexts.iter().map(|c| c.name.as_str()).collect();
    for name in ["ctx-first", "only-first", "ctx-second", "only-second"] {
        assert!(contexts.contains(&name), "{name} in {contexts:?}");
    }
    let e = read_kubeconfigs(&[missing]).unwrap_err().to_string();
    assert!(e.starts_with("KUBECONFIG"), "{e}");
}

/// Values that clap takes but that would fail after the start (a lease the API server refuses at
/// every renewal, a provisioner name no class can name, listeners that cannot both bind, a ','
/// in a pool path) stop the start with one line naming the env var, the flag and the value.
#[test]
fn values_that_would_fail_later_are_refused_at_start_naming_the_flag_and_the_value() {
    let cases: [(&[&str], &str, &str, &str); 11] = [
        (&["--pv-dir", "/a,b"], "PV_DIR", "--pv-dir", "/a,b"),
        (&["--pool", "ssd=/mnt/a,b"], "STORAGE_POOLS", "--pool", "ssd=/mnt/a,b"),
        (&["--pool", "=/mnt/ssd"], "STORAGE_POOLS", "--pool", "=/mnt/ssd"),
        (&["--pool", "ssd=/x,accounting=none"], "STORAGE_POOLS", "--pool", "ssd=/x,accounting=none"),
        (
            &["--reap-volumes-of-removed-nodes", "0s"],
            "REAP_VOLUMES_OF_REMOVED_NODES",
            "--reap-volumes-of-removed-nodes",
            "0s",
        ),
        (
            &["--reap-volumes-of-removed-nodes", "0h"],
            "REAP_VOLUMES_OF_REMOVED_NODES",
            "--reap-volumes-of-removed-nodes",
            "0h",
        ),
        (&["--node-lease-seconds", "2147483648"], "NODE_LEASE_SECONDS", "--node-lease-seconds", "2147483648"),
        (&["--provisioner-name", " "], "PROVISIONER_NAME", "--provisioner-name", " "),
        (&["--provisioner-name", "my provisioner"], "PROVISIONER_NAME", "--provisioner-name", "my provisioner"),
        (&["--provisioner-name", "example.com/a/b"], "PROVISIONER_NAME", "--provisioner-name", "example.com/a/b"),
        (
            &["--health-addr", "127.0.0.1:8080"],
            "METRICS_ADDR",
            "--metrics-addr",
            "0.0.0.0:8080 (HEALTH_ADDR 127.0.0.1:8080)",
        ),
    ];
    for (args, setting, flag, value) in cases {
        let mut all = vec!["--node-name", "n"];
        if !args.contains(&"--pv-dir") {
            all.extend(["--pv-dir", "/p"]);
        }
        all.extend_from_slice(args);
        let e = parse(&all).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{setting}: invalid value {value:?} (flag {flag}): ")), "{args:?}: {e}");
        assert!(!e.contains('\n'), "one line: {e:?}");
    }
    // The edges that still work.
    let c = parse_on_node(&["--pv-dir", "/p", "--node-lease-seconds", "2147483647"]).unwrap();
    assert_eq!(c.node_lease.as_secs(), 2_147_483_647);
    for name in ["kubevirt.io/hostpath-provisioner", "hostpath.example.org", "Example_Name.1", "a.b/C-d_e.f"] {
        assert_eq!(parse_on_node(&["--pv-dir", "/p", "--provisioner-name", name]).unwrap().provisioner_name, name);
    }
    // RUST_LOG has no flag: no flag named.
    let e = log_filter(Some(std::ffi::OsStr::new("=debug"))).unwrap_err().to_string();
    assert!(e.starts_with("RUST_LOG: invalid value \"=debug\": "), "{e}");
}

#[test]
fn provisioner_names_are_what_the_api_server_takes_as_a_class_provisioner() {
    for good in ["a", "kubevirt.io/hostpath-provisioner", "x.y/Z", "a-b_c.d", &"n".repeat(63)] {
        assert!(is_qualified_name(good), "{good}");
    }
    for bad in ["", "/a", "a/", "-a", "a-", "a b", "a/b/c", "Example.com/a", "ex_ample.com/a", &"n".repeat(64), "a/b c"]
    {
        assert!(!is_qualified_name(bad), "{bad}");
    }
}

#[test]
fn listeners_collide_only_where_the_second_could_not_bind() {
    let collide = |a: &str, b: &str| listeners_collide(a.parse().unwrap(), b.parse().unwrap());
    // A wildcard takes the port for every address of its family; [::] for IPv4 too.
    assert!(collide("0.0.0.0:8080", "127.0.0.1:8080"));
    assert!(collide("10.0.0.1:8080", "0.0.0.0:8080"));
    assert!(collide("[::]:8080", "127.0.0.1:8080"));
    assert!(collide("0.0.0.0:8080", "[::]:8080"));
    assert!(collide("[::1]:8080", "[::]:8080"));
    // Different ports, distinct addresses, the IPv4 wildcard next to an IPv6 address, the very
    // same address (one listener serves both), and port 0 (each gets a port of its own).
    assert!(!collide("0.0.0.0:8080", "0.0.0.0:8081"));
    assert!(!collide("127.0.0.1:8080", "127.0.0.2:8080"));
    assert!(!collide("0.0.0.0:8080", "[::1]:8080"));
    assert!(!collide("0.0.0.0:8080", "0.0.0.0:8080"));
    assert!(!collide("0.0.0.0:0", "127.0.0.1:0"));
    let c = parse_on_node(&["--pv-dir", "/p", "--health-addr", ":8080", "--metrics-addr", ":8080"]).unwrap();
    assert_eq!(c.health_addr, Some("0.0.0.0:8080".parse().unwrap()));
    assert_eq!(c.metrics_addr, c.health_addr, "one listener serves both");
    assert!(parse_on_node(&["--pv-dir", "/p", "--metrics-addr", "127.0.0.1:8081"]).is_err());
    assert!(parse_on_node(&["--pv-dir", "/p", "--metrics-addr", ""]).is_ok(), "disabled metrics collide with nothing");
}

#[test]
fn a_blank_pool_list_is_no_pools_as_a_blank_pv_dir_is() {
    let c = parse_on_node(&["--pv-dir", "/p", "--pool", "", "--pool", "  "]).unwrap();
    assert_eq!(c.pools, vec![counted(PoolPath::local("legacy", "/p"))]);
    let e = parse_on_node(&["--pool", ""]).unwrap_err().to_string();
    assert!(e.contains("PV_DIR"), "still needs a pool: {e}");
}

/// The daemon's `--help` names every subcommand `main` dispatches on, each on a line of its own.
#[test]
fn the_help_names_every_subcommand() {
    use clap::CommandFactory;
    let help = Args::command().render_long_help().to_string();
    for subcommand in [
        crate::doctor::SUBCOMMAND,
        crate::doctor::readyz::SUBCOMMAND,
        crate::doctor::volume_check::SUBCOMMAND,
        crate::operating::SUBCOMMAND,
        crate::operating::pool_mount::SUBCOMMAND,
    ] {
        assert!(
            help.lines().any(|line| line.trim_start().starts_with(&format!("{subcommand} "))),
            "{subcommand} missing from:\n{help}"
        );
    }
}

/// docs/configuration.md lists every flag and env var of the binary, its subcommands' included.
#[test]
fn the_configuration_reference_lists_every_setting() {
    use clap::CommandFactory;
    let doc = include_str!("../../docs/configuration.md");
    let commands = [
        Args::command(),
        crate::doctor::DoctorArgs::command(),
        crate::doctor::readyz::ReadyzArgs::command(),
        crate::operating::OperatorArgs::command(),
        crate::operating::pool_mount::PoolMountArgs::command(),
    ];
    for command in commands {
        for arg in command.get_arguments() {
            if let Some(long) = arg.get_long().filter(|l| !matches!(*l, "help" | "version")) {
                assert!(doc.contains(&format!("`--{long}")), "{} --{long} missing", command.get_name());
            }
            if let Some(env) = arg.get_env() {
                let env = env.to_string_lossy();
                assert!(doc.contains(&format!("`{env}`")), "{} {env} missing", command.get_name());
            }
        }
    }
}
