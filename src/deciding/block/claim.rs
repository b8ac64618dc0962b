//! Whether a `volumeMode: Block` claim can be served, and how (issue #47). Pure. Not yet asked by
//! `deciding::claim`: Block claims are refused there until provisioning, deletion and start-up
//! carry Block volumes out (see the module above).

use crate::deciding::block::Allocation;
pub use crate::deciding::block::SETTING;
use crate::deciding::class::ClassRequest;
use crate::deciding::quota::QuotaMode;
pub use crate::deciding::refusal::BlockClaimRefusal;
use crate::deciding::topology::Topology;

/// A Block claim accepted: how its backing file is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRequest {
    /// The class's `allocation` parameter.
    pub allocation: Allocation,
}

/// Whether a Block claim of class `class` (read into `request`, its `allocation` parameter
/// `allocation`) is served, on an install where Block volumes are `enabled`. A clone or a
/// restore is checked by `deciding::clone` and `deciding::snapshot` (the source's mode).
pub fn accept_block_claim(
    enabled: bool,
    class: &str,
    request: &ClassRequest,
    allocation: Option<&str>,
) -> Result<BlockRequest, BlockClaimRefusal> {
    if !enabled {
        return Err(BlockClaimRefusal::Disabled);
    }
    if request.topology != Topology::Node {
        return Err(BlockClaimRefusal::Topology { class: class.to_owned(), topology: request.topology });
    }
    if request.quota == QuotaMode::Enforce {
        return Err(BlockClaimRefusal::Quota(class.to_owned()));
    }
    if request.path_pattern.is_some() {
        return Err(BlockClaimRefusal::PathPattern(class.to_owned()));
    }
    let allocation = Allocation::parse(allocation).map_err(|accepted| BlockClaimRefusal::Allocation {
        class: class.to_owned(),
        value: allocation.unwrap_or_default().to_owned(),
        accepted,
    })?;
    Ok(BlockRequest { allocation })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deciding::class::class_request;
    use crate::test_fixtures::*;

    fn request(params: &[(&str, &str)]) -> ClassRequest {
        let mut c = class("hpp", "WaitForFirstConsumer");
        c.parameters = Some(params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        class_request(&c, "hpp", &config()).expect("a valid class")
    }

    #[test]
    fn a_block_claim_is_served_only_when_the_install_opted_in() {
        let plain = request(&[]);
        let refused = accept_block_claim(false, "hpp", &plain, None).unwrap_err();
        assert_eq!(refused, BlockClaimRefusal::Disabled);
        assert!(refused.to_string().contains("--block-volumes"), "names the setting: {refused}");
        assert_eq!(accept_block_claim(true, "hpp", &plain, None), Ok(BlockRequest { allocation: Allocation::Sparse }));
        assert_eq!(
            accept_block_claim(true, "hpp", &plain, Some("full")),
            Ok(BlockRequest { allocation: Allocation::Full })
        );
    }

    #[test]
    fn what_a_block_volume_cannot_be_is_refused_saying_what_to_change() {
        let plain = request(&[]);
        for (request, allocation, says) in [
            (request(&[("topology", "shared")]), None, "use topology node"),
            (request(&[("topology", "everyNode")]), None, "use topology node"),
            (request(&[("quota", "enforce")]), None, "without quota"),
            (request(&[("pathPattern", "{namespace}_{claim}")]), None, "without pathPattern"),
            (plain.clone(), Some("thick"), "accepted: sparse, full"),
        ] {
            let refused = accept_block_claim(true, "hpp", &request, allocation).unwrap_err();
            assert!(refused.to_string().contains(says), "{refused}");
        }
    }
}
