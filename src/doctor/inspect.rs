//! The doctor's I/O edge: what the pools' filesystems and the API server say. Every decision on
//! these facts is in [`crate::doctor::assess`].

use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::quota::QuotaCapability;
use crate::deciding::snapshot::HostPathSnapshot;
use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use kube::api::{Api, ListParams};
use kube::config::KubeConfigOptions;

use crate::config::Config;
use crate::deciding::identity::Identity;
use crate::deciding::layout::PoolPath;
use crate::doctor::capabilities::{self, Reflink};
use crate::doctor::report::{
    FilesystemReport, MissingDirectory, OrphanDirectory, PoolReport, SelinuxReport, TrashReport, VolumesReport,
};
use crate::doctor::{DoctorError, assess};
use crate::filesystem::{Marker, PoolRoot, VolumeDirName};

/// How long the doctor waits for the API server before reporting it unreachable.
const API_TIMEOUT: Duration = Duration::from_secs(30);

/// What the API server says about this node's volumes.
#[derive(Clone, Debug, Default)]
pub struct ClusterFacts {
    /// Every PV.
    pub pvs: Vec<KeptVolume>,
    /// UIDs of every claim.
    pub claim_uids: HashSet<String>,
    /// This node's `kubernetes.io/hostname` label (the node name when absent).
    pub hostname: String,
    /// This node's labels of `NODE_AFFINITY_KEYS`: the volumes pinned to them are its own.
    pub affinity: Vec<crate::deciding::node_affinity::AffinityLabel>,
    /// UIDs of every HostPathSnapshot (none without the CRD: its objects went with it).
    pub snapshot_uids: HashSet<String>,
    /// This node's affinity labels that other live nodes carry too.
    pub shared_affinity: Vec<crate::deciding::node_affinity::duplicate::SharedLabel>,
}

/// The API check: `Ok(None)` when there is no API access to ask (no kubeconfig, not in a pod).
pub async fn cluster_facts(config: &Config) -> Result<Option<ClusterFacts>, DoctorError> {
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    if config.kubeconfig.is_empty() && !in_cluster {
        return Ok(None);
    }
    match tokio::time::timeout(API_TIMEOUT, list(config)).await {
        Ok(result) => result.map(Some),
        Err(_) => Err(DoctorError::ApiTimeout(API_TIMEOUT.as_secs())),
    }
}

async fn list(config: &Config) -> Result<ClusterFacts, DoctorError> {
    let client_error = |e: &dyn std::fmt::Display| DoctorError::Client(e.to_string());
    let kube_config = if config.kubeconfig.is_empty() {
        kube::Config::incluster().map_err(|e| client_error(&e))?
    } else {
        let kubeconfig = crate::config::read_kubeconfigs(&config.kubeconfig)?;
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| client_error(&e))?
    };
    let client = kube::Client::try_from(kube_config).map_err(|e| client_error(&e))?;
    let api = |op| move |source| DoctorError::Api { op, source };
    let pvs = list_all(Api::<KeptVolume>::all(client.clone())).await.map_err(api("list PersistentVolumes"))?;
    let claims = list_all(Api::<PersistentVolumeClaim>::all(client.clone()))
        .await
        .map_err(api("list PersistentVolumeClaims"))?;
    let snapshot_uids = match list_all(Api::<HostPathSnapshot>::all(client.clone())).await {
        Ok(snapshots) => snapshots.into_iter().filter_map(|s| s.metadata.uid).collect(),
        Err(kube::Error::Api(status)) if status.code == 404 => HashSet::new(),
        Err(source) => return Err(DoctorError::Api { op: "list HostPathSnapshots", source }),
    };
    let node =
        Api::<Node>::all(client.clone()).get_opt(&config.node_name).await.map_err(api("get this node's Node"))?;
    let labels = node.and_then(|n| n.metadata.labels).unwrap_or_default();
    let hostname = labels.get(crate::keys::HOSTNAME_LABEL).cloned().unwrap_or_else(|| config.node_name.clone());
    let affinity = crate::deciding::node_affinity::served_labels(&config.node_affinity_keys, &labels);
    let claim_uids = claims.into_iter().filter_map(|c| c.metadata.uid).collect();
    let shared_affinity = if affinity.is_empty() {
        Vec::new()
    } else {
        shared_affinity(&client, config, &affinity)
            .await
            .map_err(api("look for other live nodes with this node's affinity labels"))?
    };
    Ok(ClusterFacts { pvs, claim_uids, hostname, affinity, snapshot_uids, shared_affinity })
}

