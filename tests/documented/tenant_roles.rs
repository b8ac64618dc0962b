//! What a documented install gives tenants on HostPathSnapshots (docs/snapshots.md, "Who may take
//! snapshots"): its ClusterRoles aggregated by the real controller into the built-in `admin` and
//! `view`, then used by impersonated users bound to those in a namespace of their own.

use super::*;

/// The controllers of a cluster whose built-in roles gain the installed ClusterRoles' rules
/// (`clusterrole-aggregation`, not in the harness's list), besides the DaemonSet controller.
pub const AGGREGATING_CONTROLLERS: &[&str] = &["daemonset", "clusterrole-aggregation"];

/// The namespace of the tenants (docs/snapshots.md's), and its users: `alice` is bound to
/// `admin` by the doc's command, `bob` to `view`.
const TENANTS: &str = "team-a";

/// A snapshot of a claim of the tenants' namespace (no provisioner runs: it stays pending).
const SNAPSHOT: &str = "apiVersion: hostpath-provisioner.kubevirt.io/v1alpha1
kind: HostPathSnapshot
metadata:
  name: before-upgrade
  namespace: team-a
spec:
  source:
    persistentVolumeClaimName: data
";

/// kubectl as `user` (impersonated by the harness's admin): its stdout, or its stderr when it
/// failed.
fn kubectl_as(shell: &Shell, user: &str, args: &[&str]) -> Result<String, String> {
    let mut args = args.to_vec();
    args.extend(["--as", user, "-n", TENANTS]);
    shell.cp().run_kubectl(shell.dir(), &args).map_err(|e| format!("{e:#}"))
}

fn forbidden(shell: &Shell, user: &str, args: &[&str]) {
    match kubectl_as(shell, user, args) {
        Ok(out) => panic!("{user} may {args:?}: {out}"),
        Err(said) => assert!(said.contains("Forbidden") || said.contains("forbidden"), "{user} {args:?}: {said}"),
    }
}

fn allowed(shell: &Shell, user: &str, args: &[&str]) -> String {
    kubectl_as(shell, user, args).unwrap_or_else(|said| panic!("{user} may not {args:?}: {said}"))
}

/// A namespace admin may take, list and delete snapshots and may never write their status; a
/// viewer may read them and nothing more. Fails on an install without the aggregated roles (the
/// admin is Forbidden) and on roles that grant `hostpathsnapshots/status`.
pub async fn tenants_take_snapshots_with_the_built_in_roles(shell: &mut Shell, docs: &Docs) {
    shell.kubectl(&["create", "namespace", TENANTS]);
    shell.run(&docs.command("docs/snapshots.md", "Who may take snapshots", "kubectl create rolebinding alice-admin"));
    shell.kubectl(&["create", "rolebinding", "bob-view", "--clusterrole=view", "--user=bob", "-n", TENANTS]);
    // The controller adds the rules to the built-in roles shortly after the install's roles
    // appear.
    testbed::wait_for("the snapshot roles aggregated into admin and view", WAIT, || async {
        let admin = kubectl_as(
            shell,
            "alice",
            &["auth", "can-i", "create", "hostpathsnapshots.hostpath-provisioner.kubevirt.io"],
        );
        let view =
            kubectl_as(shell, "bob", &["auth", "can-i", "list", "hostpathsnapshots.hostpath-provisioner.kubevirt.io"]);
        anyhow::Ok((admin.is_ok_and(|a| a.trim() == "yes") && view.is_ok_and(|v| v.trim() == "yes")).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));

    let file = shell.dir().join("snapshot.yaml");
    std::fs::write(&file, SNAPSHOT).expect("write the snapshot");
    let file = file.to_str().expect("utf-8 path");
    allowed(shell, "alice", &["create", "-f", file]);
    allowed(shell, "alice", &["label", "hostpathsnapshot", "before-upgrade", "purpose=upgrade"]);
    // The status names the node that keeps the copy: the provisioner's alone.
    let status = r#"{"status":{"node":"another-node","method":"copy"}}"#;
    let patch_status =
        ["patch", "hostpathsnapshot", "before-upgrade", "--subresource=status", "--type=merge", "-p", status];
    forbidden(shell, "alice", &patch_status);

    let listed = allowed(shell, "bob", &["get", "hostpathsnapshots", "-o", "name"]);
    assert_eq!(listed.trim(), "hostpathsnapshot.hostpath-provisioner.kubevirt.io/before-upgrade");
    allowed(shell, "bob", &["get", "hostpathsnapshot", "before-upgrade"]);
    forbidden(shell, "bob", &["create", "-f", file]);
    forbidden(shell, "bob", &["delete", "hostpathsnapshot", "before-upgrade"]);
    forbidden(shell, "bob", &patch_status);

    allowed(shell, "alice", &["delete", "hostpathsnapshot", "before-upgrade", "--wait=false"]);
    shell.wait_gone(&["hostpathsnapshot", "before-upgrade", "-n", TENANTS]).await;
    // Another namespace is not theirs.
    forbidden(shell, "alice", &["get", "hostpathsnapshots", "--all-namespaces"]);
}
