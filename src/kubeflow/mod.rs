//! Kubeflow Trainer's progress endpoint, served by `trainlet exec` inside the pod.
//!
//! Kubeflow Trainer (v2.2 and later, the `TrainJobStatus` feature) gives a trainer's
//! containers three variables and takes progress from them: percentage, estimated
//! time remaining and named metrics, POSTed as JSON (kubeflow/trainer
//! `pkg/statusserver/server.go`, `pkg/apis/trainer/v1alpha1/trainjob_types.go`,
//! `pkg/runtime/framework/plugins/trainjobstatus/trainjobstatus.go`). The Kubeflow SDK
//! (`kubeflow.trainer.update_trainjob_status`) and Transformers' `KubeflowCallback`
//! send it whenever `KUBEFLOW_TRAINER_SERVER_URL` is set. Without Trainer, exec serves
//! the same endpoint on loopback and sets the variables for CMD: a report is then
//! progress for the stall watch, and trainlet publishes what it says.
//!
//! [`request`] is the endpoint's answers (pure), [`bounds`] what a report may say
//! there and in exec's handover to the sidecar (pure); [`tls`] makes its certificate
//! and the files CMD reads; [`server`] serves it, each connection on its own
//! ([`connections`]).

pub mod bounds;
pub mod connections;
pub mod request;
pub mod server;
pub mod tls;

use thiserror::Error;

/// The full URL of the endpoint, path included (as Trainer sets it).
pub const URL_ENV: &str = "KUBEFLOW_TRAINER_SERVER_URL";
/// The path of the CA certificate (PEM) that signed the endpoint's certificate.
pub const CA_CERT_ENV: &str = "KUBEFLOW_TRAINER_SERVER_CA_CERT";
/// The path of the file whose content is the bearer token.
pub const TOKEN_ENV: &str = "KUBEFLOW_TRAINER_SERVER_TOKEN";

#[derive(Debug, Error)]
pub enum KubeflowError {
    #[error("cannot make the Kubeflow progress endpoint's certificate: {0}")]
    Certificate(String),
    #[error("cannot write {path} for the Kubeflow progress endpoint: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot listen on loopback for the Kubeflow progress endpoint: {0}")]
    Listen(std::io::Error),
}
