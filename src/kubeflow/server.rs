//! The endpoint on loopback: TLS (rustls), HTTP/1.1 (hyper), [`request`]'s answers.
//! What the training container, or anything else on loopback, sends is bounded, and
//! cannot delay the trainer's own reports: every connection is served by a task of
//! its own, at most [`MAX_CONNECTIONS`] at once, a new one evicting the oldest that
//! has not shown the token ([`connections`]); the handshake within [`HANDSHAKE`], the
//! request's headers within [`HEADERS`] after it, one request a connection. Only then,
//! with the token, a report spends the rate ([`BURST`], one every [`REFILL`]) and its
//! body is read: at most [`request::MAX_BODY`], within [`BODY`].

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Request, Response};
use tokio::net::TcpStream;
use tracing::{debug, info};

use super::connections::{Connections, Slot, Trust};
use super::request::{self, Answer, Endpoint, TrainerStatus};
use super::{CA_CERT_ENV, KubeflowError, TOKEN_ENV, URL_ENV, tls};
use crate::publish::TokenBucket;

/// Connections at once. Each costs a task and its buffers (tens of KiB); past this,
/// a new one takes the oldest untrusted one's place, so the bound protects exec's
/// memory without keeping the trainer out.
pub const MAX_CONNECTIONS: usize = 64;
/// For the TLS handshake: on loopback it takes milliseconds.
pub const HANDSHAKE: Duration = Duration::from_secs(2);
/// For a request's headers, after the handshake: the clients send them at once.
pub const HEADERS: Duration = Duration::from_secs(2);
/// For the body of a request with the token.
pub const BODY: Duration = Duration::from_secs(10);
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

/// What every connection shares.
struct Shared {
    acceptor: tokio_rustls::TlsAcceptor,
    endpoint: Endpoint,
    bucket: Mutex<TokenBucket>,
    accepted: Box<dyn Fn(TrainerStatus) + Send + Sync>,
}

impl Prepared {
    /// Serves until the task is dropped; `accepted` gets every accepted report. Accepts
    /// without pause: a connection never waits for another to end.
    pub async fn serve(self, accepted: impl Fn(TrainerStatus) + Send + Sync + 'static) {
        let Ok(listener) = tokio::net::TcpListener::from_std(self.listener) else {
            return;
        };
        info!(url = %self.env[0].1, "serving Kubeflow Trainer's progress endpoint for the command");
        let shared = Arc::new(Shared {
            acceptor: tokio_rustls::TlsAcceptor::from(self.tls),
            endpoint: self.endpoint,
            bucket: Mutex::new(TokenBucket::new(BURST, REFILL, Instant::now())),
            accepted: Box::new(accepted),
        });
        let connections = Connections::new(MAX_CONNECTIONS);
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                // Out of file descriptors, most likely: a moment for some to close.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let Some(slot) = connections.admit() else {
                debug!("Kubeflow endpoint: every connection has the token; refused one");
                continue;
            };
            tokio::spawn(connection(stream, slot, shared.clone()));
        }
    }
}

/// One connection, until it is answered, too slow, or evicted by a newer one.
async fn connection(stream: TcpStream, mut slot: Slot, shared: Arc<Shared>) {
    let trust = slot.trust();
    tokio::select! {
        () = serve_one(stream, trust, shared) => {}
        _ = &mut slot.evicted => debug!("Kubeflow endpoint: a newer connection took this one's place"),
    }
}

async fn serve_one(stream: TcpStream, trust: Trust, shared: Arc<Shared>) {
    let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE, shared.acceptor.accept(stream)).await else {
        debug!("Kubeflow endpoint: TLS handshake failed or timed out");
        return;
    };
    let svc = hyper::service::service_fn(move |req| {
        let (shared, trust) = (shared.clone(), trust.clone());
        async move {
            let a = handle(req, &shared, &trust).await;
            Ok::<_, std::convert::Infallible>(response(a))
        }
    });
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADERS)
        .keep_alive(false)
        .max_buf_size(request::MAX_BODY)
        .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
        .await
    {
        debug!("Kubeflow endpoint: connection ended: {e}");
    }
}

/// Trainer's checks in its order (the declared size, the route, the token), then
/// trainlet's rate, which only a caller with the token spends, then the body.
async fn handle(req: Request<hyper::body::Incoming>, shared: &Shared, trust: &Trust) -> Answer {
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > request::MAX_BODY as u64) {
        return request::too_large();
    }
    let authorization = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let path = req.uri().path();
    if let Err(refused) =
        request::admit(&shared.endpoint, req.method().as_str(), path, authorization)
    {
        debug!(code = refused.code, "Kubeflow endpoint: refused a request");
        return refused;
    }
    trust.set();
    if !shared
        .bucket
        .lock()
        .map(|mut b| b.take(Instant::now()))
        .unwrap_or(false)
    {
        return request::too_many();
    }
    let body = match tokio::time::timeout(
        BODY,
        Limited::new(req.into_body(), request::MAX_BODY).collect(),
    )
    .await
    {
        Ok(Ok(b)) => b.to_bytes(),
        _ => return request::invalid_payload(),
    };
    let (answer, status) = request::decode(&shared.endpoint, &body);
    if answer.code != 200 {
        debug!(code = answer.code, "Kubeflow endpoint: refused a report");
    }
    if let Some(Some(s)) = status {
        (shared.accepted)(s);
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
