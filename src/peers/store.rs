//! One store for the pods a watch sees, kept the way kube-runtime's watcher delivers
//! them: `Init` starts a relist into a buffer, `InitApply` fills it, `InitDone` swaps it
//! in (so a relist after `410 Gone` replaces the store whole, and a pod deleted while
//! the watch was away is gone); `Apply` and `Delete` change one pod. Every watch of
//! trainlet keeps its pods in one: the init wait (one per selector), a follower's watch
//! of the resolver pod, and the reporters' drift watch.

use std::collections::BTreeMap;

use kube::runtime::watcher;

/// The pods of one watch, by key, as `T`.
#[derive(Debug, Clone)]
pub struct Store<T> {
    pods: BTreeMap<String, T>,
    relist: BTreeMap<String, T>,
    synced: bool,
}

impl<T> Default for Store<T> {
    fn default() -> Self {
        Store {
            pods: BTreeMap::new(),
            relist: BTreeMap::new(),
            synced: false,
        }
    }
}

impl<T> Store<T> {
    /// Applies one event: `key` names a pod, `into` keeps what the store holds of it.
    pub fn apply<P>(
        &mut self,
        ev: watcher::Event<P>,
        key: impl Fn(&P) -> String,
        into: impl Fn(P) -> T,
    ) {
        match ev {
            watcher::Event::Init => self.relist.clear(),
            watcher::Event::InitApply(p) => {
                self.relist.insert(key(&p), into(p));
            }
            watcher::Event::InitDone => {
                std::mem::swap(&mut self.pods, &mut self.relist);
                self.relist.clear();
                self.synced = true;
            }
            watcher::Event::Apply(p) => {
                self.pods.insert(key(&p), into(p));
            }
            watcher::Event::Delete(p) => {
                self.pods.remove(&key(&p));
            }
        }
    }

    /// Whether the first list is complete: before that, every pod would look missing.
    pub fn synced(&self) -> bool {
        self.synced
    }

    pub fn get(&self, key: &str) -> Option<&T> {
        self.pods.get(key)
    }

    /// Every pod, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &T)> {
        self.pods.iter()
    }

    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.pods.values()
    }
}

/// A pod's key: its uid, else namespace/name.
pub fn key<K: kube::ResourceExt>(p: &K) -> String {
    p.meta()
        .uid
        .clone()
        .unwrap_or_else(|| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    fn pod(uid: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.metadata.name = Some(format!("p-{uid}"));
        p
    }

    /// A relist replaces the store whole; before the first list is done nothing is
    /// synced; applies and deletes change one pod.
    #[test]
    fn a_relist_replaces_the_store_whole() {
        let mut s: Store<String> = Store::default();
        let name = |p: Pod| p.metadata.name.unwrap();
        s.apply(watcher::Event::Init, key, name);
        s.apply(watcher::Event::InitApply(pod("a")), key, name);
        s.apply(watcher::Event::InitApply(pod("b")), key, name);
        assert!(!s.synced());
        assert_eq!(s.values().count(), 0);
        s.apply(watcher::Event::InitDone, key, name);
        assert!(s.synced());
        assert_eq!(s.values().collect::<Vec<_>>(), ["p-a", "p-b"]);
        s.apply(watcher::Event::Delete(pod("a")), key, name);
        s.apply(watcher::Event::Apply(pod("c")), key, name);
        assert_eq!(s.values().collect::<Vec<_>>(), ["p-b", "p-c"]);
        // A relist after the watch was away: what it does not list is gone.
        s.apply(watcher::Event::Init, key, name);
        s.apply(watcher::Event::InitApply(pod("d")), key, name);
        assert_eq!(
            s.values().collect::<Vec<_>>(),
            ["p-b", "p-c"],
            "until it is done"
        );
        s.apply(watcher::Event::InitDone, key, name);
        assert_eq!(s.values().collect::<Vec<_>>(), ["p-d"]);
        assert_eq!(s.get("d").map(String::as_str), Some("p-d"));
    }
}
