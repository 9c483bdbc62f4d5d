//! The resolved cluster as one pod publishes it for all the others (coordinated mode).
//!
//! In a job of N pods where every agent watches every peer, the API server sends
//! O(N²) events. In coordinated mode one agent, the *resolver* (the pod of the first
//! task of the first type), watches all peers as before and writes the resolved
//! cluster into an annotation on its own pod; every other agent watches only that pod.
//! The annotation carries everything the files hold (each task's name, address, node
//! and uid, in rank order), so an agent writes byte for byte what it would have written
//! by watching all peers.
//!
//! Format: `{"v":2,"generation":G,"peers":N,"sha256":"…","deflate":"…"}`, where
//! `deflate` is the base64 of the raw-deflated JSON payload
//! `{"tasks":[["ps",[[name,address,node,uid],…]],["worker",…]],"lost":["worker/1"]}`
//! (types in `--job` order). `lost` names the tasks that have no live pod right now:
//! the resolver keeps watching after the start and publishes again, with a higher
//! generation, whenever a task's pod is lost or replaced (`cluster::drift` says which),
//! so that the other pods learn of it from this one pod, and a replacement finds
//! itself in it. A resolution with lost tasks is never resolved from; its last entry
//! for a lost task is the pod that held it. Pod uids are random, so the payload is
//! about 110 bytes per pod before compression and about 45 after, with base64
//! (measured in the tests below for realistic, long and IPv6 names). A cluster whose
//! annotation would not fit in [`MAX_ENCODED`] is refused with a clear error.
//!
//! The hash detects a truncated or corrupted value, not a forgery: anyone who may patch
//! the pod can compute it. What protects a reader is what it checks: the resolver's own
//! entry is that pod (its uid), the types and counts are those it expects, and it finds
//! itself at the address the API server reports for its own pod.

use std::collections::BTreeMap;
use std::io::{Read, Write};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{Cluster, Peer, Task};

/// The annotation on the resolver pod.
pub const ANNOTATION: &str = "trainlet.io/resolution";

/// A pod's part in a coordinated job after the start, as `cluster.json` records it for
/// the reporters: the resolver watches every peer and publishes again when one
/// changes; a follower watches the resolver pod only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Coordination {
    pub role: CoordinationRole,
    /// The label selector that finds the resolver pod (a follower's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolver: Option<String>,
    /// The job types in `--job` order: the order of the published resolution.
    pub types: Vec<String>,
    /// The generation of the resolution the files hold: a follower compares them only
    /// with a resolution at least this new.
    pub generation: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CoordinationRole {
    Resolver,
    Follower,
}

impl Coordination {
    /// Task 0 of the first type: the resolver's own task.
    pub fn resolver_task(&self) -> String {
        format!("{}/0", self.types.first().map_or("", String::as_str))
    }
}

/// The next generation after `previous`: the time in milliseconds, so that a new
/// resolver pod (which knows no previous one) still publishes a higher one, and never
/// less than one more than `previous`.
pub fn next_generation(previous: u64, now_ms: u64) -> u64 {
    now_ms.max(previous.saturating_add(1))
}
/// The most the annotation may hold: a pod's annotations share 256 KiB, and the
/// resolver pod carries trainlet's report and the user's own annotations too.
pub const MAX_ENCODED: usize = 200 * 1024;
/// The most an annotation may inflate to: a reader does not trust what it reads.
const MAX_PAYLOAD: usize = 16 << 20;
/// The format's version: 2 added `lost` (the resolver publishes after the start).
const VERSION: u32 = 2;

#[derive(Debug, Error, PartialEq)]
pub enum PublishedError {
    #[error(
        "the cluster of {peers} pods takes {bytes} bytes, more than the {MAX_ENCODED} an annotation may hold here"
    )]
    TooLarge { peers: usize, bytes: usize },
    #[error("not trainlet's format: {0}")]
    Format(String),
    #[error("format version {0} is not {VERSION}")]
    Version(u32),
    #[error("the hash does not match the content")]
    Hash,
}

