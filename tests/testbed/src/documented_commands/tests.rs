use std::collections::BTreeSet;

use super::*;

fn texts(commands: &[DocumentedCommand]) -> Vec<&str> {
    commands.iter().map(|c| c.text.as_str()).collect()
}

#[test]
fn shell_block_lines_are_commands_with_continuations_joined_and_comments_dropped() {
    let doc = "\
# Install

## 3a. Helm

```sh
# a comment line
helm install hpp deploy/helm/hostpath-provisioner \\
  --namespace hpp --create-namespace \\
  --set image.registry=registry.example.com
kubectl apply -k deploy/legacy          # plain Kubernetes

kubectl patch pv x -p '{\"a\":\"# not a comment\"}'
```
";
    let commands = extract("docs/install.md", doc);
    assert_eq!(
        texts(&commands),
        [
            "helm install hpp deploy/helm/hostpath-provisioner --namespace hpp --create-namespace --set image.registry=registry.example.com",
            "kubectl apply -k deploy/legacy",
            "kubectl patch pv x -p '{\"a\":\"# not a comment\"}'",
        ]
    );
    assert_eq!(commands[0].line, 7, "the line the command starts on");
    assert_eq!(commands[1].line, 10);
    assert!(commands.iter().all(|c| c.section == "3a. Helm" && c.origin == Origin::Block));
    assert_eq!(commands[0].location(), "docs/install.md:7");
}

