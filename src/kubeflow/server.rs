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
/// The longest a connection lives, whatever it waits for: the sum of the above, and
/// a little for the answer.
const LIFETIME: Duration = Duration::from_secs(16);
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
        r = tokio::time::timeout(LIFETIME, serve_one(stream, trust, shared)) => {
            if r.is_err() {
                debug!("Kubeflow endpoint: a connection outlived {LIFETIME:?}");
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A client as CMD's: TLS with the CA file exec wrote, one request a connection.
    struct Client {
        addr: SocketAddr,
        path: String,
        token: String,
        tls: tokio_rustls::TlsConnector,
    }

    impl Client {
        fn of(p: &Prepared) -> Client {
            let var = |k: &str| p.env.iter().find(|(n, _)| n == k).unwrap().1.clone();
            let url = var(URL_ENV);
            let rest = url.strip_prefix("https://").unwrap();
            let (host, path) = rest.split_at(rest.find('/').unwrap());
            let pem = std::fs::read_to_string(var(CA_CERT_ENV)).unwrap();
            let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
            let der = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap();
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(rustls::pki_types::CertificateDer::from(der))
                .unwrap();
            let config = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
            Client {
                addr: host.parse().unwrap(),
                path: path.to_string(),
                token: std::fs::read_to_string(var(TOKEN_ENV)).unwrap(),
                tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            }
        }

        /// POSTs `body` with `token`: the answer's code.
        async fn post(&self, token: &str, body: &str) -> u16 {
            let tcp = TcpStream::connect(self.addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let mut s = self.tls.connect(name, tcp).await.unwrap();
            let req = format!(
                "POST {} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                self.path,
                body.len()
            );
            s.write_all(req.as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            // The server closes after one answer; a TLS peer may end without close_notify.
            let _ = s.read_to_end(&mut answer).await;
            let text = String::from_utf8_lossy(&answer);
            text.split(' ')
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0)
        }
    }

    const REPORT: &str =
        r#"{"trainerStatus":{"progressPercentage":5,"lastUpdatedTime":"2026-11-26T10:25:35Z"}}"#;

    async fn serving() -> (
        Client,
        std::sync::mpsc::Receiver<TrainerStatus>,
        tempfile::TempDir,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let p = prepare(dir.path(), "ml", "job").unwrap();
        let client = Client::of(&p);
        let (tx, rx) = std::sync::mpsc::channel();
        tokio::spawn(p.serve(move |s| {
            let _ = tx.send(s);
        }));
        (client, rx, dir)
    }

    /// 30 requests with a wrong token spend none of the rate (a burst of 10): the report
    /// after them is accepted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wrong_token_spends_none_of_the_rate() {
        let (c, accepted, _dir) = serving().await;
        let mut wrong = Vec::new();
        for _ in 0..30 {
            wrong.push(c.post("nope", REPORT).await);
        }
        assert_eq!(
            (wrong, c.post(&c.token, REPORT).await),
            (vec![403; 30], 200)
        );
        assert_eq!(accepted.recv().unwrap().percent, Some(5));
    }

    /// 100 idle connections, past the 64 places, and 20 more idle after the handshake:
    /// the report is answered within a second (asserted within 2 s, for a loaded
    /// host), and every idle connection is closed by the server.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_connections_do_not_hold_a_report_up() {
        let (c, accepted, _dir) = serving().await;
        let mut idle = Vec::new();
        for _ in 0..100 {
            idle.push(TcpStream::connect(c.addr).await.unwrap());
        }
        // Each within a second, or not at all: before, the 100 held every place.
        let mut handshaken = Vec::new();
        for _ in 0..20 {
            let tcp = TcpStream::connect(c.addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let tls = tokio::time::timeout(Duration::from_secs(1), c.tls.connect(name, tcp));
            if let Ok(Ok(s)) = tls.await {
                handshaken.push(s);
            }
        }
        let start = Instant::now();
        // The Python clients' timeout.
        let code = tokio::time::timeout(Duration::from_secs(5), c.post(&c.token, REPORT)).await;
        let took = start.elapsed();
        assert_eq!((code, handshaken.len()), (Ok(200), 20));
        assert!(took < Duration::from_secs(2), "{took:?}");
        assert_eq!(accepted.recv().unwrap().percent, Some(5));
        for mut s in idle {
            let mut buf = [0u8; 1];
            let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
                .await
                .expect("the server closes an idle connection");
            assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
        }
    }
}