/// The annotation's outer layer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    v: u32,
    generation: u64,
    peers: usize,
    sha256: String,
    deflate: String,
}

/// One task: name, address, node, uid.
type Entry = (String, String, Option<String>, String);

/// What the annotation carries of each peer of a task.
fn entries(peers: &[Peer]) -> Vec<Entry> {
    peers
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                p.address.clone(),
                p.node.clone(),
                p.uid.clone(),
            )
        })
        .collect()
}

/// The hashed, deflated part.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Payload<T> {
    tasks: Vec<(T, Vec<Entry>)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    lost: Vec<String>,
}

/// A published resolution, decoded.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Resolution {
    pub cluster: Cluster,
    pub generation: u64,
    /// Tasks (`type/index`) without a live pod when it was published; their entries
    /// in `cluster` are the pods that held them.
    pub lost: Vec<String>,
}

impl Resolution {
    /// Complete: every task has a live pod. Only a complete resolution is resolved from.
    pub fn is_complete(&self) -> bool {
        self.lost.is_empty()
    }

    /// The same cluster (what the annotation carries of each task) and lost tasks,
    /// whatever the generation.
    pub fn same_content(&self, other: &Resolution) -> bool {
        let tasks = |c: &Cluster| -> Vec<(String, Vec<Entry>)> {
            c.tasks
                .iter()
                .map(|(t, peers)| (t.clone(), entries(peers)))
                .collect()
        };
        self.lost == other.lost && tasks(&self.cluster) == tasks(&other.cluster)
    }
}

/// Encodes the cluster, its types in `order` (the `--job` order), and the tasks that
/// have no live pod now, for the annotation.
pub fn encode(
    cluster: &Cluster,
    order: &[&str],
    generation: u64,
    lost: &[String],
) -> Result<String, PublishedError> {
    let json = payload(cluster, order, lost);
    let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
    z.write_all(&json).expect("writing to memory");
    let deflated = z.finish().expect("writing to memory");
    let peers = cluster.tasks.values().map(Vec::len).sum();
    let text = serde_json::to_string(&Envelope {
        v: VERSION,
        generation,
        peers,
        sha256: sha256_hex(&json),
        deflate: BASE64.encode(deflated),
    })
    .expect("plain data");
    if text.len() > MAX_ENCODED {
        return Err(PublishedError::TooLarge {
            peers,
            bytes: text.len(),
        });
    }
    Ok(text)
}

/// The JSON that the annotation deflates and hashes: each task's name, address, node and
/// uid, types in `order`, and the lost tasks.
fn payload(cluster: &Cluster, order: &[&str], lost: &[String]) -> Vec<u8> {
    let tasks: Vec<(&str, Vec<Entry>)> = order
        .iter()
        .map(|t| {
            let peers = cluster.tasks.get(*t).map(Vec::as_slice).unwrap_or_default();
            (*t, entries(peers))
        })
        .collect();
    let payload = Payload {
        tasks,
        lost: lost.to_vec(),
    };
    serde_json::to_vec(&payload).expect("plain data")
}

/// The SHA-256 of the resolved cluster: of the payload a resolver publishes for it, with
/// its types in the cluster's order (alphabetical) and no lost task, so the same for
/// every pod that resolved the same cluster, whether it watched every peer or followed
/// the resolver. It changes with any task's pod, address or node, and pod uids are
/// random: a process that cannot read the job's pods cannot compute it (the
/// pre-flight's hellos are keyed with it).
pub fn digest(cluster: &Cluster) -> [u8; 32] {
    let order: Vec<&str> = cluster.tasks.keys().map(String::as_str).collect();
    let hash = ring::digest::digest(&ring::digest::SHA256, &payload(cluster, &order, &[]));
    hash.as_ref().try_into().expect("SHA-256 has 32 bytes")
}

