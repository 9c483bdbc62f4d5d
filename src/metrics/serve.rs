//! The admin HTTP server of the reporters, on hyper.
//!
//! Routes:
//! - `GET /metrics`: every metric, in the OpenMetrics text format (prometheus-client)
//!   to every client that accepts it, as Prometheus does; in the classic text format
//!   (0.0.4) to the others, such as `curl` and `promtool check metrics`, which do not
//!   parse OpenMetrics (client_golang negotiates the same way);
//! - `GET /livez`: 200 while the process serves at all;
//! - `GET /readyz`: 200 once the first report has been published, 503 before.
//!
//! The server is plain HTTP/1 on hyper, one small task per connection on the same
//! single-threaded runtime as the reporters: a scrape every 15 s costs nothing worth a
//! thread.
//!
//! The port is reachable by anything in the cluster network, and the sidecar lives in a
//! 128 MiB container, so the server is bounded as a Go server with `ReadHeaderTimeout`
//! and `MaxHeaderBytes` is: a client has [`HEADER_READ_TIMEOUT`] to send its request
//! head (also between the requests of a kept-alive connection), a connection's read
//! buffer holds at most [`MAX_BUFFER`] bytes (a larger head is refused), and at most
//! [`MAX_CONNECTIONS`] are served at once; past that a new connection is closed at once.
//! 500 slow clients then cost a few MiB, not hyper's default 400 KiB each.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use tracing::{debug, info};

use super::{CONTENT_TYPE, Metrics, MetricsError, TEXT_CONTENT_TYPE};

/// Rewrites OpenMetrics text into the classic text format (0.0.4), for the metric
/// types trainlet uses: a counter's family is named with its `_total` suffix, an info
/// metric becomes a gauge named `<name>_info`, and `# UNIT` and `# EOF` go. Pure.
pub fn to_classic_text(openmetrics: &str) -> String {
    let mut types: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
    for l in openmetrics.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ")
            && let Some((name, ty)) = rest.split_once(' ')
        {
            types.insert(name, ty);
        }
    }
    let rename = |name: &str| -> String {
        match types.get(name).copied() {
            Some("counter") => format!("{name}_total"),
            Some("info") => format!("{name}_info"),
            _ => name.to_string(),
        }
    };
    let mut out = String::with_capacity(openmetrics.len());
    for l in openmetrics.lines() {
        if l == "# EOF" || l.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = l.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.push_str(&format!("# HELP {} {help}\n", rename(name)));
        } else if let Some(rest) = l.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').unwrap_or((rest, ""));
            let ty = if ty == "info" { "gauge" } else { ty };
            out.push_str(&format!("# TYPE {} {ty}\n", rename(name)));
        } else {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// Whether a request's Accept header asks for OpenMetrics.
fn wants_openmetrics<B>(req: &Request<B>) -> bool {
    req.headers()
        .get_all(hyper::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"))
}

/// The readiness latch: it flips once, when the first report is published, and never
/// back. A reporter that loses the API server later is still ready: it has reported,
/// and it catches up on its own.
#[derive(Clone, Default, Debug)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// How long a client may take to send a request head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The most a connection buffers: a request head larger than this is refused (hyper's
/// minimum is 8 KiB; Prometheus sends well under 1 KiB).
pub const MAX_BUFFER: usize = 16 * 1024;
/// The most connections served at once.
pub const MAX_CONNECTIONS: usize = 1024;
/// Open connections above this are a burst: its buffers are handed back to the kernel
/// once the last connection has closed (Prometheus keeps one or two open).
const BURST: usize = 32;

/// Binds the admin server's socket. Separate from [`serve`] so that a bind failure is
/// reported before anything else starts.
pub fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, MetricsError> {
    let std =
        std::net::TcpListener::bind(addr).map_err(|source| MetricsError::Bind { addr, source })?;
    std.set_nonblocking(true)
        .map_err(|source| MetricsError::Bind { addr, source })?;
    tokio::net::TcpListener::from_std(std).map_err(|source| MetricsError::Bind { addr, source })
}

/// Binds `addr`, or where another process holds its port, any free port of the same
/// address: a reporter whose port is taken (two hostNetwork pods on one node) reports
/// all the same, on a port it logs, instead of crash-looping. The error says why.
pub fn bind_or_any_port(
    addr: SocketAddr,
) -> Result<(tokio::net::TcpListener, Option<MetricsError>), MetricsError> {
    match bind(addr) {
        Ok(l) => Ok((l, None)),
        Err(MetricsError::Bind { source, .. })
            if source.kind() == std::io::ErrorKind::AddrInUse && addr.port() != 0 =>
        {
            let any = SocketAddr::new(addr.ip(), 0);
            Ok((bind(any)?, Some(MetricsError::Bind { addr, source })))
        }
        Err(e) => Err(e),
    }
}

/// Serves `/metrics`, `/livez` and `/readyz` until the task is dropped.
///
/// Says so at once, not in the spawned task: the sidecar's startup probe passes once the
/// port listens, and its first line must come before the training container's.
pub fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    ready: Readiness,
) -> impl Future<Output = ()> {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving /metrics, /livez and /readyz");
    }
    accept(listener, metrics, ready)
}

async fn accept(listener: tokio::net::TcpListener, metrics: Arc<Metrics>, ready: Readiness) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let burst = Arc::new(AtomicBool::new(false));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                debug!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            debug!(%peer, "{MAX_CONNECTIONS} admin connections open; closing this one");
            metrics.admin_refused.inc();
            continue;
        };
        if MAX_CONNECTIONS - slots.available_permits() > BURST {
            burst.store(true, Ordering::Relaxed);
        }
        let metrics = metrics.clone();
        let ready = ready.clone();
        let (slots, burst) = (slots.clone(), burst.clone());
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let resp = route(&req, &metrics, &ready);
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .max_buf_size(MAX_BUFFER)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .await
            {
                debug!(%peer, "admin connection ended: {e}");
            }
            drop(slot);
            if slots.available_permits() == MAX_CONNECTIONS && burst.swap(false, Ordering::Relaxed)
            {
                crate::heap::release_freed();
            }
        });
    }
}

fn route<B>(req: &Request<B>, metrics: &Metrics, ready: &Readiness) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: &str| {
        Response::builder()
            .status(status)
            .header("content-type", "text/plain; charset=utf-8")
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("static response")
    };
    if req.method() != hyper::Method::GET && req.method() != hyper::Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
    }
    match req.uri().path() {
        "/metrics" if wants_openmetrics(req) => Response::builder()
            .header("content-type", CONTENT_TYPE)
            .body(Full::new(Bytes::from(metrics.encode())))
            .expect("static response"),
        "/metrics" => Response::builder()
            .header("content-type", TEXT_CONTENT_TYPE)
            .body(Full::new(Bytes::from(to_classic_text(&metrics.encode()))))
            .expect("static response"),
        "/livez" => text(StatusCode::OK, "ok\n"),
        "/readyz" if ready.is_ready() => text(StatusCode::OK, "ok\n"),
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the first report has not been published yet\n",
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /livez or /readyz\n",
        ),
    }
}
