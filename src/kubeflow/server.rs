//! The endpoint on loopback: TLS (rustls), HTTP/1.1 (hyper), [`request::answer`]'s
//! answers. What the training container sends is bounded: 4 connections at once, the
//! handshake and a request's headers and body within [`READ_TIMEOUT`], a body of at
//! most [`request::MAX_BODY`], and a report every [`REFILL`] with a burst of [`BURST`].

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Request, Response};
use tracing::{debug, info};

use super::request::{self, Answer, Endpoint, TrainerStatus};
use super::{CA_CERT_ENV, KubeflowError, TOKEN_ENV, URL_ENV, tls};
use crate::publish::TokenBucket;

/// Connections served at once; more wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 4;
/// For the TLS handshake, and for a request's headers and then its body.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// One report a second, on average: both Python clients send one every 5 s at most.
pub const REFILL: Duration = Duration::from_secs(1);
/// Reports at once (Transformers' first and last are sent however recent the one
/// before).
pub const BURST: u32 = 10;

/// The endpoint, made and listening, not yet served: its variables go into CMD's
/// environment before CMD starts.
pub struct Prepared {
    listener: std::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    endpoint: Endpoint,
    /// The three variables for CMD.
    pub env: Vec<(String, String)>,
}

/// Listens on `127.0.0.1` (a free port) and writes the CA and token files into
/// `dir`, for TrainJob `namespace/name`.
pub fn prepare(dir: &Path, namespace: &str, name: &str) -> Result<Prepared, KubeflowError> {
    let m = tls::make(dir)?;
    let listener = std::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(KubeflowError::Listen)?;
    let port = listener.local_addr().map_err(KubeflowError::Listen)?.port();
    let path = request::status_path(namespace, name);
    let env = vec![
        (
            URL_ENV.to_string(),
            format!("https://127.0.0.1:{port}{path}"),
        ),
        (CA_CERT_ENV.to_string(), m.ca_file.display().to_string()),
        (TOKEN_ENV.to_string(), m.token_file.display().to_string()),
    ];
    Ok(Prepared {
        listener,
        tls: m.config,
        endpoint: Endpoint {
            path,
            name: name.to_string(),
            token: m.token,
        },
        env,
    })
}

impl Prepared {
    /// Serves until the task is dropped; `accepted` gets every accepted report.
    pub async fn serve(self, accepted: impl Fn(TrainerStatus) + Send + Sync + 'static) {
        let Ok(listener) = tokio::net::TcpListener::from_std(self.listener) else {
            return;
        };
        info!(url = %self.env[0].1, "serving Kubeflow Trainer's progress endpoint for the command");
        let acceptor = tokio_rustls::TlsAcceptor::from(self.tls);
        let endpoint = Arc::new(self.endpoint);
        let bucket = Arc::new(Mutex::new(TokenBucket::new(BURST, REFILL, Instant::now())));
        let accepted = Arc::new(accepted);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let (acceptor, endpoint, bucket, accepted) = (
                acceptor.clone(),
                endpoint.clone(),
                bucket.clone(),
                accepted.clone(),
            );
            tokio::spawn(async move {
                let Ok(Ok(tls)) = tokio::time::timeout(READ_TIMEOUT, acceptor.accept(stream)).await
                else {
                    debug!("Kubeflow endpoint: TLS handshake failed or timed out");
                    return;
                };
                let svc = hyper::service::service_fn(move |req| {
                    let (endpoint, bucket, accepted) =
                        (endpoint.clone(), bucket.clone(), accepted.clone());
                    async move {
                        let a = handle(req, &endpoint, &bucket, &*accepted).await;
                        Ok::<_, std::convert::Infallible>(response(a))
                    }
                });
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(READ_TIMEOUT)
                    .max_buf_size(request::MAX_BODY)
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                    .await
                {
                    debug!("Kubeflow endpoint: connection ended: {e}");
                }
                drop(slot);
            });
        }
    }
}

async fn handle(
    req: Request<hyper::body::Incoming>,
    endpoint: &Endpoint,
    bucket: &Mutex<TokenBucket>,
    accepted: &(dyn Fn(TrainerStatus) + Send + Sync),
) -> Answer {
    if !bucket
        .lock()
        .map(|mut b| b.take(Instant::now()))
        .unwrap_or(false)
    {
        return request::too_many();
    }
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > request::MAX_BODY as u64) {
        return request::too_large();
    }
    let (parts, body) = req.into_parts();
    let body = match tokio::time::timeout(
        READ_TIMEOUT,
        Limited::new(body, request::MAX_BODY).collect(),
    )
    .await
    {
        Ok(Ok(b)) => b.to_bytes(),
        _ => return request::invalid_payload(),
    };
    let (answer, status) = request::answer(
        endpoint,
        &request::Request {
            method: parts.method.as_str(),
            path: parts.uri.path(),
            authorization: parts
                .headers
                .get(hyper::header::AUTHORIZATION)
                .map(|v| v.as_bytes()),
            body: &body,
        },
    );
    if answer.code != 200 {
        debug!(code = answer.code, "Kubeflow endpoint: refused a report");
    }
    if let Some(Some(s)) = status {
        accepted(s);
    }
    answer
}

fn response(a: Answer) -> Response<Full<Bytes>> {
    Response::builder()
        .status(a.code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(a.body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}
