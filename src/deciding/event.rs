//! The Events this project writes itself, as kube's recorder writes them (`<object>.<time in hex
//! nanoseconds>`), but named so that the API server takes them for every object.
//!
//! The recorder names an Event after the object it is about. An object's name may be 253
//! characters long (a claim's, a snapshot's), and with the recorder's 17-character suffix the
//! Event's name is over the API server's limit: the create is refused and the user never sees the
//! refusal or the wait it explains, only the provisioner's log does. Such objects get an Event
//! named from a shortened name and a hash of the whole one instead.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use sha2::{Digest, Sha256};

/// Longest name the API server accepts for an Event (a DNS subdomain).
pub const MAX_EVENT_NAME: usize = 253;

/// Hex digits of the whole name's hash kept in a shortened name: enough that two long names
/// sharing their first 220 characters still name their Events apart.
const HASH_DIGITS: usize = 10;

/// The name kube's recorder gives an Event about `object` at `at`.
fn recorder_name(object: &str, at: Timestamp) -> String {
    format!("{object}.{:x}", at.as_nanosecond())
}

/// Whether kube's recorder can name an Event about `object` (its name is short enough).
pub fn recorder_can_name(object: &str) -> bool {
    recorder_name(object, Timestamp::MAX).len() <= MAX_EVENT_NAME
}

/// The name of an Event about `object` at `at`: the recorder's when it fits, else the object's
/// name cut short (at a character a DNS subdomain may end with), a hash of the whole name and the
/// time. Always a valid DNS subdomain when `object` is one.
pub fn event_name(object: &str, at: Timestamp) -> String {
    let name = recorder_name(object, at);
    if name.len() <= MAX_EVENT_NAME {
        return name;
    }
    let hash: String = Sha256::digest(object.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    let time = format!("{:x}", at.as_nanosecond());
    // Two dots between the three parts.
    let room = MAX_EVENT_NAME - HASH_DIGITS - time.len() - 2;
    // A DNS subdomain is ASCII, so any byte is a character boundary; anything else is cut at one.
    let mut end = room.min(object.len());
    while !object.is_char_boundary(end) {
        end -= 1;
    }
    let prefix = object[..end].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{prefix}.{}.{time}", &hash[..HASH_DIGITS])
}

/// What an Event says, apart from whom it is about and who reports it.
#[derive(Clone, Copy, Debug)]
pub struct EventText<'a> {
    /// `Normal` or `Warning`.
    pub type_: &'a str,
    /// The reason (CamelCase).
    pub reason: &'a str,
    /// The action it reports on.
    pub action: &'a str,
    /// What a user reads (at most 1 KiB: the caller cuts it).
    pub note: &'a str,
}

/// A first occurrence of an Event, as kube's recorder writes one, named by [`event_name`]. A
/// cluster-scoped object's Events go to `default`, as the recorder puts them.
pub fn new_event(
    controller: &str,
    instance: &str,
    regarding: &ObjectReference,
    text: EventText<'_>,
    at: Timestamp,
) -> Event {
    let object = regarding.name.as_deref().unwrap_or(controller);
    Event {
        metadata: ObjectMeta {
            namespace: Some(regarding.namespace.clone().unwrap_or_else(|| "default".into())),
            name: Some(event_name(object, at)),
            ..Default::default()
        },
        action: Some(text.action.into()),
        reason: Some(text.reason.into()),
        event_time: Some(MicroTime(at)),
        regarding: Some(regarding.clone()),
        note: Some(text.note.into()),
        reporting_controller: Some(controller.into()),
        reporting_instance: Some(instance.into()),
        type_: Some(text.type_.into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DNS-1123 subdomain, as the API server checks an Event's name.
    fn is_dns_subdomain(name: &str) -> bool {
        name.len() <= MAX_EVENT_NAME
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    }

    fn at() -> Timestamp {
        "2026-11-28T20:00:00.123456789Z".parse().unwrap()
    }

    #[test]
    fn a_short_name_is_named_as_kubes_recorder_names_it() {
        assert_eq!(event_name("data-0", at()), format!("data-0.{:x}", at().as_nanosecond()));
        assert!(recorder_can_name("data-0"));
    }

    #[test]
    fn every_name_length_up_to_the_limit_gives_a_valid_event_name() {
        // Every length, with a '-' or a '.' at every place in turn, where the cut may fall: a cut
        // that left one at the end of a label would be refused.
        for len in 1..=MAX_EVENT_NAME {
            for separator in [b'-', b'.'] {
                for at_byte in 0..len {
                    let mut object = vec![b'x'; len];
                    if at_byte > 0 && at_byte + 1 < len {
                        object[at_byte] = separator;
                    }
                    let object = String::from_utf8(object).unwrap();
                    let name = event_name(&object, at());
                    assert!(is_dns_subdomain(&name), "{len} {at_byte}: {name}");
                }
            }
        }
    }

    #[test]
    fn a_name_of_253_characters_gets_a_shortened_event_name_that_still_tells_the_objects_apart() {
        let a = format!("{}a", "v".repeat(252));
        let b = format!("{}b", "v".repeat(252));
        assert!(!recorder_can_name(&a));
        let (name_a, name_b) = (event_name(&a, at()), event_name(&b, at()));
        assert!(name_a.len() <= MAX_EVENT_NAME && is_dns_subdomain(&name_a), "{name_a}");
        assert_ne!(name_a, name_b, "the hash tells two names with one prefix apart");
        assert!(name_a.starts_with(&"v".repeat(200)), "readable: starts with the object's name: {name_a}");
    }

    #[test]
    fn the_longest_name_the_recorder_can_still_name_is_the_boundary() {
        let time = format!("{:x}", Timestamp::MAX.as_nanosecond());
        let fits = "n".repeat(MAX_EVENT_NAME - 1 - time.len());
        assert!(recorder_can_name(&fits));
        assert!(!recorder_can_name(&format!("{fits}n")));
    }

    #[test]
    fn a_new_event_names_its_object_reporter_and_namespace() {
        let regarding = ObjectReference {
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some("tenant".into()),
            name: Some("c".repeat(253)),
            uid: Some("u-1".into()),
            ..Default::default()
        };
        let text = EventText { type_: "Warning", reason: "ProvisioningFailed", action: "Provision", note: "why" };
        let event = new_event("example.com/hpp", "node-1", &regarding, text, at());
        assert_eq!(event.metadata.namespace.as_deref(), Some("tenant"));
        assert!(is_dns_subdomain(event.metadata.name.as_deref().unwrap()));
        assert_eq!(event.regarding.as_ref().and_then(|r| r.uid.as_deref()), Some("u-1"));
        assert_eq!(event.reporting_controller.as_deref(), Some("example.com/hpp"));
        assert_eq!(event.reporting_instance.as_deref(), Some("node-1"));
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        let cluster_scoped = ObjectReference { namespace: None, ..regarding };
        assert_eq!(new_event("c", "i", &cluster_scoped, text, at()).metadata.namespace.as_deref(), Some("default"));
    }
}
