//! The watches: how they list, which objects they keep (deciding::retention), and how their
//! health (initial list received, API server reachable, restarts) is recorded.

use std::sync::Arc;

use futures::StreamExt;
use kube::Client;
use kube::runtime::{WatchStreamExt, watcher};

use crate::deciding::watch_list;
use crate::reconciling::watch_backoff::{self, OutageBackoff, WatchHealth};
use crate::serving::health::{Health, Watch};
use crate::serving::metrics::{Metrics, WatchLabel};

/// How the watches fetch their initial state: streamed one object at a time where the API server
/// serves that by default, else in small pages; and how long each stays open before it is
/// re-opened, a length of this node's own (deciding::watch_list). One request at start-up.
pub async fn initial_list_config(client: &Client, node: &str) -> watcher::Config {
    let config = watcher::Config::default().timeout(watch_list::watch_seconds(node));
    match client.apiserver_version().await {
        Ok(info) if watch_list::streaming_lists_by_default(&info.major, &info.minor) => {
            tracing::info!(version = %info.git_version, "the API server streams initial lists: watches use them");
            config.streaming_lists()
        }
        Ok(info) => {
            tracing::info!(version = %info.git_version, page = watch_list::PAGE_SIZE, "initial lists are paginated");
            config.page_size(watch_list::PAGE_SIZE)
        }
        Err(error) => {
            tracing::warn!(%error, page = watch_list::PAGE_SIZE, "cannot read the API server's version; initial lists are paginated");
            config.page_size(watch_list::PAGE_SIZE)
        }
    }
}

/// Lets through the watch events of objects this node keeps (`keep` decides, trims what it keeps
/// and forgets what it drops); an object it does not keep leaves the cache as a deletion, and
/// `forget` drops what this node remembered about a deleted one (deciding::retention).
pub fn retain<K>(
    event: Result<watcher::Event<K>, watcher::Error>,
    keep: impl Fn(&mut K) -> bool,
    forget: impl Fn(&K),
) -> Option<Result<watcher::Event<K>, watcher::Error>> {
    use watcher::Event;
    let Ok(event) = event else { return Some(event) };
    let kept = match event {
        Event::Apply(mut object) => {
            if keep(&mut object) {
                Event::Apply(object)
            } else {
                Event::Delete(object)
            }
        }
        Event::InitApply(mut object) => {
            if !keep(&mut object) {
                return None;
            }
            Event::InitApply(object)
        }
        Event::Delete(object) => {
            forget(&object);
            Event::Delete(object)
        }
        other @ (Event::Init | Event::InitDone) => other,
    };
    Some(Ok(kept))
}

/// Marks the initial list of `watch` received, the API reachable or not, and counts restarts.
/// Retries back off up to [`watch_backoff::MAX_DELAY`] across an outage, and the log says when
/// the API server stops and starts answering, not every attempt.
pub fn observe<K, S>(
    watch: Watch,
    stream: S,
    health: &Arc<Health>,
    metrics: &Arc<Metrics>,
) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + use<K, S>
where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
    K: kube::Resource + Send,
{
    let (health, metrics) = (health.clone(), metrics.clone());
    let watch_health = WatchHealth::default();
    let backoff = OutageBackoff::new(watch_health.clone());
    let mut failing = false;
    // managedFields are half of a claim's metadata and never read here: dropping them keeps the
    // per-object cost of the caches down.
    stream
        .modify(|object: &mut K| object.meta_mut().managed_fields = None)
        .inspect(move |item| watch_health.observe(item))
        .backoff(backoff)
        .inspect(move |result| match result {
            Ok(event) => {
                health.set_api_reachable(true);
                if failing && !matches!(event, watcher::Event::Init) {
                    tracing::info!(?watch, "watch works again");
                    failing = false;
                }
                if matches!(event, watcher::Event::InitDone) {
                    tracing::debug!(?watch, "initial list received");
                    health.synced(watch);
                }
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(?watch, %error, max_delay = ?watch_backoff::MAX_DELAY, "watch failed; retrying with backoff until the API server answers");
                    failing = true;
                } else {
                    tracing::debug!(?watch, %error, "watch still failing");
                }
                health.set_api_reachable(false);
                metrics.watch_restarts.get_or_create(&WatchLabel { watch: format!("{watch:?}").to_lowercase() }).inc();
            }
        })
}
