//! The API server's own counters, read from its `/metrics`: how many requests and bytes
//! the agents under test cost it.

use std::collections::BTreeMap;

use kube::Client;

/// One scrape: (metric name, sorted labels) -> value.
#[derive(Debug, Clone, Default)]
pub struct Scrape(pub BTreeMap<(String, Vec<(String, String)>), f64>);

pub async fn scrape(client: &Client) -> Scrape {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(req).await.expect("scrape /metrics");
    parse(&text)
}

/// Parses the Prometheus text format (only what the API server emits).
pub fn parse(text: &str) -> Scrape {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = match line.rsplit_once(' ') {
            Some(x) => x,
            None => continue,
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, parse_labels(rest.trim_end_matches('}'))),
            None => (series, Vec::new()),
        };
        out.insert((name.to_string(), labels), value);
    }
    Scrape(out)
}

fn parse_labels(s: &str) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    let mut rest = s;
    while let Some((k, v)) = rest.split_once("=\"") {
        let end = v.find('"').unwrap_or(v.len());
        labels.push((k.trim_start_matches(',').to_string(), v[..end].to_string()));
        rest = &v[(end + 1).min(v.len())..];
    }
    labels.sort();
    labels
}

impl Scrape {
    fn get(&self, name: &str) -> impl Iterator<Item = (&Vec<(String, String)>, f64)> {
        self.0
            .iter()
            .filter(move |((n, _), _)| n == name)
            .map(|((_, l), v)| (l, *v))
    }
}

fn label<'a>(labels: &'a [(String, String)], key: &str) -> &'a str {
    labels
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or("")
}

/// Requests and response bytes between two scrapes, by "VERB resource[/subresource]",
/// counting only what an agent can cause: pods, events and discovery. The harness's own
/// writes (pod status, bindings, creates) are excluded by subresource and verb.
pub fn agent_cost(before: &Scrape, after: &Scrape) -> (BTreeMap<String, f64>, f64) {
    let key = |l: &[(String, String)]| {
        let (verb, res, sub) = (
            label(l, "verb"),
            label(l, "resource"),
            label(l, "subresource"),
        );
        let counted = matches!(res, "pods" | "events" | "")
            && !matches!(sub, "status" | "binding")
            && !(res == "pods" && verb == "POST");
        counted.then(|| {
            let res = if res.is_empty() { "discovery" } else { res };
            format!("{verb} {res}")
        })
    };
    let mut requests = BTreeMap::new();
    for (l, v) in after.get("apiserver_request_total") {
        if let Some(k) = key(l) {
            let b = before
                .0
                .get(&("apiserver_request_total".to_string(), l.clone()))
                .copied()
                .unwrap_or(0.0);
            if v - b > 0.0 {
                *requests.entry(k).or_insert(0.0) += v - b;
            }
        }
    }
    let mut bytes = 0.0;
    for (l, v) in after.get("apiserver_response_sizes_sum") {
        if key(l).is_some() {
            let b = before
                .0
                .get(&("apiserver_response_sizes_sum".to_string(), l.clone()))
                .copied()
                .unwrap_or(0.0);
            bytes += v - b;
        }
    }
    (requests, bytes)
}

/// Open watches on pods right now.
pub fn pod_watches(s: &Scrape) -> f64 {
    s.get("apiserver_longrunning_requests")
        .filter(|(l, _)| label(l, "resource") == "pods" && label(l, "verb") == "WATCH")
        .map(|(_, v)| v)
        .sum()
}
