//! The operator's decisions: the `HostPathProvisioner` resource ([`resource`]), the objects a
//! resource makes ([`render`]), the status it reports ([`status`]), and which operator replica
//! acts ([`lease`]); the core objects it embeds are read strictly ([`embedded`]). Pure: the I/O is in `crate::operating`.

pub mod embedded;
pub mod lease;
pub mod pool_claims;
pub mod pool_plan;
pub mod render;
pub mod resource;
pub mod spec_rules;
pub mod status;
pub mod takeover;
pub mod takeover_stop;