/// This node's affinity labels that other live nodes carry (as the daemon's
/// `reconciling::affinity_duplicates` looks: the live nodes as the daemon sees them, one GET each).
async fn shared_affinity(
    client: &kube::Client,
    config: &Config,
    affinity: &[crate::deciding::node_affinity::AffinityLabel],
) -> Result<Vec<crate::deciding::node_affinity::duplicate::SharedLabel>, kube::Error> {
    let membership = crate::reconciling::membership::Membership::new(
        client.clone(),
        &config.namespace,
        &config.provisioner_name,
        &config.node_name,
        config.node_lease,
        config.peer_service.as_deref(),
    );
    let nodes = Api::<Node>::all(client.clone());
    let mut labels = Vec::new();
    for live in membership.live().await? {
        if let Some(node) = nodes.get_opt(&live.node).await? {
            labels.push((live.node, node.metadata.labels.unwrap_or_default()));
        }
    }
    Ok(crate::deciding::node_affinity::duplicate::shared_labels(
        &config.node_name,
        affinity,
        labels.iter().map(|(node, labels)| (node.as_str(), labels)),
    ))
}

/// Lists every object in pages, so a large cluster is not one huge response.
async fn list_all<K>(api: Api<K>) -> Result<Vec<K>, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut all = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await?;
        all.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(all),
        }
    }
}

/// Everything the doctor reports about one pool.
pub fn pool_report(pool: &PoolPath, config: &Config, cluster: Option<&ClusterFacts>) -> PoolReport {
    let mut report = PoolReport {
        name: pool.name.clone(),
        path: pool.root.display().to_string(),
        shared_pool: pool.shared,
        require_mountpoint: pool.require_mountpoint,
        reserve_bytes: pool.reserve.unwrap_or(config.reserved_bytes),
        accounting: pool.accounting.unwrap_or_default().as_str(),
        promised_bytes: cluster.map(|c| crate::deciding::volume::promised_bytes(&c.pvs, &pool.root)),
        ..Default::default()
    };
    let root = match PoolRoot::open(&pool.name, &pool.root) {
        Ok(root) => root,
        Err(error) => {
            report.error = Some(error.to_string());
            return report;
        }
    };
    match filesystem_report(&root) {
        Ok(fs) => report.filesystem = Some(fs),
        Err(error) => report.error = Some(error.to_string()),
    }
    report.trash = Some(trash_report(&root));
    if let Some(cluster) = cluster {
        match root.list_entries() {
            Ok(entries) => report.volumes = Some(volumes_report(&root, pool, config, cluster, &entries)),
            Err(error) => report.error = Some(error.to_string()),
        }
    }
    report
}

fn filesystem_report(root: &PoolRoot) -> Result<FilesystemReport, DoctorError> {
    let path = root.path();
    let st = rustix::fs::statvfs(path).map_err(|e| DoctorError::fs("statvfs", path, e))?;
    let magic = capabilities::fs_magic(path)?;
    let mount = capabilities::read_mount_of(path)?;
    let is_mount_point = root.is_mountpoint()?;
    // The metric's own reading and rule, so that both say the same of a pool.
    let shares_os_disk = crate::filesystem::os_disk::pool_shares_os_disk(path).map_err(|source| {
        DoctorError::Filesystem { op: "tell whether it is on the OS disk", path: path.to_owned(), source }
    })?;
    let read_only = st.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY);
    let reflink = if read_only { Reflink::Unknown("read-only".into()) } else { capabilities::probe_reflink(path) };
    let options = mount.as_ref().map(|m| m.options.clone()).unwrap_or_default();
    let quota_options = capabilities::quota_options(&options);
    // The daemon's own verdict on `quota: enforce` for this pool, from the same facts.
    let quota = crate::deciding::quota::capability(&root.quota_facts().map_err(DoctorError::Pool)?);
    let fs_type = mount
        .as_ref()
        .map(|m| m.fs_type.clone())
        .or_else(|| capabilities::fs_type_name(magic).map(str::to_owned))
        .unwrap_or_else(|| format!("unknown (magic {magic:#x})"));
    let selinux =
        capabilities::selinux_of(path).map(|(mode, label)| SelinuxReport { mode: mode.to_owned(), label: label.ok() });
    Ok(FilesystemReport {
        fs_type,
        source: mount.as_ref().map(|m| m.source.clone()),
        mount_point: mount.as_ref().map(|m| m.mount_point.display().to_string()),
        mount_root: mount.as_ref().map(|m| m.fs_root.display().to_string()),
        is_mount_point,
        shares_os_disk,
        read_only,
        size_bytes: st.f_blocks.saturating_mul(st.f_frsize),
        available_bytes: st.f_bavail.saturating_mul(st.f_frsize),
        inodes_total: st.f_files,
        inodes_available: st.f_favail,
        reflink: reflink.to_string(),
        quota: quota.label().to_owned(),
        quota_missing: match quota {
            QuotaCapability::Unable(missing) => Some(missing),
            _ => None,
        },
        quota_options,
        selinux,
    })
}

