//! What the bench sees happen, timed on arrival: one watch on all claims, one on all PVs.
//!
//! Method: every watch event is stamped with the bench's monotonic clock when the bench's watch
//! task processes it. API timestamps (creationTimestamp) have one-second resolution, too coarse
//! for provisioning that takes milliseconds. Both ends of a latency are stamped the same way,
//! so the API server's watch fan-out delay largely cancels out; what remains is the bench's own
//! scheduling delay on a busy machine (typically well under a millisecond, more when the CPUs
//! are saturated).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

use testbed::fixtures::annotations::{BETA_STORAGE_PROVISIONER, SELECTED_NODE, STORAGE_PROVISIONER};

/// Times a claim was first seen in a state, by the bench's watch.
#[derive(Clone, Debug, Default)]
pub struct ClaimTimes {
    /// First event of the claim at all.
    pub seen: Option<Instant>,
    /// First event carrying `volume.kubernetes.io/selected-node`.
    pub selected: Option<Instant>,
    /// First event carrying `volume.kubernetes.io/storage-provisioner` (or the beta key), which
    /// the PV controller adds and the provisioner waits for unless the claim is pinned.
    pub annotated: Option<Instant>,
    /// First event with phase Bound.
    pub bound: Option<Instant>,
}

/// Times a PV was first seen in a state.
#[derive(Clone, Debug, Default)]
pub struct PvTimes {
    pub seen: Option<Instant>,
    pub released: Option<Instant>,
    pub gone: Option<Instant>,
    /// `kubevirt.io/provisionOnNode` (the node that made it).
    pub node: String,
}

#[derive(Debug, Default)]
pub struct Observations {
    /// By claim uid.
    pub claims: HashMap<String, ClaimTimes>,
    /// By PV name.
    pub pvs: HashMap<String, PvTimes>,
    /// PV names in the current relist (watch restarts), to notice deletions missed meanwhile.
    relisted: Option<HashSet<String>>,
}

/// The two watches, running on their own tasks until dropped.
pub struct Observer {
    state: Arc<Mutex<Observations>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.tasks.iter().for_each(JoinHandle::abort);
    }
}

impl Observer {
    /// Starts both watches and waits until their initial lists are in.
    pub async fn start(client: &Client) -> Result<Observer> {
        let state = Arc::new(Mutex::new(Observations::default()));
        let listed = Arc::new(AtomicUsize::new(0));
        let claims = watcher(Api::<PersistentVolumeClaim>::all(client.clone()));
        let pvs = watcher(Api::<PersistentVolume>::all(client.clone()));
        let tasks = vec![
            tokio::spawn(run(claims, state.clone(), listed.clone(), on_claim)),
            tokio::spawn(run(pvs, state.clone(), listed.clone(), on_pv)),
        ];
        let observer = Observer { state, tasks };
        let started = Instant::now();
        while listed.load(Ordering::SeqCst) < 2 {
            if started.elapsed() > Duration::from_secs(60) {
                bail!("the bench's watches did not list within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(observer)
    }

    /// Runs `f` on the observations (briefly: the watch tasks wait meanwhile).
    pub fn with<T>(&self, f: impl FnOnce(&Observations) -> T) -> T {
        f(&self.state.lock().expect("observations"))
    }
}

fn watcher<K>(api: Api<K>) -> impl futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: kube::Resource + Clone + std::fmt::Debug + k8s_openapi::serde::de::DeserializeOwned + Send + 'static,
{
    use kube::runtime::WatchStreamExt;
    watcher::watcher(api, watcher::Config::default()).default_backoff()
}

/// Feeds a watch into `handle`, stamping each event on arrival; bumps `listed` after the first
/// initial list.
async fn run<K>(
    stream: impl futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send,
    state: Arc<Mutex<Observations>>,
    listed: Arc<AtomicUsize>,
    handle: fn(&mut Observations, Event<K>, Instant),
) {
    let mut stream = std::pin::pin!(stream);
    let mut first_list = true;
    while let Some(result) = stream.next().await {
        let now = Instant::now();
        match result {
            Ok(event) => {
                let init_done = matches!(event, Event::InitDone);
                handle(&mut state.lock().expect("observations"), event, now);
                if init_done && std::mem::take(&mut first_list) {
                    listed.fetch_add(1, Ordering::SeqCst);
                }
            }
            Err(err) => eprintln!("bench: watch error (retrying): {err}"),
        }
    }
}

fn on_claim(state: &mut Observations, event: Event<PersistentVolumeClaim>, now: Instant) {
    let (Event::Apply(claim) | Event::InitApply(claim)) = event else { return };
    let Some(uid) = claim.metadata.uid.clone() else { return };
    let times = state.claims.entry(uid).or_default();
    times.seen.get_or_insert(now);
    if claim.annotations().contains_key(SELECTED_NODE) {
        times.selected.get_or_insert(now);
    }
    if [STORAGE_PROVISIONER, BETA_STORAGE_PROVISIONER].iter().any(|k| claim.annotations().contains_key(*k)) {
        times.annotated.get_or_insert(now);
    }
    if claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound") {
        times.bound.get_or_insert(now);
    }
}

fn on_pv(state: &mut Observations, event: Event<PersistentVolume>, now: Instant) {
    match event {
        Event::Apply(pv) | Event::InitApply(pv) => {
            let name = pv.name_any();
            if let Some(relisted) = state.relisted.as_mut() {
                relisted.insert(name.clone());
            }
            let times = state.pvs.entry(name).or_default();
            times.seen.get_or_insert(now);
            if times.node.is_empty() {
                times.node = pv.annotations().get("kubevirt.io/provisionOnNode").cloned().unwrap_or_default();
            }
            if pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released") {
                times.released.get_or_insert(now);
            }
        }
        Event::Delete(pv) => {
            state.pvs.entry(pv.name_any()).or_default().gone.get_or_insert(now);
        }
        Event::Init => state.relisted = Some(HashSet::new()),
        Event::InitDone => {
            // Deleted while the watch was down: gone by now at the latest.
            if let Some(relisted) = state.relisted.take() {
                for (name, times) in state.pvs.iter_mut() {
                    if !relisted.contains(name) && times.gone.is_none() {
                        times.gone = Some(now);
                    }
                }
            }
        }
    }
}
