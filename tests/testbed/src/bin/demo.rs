//! `make demo`: a local control plane, one claim provisioned and deleted, narrated step by step.
//! Where the host can run the real-node lane (root, containerd, the kubelet), a real pod on a
//! real kubelet writes into the volume; elsewhere two simulated nodes stand in, and the demo
//! says why. Usage: `demo --provisioner PATH [--logs DIR] [--simulated]`.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Event, Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use testbed::fixtures::{self, annotations::SELECTED_NODE};
use testbed::{ControlPlane, SimNode};

/// How long any one step may take before the demo gives up.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(20);
const NAMESPACE: &str = "demo";
const CLAIM: &str = "demo-data";
const POD: &str = "demo-app";
const CLASS_FILE: &str = "deploy/legacy/storageclass-wffc.yaml";

/// Everything the demo started. Field order is drop order: provisioners, then the control plane.
#[derive(Default)]
struct Demo {
    nodes: Vec<SimNode>,
    cp: Option<ControlPlane>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let (provisioner, logs_dir, simulated) = match parse_args() {
        Ok(args) => args,
        Err(err) => {
            eprintln!("demo: {err:#}\nusage: demo --provisioner PATH [--logs DIR] [--simulated]");
            return ExitCode::from(2);
        }
    };
    if !simulated {
        match testbed::real_nodes::availability() {
            Ok(()) => return real::demo(&provisioner, &logs_dir).await,
            Err(reason) => {
                println!("NOTE: this host cannot run a real kubelet, so the demo uses SIMULATED nodes:");
                println!("      {reason:#}");
                println!("      (no pod will start; the provisioning flow is the same)\n");
            }
        }
    }
    let mut demo = Demo::default();
    let outcome = tokio::select! {
        result = run(&provisioner, &mut demo) => Some(result),
        _ = tokio::signal::ctrl_c() => None,
    };
    let saved = save_logs(&demo, &logs_dir);
    let code = match outcome {
        Some(Ok(())) => ExitCode::SUCCESS,
        Some(Err(err)) => {
            eprintln!("\ndemo FAILED: {err:#}");
            ExitCode::FAILURE
        }
        None => {
            eprintln!("\ninterrupted (Ctrl-C)");
            ExitCode::from(130)
        }
    };
    heading("Logs");
    match saved {
        Ok(paths) => paths.iter().for_each(|p| println!("  {}", p.display())),
        Err(err) => println!("  could not copy the logs: {err:#}"),
    }
    println!("\nStopping the provisioners and the control plane...");
    drop(demo);
    println!("Done: every process the demo started is stopped and its temp dir removed.");
    code
}

fn parse_args() -> Result<(PathBuf, PathBuf, bool)> {
    let (mut provisioner, mut logs, mut simulated) = (None, PathBuf::from("target/demo-logs"), false);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--simulated" => simulated = true,
            "--provisioner" => provisioner = args.next().map(PathBuf::from),
            "--logs" => logs = args.next().map(PathBuf::from).context("--logs needs a directory")?,
            other => bail!("unknown argument {other:?}"),
        }
    }
    let provisioner = provisioner.context("--provisioner PATH is required")?;
    let binary = provisioner
        .canonicalize()
        .with_context(|| format!("{} not found (cargo build -p hostpath-provisioner)", provisioner.display()))?;
    Ok((binary, logs, simulated))
}

