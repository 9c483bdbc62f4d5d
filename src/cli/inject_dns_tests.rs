//! Unit tests of `inject --address dns`: the headless Service the pods' DNS names need,
//! added where the manifests have none, and a Job's subdomain.

use clap::Parser;

use super::lower::inject_config;
use super::{Cli, Command};
use crate::inject::{InjectConfig, inject};

fn config(args: &[&str]) -> InjectConfig {
    let argv = ["trainlet", "inject"].iter().chain(args);
    let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}"));
    let Command::Inject(a) = cli.command else {
        unreachable!()
    };
    inject_config(&a).unwrap_or_else(|f| panic!("{}", f.message))
}

const JOB: &str = "apiVersion: batch/v1
kind: Job
metadata:
  name: mnist
  namespace: ml
spec:
  completionMode: Indexed
  template:
    metadata:
      labels:
        app: mnist
        role: worker
    spec:
      restartPolicy: Never
      containers:
        - name: train
          image: python:3.12
          command: [python, train.py]
";

const SERVICE: &str = "---
apiVersion: v1
kind: Service
metadata:
  name: mnist
  namespace: ml
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector:
    app: mnist
    role: worker
";

fn notes(out: &crate::inject::transform::Output) -> Vec<String> {
    out.notes.iter().map(ToString::to_string).collect()
}

#[test]
fn a_job_gets_a_subdomain_and_its_headless_service() {
    let cfg = config(&["--job", "worker=app=mnist", "--address", "dns"]);
    let out = inject(JOB, &cfg).unwrap();
    assert!(
        out.yaml.contains("\n      subdomain: mnist\n---\n"),
        "{}",
        out.yaml
    );
    assert!(out.yaml.ends_with(SERVICE), "{}", out.yaml);
    assert_eq!(
        notes(&out),
        [
            "document 1 (batch/v1 Job \"mnist\"): set the pod template's subdomain to \"mnist\": --address dns needs one for the pods' DNS names",
            "document 1 (batch/v1 Job \"mnist\"): injected",
            "document 2 (v1 Service \"mnist\"): added: the DNS names of the pods of batch/v1 Job \"mnist\" need a headless Service (--address dns)",
        ]
    );
    // Once the Service is there, a second inject adds nothing.
    let again = inject(&out.yaml, &cfg).unwrap();
    assert_eq!(again.yaml, out.yaml);
    // Without --address dns, nothing of it.
    let plain = inject(JOB, &config(&["--job", "worker=app=mnist"])).unwrap();
    assert!(!plain.yaml.contains("subdomain"), "{}", plain.yaml);
    assert!(!plain.yaml.contains("kind: Service"), "{}", plain.yaml);
}

#[test]
fn jobs_sharing_a_subdomain_get_one_service_selecting_their_common_labels() {
    let cfg = config(&["--job", "worker=app=mnist", "--address", "dns"]);
    let two = format!(
        "{}---\n{}",
        JOB.replace(
            "      restartPolicy",
            "      subdomain: ml\n      restartPolicy"
        ),
        JOB.replace("name: mnist\n  namespace", "name: mnist-ps\n  namespace")
            .replace("role: worker", "role: ps")
            .replace(
                "      restartPolicy",
                "      subdomain: ml\n      restartPolicy"
            )
    );
    let out = inject(&two, &cfg).unwrap();
    assert!(
        out.yaml.ends_with(
            "---
apiVersion: v1
kind: Service
metadata:
  name: ml
  namespace: ml
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector:
    app: mnist
"
        ),
        "{}",
        out.yaml
    );
    assert_eq!(out.yaml.matches("kind: Service").count(), 1);
}

#[test]
fn an_existing_headless_service_is_kept_and_a_non_headless_one_noted() {
    let cfg = config(&["--job", "worker=app=mnist", "--address", "dns"]);
    let sts = include_str!("../../tests/fixtures/inject/statefulset-dns.yaml");
    let out = inject(sts, &cfg).unwrap();
    assert_eq!(out.yaml.matches("kind: Service").count(), 1);
    assert!(notes(&out).iter().all(|n| !n.contains("added")));
    let not_headless = sts.replace("  clusterIP: None\n", "");
    let out = inject(&not_headless, &cfg).unwrap();
    assert_eq!(out.yaml.matches("kind: Service").count(), 1);
    assert_eq!(
        notes(&out).last().unwrap(),
        "document 2 (apps/v1 StatefulSet \"mnist\"): Service \"mnist\" is not headless (clusterIP: None), so the pods of apps/v1 StatefulSet \"mnist\" get no DNS names under it; make it headless for --address dns"
    );
}
