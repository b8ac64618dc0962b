//! docs/upgrading.md, run as written: an install of a pinned earlier commit of this project,
//! made before the HostPathSnapshot CRD existed, upgraded to this checkout by the documented
//! steps, then rolled back. After the upgrade the CRD is served and the provisioner's ClusterRole
//! grants snapshots; after the rollback the earlier rules are back and the CRD (and an object of
//! it) stays. The Helm path is the one Helm leaves a CRD behind on; the kustomization takes its
//! CRD along.

use super::*;

/// The pinned earlier commit: the last before HostPathSnapshot (its CRD, its RBAC) existed.
const EARLIER: &str = "12b82d297bdf2511c5dcb4140a08407fe805fe2d";
const SNAPSHOT_CRD: &str = "hostpathsnapshots.hostpath-provisioner.kubevirt.io";
const DOC: &str = "docs/upgrading.md";

/// Puts the deploy files of `commit` (None: this checkout's) into the shell's checkout, as a
/// user who takes that release's files.
fn take_the_files_of(shell: &Shell, commit: Option<&str>) {
    let deploy = shell.dir().join("deploy");
    std::fs::remove_dir_all(&deploy).expect("remove deploy/");
    let Some(commit) = commit else {
        copy_tree(&repo().join("deploy"), &deploy);
        return;
    };
    let archive = Command::new("git")
        .arg("-C")
        .arg(repo())
        .args(["archive", "--format=tar", commit, "deploy"])
        .output()
        .expect("git archive");
    assert!(
        archive.status.success(),
        "the pinned earlier commit {commit} is not in this clone (a shallow clone? fetch the history): {}",
        String::from_utf8_lossy(&archive.stderr)
    );
    let mut tar = Command::new("tar").arg("-x").arg("-C").arg(shell.dir()).stdin(Stdio::piped()).spawn().expect("tar");
    std::io::Write::write_all(&mut tar.stdin.take().expect("tar's stdin"), &archive.stdout).expect("untar");
    assert!(tar.wait().expect("tar").success(), "untar {commit}'s deploy/");
}

