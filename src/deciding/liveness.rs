//! Which nodes run a live provisioner, when liveness comes from the readiness of the provisioner
//! pods (`--peer-service`) instead of renewed Leases.
//!
//! The kubelet probes each provisioner pod's `/readyz` and the EndpointSlice controller publishes
//! the result, per pod, with the pod's node, in the EndpointSlices of a Service selecting the
//! pods. Both are written only when something changes, so reading liveness from them costs the
//! cluster nothing at rest, where a renewed Lease per node costs one write per node every
//! renewal, forever. A node's Lease is still written, but only when the pools it can use change:
//! it says which pools the node serves, not whether it is alive.
//!
//! Rules (unit-tested below):
//! - a node is live when at least one endpoint on it is ready and not terminating; an endpoint
//!   whose readiness is unknown (no `ready` condition) counts as ready, as the API documents;
//! - a terminating pod hands its work over at once (its successor becomes ready on its own);
//! - the pools a live node serves come from its Lease; a live node without a Lease (written just
//!   after it became ready, or not at all yet) is live and serves no pool, so it is kept from
//!   being forgotten (its published capacity stays) but is handed no pool's work;
//! - this node is live only when its own endpoint says so: it acts for the cluster only while the
//!   other nodes see it as live, and then with the pools it can use now (not its Lease's, which
//!   may lag a write behind).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::deciding::topology::{LiveNode, PoolKey};
use crate::keys;

/// Label the EndpointSlice controller sets on the slices of a Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The nodes with at least one ready, not terminating endpoint in `slices`.
pub fn ready_nodes(slices: &[EndpointSlice]) -> BTreeSet<String> {
    slices
        .iter()
        .flat_map(|slice| slice.endpoints.iter().flatten())
        .filter(|endpoint| {
            let conditions = endpoint.conditions.as_ref();
            let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
            let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
            ready && !terminating
        })
        .filter_map(|endpoint| endpoint.node_name.clone())
        .collect()
}

/// Why the slices listed for the peers Service cannot be a view of the cluster, if they cannot:
/// none at all means no such Service selects a pod (a typo in PEER_SERVICE, the Service not
/// applied, the EndpointSlice controller not running). Deciding on that empty view would count
/// every node gone (this one too), so no node would act and each would remove the others'
/// published capacity: the caller reports it and waits instead.
pub fn unusable_view(slices: &[EndpointSlice], service: &str, namespace: &str) -> Option<String> {
    slices.is_empty().then(|| {
        format!(
            "no EndpointSlice of Service {service} in namespace {namespace}: liveness from readiness (PEER_SERVICE) \
             needs that headless Service selecting the provisioner pods and the EndpointSlice controller"
        )
    })
}

/// The pools each node's Lease advertises, by node (the Lease's holder).
pub fn advertised_pools(leases: &[Lease]) -> BTreeMap<String, Vec<PoolKey>> {
    leases
        .iter()
        .filter_map(|lease| {
            let node = lease.spec.as_ref()?.holder_identity.clone()?;
            let pools = lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(keys::LEASE_POOLS))
                .map(|list| parse_advertised(list))
                .unwrap_or_default();
            Some((node, pools))
        })
        .collect()
}

/// The live nodes: every node in `ready` with the pools its Lease advertises, this node (`me`)
/// with `my_pools` instead. `recheck` is how soon a decision that another node acts looks again
/// (there is no expiry to wait for: readiness changes are seen at the next look).
pub fn live_nodes(
    ready: &BTreeSet<String>,
    advertised: &BTreeMap<String, Vec<PoolKey>>,
    me: &str,
    my_pools: &[PoolKey],
    recheck: Duration,
) -> Vec<LiveNode> {
    ready
        .iter()
        .map(|node| {
            let pools = if node == me { my_pools.to_vec() } else { advertised.get(node).cloned().unwrap_or_default() };
            LiveNode { node: node.clone(), pools, expires_in: recheck }
        })
        .collect()
}

