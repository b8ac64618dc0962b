//! The node DaemonSet's settings, checked by the node binary's own parser before the operator
//! applies them: a `spec.config` value (or pool option) that the node pods would refuse at start
//! would otherwise roll out pods that exit in a loop, node after node. Refused instead, with the
//! binary's message and the spec field, and what runs is left as it was.

use clap::{CommandFactory, FromArgMatches};
use k8s_openapi::api::apps::v1::DaemonSet;

use crate::config::Args;
use crate::deciding::operator::render::{NODE_CONTAINER, Problem, Rendered, field_of_env};

/// `rendered`, or, when the node binary would refuse its DaemonSet's settings, nothing to apply
/// and the problem (as any problem of the whole resource: what runs is left as it was).
pub fn checked(rendered: Rendered) -> Rendered {
    match check(&rendered) {
        None => rendered,
        Some(problem) => {
            let mut problems = rendered.problems;
            problems.push(problem);
            Rendered { problems, not_acted_upon: rendered.not_acted_upon, ..Rendered::default() }
        }
    }
}

/// The node binary's objection to the rendered DaemonSet's settings, as a problem of the whole
/// resource; None when it would start.
pub fn check(rendered: &Rendered) -> Option<Problem> {
    let object = rendered.objects.iter().find(|o| o.kind == "DaemonSet")?;
    let daemonset: DaemonSet = serde_json::from_value(object.body.clone()).ok()?;
    let pod = daemonset.spec?.template.spec?;
    let container = pod.containers.iter().find(|c| c.name == NODE_CONTAINER)?;
    let env: Vec<(String, String)> =
        container.env.iter().flatten().filter_map(|e| Some((e.name.clone(), e.value.clone()?))).collect();
    let (setting, message) = objection(&env)?;
    let field = field_of_env(&setting).unwrap_or_else(|| format!("the DaemonSet's {setting}"));
    Some(Problem {
        reason: "InvalidNodeSetting",
        message: format!(
            "{field}: the node provisioner would refuse it at start, so the node DaemonSet is left as it was: {message}"
        ),
        pool: None,
    })
}

/// The env var the binary refuses and its message, given the container's plain env values (the
/// downward-API ones get stand-ins). Only these values count: the operator's own environment is
/// not read.
pub fn objection(env: &[(String, String)]) -> Option<(String, String)> {
    let command = Args::command().mut_args(|arg| arg.env(None::<&str>));
    let mut env = env.to_vec();
    for (name, stand_in) in [("NODE_NAME", "node-check"), ("POD_NAMESPACE", "node-check")] {
        if !env.iter().any(|(n, _)| n == name) {
            env.push((name.to_owned(), stand_in.to_owned()));
        }
    }
    let mut argv = vec!["hostpath-provisioner".to_owned()];
    let mut rust_log = None;
    for (name, value) in &env {
        if name == "RUST_LOG" {
            rust_log = Some(value.clone());
            continue;
        }
        if let Some(long) = flag_of(name) {
            argv.push(format!("{long}={value}"));
        }
    }
    if let Some(value) = rust_log
        && let Err(error) = crate::config::log_filter(Some(std::ffi::OsStr::new(&value)))
    {
        return Some(("RUST_LOG".into(), error.to_string()));
    }
    let matches = match command.try_get_matches_from(&argv) {
        Ok(matches) => matches,
        Err(error) => return Some((setting_named(&error.to_string(), &env), error.to_string())),
    };
    let args = match Args::from_arg_matches(&matches) {
        Ok(args) => args,
        Err(error) => return Some((setting_named(&error.to_string(), &env), error.to_string())),
    };
    match args.validate() {
        Ok(_) => None,
        Err(error) => Some((setting_named(&error.to_string(), &env), error.to_string())),
    }
}

/// The flag (`--pv-capacity`) of the setting read from env var `name`.
fn flag_of(name: &str) -> Option<String> {
    Args::command()
        .get_arguments()
        .find(|a| a.get_env().is_some_and(|e| e == name))
        .and_then(|a| a.get_long().map(|l| format!("--{l}")))
}