async fn run(provisioner: &Path, demo: &mut Demo) -> Result<()> {
    println!("hostpath-provisioner demo: one claim, from Pending to provisioned to deleted.");
    heading("1. Local control plane");
    println!("  starting etcd, kube-apiserver, kube-controller-manager (PV controllers), kube-scheduler...");
    let cp = demo.cp.insert(ControlPlane::start().await?);
    println!("  ready in {:.1} s at {}", cp.started_in().as_secs_f64(), cp.connection().url);
    println!("  no kubelet runs here: pods get scheduled, never started");

    heading("2. Two simulated nodes, each a provisioner process with its own pool root");
    for name in ["node-1", "node-2"] {
        let node = SimNode::start(cp, name, provisioner, &[]).await?;
        println!("  {name}: provisioner pid {} ready, pool {}", node.provisioner.pid(), node.pool_root.display());
        demo.nodes.push(node);
    }
    let client = cp.admin_client();

    heading("3. StorageClass");
    println!("  $ kubectl apply -f {CLASS_FILE}");
    let class_file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(CLASS_FILE);
    let applied = cp.run_kubectl(Path::new("."), &["apply", "-o", "name", "-f", &class_file.display().to_string()])?;
    let class = applied.trim().rsplit('/').next().unwrap_or_default().to_string();
    let sc = Api::<k8s_openapi::api::storage::v1::StorageClass>::all(client.clone()).get(&class).await?;
    println!("  {class}: provisioner {}, binding {}", sc.provisioner, sc.volume_binding_mode.unwrap_or_default());

    heading(&format!("4. Claim {NAMESPACE}/{CLAIM} (1Gi)"));
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &fixtures::namespace(NAMESPACE)).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let claim =
        claims.create(&PostParams::default(), &fixtures::claim(NAMESPACE, CLAIM, &class, "1Gi").build()).await?;
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let events: Api<Event> = Api::namespaced(client.clone(), NAMESPACE);
    let note = claim_event(&events, &uid, "WaitForFirstConsumer").await?.message.unwrap_or_default();
    let claim = claims.get(CLAIM).await?;
    println!("  phase {}: WaitForFirstConsumer, nothing happens until a pod uses it", phase_of_claim(&claim));
    println!("  event from the PV controller: {note:?}");

    heading(&format!("5. Pod {NAMESPACE}/{POD} using the claim"));
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let started = Instant::now();
    pods.create(&PostParams::default(), &fixtures::pod_using_claim(NAMESPACE, POD, CLAIM).build()).await?;
    println!("  created; the scheduler picks a node for the pod, and so for the volume");
    timeline("the claim Bound and the pod scheduled", started, &[2, 3], || async {
        let (claim, pod) = (claims.get(CLAIM).await?, pods.get(POD).await?);
        let pv = pvs.get_opt(&format!("pvc-{uid}")).await?;
        let selected = claim.metadata.annotations.as_ref().and_then(|a| a.get(SELECTED_NODE));
        Ok(vec![
            selected.map(|n| format!("claim annotated {SELECTED_NODE}={n}")),
            pv.map(|pv| format!("PV {} created by the node's provisioner", pv.metadata.name.unwrap_or_default())),
            (phase_of_claim(&claim) == "Bound").then(|| "claim Bound to it (by the PV controller)".to_string()),
            pod.spec.and_then(|s| s.node_name).map(|n| format!("pod bound to {n} (pod.spec.nodeName)")),
        ])
    })
    .await?;
    let node = pods.get(POD).await?.spec.and_then(|s| s.node_name).context("pod scheduled")?;
    println!("  (the scheduler's volume-binding step checks about once a second whether the claim is bound;");
    println!("   the pod stays Pending afterwards: there is no kubelet to start it)");

    heading("6. The provisioned volume");
    let pv_name = claims.get(CLAIM).await?.spec.and_then(|s| s.volume_name).unwrap_or_default();
    let pv = pvs.get(&pv_name).await?;
    let spec = pv.spec.clone().unwrap_or_default();
    let host_path = spec.host_path.clone().map(|h| (h.path, h.type_.unwrap_or_default())).unwrap_or_default();
    let capacity = spec.capacity.as_ref().and_then(|c| c.get("storage")).map(|q| q.0.clone()).unwrap_or_default();
    println!("  PV             {pv_name}");
    let reclaim = spec.persistent_volume_reclaim_policy.unwrap_or_default();
    println!("  capacity       {capacity}, reclaim policy {reclaim}");
    println!("  node affinity  {}", node_affinity(&pv));
    println!("  hostPath       {} (type {})", host_path.0, host_path.1);
    let event = claim_event(&events, &uid, "ProvisioningSucceeded").await?;
    let (by, on) = (event.reporting_component.unwrap_or_default(), event.reporting_instance.unwrap_or_default());
    println!("  event          ProvisioningSucceeded from {by} on {on}: {:?}", event.message.unwrap_or_default());
    demo.nodes.iter().try_for_each(show_pool)?;
    let dir = PathBuf::from(&host_path.0);
    let chosen_pool = &demo.nodes.iter().find(|n| n.name == node).context("the chosen node")?.pool_root;
    anyhow::ensure!(dir.is_dir() && dir.starts_with(chosen_pool), "{} is not in {node}'s pool", dir.display());

    heading("7. Delete the pod and the claim");
    let started = Instant::now();
    pods.delete(POD, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await?;
    claims.delete(CLAIM, &DeleteParams::default()).await?;
    println!("  deleted; the PV controller releases the volume, {node}'s provisioner reclaims it");
    timeline("the PV and its directory to be gone", started, &[0, 2, 3], || async {
        let pv = pvs.get_opt(&pv_name).await?;
        let phase = pv.as_ref().and_then(|p| p.status.as_ref()?.phase.clone()).unwrap_or_default();
        Ok(vec![
            claims.get_opt(CLAIM).await?.is_none().then(|| "claim gone".to_string()),
            (phase == "Released").then(|| format!("PV {pv_name} Released")),
            (!dir.exists()).then(|| format!("directory gone from {node}'s pool")),
            pv.is_none().then(|| "PV gone".to_string()),
        ])
    })
    .await?;
    println!("\nThe demo worked: claim provisioned on the scheduler's node and reclaimed after use.");
    Ok(())
}