/// Reads `name=root,name=root` as a Lease advertises it (malformed entries are skipped).
pub fn parse_advertised(list: &str) -> Vec<PoolKey> {
    list.split(',')
        .filter_map(|entry| entry.split_once('='))
        .filter(|(name, root)| !name.is_empty() && root.starts_with('/'))
        .map(|(name, root)| PoolKey::new(name, root))
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn endpoint(node: Option<&str>, ready: Option<bool>, terminating: Option<bool>) -> Endpoint {
        Endpoint {
            addresses: vec!["10.0.0.1".into()],
            node_name: node.map(Into::into),
            conditions: Some(EndpointConditions { ready, serving: ready, terminating }),
            ..Default::default()
        }
    }

    fn slice(endpoints: Vec<Endpoint>) -> EndpointSlice {
        EndpointSlice { address_type: "IPv4".into(), endpoints: Some(endpoints), ..Default::default() }
    }

    fn lease(node: &str, pools: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                annotations: Some([(keys::LEASE_POOLS.to_owned(), pools.to_owned())].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec { holder_identity: Some(node.into()), ..Default::default() }),
        }
    }

    #[test]
    fn a_node_is_live_while_one_of_its_endpoints_is_ready_and_not_terminating() {
        let slices = [
            slice(vec![
                endpoint(Some("ready"), Some(true), Some(false)),
                endpoint(Some("unknown"), None, None),
                endpoint(Some("not-ready"), Some(false), Some(false)),
                endpoint(Some("terminating"), Some(true), Some(true)),
                endpoint(None, Some(true), None),
            ]),
            // A second pod on a node (a rollout's surge): one ready endpoint is enough.
            slice(vec![endpoint(Some("not-ready"), Some(true), None)]),
        ];
        assert_eq!(
            ready_nodes(&slices),
            BTreeSet::from(["not-ready".to_owned(), "ready".to_owned(), "unknown".to_owned()])
        );
        assert!(ready_nodes(&[]).is_empty());
    }

    #[test]
    fn no_slice_at_all_is_a_misconfiguration_not_a_cluster_without_live_nodes() {
        let reason = unusable_view(&[], "hpp-peers", "ns").expect("refused");
        assert!(reason.contains("hpp-peers") && reason.contains("ns") && reason.contains("PEER_SERVICE"), "{reason}");
        // A slice whose endpoints are all not ready is a view: every node is gone.
        let all_down = [slice(vec![endpoint(Some("a"), Some(false), None)])];
        assert_eq!(unusable_view(&all_down, "hpp-peers", "ns"), None);
        assert!(ready_nodes(&all_down).is_empty());
    }

    #[test]
    fn pools_come_from_the_lease_and_mine_from_what_i_can_use_now() {
        let ready = BTreeSet::from(["a".to_owned(), "b".to_owned(), "me".to_owned()]);
        let advertised = advertised_pools(&[
            lease("a", "nfs=/mnt/nfs"),
            lease("me", "stale=/old"),
            // A Lease without a ready endpoint: a dead node, not live whatever its Lease says.
            lease("dead", "nfs=/mnt/nfs"),
        ]);
        let mine = [PoolKey::new("nfs", "/mnt/nfs"), PoolKey::new("local", "/var/hpvolumes")];
        let live = live_nodes(&ready, &advertised, "me", &mine, Duration::from_secs(15));
        let by_node: BTreeMap<_, _> = live.iter().map(|n| (n.node.as_str(), n.pools.clone())).collect();
        assert_eq!(by_node.len(), 3, "{live:?}");
        assert_eq!(by_node["a"], vec![PoolKey::new("nfs", "/mnt/nfs")]);
        assert_eq!(by_node["b"], vec![], "live without a Lease: serves nothing yet");
        assert_eq!(by_node["me"], mine.to_vec());
        assert!(live.iter().all(|n| n.expires_in == Duration::from_secs(15)));
    }

    #[test]
    fn this_node_is_not_live_while_its_own_endpoint_is_not_ready() {
        let ready = BTreeSet::from(["a".to_owned()]);
        let live = live_nodes(&ready, &BTreeMap::new(), "me", &[PoolKey::new("nfs", "/n")], Duration::from_secs(1));
        assert!(live.iter().all(|n| n.node != "me"), "{live:?}");
    }

    #[test]
    fn advertised_pools_round_trip_and_garbage_is_skipped() {
        assert_eq!(
            parse_advertised("legacy=/var/hpvolumes,nfs=/mnt/nfs"),
            vec![PoolKey::new("legacy", "/var/hpvolumes"), PoolKey::new("nfs", "/mnt/nfs")]
        );
        assert_eq!(parse_advertised(""), vec![]);
        assert_eq!(parse_advertised("junk,=/x,a=relative,b=/ok"), vec![PoolKey::new("b", "/ok")]);
    }
}

#[cfg(test)]
mod mixed_model;
