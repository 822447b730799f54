//! Watch-fed views of the cluster: the latest version of every object of a
//! kind in the benchmark namespaces, when each was received, how many
//! resourceVersion changes were seen, and when an object's "fingerprint"
//! (e.g. the pod-template checksum) last changed.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tokio::sync::Notify;

pub struct Entry<K> {
    pub obj: Arc<K>,
    /// The fingerprint and when it was first received with this value.
    pub fingerprint: Option<String>,
    pub fingerprint_since: Instant,
}

struct State<K> {
    objects: HashMap<String, Entry<K>>,
    /// Creations, resourceVersion changes and deletions seen.
    changes: u64,
    /// The keys of the last changes (for diagnosing idle writes).
    recent: Vec<String>,
    synced: bool,
    init_keys: HashSet<String>,
}

pub struct Tracker<K> {
    state: Arc<Mutex<State<K>>>,
}

impl<K> Clone for Tracker<K> {
    fn clone(&self) -> Self {
        Tracker {
            state: self.state.clone(),
        }
    }
}

pub fn key_of<K: Resource>(obj: &K) -> String {
    format!(
        "{}/{}",
        obj.meta().namespace.as_deref().unwrap_or(""),
        obj.meta().name.as_deref().unwrap_or("")
    )
}

impl<K> Tracker<K>
where
    K: Resource + Clone + Debug + Send + Sync + 'static,
{
    /// Polls `stream` in a task; keeps objects whose namespace passes `keep`.
    pub fn spawn<S>(
        what: &'static str,
        stream: S,
        keep: impl Fn(&str) -> bool + Send + 'static,
        fingerprint: fn(&K) -> Option<String>,
        notify: Arc<Notify>,
    ) -> Self
    where
        S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    {
        let state = Arc::new(Mutex::new(State {
            objects: HashMap::new(),
            changes: 0,
            recent: Vec::new(),
            synced: false,
            init_keys: HashSet::new(),
        }));
        let tracker = Tracker {
            state: state.clone(),
        };
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream.default_backoff());
            while let Some(event) = stream.next().await {
                let now = Instant::now();
                let event = match event {
                    Ok(event) => event,
                    Err(error) => {
                        eprintln!("bench: watch of {what} failed: {error}; retrying");
                        continue;
                    }
                };
                let mut st = state.lock().unwrap();
                match event {
                    watcher::Event::Init => st.init_keys.clear(),
                    watcher::Event::InitApply(obj) | watcher::Event::Apply(obj) => {
                        let ns = obj.namespace().unwrap_or_default();
                        if keep(&ns) {
                            let key = key_of(&obj);
                            st.init_keys.insert(key.clone());
                            upsert(&mut st, key, obj, fingerprint, now);
                        }
                    }
                    watcher::Event::InitDone => {
                        let keys = std::mem::take(&mut st.init_keys);
                        let before = st.objects.len();
                        st.objects.retain(|k, _| keys.contains(k));
                        st.changes += (before - st.objects.len()) as u64;
                        st.synced = true;
                    }
                    watcher::Event::Delete(obj) => {
                        let key = key_of(&obj);
                        if st.objects.remove(&key).is_some() {
                            st.changes += 1;
                            remember(&mut st, format!("delete {key}"));
                        }
                    }
                }
                drop(st);
                notify.notify_one();
            }
        });
        tracker
    }

    pub fn synced(&self) -> bool {
        self.state.lock().unwrap().synced
    }

    pub fn changes(&self) -> u64 {
        self.state.lock().unwrap().changes
    }

    pub fn recent(&self) -> Vec<String> {
        self.state.lock().unwrap().recent.clone()
    }

    pub fn len_where(&self, prefix: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .objects
            .keys()
            .filter(|k| k.starts_with(prefix))
            .count()
    }

    /// Every object whose key starts with `prefix`.
    pub fn objects(&self, prefix: &str) -> Vec<Arc<K>> {
        self.state
            .lock()
            .unwrap()
            .objects
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, e)| e.obj.clone())
            .collect()
    }

    /// The fingerprint of `key` and since when it has had it.
    pub fn fingerprint(&self, key: &str) -> Option<(Option<String>, Instant)> {
        self.state
            .lock()
            .unwrap()
            .objects
            .get(key)
            .map(|e| (e.fingerprint.clone(), e.fingerprint_since))
    }
}

fn remember<K>(st: &mut State<K>, what: String) {
    if st.recent.len() >= 20 {
        st.recent.remove(0);
    }
    st.recent.push(what);
}

fn upsert<K: Resource>(
    st: &mut State<K>,
    key: String,
    obj: K,
    fingerprint: fn(&K) -> Option<String>,
    now: Instant,
) {
    let fp = fingerprint(&obj);
    let rv = obj.meta().resource_version.clone();
    match st.objects.get_mut(&key) {
        Some(entry) => {
            if entry.obj.meta().resource_version != rv {
                st.changes += 1;
                if st.recent.len() >= 20 {
                    st.recent.remove(0);
                }
                st.recent.push(format!("update {key}"));
            }
            if entry.fingerprint != fp {
                entry.fingerprint = fp;
                entry.fingerprint_since = now;
            }
            entry.obj = Arc::new(obj);
        }
        None => {
            st.changes += 1;
            remember(st, format!("create {key}"));
            st.objects.insert(
                key,
                Entry {
                    obj: Arc::new(obj),
                    fingerprint: fp,
                    fingerprint_since: now,
                },
            );
        }
    }
}

pub fn no_fingerprint<K>(_: &K) -> Option<String> {
    None
}