/// Decodes an annotation into the resolution (peers in `namespace`). Everything is
/// checked and bounded: the value comes from a pod anyone with `patch pods` could have
/// written.
pub fn decode(text: &str, namespace: &str) -> Result<Resolution, PublishedError> {
    let bad = |why: String| PublishedError::Format(why);
    if text.len() > MAX_ENCODED {
        return Err(bad(format!(
            "{} bytes, more than {MAX_ENCODED}",
            text.len()
        )));
    }
    let env: Envelope = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    if env.v != VERSION {
        return Err(PublishedError::Version(env.v));
    }
    let deflated = BASE64
        .decode(env.deflate.as_bytes())
        .map_err(|e| bad(format!("deflate is not base64: {e}")))?;
    let mut json = Vec::new();
    flate2::read::DeflateDecoder::new(deflated.as_slice())
        .take(MAX_PAYLOAD as u64 + 1)
        .read_to_end(&mut json)
        .map_err(|e| bad(format!("deflate does not inflate: {e}")))?;
    if json.len() > MAX_PAYLOAD {
        return Err(bad(format!("inflates to more than {MAX_PAYLOAD} bytes")));
    }
    if sha256_hex(&json) != env.sha256 {
        return Err(PublishedError::Hash);
    }
    let payload: Payload<String> =
        serde_json::from_slice(&json).map_err(|e| bad(format!("payload: {e}")))?;
    let mut cluster = Cluster::default();
    for (task_type, entries) in payload.tasks {
        let peers = entries
            .into_iter()
            .enumerate()
            .map(|(index, (name, address, node, uid))| Peer {
                name,
                task_type: task_type.clone(),
                index,
                address,
                node,
                uid,
                namespace: namespace.to_string(),
                pod_ip: None,
                slot: String::new(),
                past_init: false,
            })
            .collect();
        if cluster.tasks.insert(task_type.clone(), peers).is_some() {
            return Err(bad(format!("type {task_type:?} twice")));
        }
    }
    let peers: usize = cluster.tasks.values().map(Vec::len).sum();
    if peers != env.peers {
        return Err(bad(format!(
            "{peers} peers, but the header says {}",
            env.peers
        )));
    }
    for task in &payload.lost {
        let known = task
            .rsplit_once('/')
            .and_then(|(t, i)| cluster.task(t, i.parse().ok()?));
        if known.is_none() {
            return Err(bad(format!("lost task {task:?} is not one of its tasks")));
        }
    }
    Ok(Resolution {
        cluster,
        generation: env.generation,
        lost: payload.lost,
    })
}

