//! The odd one out: the pods of a stalled job grouped by where their ranks are
//! ([`super::summary::places`]), and the pods that differ from the rest named.
//! `7 pods in all_reduce ← train_step (train.py:88); worker-3 in load_batch
//! (data.py:41)`. Where every pod is in the same place, it says so.

use std::collections::BTreeMap;

/// Where the pods of a job are, as compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Comparison {
    /// No pod said where it is.
    Unknown,
    /// Every pod that said is in the same place.
    Same { pods: usize, place: String },
    /// Most pods are in one place (`pods` of them); the others, each with where it
    /// is that the most are not.
    Apart {
        pods: usize,
        place: String,
        odd: Vec<(String, String)>,
    },
}

/// `pods`: each pod's name and the places of its ranks (empty: it said nothing). The
/// most pods' set of places is the rest; ties go to the set that comes first.
pub fn compare(pods: &[(String, Vec<String>)]) -> Comparison {
    let said: Vec<&(String, Vec<String>)> = pods.iter().filter(|(_, p)| !p.is_empty()).collect();
    let mut groups: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    for (_, places) in &said {
        *groups.entry(key(places)).or_default() += 1;
    }
    let Some((rest, &n)) = groups
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
    else {
        return Comparison::Unknown;
    };
    let place = rest.join(", ");
    if groups.len() == 1 {
        return Comparison::Same { pods: n, place };
    }
    let odd = said
        .iter()
        .filter(|(_, p)| key(p) != *rest)
        .map(|(name, p)| {
            let own: Vec<&String> = p.iter().filter(|x| !rest.contains(x)).collect();
            let shown = if own.is_empty() {
                p.join(", ")
            } else {
                own.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            (name.clone(), shown)
        })
        .collect();
    Comparison::Apart {
        pods: n,
        place,
        odd,
    }
}

/// A pod's places, each once, sorted: two pods whose ranks are in the same places are
/// in the same group whatever their ranks' order.
fn key(places: &[String]) -> Vec<String> {
    let mut k = places.to_vec();
    k.sort();
    k.dedup();
    k
}

impl Comparison {
    /// One line for `trainlet status`.
    pub fn text(&self) -> String {
        let pods = |n: usize| {
            if n == 1 {
                "1 pod".to_string()
            } else {
                format!("{n} pods")
            }
        };
        match self {
            Comparison::Unknown => "no pod said where it is".to_string(),
            Comparison::Same { pods: n, place } => {
                format!("all {} in the same place: {place}", pods(*n))
            }
            Comparison::Apart {
                pods: n,
                place,
                odd,
            } => {
                let odd: Vec<String> = odd.iter().map(|(p, at)| format!("{p} in {at}")).collect();
                format!("{} in {place}; {}", pods(*n), odd.join("; "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, places: &[&str]) -> (String, Vec<String>) {
        (name.into(), places.iter().map(|s| s.to_string()).collect())
    }

    const REDUCE: &str =
        "all_reduce (torch/distributed/distributed_c10d.py:2501) ← train_step (train.py:88)";

    #[test]
    fn the_pod_whose_rank_is_elsewhere_is_named_with_where_only_it_is() {
        let mut pods: Vec<_> = (0..8)
            .filter(|i| *i != 3)
            .map(|i| pod(&format!("worker-{i}"), &[REDUCE]))
            .collect();
        pods.push(pod("worker-3", &["load_batch (data.py:41)", REDUCE]));
        let c = compare(&pods);
        assert_eq!(
            c.text(),
            format!("7 pods in {REDUCE}; worker-3 in load_batch (data.py:41)")
        );
    }

    #[test]
    fn pods_in_one_place_are_said_to_be_and_silent_pods_do_not_count() {
        let pods = vec![
            pod("a", &[REDUCE, REDUCE]),
            pod("b", &[REDUCE]),
            pod("c", &[]),
        ];
        assert_eq!(
            compare(&pods),
            Comparison::Same {
                pods: 2,
                place: REDUCE.into()
            }
        );
        assert_eq!(
            compare(&pods).text(),
            format!("all 2 pods in the same place: {REDUCE}")
        );
        assert_eq!(compare(&[pod("c", &[])]), Comparison::Unknown);
        assert_eq!(compare(&[]).text(), "no pod said where it is");
    }

    #[test]
    fn a_tie_goes_to_the_place_that_sorts_first_and_a_pod_in_fewer_places_shows_all_of_its() {
        let pods = vec![pod("a", &["x (a.py:1)"]), pod("b", &["y (b.py:2)"])];
        assert_eq!(
            compare(&pods).text(),
            "1 pod in x (a.py:1); b in y (b.py:2)"
        );
        let pods = vec![
            pod("a", &["x (a.py:1)", "y (b.py:2)"]),
            pod("b", &["x (a.py:1)", "y (b.py:2)"]),
            pod("c", &["x (a.py:1)"]),
        ];
        assert_eq!(
            compare(&pods).text(),
            "2 pods in x (a.py:1), y (b.py:2); c in x (a.py:1)"
        );
    }
}
