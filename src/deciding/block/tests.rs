use super::*;
use crate::deciding::claim::ProvisionPlan;
use crate::deciding::claim::{Decision, decide_claim};
use crate::deciding::volume_spec::NodeFacts;
use crate::keys;
use crate::test_fixtures::*;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

fn plan() -> ProvisionPlan {
    let claim = claim("hpp").selected(NODE).build();
    match decide_claim(&claim, Some(&class("hpp", "WaitForFirstConsumer")), &me(), &config(), &[]) {
        Decision::Provision(plan) => *plan,
        other => panic!("{other:?}"),
    }
}

fn dev() -> &'static Path {
    Path::new(DEVICE_DIR)
}

fn node() -> NodeFacts {
    NodeFacts { name: NODE.into(), hostname: "node-a.example.com".into() }
}

#[test]
fn the_node_and_the_backing_file_are_named_after_the_volume_only() {
    let pv = format!("pvc-{UID}");
    assert_eq!(device_node_path(dev(), &pv).unwrap(), Path::new(&format!("/dev/hostpath-provisioner/pvc-{UID}")));
    for foreign in ["sda", "pvc-../../sda", "pvc-x", "", "pvc-0b5c7f8e-6a4d-4e1f-9c2b-3d4e5f607182/../x"] {
        assert!(matches!(device_node_path(dev(), foreign), Err(BlockPathRefusal::ForeignPvName(_))), "{foreign:?}");
    }
    assert_eq!(
        backing_file_path(Path::new("/var/hpvolumes"), &pv),
        Path::new(&format!("/var/hpvolumes/pvc-{UID}/block.img"))
    );
}

#[test]
fn a_block_pv_naming_a_host_device_or_another_volumes_node_is_refused() {
    let pv = format!("pvc-{UID}");
    let other = "pvc-11111111-2222-3333-4444-555555555555";
    let own = format!("/dev/hostpath-provisioner/{pv}");
    assert_eq!(accept_device_path(&own, &pv, dev()).unwrap(), Path::new(&own));
    assert!(
        accept_device_path(&format!("/dev//hostpath-provisioner/./{pv}"), &pv, dev()).is_ok(),
        "lexically the same"
    );
    for forged in [
        "/dev/sda".to_owned(),
        "/dev/loop3".to_owned(),
        format!("/dev/hostpath-provisioner/{other}"),
        format!("/dev/hostpath-provisioner/{other}/../{pv}"),
        format!("/dev/hostpath-provisioner/{pv}/x"),
        format!("dev/hostpath-provisioner/{pv}"),
        format!("/var/hpvolumes/{pv}/block.img"),
        "/dev/hostpath-provisioner".to_owned(),
    ] {
        match accept_device_path(&forged, &pv, dev()) {
            Err(BlockPathRefusal::NotItsNode { path, .. }) => assert_eq!(path, forged),
            other => panic!("{forged}: {other:?}"),
        }
    }
    assert!(matches!(accept_device_path("/dev/sda", "sda", dev()), Err(BlockPathRefusal::ForeignPvName(_))));
}

#[test]
fn a_block_pv_is_a_local_pv_of_the_device_node_pinned_to_the_node() {
    let claim = claim("hpp").selected(NODE).block().build();
    let plan = plan();
    let pv =
        crate::deciding::volume_spec::build_block_pv(&plan, &claim, &node(), Quantity("1Gi".into()), 4242, None, dev())
            .unwrap();
    let spec = pv.spec.as_ref().unwrap();
    assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
    assert!(spec.host_path.is_none());
    let local = spec.local.as_ref().unwrap();
    assert_eq!(local.path, format!("/dev/hostpath-provisioner/pvc-{UID}"));
    assert_eq!(local.fs_type, None);
    assert!(spec.node_affinity.is_some(), "a local PV needs its node affinity");
    let ann = pv.metadata.annotations.as_ref().unwrap();
    assert_eq!(ann[BACKING_INODE_ANNOTATION], "4242");
    assert_eq!(ann[BACKING_DIR_ANNOTATION], format!("/var/hpvolumes/pvc-{UID}"));
    assert_eq!(ann[keys::PROVISIONER_IDENTITY], format!("{PROVISIONER}/local"), "the Go build leaves it alone");
    // What is written is what is accepted later: the node, and the directory for deletion.
    assert!(accept_device_path(&local.path, &plan.pv_name, dev()).is_ok());
    let accepted = layout::accept_delete_path(&ann[BACKING_DIR_ANNOTATION], &plan.pv_name, &config().pools).unwrap();
    assert_eq!(accepted.dir_name, plan.dir_name);
}

#[test]
fn a_block_volume_is_only_node_shaped() {
    let claim = claim("hpp").selected(NODE).block().build();
    for topology in [Topology::Shared, Topology::EveryNode] {
        let plan = ProvisionPlan { topology, ..plan() };
        assert_eq!(
            crate::deciding::volume_spec::build_block_pv(
                &plan,
                &claim,
                &node(),
                Quantity("1Gi".into()),
                1,
                None,
                dev()
            ),
            Err(BlockPathRefusal::NotNodeTopology(topology))
        );
    }
}

#[test]
fn allocation_is_sparse_unless_full_is_asked() {
    assert_eq!(Allocation::parse(None), Ok(Allocation::Sparse));
    assert_eq!(Allocation::parse(Some("sparse")), Ok(Allocation::Sparse));
    assert_eq!(Allocation::parse(Some("full")), Ok(Allocation::Full));
    assert_eq!(Allocation::parse(Some("Full")), Err("sparse, full"));
}

#[test]
fn a_birth_time_is_written_and_read_back_exactly_and_nothing_else_is_read_as_one() {
    let birth = Birth { seconds: 1_700_000_000, nanoseconds: 42 };
    assert_eq!(birth.to_annotation(), "1700000000.000000042");
    assert_eq!(Birth::parse(&birth.to_annotation()), Some(birth));
    for bad in ["", "1700000000", "1700000000.42", "x.000000042", "1.0000000001", "1.-00000001", "1.+00000001"] {
        assert_eq!(Birth::parse(bad), None, "{bad:?}");
    }
    let claim = claim("hpp").selected(NODE).block().build();
    let pv = crate::deciding::volume_spec::build_block_pv(
        &plan(),
        &claim,
        &node(),
        Quantity("1Gi".into()),
        7,
        Some(birth),
        dev(),
    )
    .unwrap();
    assert_eq!(pv.metadata.annotations.unwrap()[BACKING_BIRTH_ANNOTATION], "1700000000.000000042");
}