/// Whether a ClusterRole grants anything on HostPathSnapshots.
fn grants_snapshots(role: &Value) -> bool {
    role["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|rule| rule["resources"].as_array().into_iter().flatten().any(|r| r == "hostpathsnapshots"))
}

/// An object of the new kind, which the API server serves only once the CRD is there.
fn create_a_snapshot_object(shell: &Shell) {
    let file = shell.dir().join("snapshot.yaml");
    std::fs::write(
        &file,
        "apiVersion: hostpath-provisioner.kubevirt.io/v1alpha1\nkind: HostPathSnapshot\nmetadata:\n  name: before-rollback\n  namespace: default\nspec:\n  source:\n    persistentVolumeClaimName: data\n",
    )
    .expect("write the snapshot");
    shell.kubectl(&["create", "-f", file.to_str().expect("utf-8 path")]);
}

fn snapshot_object_exists(shell: &Shell) -> bool {
    shell.get(&["hostpathsnapshot", "before-rollback", "-n", "default"]).is_some()
}

#[tokio::test(flavor = "multi_thread")]
async fn upgrading_a_helm_release_from_before_snapshots_and_back_runs_as_written() {
    let docs = Docs::load();
    let mut shell =
        Shell::with_cluster("upgrading_a_helm_release_from_before_snapshots_and_back_runs_as_written").await;
    let role = |shell: &Shell| shell.must_get(&["clusterrole", "hostpath-provisioner"]);
    take_the_files_of(&shell, Some(EARLIER));
    let out = shell.run(&docs.command("docs/install.md", "3a. Helm", "helm install"));
    assert!(out.contains("STATUS: deployed"), "{out}");
    assert!(shell.get(&["crd", SNAPSHOT_CRD]).is_none(), "the earlier chart has no snapshot CRD");
    assert!(!grants_snapshots(&role(&shell)));

    take_the_files_of(&shell, None);
    let section = "Helm";
    shell.run(&docs.command(DOC, section, "helm get values"));
    assert!(shell.read("my-values.yaml").contains(REGISTRY), "the values installed with");
    shell.run(&docs.command(
        DOC,
        section,
        "kubectl apply --server-side --force-conflicts -f deploy/helm/hostpath-provisioner/crds/",
    ));
    let out = shell.run(&docs.command(DOC, section, "helm upgrade hostpath-provisioner"));
    assert!(out.contains("STATUS: deployed") && out.contains("REVISION: 2"), "{out}");
    let out = shell.run(&docs.command(DOC, section, "kubectl -n hostpath-provisioner rollout status"));
    assert!(out.contains("successfully rolled out"), "{out}");
    shell.kubectl(&["wait", "--for", "condition=Established", "--timeout", "60s", &format!("crd/{SNAPSHOT_CRD}")]);
    assert!(grants_snapshots(&role(&shell)), "the upgraded release's rules");
    let daemonset = shell.must_get(&["daemonset", "hostpath-provisioner", "-n", "hostpath-provisioner"]);
    assert_eq!(
        container(&daemonset)["image"],
        format!("{REGISTRY}/hostpath-provisioner:{}", env!("CARGO_PKG_VERSION"))
    );
    create_a_snapshot_object(&shell);

    let out = shell.run(&docs.command(DOC, section, "helm rollback hostpath-provisioner"));
    assert!(out.contains("Rollback was a success"), "{out}");
    assert!(!grants_snapshots(&role(&shell)), "the earlier revision's rules are back");
    assert!(shell.get(&["crd", SNAPSHOT_CRD]).is_some(), "Helm never deletes a CRD");
    assert!(snapshot_object_exists(&shell), "nor the objects of its kind");
    shell.finish();
}

#[tokio::test(flavor = "multi_thread")]
async fn upgrading_a_kustomize_install_from_before_snapshots_and_back_runs_as_written() {
    let docs = Docs::load();
    let mut shell =
        Shell::with_cluster("upgrading_a_kustomize_install_from_before_snapshots_and_back_runs_as_written").await;
    let role = |shell: &Shell| shell.must_get(&["clusterrole", "kubevirt-hostpath-provisioner"]);
    let section = "Kustomize and the one file";
    let apply = docs.command(DOC, section, "kubectl apply -k deploy/legacy");
    let rollout = docs.command(DOC, section, "kubectl -n kubevirt-hostpath-provisioner rollout status");
    take_the_files_of(&shell, Some(EARLIER));
    shell.set_image_in_kustomization("deploy/legacy/kustomization.yaml");
    shell.run(&apply);
    assert!(shell.get(&["crd", SNAPSHOT_CRD]).is_none(), "the earlier kustomization has no snapshot CRD");
    assert!(!grants_snapshots(&role(&shell)));

    take_the_files_of(&shell, None);
    shell.set_image_in_kustomization("deploy/legacy/kustomization.yaml");
    shell.run(&apply);
    let out = shell.run(&rollout);
    assert!(out.contains("successfully rolled out"), "{out}");
    shell.kubectl(&["wait", "--for", "condition=Established", "--timeout", "60s", &format!("crd/{SNAPSHOT_CRD}")]);
    assert!(grants_snapshots(&role(&shell)), "the new release's rules");
    create_a_snapshot_object(&shell);

    // Back: the same command from the earlier release's files.
    take_the_files_of(&shell, Some(EARLIER));
    shell.set_image_in_kustomization("deploy/legacy/kustomization.yaml");
    shell.run(&apply);
    shell.run(&rollout);
    assert!(!grants_snapshots(&role(&shell)), "the earlier rules are back");
    assert!(shell.get(&["crd", SNAPSHOT_CRD]).is_some(), "an apply never removes what the new release added");
    assert!(snapshot_object_exists(&shell));
    shell.finish();
}