/// Checks a decoded resolution against what this agent knows, and finds its own task:
/// every task has a live pod, the job types are exactly its own, every type has its
/// expected count where one is known, task 0 of the first type is the resolver pod
/// itself, and this pod is in the cluster at the address the API server reports for
/// it. `Err` says why not.
pub fn own_task(
    resolution: &Resolution,
    types: &[&str],
    expected: &BTreeMap<String, usize>,
    resolver_uid: &str,
    own_uid: &str,
    own_address: Option<&str>,
) -> Result<Task, String> {
    let cluster = &resolution.cluster;
    if let Some(task) = resolution.lost.first() {
        return Err(format!(
            "it says task {task} has no live pod{}",
            match resolution.lost.len() {
                1 => String::new(),
                n => format!(" (and {} more)", n - 1),
            }
        ));
    }
    let have: Vec<&str> = cluster.tasks.keys().map(String::as_str).collect();
    let mut want: Vec<&str> = types.to_vec();
    want.sort_unstable();
    if have != want {
        return Err(format!(
            "its job types ({}) are not this pod's ({})",
            have.join(", "),
            want.join(", ")
        ));
    }
    for (t, n) in expected {
        let got = cluster.tasks.get(t).map_or(0, Vec::len);
        if got != *n {
            return Err(format!("it has {got} {t} tasks, {n} are expected"));
        }
    }
    let first = types.first().and_then(|t| cluster.task(t, 0));
    if first.is_none_or(|p| p.uid != resolver_uid) {
        return Err("its first task is not the resolver pod that carries it".into());
    }
    let own = cluster
        .tasks
        .values()
        .flatten()
        .find(|p| p.uid == own_uid)
        .ok_or_else(|| format!("it does not contain this pod (uid {own_uid})"))?;
    if let Some(addr) = own_address
        && own.address != addr
    {
        return Err(format!(
            "it places this pod at {}, but its address is {addr}",
            own.address
        ));
    }
    Ok(Task {
        task_type: own.task_type.clone(),
        index: own.index,
    })
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(t: &str, i: usize, uid: &str) -> Peer {
        Peer {
            name: format!("job-{t}-{i}-x7k2p"),
            task_type: t.into(),
            index: i,
            address: format!("10.244.{}.{}:8470", i / 250, i % 250),
            node: Some(format!("node-{i}")),
            uid: uid.into(),
            namespace: "ml".into(),
            pod_ip: None,
            slot: String::new(),
            past_init: false,
        }
    }

    fn uid(i: usize) -> String {
        // Random-looking, as the API server's are: they do not compress.
        let h = sha256_hex(&i.to_le_bytes());
        format!(
            "{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        )
    }

    fn cluster(ps: usize, workers: usize) -> Cluster {
        let mut c = Cluster::default();
        c.tasks.insert(
            "ps".into(),
            (0..ps).map(|i| peer("ps", i, &uid(i))).collect(),
        );
        c.tasks.insert(
            "worker".into(),
            (0..workers)
                .map(|i| peer("worker", i, &uid(10_000 + i)))
                .collect(),
        );
        c
    }

    fn resolution(c: &Cluster, generation: u64, lost: &[&str]) -> Resolution {
        Resolution {
            cluster: c.clone(),
            generation,
            lost: lost.iter().map(|t| t.to_string()).collect(),
        }
    }

    #[test]
    fn round_trips_exactly() {
        let c = cluster(2, 5);
        let text = encode(&c, &["worker", "ps"], 7, &[]).unwrap();
        assert_eq!(decode(&text, "ml").unwrap(), resolution(&c, 7, &[]));
        let lost = ["worker/3".to_string(), "ps/1".to_string()];
        let text = encode(&c, &["worker", "ps"], 8, &lost).unwrap();
        let r = decode(&text, "ml").unwrap();
        assert_eq!(r, resolution(&c, 8, &["worker/3", "ps/1"]));
        assert!(!r.is_complete());
        assert!(!r.same_content(&resolution(&c, 8, &[])));
        assert!(r.same_content(&resolution(&c, 9, &["worker/3", "ps/1"])));
    }

    #[test]
    fn the_digest_is_the_published_hash_and_follows_every_entry() {
        let c = cluster(2, 3);
        let text = encode(&c, &["ps", "worker"], 1, &[]).unwrap();
        let env: Envelope = serde_json::from_str(&text).unwrap();
        let hex: String = digest(&c).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, env.sha256);
        // What a follower decodes digests alike, whatever the generation.
        let followed = decode(&encode(&c, &["worker", "ps"], 9, &[]).unwrap(), "other").unwrap();
        assert_eq!(digest(&followed.cluster), digest(&c));
        let changed: [fn(&mut Peer); 4] = [
            |p| p.name.push('x'),
            |p| p.address.push('1'),
            |p| p.node = None,
            |p| p.uid.push('0'),
        ];
        for change in changed {
            let mut other = c.clone();
            change(&mut other.tasks.get_mut("worker").unwrap()[2]);
            assert_ne!(digest(&other), digest(&c));
        }
        // Not part of a peer's identity: the same resolution.
        let mut same = c.clone();
        same.tasks.get_mut("ps").unwrap()[0].past_init = true;
        assert_eq!(digest(&same), digest(&c));
    }

    #[test]
    fn a_lost_task_must_be_one_of_its_tasks() {
        let text = encode(&cluster(1, 2), &["ps", "worker"], 1, &["worker/2".into()]).unwrap();
        assert_eq!(
            decode(&text, "ml").unwrap_err(),
            PublishedError::Format("lost task \"worker/2\" is not one of its tasks".into())
        );
    }

    #[test]
    fn four_thousand_pods_fit_and_more_are_refused_clearly() {
        let text = encode(&cluster(1, 4095), &["ps", "worker"], 1, &[]).unwrap();
        assert!(text.len() < MAX_ENCODED, "{} bytes", text.len());
        let e = encode(&cluster(1, 6000), &["ps", "worker"], 1, &[]).unwrap_err();
        assert!(
            matches!(e, PublishedError::TooLarge { peers: 6001, .. }),
            "{e}"
        );
    }

    /// A cluster of `n` workers whose names, addresses and nodes have one of the shapes
    /// below, with random-looking uids.
    fn shaped(n: usize, shape: Shape) -> Cluster {
        let mut c = Cluster::default();
        let peers = (0..n)
            .map(|i| {
                let h = sha256_hex(&(i as u64 ^ 0x5eed).to_le_bytes());
                let suffix = &h[..5];
                let (name, address, node) = match shape {
                    // An Indexed Job's pod: <job>-<index>-<5 random>, IPv4, GKE-like nodes.
                    Shape::Realistic => (
                        format!("mnist-train-worker-{i}-{suffix}"),
                        format!("10.{}.{}.{}:2222", 64 + i / 65536, (i / 256) % 256, i % 256),
                        format!("gke-train-a3-pool-{}-{}", &h[5..13], &h[13..17]),
                    ),
                    // The longest Job name a pod name allows (63), IPv6 pod IPs.
                    Shape::LongIpv6 => (
                        format!("{}-{i}-{suffix}", "w".repeat(63 - 6)),
                        format!("[fd00:10:244:{:x}::{:x}]:2222", i / 256, i % 256 + 2),
                        format!("node-{}-{}.compute.internal", &h[5..21], i % 64),
                    ),
                    // The worst case: pod and node names of 253 characters that share
                    // nothing (random), IPv6 pod IPs.
                    Shape::Random253 => (
                        random(253, i as u64),
                        format!("[fd00:10:244:{:x}::{:x}]:2222", i / 256, i % 256 + 2),
                        random(253, (i as u64) << 32),
                    ),
                };
                Peer {
                    name,
                    task_type: "worker".into(),
                    index: i,
                    address,
                    node: Some(node),
                    uid: uid(i),
                    namespace: "ml".into(),
                    pod_ip: None,
                    slot: String::new(),
                    past_init: false,
                }
            })
            .collect();
        c.tasks.insert("worker".into(), peers);
        c
    }

    #[derive(Clone, Copy, Debug)]
    enum Shape {
        Realistic,
        LongIpv6,
        Random253,
    }

    /// `len` random-looking lower-case hex characters.
    fn random(len: usize, seed: u64) -> String {
        let mut out = String::new();
        let mut n = seed;
        while out.len() < len {
            out.push_str(&sha256_hex(&n.to_le_bytes()));
            n = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
        }
        out.truncate(len);
        out
    }

    /// Whether `n` is the largest job of that shape whose resolution fits.
    fn largest_is(shape: Shape, n: usize) -> bool {
        let fits = |n| encode(&shaped(n, shape), &["worker"], 1, &[]).is_ok();
        fits(n) && !fits(n + 1)
    }

    /// The figures of docs/large-jobs.md: the largest job that
    /// coordinated mode can publish, by the shape of its names and addresses. Exact, so
    /// that a change of the format shows here and in the README at once.
    #[test]
    fn the_largest_job_that_fits_by_name_shape() {
        assert!(largest_is(Shape::Realistic, 3_624));
        assert!(largest_is(Shape::LongIpv6, 3_276));
        assert!(largest_is(Shape::Random253, 481));
    }

    #[test]
    fn tampering_is_detected() {
        let c = cluster(1, 3);
        let text = encode(&c, &["ps", "worker"], 1, &[]).unwrap();
        let mut env: serde_json::Value = serde_json::from_str(&text).unwrap();
        // Another payload under the same hash.
        let other = encode(&cluster(1, 4), &["ps", "worker"], 1, &[]).unwrap();
        let other: serde_json::Value = serde_json::from_str(&other).unwrap();
        env["deflate"] = other["deflate"].clone();
        assert_eq!(
            decode(&env.to_string(), "ml").unwrap_err(),
            PublishedError::Hash
        );
        assert!(matches!(decode("{", "ml"), Err(PublishedError::Format(_))));
        assert!(matches!(
            decode(
                r#"{"v":1,"generation":1,"peers":0,"sha256":"","deflate":""}"#,
                "ml"
            ),
            Err(PublishedError::Version(1))
        ));
        assert!(matches!(
            decode(
                r#"{"v":2,"generation":1,"peers":0,"sha256":"","deflate":"!!"}"#,
                "ml"
            ),
            Err(PublishedError::Format(_))
        ));
    }

    #[test]
    fn a_deflate_bomb_is_refused() {
        let zeros = vec![b'['; MAX_PAYLOAD + 10];
        let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(&zeros).unwrap();
        let text = serde_json::to_string(&Envelope {
            v: VERSION,
            generation: 1,
            peers: 0,
            sha256: sha256_hex(&zeros),
            deflate: BASE64.encode(z.finish().unwrap()),
        })
        .unwrap();
        let e = decode(&text, "ml").unwrap_err();
        assert!(
            matches!(&e, PublishedError::Format(why) if why.starts_with("inflates to more than")),
            "{e}"
        );
    }

    #[test]
    fn a_reader_finds_itself_or_says_why_not() {
        let c = cluster(1, 3);
        let r = resolution(&c, 1, &[]);
        let types = ["ps", "worker"];
        let none = BTreeMap::new();
        let me = &c.tasks["worker"][2];
        assert_eq!(
            own_task(&r, &types, &none, &uid(0), &me.uid, Some(&me.address)),
            Ok(Task {
                task_type: "worker".into(),
                index: 2
            })
        );
        assert_eq!(
            own_task(&r, &types, &none, &uid(0), &me.uid, Some("10.9.9.9:8470")),
            Err(format!(
                "it places this pod at {}, but its address is 10.9.9.9:8470",
                me.address
            ))
        );
        assert_eq!(
            own_task(&r, &types, &none, &uid(0), "nobody", Some(&me.address)),
            Err("it does not contain this pod (uid nobody)".into())
        );
        assert_eq!(
            own_task(
                &r,
                &types,
                &none,
                "someone-else",
                &me.uid,
                Some(&me.address)
            ),
            Err("its first task is not the resolver pod that carries it".into())
        );
        assert_eq!(
            own_task(&r, &["worker"], &none, &uid(0), &me.uid, Some(&me.address)),
            Err("its job types (ps, worker) are not this pod's (worker)".into())
        );
        let four = BTreeMap::from([("worker".to_string(), 4)]);
        assert_eq!(
            own_task(&r, &types, &four, &uid(0), &me.uid, Some(&me.address)),
            Err("it has 3 worker tasks, 4 are expected".into())
        );
        // A task without a live pod: nothing to resolve from yet.
        let lost = resolution(&c, 2, &["worker/1", "worker/0"]);
        assert_eq!(
            own_task(&lost, &types, &none, &uid(0), &me.uid, Some(&me.address)),
            Err("it says task worker/1 has no live pod (and 1 more)".into())
        );
    }
}