/// Polls `observe` (milestones in order, `None` while not reached) until every milestone in
/// `required` was reached, then prints each with the time since `started` it was first seen.
async fn timeline<F, Fut>(what: &str, started: Instant, required: &[usize], observe: F) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Vec<Option<String>>>>,
{
    let seen = RefCell::new(BTreeMap::new());
    poll(what, || async {
        for (i, milestone) in observe().await?.into_iter().enumerate() {
            if let Some(line) = milestone {
                seen.borrow_mut().entry(i).or_insert((started.elapsed(), line));
            }
        }
        Ok(required.iter().all(|i| seen.borrow().contains_key(i)).then_some(()))
    })
    .await?;
    seen.into_inner().values().for_each(|(at, line)| println!("  +{:>5.2} s  {line}", at.as_secs_f64()));
    Ok(())
}

fn heading(title: &str) {
    println!("\n== {title}");
}

/// Polls `probe` every 20 ms until it yields a value; fails after [`STEP_TIMEOUT`].
async fn poll<T, F, Fut>(what: &str, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let started = Instant::now();
    loop {
        let last = match probe().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => None,
            Err(err) => Some(err),
        };
        if started.elapsed() > STEP_TIMEOUT {
            let last = last.map(|e| format!(" (last error: {e:#})")).unwrap_or_default();
            bail!("nothing happened within {} s while waiting for {what}{last}", STEP_TIMEOUT.as_secs());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits for an event with `reason` about the object `uid` (core/v1 view of all events).
async fn claim_event(events: &Api<Event>, uid: &str, reason: &str) -> Result<Event> {
    poll(&format!("the {reason} event on the claim"), || async {
        let list = events.list(&ListParams::default().fields(&format!("involvedObject.uid={uid}"))).await?;
        Ok(list.items.into_iter().find(|e| e.reason.as_deref() == Some(reason)))
    })
    .await
}

/// One line per entry of the node's pool root, `ls -l` style, or "empty".
fn show_pool(node: &SimNode) -> Result<()> {
    let entries: Vec<_> = std::fs::read_dir(&node.pool_root)?.flatten().map(|e| e.path()).collect();
    if entries.is_empty() {
        println!("  {} pool: empty", node.name);
    }
    for path in entries {
        let mode = std::fs::metadata(&path)?.permissions().mode();
        println!("  {} pool: {} {}", node.name, mode_string(mode), path.display());
    }
    Ok(())
}

fn phase_of_claim(claim: &PersistentVolumeClaim) -> String {
    claim.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_else(|| "(none)".into())
}

fn node_affinity(pv: &PersistentVolume) -> String {
    let terms = pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()?.required.as_ref());
    let exprs =
        terms.into_iter().flat_map(|r| &r.node_selector_terms).flat_map(|t| t.match_expressions.iter().flatten());
    let shown: Vec<String> = exprs
        .map(|e| format!("{} {} [{}]", e.key, e.operator, e.values.clone().unwrap_or_default().join(", ")))
        .collect();
    shown.join("; ")
}

/// `drwxrwxrwx`, as `ls -l` shows it.
fn mode_string(mode: u32) -> String {
    let kind = if mode & 0o170000 == 0o040000 { 'd' } else { '-' };
    let bits = (0..9).rev().map(|i| if mode & (1 << i) != 0 { ['x', 'w', 'r'][i % 3] } else { '-' });
    std::iter::once(kind).chain(bits).collect()
}

/// Copies the provisioner and component logs out of the temp dir, which is removed on exit.
fn save_logs(demo: &Demo, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut sources: Vec<&Path> = demo.nodes.iter().map(|n| n.provisioner.log_path()).collect();
    sources.extend(demo.cp.iter().flat_map(|cp| cp.log_paths()).map(|(_, path)| path));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    sources
        .into_iter()
        .map(|source| {
            let target = dir.join(source.file_name().context("log file name")?);
            std::fs::copy(source, &target).with_context(|| format!("copying {}", source.display()))?;
            Ok(target)
        })
        .collect()
}

/// The demo on a real kubelet: the provisioner runs on the host for the real node (as the
/// DaemonSet's pod would, without building the image), and a real pod running as uid 1000
/// writes into the volume it made.
mod real {
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;
    use std::process::ExitCode;
    use std::time::Instant;

    use anyhow::{Context, Result};
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use kube::api::{Api, DeleteParams, PostParams};
    use testbed::real_nodes::{Lane, LaneOptions, PodRun};
    use testbed::{Provisioner, ProvisionerSpec, fixtures};

    use super::{CLAIM, CLASS_FILE, NAMESPACE, POD, heading, poll};

    pub async fn demo(provisioner: &Path, logs_dir: &Path) -> ExitCode {
        println!("hostpath-provisioner demo on a REAL kubelet: a pod writes into the volume the provisioner made.");
        heading("1. Control plane, containerd and a kubelet on this machine");
        let lane = match Lane::start(LaneOptions::default()).await {
            Ok(lane) => lane,
            Err(err) => {
                eprintln!("\ndemo FAILED: the real-node lane did not start: {err:#}");
                eprintln!("(run `make demo DEMO_ARGS=--simulated` for the simulated-node demo)");
                return ExitCode::FAILURE;
            }
        };
        println!(
            "  node {} Ready in {:.1} s (kubelet + containerd, files in {})",
            lane.node_name(),
            lane.started_in().as_secs_f64(),
            lane.dir().display()
        );
        let mut host_provisioner = None;
        let result = tokio::select! {
            result = run(&lane, provisioner, &mut host_provisioner) => Some(result),
            _ = tokio::signal::ctrl_c() => None,
        };
        let _ = std::fs::create_dir_all(logs_dir);
        let mut logs = lane.log_paths();
        if let Some(p) = &host_provisioner {
            let p: &Provisioner = p;
            logs.push(("provisioner".into(), p.log_path().to_path_buf()));
        }
        heading("Logs");
        for (name, path) in logs {
            let target = logs_dir.join(format!("{name}.log"));
            if std::fs::copy(&path, &target).is_ok() {
                println!("  {}", target.display());
            }
        }
        drop(host_provisioner);
        println!(
            "\nStopping the pods, the kubelet, containerd and the control plane; undoing mounts, bridge, iptables rule, cgroups..."
        );
        let teardown = lane.teardown().await;
        match (result, teardown) {
            (Some(Ok(())), Ok(())) => {
                println!("Done: every process the demo started is stopped and the host is as it was.");
                ExitCode::SUCCESS
            }
            (Some(Err(err)), _) => {
                eprintln!("\ndemo FAILED: {err:#}");
                ExitCode::FAILURE
            }
            (None, _) => {
                eprintln!("\ninterrupted (Ctrl-C)");
                ExitCode::from(130)
            }
            (_, Err(err)) => {
                eprintln!("\nteardown incomplete: {err:#}");
                ExitCode::FAILURE
            }
        }
    }

    async fn run(lane: &Lane, binary: &Path, host_provisioner: &mut Option<Provisioner>) -> Result<()> {
        let cp = lane.cp();
        heading(&format!("2. The provisioner for {}, pool {}", lane.node_name(), lane.pool_root().display()));
        let spec = ProvisionerSpec::new(binary, lane.node_name(), lane.pool_root().to_path_buf(), cp.kubeconfig_path());
        let provisioner = host_provisioner.insert(Provisioner::spawn(spec, cp.temp_dir())?);
        provisioner.wait_ready(testbed::PROVISIONER_READY_TIMEOUT).await?;
        println!(
            "  pid {} ready (on the host; the e2e lane runs it as the DaemonSet from deploy/legacy)",
            provisioner.pid()
        );

        heading("3. StorageClass and claim");
        let class_file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(CLASS_FILE);
        println!("  $ kubectl apply -f {CLASS_FILE}");
        cp.run_kubectl(Path::new("."), &["apply", "-f", &class_file.display().to_string()])?;
        lane.create_namespace(NAMESPACE).await?;
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(lane.client(), NAMESPACE);
        claims
            .create(&PostParams::default(), &fixtures::claim(NAMESPACE, CLAIM, "hostpath-provisioner", "1Gi").build())
            .await?;
        println!("  claim {NAMESPACE}/{CLAIM} created: Pending until a pod uses it (WaitForFirstConsumer)");

        heading(&format!("4. A real pod {NAMESPACE}/{POD}, running as uid 1000, writes into /data"));
        let script = "echo \"hello from pod $(hostname), uid $(id -u)\" > /data/hello.txt && ls -ln /data";
        println!("  $ sh -c '{script}'");
        let started = Instant::now();
        let outcome = lane.run_pod(&PodRun::new(NAMESPACE, POD, script).claim(CLAIM).as_user(1000, 1000)).await?;
        println!(
            "  pod finished in {:.1} s, exit code {:?}; its output:",
            started.elapsed().as_secs_f64(),
            outcome.exit_code
        );
        outcome.logs.lines().for_each(|l| println!("    {l}"));
        anyhow::ensure!(outcome.exit_code == Some(0), "the pod failed");

        heading("5. On the host");
        let dir = lane.volume_dir(NAMESPACE, CLAIM).await?;
        let file = dir.join("hello.txt");
        let meta = std::fs::metadata(&file).with_context(|| format!("{} on the host", file.display()))?;
        println!("  PV hostPath  {}", dir.display());
        println!("  $ cat {}", file.display());
        println!("    {}", std::fs::read_to_string(&file)?.trim());
        println!("  owner uid {} gid {}: the pod's user, on the host's disk", meta.uid(), meta.gid());

        heading("6. Delete the pod and the claim");
        let started = Instant::now();
        lane.delete_pod(NAMESPACE, POD).await?;
        claims.delete(CLAIM, &DeleteParams::default()).await?;
        poll("the volume directory to be removed", || async { Ok((!dir.exists()).then_some(())) }).await?;
        println!(
            "  directory gone {:.1} s after the pod delete: reclaimed by the provisioner",
            started.elapsed().as_secs_f64()
        );
        println!("\nThe demo worked: a real pod used a volume this project made, and the volume was reclaimed.");
        Ok(())
    }
}