#[test]
fn only_shell_fences_hold_commands_and_console_blocks_only_after_the_prompt() {
    let doc = "\
```yaml
kubectl: apply
```

```text
helm install printed output
```

```console
$ kubectl get pods
NAME   READY
$ helm upgrade hpp chart \\
    --reuse-values
Release \"hpp\" has been upgraded.
```

~~~bash
make image
~~~
";
    assert_eq!(
        texts(&extract("README.md", doc)),
        ["kubectl get pods", "helm upgrade hpp chart --reuse-values", "make image"]
    );
}

#[test]
fn an_indented_fence_in_a_list_item_is_read_without_its_indentation() {
    let doc = "\
1. **The image**:

   ```sh
   docker buildx build --platform linux/amd64 \\
     -t registry.example.com/hpp:0.1.0 --push .
   ```

   ```
   not a shell block
   ```
";
    assert_eq!(
        texts(&extract("docs/development.md", doc)),
        ["docker buildx build --platform linux/amd64 -t registry.example.com/hpp:0.1.0 --push ."]
    );
}

#[test]
fn inline_code_is_a_command_when_it_starts_with_a_known_program_and_has_an_argument() {
    let doc = "\
## Install

| Path | Command |
|---|---|
| Helm | `helm install hpp deploy/helm/hostpath-provisioner -n hpp --set image.registry=...` |
| One file | `kubectl apply -f deploy/install.yaml` |

Set `PV_DIR` and `--kubeconfig`; `kubectl` alone is no command, `IMAGE_PLATFORMS=linux/amd64 make image` is.
Escaped \\`kubectl delete pv x\\` is no code, and `` kubectl get `x` `` has backticks inside.
";
    let commands = extract("README.md", doc);
    assert_eq!(
        texts(&commands),
        [
            "helm install hpp deploy/helm/hostpath-provisioner -n hpp --set image.registry=...",
            "kubectl apply -f deploy/install.yaml",
            "IMAGE_PLATFORMS=linux/amd64 make image",
            "kubectl get `x`",
        ]
    );
    assert!(commands.iter().all(|c| c.origin == Origin::Inline && c.section == "Install"));
    assert_eq!(commands.iter().map(|c| c.line).collect::<Vec<_>>(), [5, 6, 8, 9]);
}

#[test]
fn inline_code_continues_over_a_line_break_but_not_over_a_blank_line() {
    let doc = "\
Remove the finalizer (`kubectl patch hpp <name> --type merge -p
'{\"metadata\":{\"finalizers\":null}}'`); then go on.

An unclosed `kubectl apply -f x

` stays text.
";
    let commands = extract("docs/operator.md", doc);
    assert_eq!(texts(&commands), ["kubectl patch hpp <name> --type merge -p '{\"metadata\":{\"finalizers\":null}}'"]);
    assert_eq!(commands[0].line, 1);
}

#[test]
fn code_in_a_fence_is_never_read_as_inline_code_and_sections_follow_headings() {
    let doc = "\
## One

`kubectl apply -k deploy/legacy`

```yaml
# `kubectl delete ns x` in a yaml comment
```

### Two ###
`helm uninstall hpp`
";
    let commands = extract("docs/install.md", doc);
    assert_eq!(texts(&commands), ["kubectl apply -k deploy/legacy", "helm uninstall hpp"]);
    assert_eq!(commands[0].section, "One");
    assert_eq!(commands[1].section, "Two");
}

#[test]
fn commands_that_install_upgrade_migrate_roll_back_or_remove_are_classified() {
    for command in [
        "helm install hpp deploy/helm/hostpath-provisioner",
        "helm upgrade hpp deploy/helm/hostpath-provisioner --reuse-values",
        "helm rollback hpp 1",
        "helm uninstall hpp -n hpp",
        "helm test hpp -n hpp --logs",
        "helm -n hpp test hpp",
        "helm package deploy/helm/hostpath-provisioner",
        "helm push hostpath-provisioner-0.1.0.tgz oci://registry.example.com/charts",
        "kubectl apply -f deploy/install.yaml",
        "kubectl apply --server-side --force-conflicts -k deploy/operator",
        "kubectl -n hpp delete deployment hostpath-provisioner-operator",
        "kubectl --namespace hpp rollout status daemonset/x",
        "kubectl label namespace hpp pod-security.kubernetes.io/enforce=privileged",
        "kubectl patch pv NAME --type json -p '[{\"op\":\"remove\"}]'",
        "kubectl annotate pvc data a=b",
        "kubectl scale deployment x --replicas 0",
        "kubectl set image daemonset/x c=y",
        "kubectl kustomize deploy/legacy > deploy/install.yaml",
        "cd deploy/legacy && kustomize edit set image hpp=registry.example.com/hpp:0.1.0",
        "docker build .",
        "docker buildx create --use",
        "docker push registry.example.com/hpp:0.1.0",
        "make image",
        "make image IMAGE_PLATFORMS=linux/amd64",
        "IMAGE_PLATFORMS=linux/amd64 make manifests",
        "ctr -n k8s.io images import target/image/hostpath-provisioner.oci.tar",
        "podman load -i x.tar",
        "skopeo copy oci-archive:x docker://y",
        "cp deploy/systemd/hostpath-provisioner.service /etc/systemd/system/",
        "sudo systemctl enable --now hostpath-provisioner.service",
        "systemctl daemon-reload",
    ] {
        assert!(changes_an_install(command), "{command}");
    }
}

#[test]
fn commands_that_only_read_or_develop_are_not_classified() {
    for command in [
        "kubectl get hostpathprovisioners",
        "kubectl -n hpp get pods -o wide",
        "kubectl describe pvc data",
        "kubectl -n delete logs x",
        "kubectl -n hpp exec pod -- /hostpath-provisioner doctor",
        "helm template x deploy/helm/hostpath-provisioner",
        "helm lint --strict deploy/helm/hostpath-provisioner",
        "make test",
        "make demo DEMO_ARGS=--simulated",
        "make bench BENCH_ARGS=\"--nodes 1 --claims 100\"",
        "cargo test --test e2e_real_nodes -- rolling_update",
        "docker run --rm registry.example.com/hpp:0.1.0 --help",
        "ctr images check",
        "git rev-parse HEAD",
        "cd deploy/legacy",
    ] {
        assert!(!changes_an_install(command), "{command}");
    }
}

#[test]
fn a_quoted_or_redirected_word_is_not_taken_for_a_subcommand() {
    // `delete` is the namespace here, `apply` a file name after a redirection.
    assert!(!changes_an_install("kubectl -n delete get pods"));
    assert!(!changes_an_install("kubectl get pods > apply"));
    assert!(!changes_an_install("echo 'kubectl apply -f x'"));
    assert!(changes_an_install("kubectl get pods | kubectl apply -f -"));
}

const LEDGER: &str = "\
# The ledger.

command: kubectl apply -f deploy/install.yaml
run by: the_one_file_install_runs_as_written
run by: the_readme_paths_run_as_written

command: docker build .
untestable: needs a Docker daemon
";

#[test]
fn the_ledger_parses_into_entries_with_their_coverage() {
    let ledger = parse_ledger(LEDGER).expect("parses");
    assert_eq!(
        ledger.entries,
        [
            LedgerEntry {
                command: "kubectl apply -f deploy/install.yaml".into(),
                line: 3,
                coverage: Coverage::RunBy(vec![
                    "the_one_file_install_runs_as_written".into(),
                    "the_readme_paths_run_as_written".into()
                ]),
            },
            LedgerEntry {
                command: "docker build .".into(),
                line: 7,
                coverage: Coverage::Untestable("needs a Docker daemon".into()),
            },
        ]
    );
    assert_eq!(
        ledger.run_by("the_readme_paths_run_as_written"),
        BTreeSet::from(["kubectl apply -f deploy/install.yaml"])
    );
    assert!(ledger.run_by("docker").is_empty());
}

#[test]
fn a_malformed_ledger_is_refused_with_its_line() {
    for (text, says) in [
        ("command: x\n", "neither"),
        ("command: x\nrun by: t\nuntestable: why\n", "both"),
        ("command: x\nuntestable: a\nuntestable: b\n", "second `untestable:`"),
        ("command: x\nrun by: t\ncommand: y\nrun by: t\n", "blank line"),
        ("run by: t\n", "before any `command:`"),
        ("command: x\ntested: t\n", "unknown key"),
        ("command: x\nrun by: t\n\ncommand: x\nrun by: u\n", "listed twice (first on line 1)"),
        ("command: x\nrun by t\n", "line 2"),
    ] {
        let error = format!("{:#}", parse_ledger(text).expect_err(text));
        assert!(error.contains(says), "{text:?}: {error}");
    }
}

#[test]
fn function_names_are_found_as_a_grep_would() {
    let source = "#[test]\nfn a_test() {}\nasync fn helper_2(x: u8) {}\nlet f = |x| x; // a closure\nfn  spaced() {}";
    assert_eq!(function_names(source), BTreeSet::from(["a_test".to_owned(), "helper_2".to_owned()]));
}

fn documented(file: &str, line: usize, text: &str) -> DocumentedCommand {
    DocumentedCommand { file: file.into(), line, section: String::new(), origin: Origin::Block, text: text.into() }
}

#[test]
fn the_ledger_check_names_missing_stale_and_unknown_entries() {
    let ledger = parse_ledger(
        "command: kubectl apply -f deploy/install.yaml\nrun by: a_test\n\n\
         command: kubectl apply -k deploy/gone\nuntestable: why\n\n\
         command: kubectl get pods\nrun by: a_test\n\n\
         command: docker build .\nrun by: no_such_test\n",
    )
    .expect("parses");
    let commands = [
        documented("README.md", 3, "kubectl apply -f deploy/install.yaml"),
        documented("docs/install.md", 9, "kubectl apply -f deploy/install.yaml"),
        documented("docs/install.md", 12, "helm uninstall hpp -n hpp"),
        documented("docs/install.md", 14, "kubectl get pods"),
        documented("docs/install.md", 20, "docker build ."),
    ];
    let tests = BTreeSet::from(["a_test".to_owned()]);
    let problems = ledger_problems(&commands, &ledger, &tests);
    let expected = [
        "`helm uninstall hpp -n hpp` (docs/install.md:12) is not in",
        "`kubectl apply -k deploy/gone` is no longer in the docs",
        "`kubectl get pods` (docs/install.md:14) does not change an install",
        "`docker build .` names the test `no_such_test`",
    ];
    assert_eq!(problems.len(), expected.len(), "{problems:#?}");
    for (problem, says) in problems.iter().zip(expected) {
        assert!(problem.contains(says), "{problem}\nshould say {says}");
    }
    // In step: nothing to say.
    let ledger = parse_ledger("command: kubectl apply -f deploy/install.yaml\nrun by: a_test\n").expect("parses");
    assert!(ledger_problems(&commands[..2], &ledger, &tests).is_empty());
}