/// The env var a message of the binary names: its own messages start with it, clap's quote its
/// flag (`'--publish-capacity [<PUBLISH_CAPACITY>]'`).
fn setting_named(message: &str, env: &[(String, String)]) -> String {
    let quotes_flag = |name: &str| {
        flag_of(name).is_some_and(|flag| {
            let quoted = format!("'{flag}");
            message.match_indices(&quoted).any(|(at, _)| {
                message[at + quoted.len()..].chars().next().is_none_or(|c| !c.is_ascii_alphanumeric() && c != '-')
            })
        })
    };
    env.iter()
        .map(|(name, _)| name.as_str())
        .find(|name| message.starts_with(name) || quotes_flag(name))
        .unwrap_or("a setting")
        .to_owned()
}

/// Removes the CSIDriver of published capacity this resource made and no longer asks for
/// (`spec.config.publishCapacity` turned off, or `provisionerName` changed); the rest of what the
/// operator makes is always made, and goes with the resource.
pub async fn prune_capacity_drivers(
    client: &kube::Client,
    resource: &crate::deciding::operator::resource::HostPathProvisioner,
    rendered: &Rendered,
) -> Result<(), String> {
    use k8s_openapi::api::storage::v1::CSIDriver;
    use kube::ResourceExt;
    use kube::api::{Api, DeleteParams, ListParams};
    if rendered.blocked() {
        return Ok(());
    }
    let name = resource.name_any();
    let uid = resource.uid().unwrap_or_default();
    let api: Api<CSIDriver> = Api::all(client.clone());
    let selector = format!("{}={name}", crate::deciding::operator::render::OWNER_LABEL);
    let made = api.list(&ListParams::default().labels(&selector)).await.map_err(|e| format!("list CSIDrivers: {e}"))?;
    let wanted: Vec<&str> =
        rendered.objects.iter().filter(|o| o.kind == "CSIDriver").map(|o| o.name.as_str()).collect();
    for driver in made.items.iter().filter(|d| d.owner_references().iter().any(|r| r.uid == uid)) {
        let driver_name = driver.name_any();
        if wanted.contains(&driver_name.as_str()) {
            continue;
        }
        match api.delete(&driver_name, &DeleteParams::background()).await {
            Ok(_) => {
                tracing::info!(resource = %name, csidriver = %driver_name, "removed the CSIDriver of published capacity")
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(format!("delete CSIDriver {driver_name}: {error}")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn the_binarys_own_parser_names_the_setting_it_refuses() {
        let base = [("STORAGE_POOLS", "a=/var/a"), ("POD_NAMESPACE", "ns")];
        assert_eq!(objection(&env(&base)), None);
        for (name, bad) in [
            ("PV_CAPACITY", "whole"),
            ("DIR_MODE", "rwx"),
            ("RESERVED_SPACE", "lots"),
            ("CAPACITY_ACCOUNTING", "promises"),
            ("MAX_CONCURRENCY", "0"),
            ("ORPHAN_SNAPSHOT_COPY_GRACE", "soon"),
            ("NODE_AFFINITY_KEYS", "not a key!"),
            ("PROVISION_ON_NODE", "Some Namespace"),
            ("PUBLISH_CAPACITY", "maybe"),
            ("RUST_LOG", "info,,=bad=="),
            ("STORAGE_POOLS", "a=/var/a,reserve=lots"),
        ] {
            let mut given = env(&base);
            given.retain(|(n, _)| n != name);
            given.push((name.to_owned(), bad.to_owned()));
            let (setting, message) = objection(&given).unwrap_or_else(|| panic!("{name}={bad} accepted"));
            assert_eq!(setting, name, "{message}");
        }
        let publish = env(&[("STORAGE_POOLS", "a=/var/a"), ("PUBLISH_CAPACITY", "true")]);
        let objection = objection(&publish);
        assert_eq!(objection.as_ref().map(|o| o.0.as_str()), Some("PUBLISH_CAPACITY"), "{objection:?}");
    }
}