/// Counts the trash: entries, bytes, and entries older than [`assess::TRASH_STUCK_AFTER`] (by the
/// time in their name, else by their change time).
fn trash_report(root: &PoolRoot) -> TrashReport {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let Ok(entries) = root.trash_entries() else { return TrashReport::default() };
    let mut report = TrashReport {
        bytes: root.trash_bytes().unwrap_or(0),
        staged: root.staged_volume_dirs().map(|dirs| dirs.len()).unwrap_or(0),
        staged_bytes: root.bytes_under(crate::filesystem::STAGING_DIR).unwrap_or(0),
        ..Default::default()
    };
    for (name, changed_ago) in entries {
        report.entries += 1;
        let age = assess::trash_entry_age(&name, now).or(changed_ago);
        if age.is_some_and(|age| age >= assess::TRASH_STUCK_AFTER) {
            report.stuck += 1;
        }
    }
    report
}

fn volumes_report(
    root: &PoolRoot,
    pool: &PoolPath,
    config: &Config,
    cluster: &ClusterFacts,
    entries: &[String],
) -> VolumesReport {
    let me = Identity {
        provisioner: config.provisioner_name.clone(),
        node: config.node_name.clone(),
        affinity: cluster.affinity.clone(),
        capacity_provisioner: config.capacity_provisioner_name.clone(),
    };
    let pv_names: HashSet<String> = cluster.pvs.iter().filter_map(|pv| pv.metadata.name.clone()).collect();
    let present: HashSet<&str> = entries.iter().map(String::as_str).collect();
    let mut report = VolumesReport::default();
    for pv in &cluster.pvs {
        let Some(accepted) = assess::volume_here(pv, &me, &cluster.hostname, &config.pools) else { continue };
        if accepted.root != pool.root {
            continue;
        }
        report.expected += 1;
        if !present.contains(accepted.dir_name.as_str()) {
            report.missing_directories.push(MissingDirectory {
                pv: pv.metadata.name.clone().unwrap_or_default(),
                path: pool.root.join(&accepted.dir_name).display().to_string(),
            });
        }
    }
    // pathPattern directories say by their marker which PV they belong to.
    let marked: Vec<(String, String)> = entries
        .iter()
        .filter(|entry| assess::may_be_pattern_directory(entry))
        .filter_map(|entry| match root.volume_marker(&VolumeDirName::new(entry).ok()?) {
            Ok(Marker::MarkedFor(pv)) => Some((entry.clone(), pv)),
            _ => None,
        })
        .collect();
    let orphans = assess::orphan_directories(entries, &pv_names, &cluster.claim_uids)
        .into_iter()
        .chain(assess::orphan_pattern_directories(&marked, &pv_names));
    for name in orphans {
        report
            .orphan_directories
            .push(OrphanDirectory { name: name.to_owned(), bytes: root.bytes_under(name).unwrap_or(0) });
    }
    for uid in root.snapshot_copies().unwrap_or_default() {
        if !cluster.snapshot_uids.contains(&uid) {
            let bytes = root.snapshot_copy_bytes(&uid).unwrap_or(0);
            report.orphan_snapshot_copies.push(OrphanDirectory { name: uid, bytes });
        }
    }
    report
}
