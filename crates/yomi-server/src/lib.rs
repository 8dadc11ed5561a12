//! yomi's OpenAI-compatible HTTP server (DESIGN §8): `POST /v1/chat/completions` and
//! `POST /v1/completions` (streamed as server-sent events or not), `GET /v1/models`,
//! `GET /health`, and Anthropic's `POST /v1/messages` ([`anthropic`]: the same engine path,
//! Anthropic's shapes and errors).
//!
//! One engine, batch one: handlers take a place in the bounded queue (503 when full),
//! template and tokenize the request (a prompt too many bytes long for the context is refused
//! first), check it, and hand it to the engine thread ([`worker`]). Text streams back through
//! a channel per request; a client that disconnects drops its end, which stops the generation
//! at the next token and frees the engine. The prefix cache is on unless turned off.
//! Connections are bounded in number and time: headers (and the wait on an idle keep-alive
//! connection) and bodies have timeouts. On shutdown the server stops accepting, lets requests
//! in flight finish within a grace period, then ends the rest (streams with an error event and
//! `[DONE]`, others with 503).
//!
//! Errors are OpenAI-shaped (`{"error": {"message", "type", "param", "code"}}`) with 400 (bad
//! JSON or parameters, context overflow), 401 (API key), 403 (without an API key, a `Host`
//! that a web page could have sent), 404 (unknown model or route), 408 (a body not sent
//! within the body timeout), 413 (body too large, or a `Content-Length` that says so), 415
//! (without an API key, a POST body not declared JSON), 503 (queue full, with `Retry-After`;
//! shutting down) and 500 (engine failure). Parameters that would change the output in ways
//! yomi does not implement (`n`, `best_of`, penalties, `logprobs`, `logit_bias`, a
//! `response_format` other than text, `echo`, `suffix`) get 400 rather than being ignored;
//! `stop` takes at most 4 strings of at most 256 bytes each. Chat requests may offer `tools`
//! ([`chat_tools`]): the model's template shows them, and calls in the output come back as
//! `tool_calls`.

pub mod anthropic;
pub mod api;
pub mod chat_tools;
pub mod client;
pub mod error;
pub mod reasoning;
pub mod structured;
pub mod tools;
mod worker;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use futures_util::stream;
use serde_json::{Value, json};
use tokio::sync::mpsc::unbounded_channel;
use yomi_core::SamplerParams;
use yomi_engine::generate::{DEFAULT_DRAFT_BUDGET, DraftMode};
use yomi_engine::prefix_cache::{PrefixCacheConfig, PrefixCacheStats};
use yomi_engine::stats::StatsRecorder;
use yomi_engine::{Constraint, Engine, GenerateParams};

use crate::api::{ApiKind, Outcome, ParsedRequest, PromptSpec, ResponseMeta};
use crate::chat_tools::ToolStream;
use crate::error::ApiError;
use crate::reasoning::{Split, THINK_CLOSE, THINK_OPEN, prompt_opens_thinking};
use crate::structured::{OutputSpec, ThinkClose};
use crate::tools::{ToolCallParser, ToolFormat};
use crate::worker::{Event, Job};

/// Default limit on a request body.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 << 20;
/// Default number of requests that may wait for the engine (besides the one running).
pub const DEFAULT_QUEUE_SIZE: usize = 32;
/// Default time a client has to send a request's headers; an idle keep-alive connection is
/// closed after it too (hyper starts the clock as soon as it waits for the next request).
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Default time a client has to send a request's whole body, from when its headers arrived.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Default number of connections open at once; more are closed as soon as they are accepted.
/// Below the usual 1024 file descriptors a process may hold, with room for the model's files.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Default time in-flight requests have to finish once the server is told to stop.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// `Retry-After` of a 503 (queue full): a place frees when the running request ends, so a
/// short wait; clients back off further on repeated 503s.
const RETRY_AFTER_SECS: u64 = 1;

/// How to serve (the address is [`bind`]'s).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The name clients use in `model` (and `/v1/models` lists).
    pub model_name: String,
    /// When set, `/v1/*` requires `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// The prefix cache; `None` turns it off (every request is a cold run).
    pub prefix_cache: Option<PrefixCacheConfig>,
    /// Requests that may wait while one runs; more get 503.
    pub queue_size: usize,
    /// Largest request body accepted (413 beyond).
    pub max_body_bytes: usize,
    /// Speculative drafter for every request (lossless).
    pub draft: DraftMode,
    pub draft_budget: usize,
    /// Tests only: a pause after every text delta, to make a generation slow.
    pub token_delay: Option<Duration>,
    /// A client that has not sent a request's headers this long after connecting, or after
    /// its previous response (an idle keep-alive connection), is disconnected.
    pub header_timeout: Duration,
    /// A request whose body has not arrived this long after its headers gets 408.
    pub body_timeout: Duration,
    /// Connections open at once; more are closed at once.
    pub max_connections: usize,
    /// Without an API key, the host names (`Host` header, port aside) accepted besides
    /// localhost names and IP addresses; `*` accepts any. See [`browser_guard`].
    pub allowed_hosts: Vec<String>,
    /// On shutdown, how long requests in flight may take to finish; streams still open after
    /// it end with an error event and `[DONE]`, other requests get 503.
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            model_name: "default".into(),
            api_key: None,
            prefix_cache: Some(PrefixCacheConfig::default()),
            queue_size: DEFAULT_QUEUE_SIZE,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            draft: DraftMode::Suffix,
            draft_budget: DEFAULT_DRAFT_BUDGET,
            token_delay: None,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            allowed_hosts: Vec::new(),
        }
    }
}

/// Request counters, as `/health` reports them.
#[derive(Default)]
pub(crate) struct Counters {
    pub completed: AtomicU64,
    pub cancelled: AtomicU64,
    pub failed: AtomicU64,
    pub rejected: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub running: AtomicBool,
    /// Admitted requests still being templated and tokenized: not yet in the engine's queue,
    /// which takes them in the order they finish that.
    pub preparing: AtomicU64,
}

/// Holds the engine thread between jobs (tests use it to fill the queue deterministically).
#[derive(Default)]
pub(crate) struct Gate {
    paused: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn set(&self, paused: bool) {
        *self.paused.lock().unwrap_or_else(|e| e.into_inner()) = paused;
        self.cv.notify_all();
    }

    pub(crate) fn wait(&self) {
        let mut p = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        while *p {
            p = self.cv.wait(p).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Token ids of the think tags when they are special tokens (absent from decoded text).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ThinkTokens {
    pub open: Option<u32>,
    pub close: Option<u32>,
}

pub(crate) struct Shared {
    pub cfg: ServerConfig,
    /// Requests queued or running.
    pub admitted: AtomicUsize,
    pub counters: Counters,
    pub gate: Gate,
    pub cache_stats: Mutex<Option<PrefixCacheStats>>,
    pub think: ThinkTokens,
    /// Set when the shutdown grace period is over: requests still waiting for the engine end.
    pub cutoff: tokio::sync::watch::Sender<bool>,
}

struct App {
    engine: Arc<Engine>,
    shared: Arc<Shared>,
    jobs: Mutex<std::sync::mpsc::Sender<Job>>,
    created: u64,
    next_id: AtomicU64,
    id_salt: u64,
    /// [`prompt_byte_bound`].
    max_prompt_bytes: usize,
}

type AppState = Arc<App>;

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn random_u64() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// A think tag that the tokenizer treats as one special token.
fn special_token(engine: &Engine, tag: &str) -> Option<u32> {
    let id = engine.tokenizer.token_to_id(tag)?;
    let text = engine.tokenizer.decode(&[id], true).ok()?;
    text.is_empty().then_some(id)
}

/// The server's health and counters, as `GET /health` reports them.
pub(crate) fn health_json(shared: &Shared) -> Value {
    let c = &shared.counters;
    let admitted = shared.admitted.load(Ordering::Acquire);
    let running = c.running.load(Ordering::Acquire);
    json!({
        "status": "ok",
        "model": shared.cfg.model_name,
        "queue": {
            "waiting": admitted.saturating_sub(usize::from(running)),
            "preparing": c.preparing.load(Ordering::Acquire),
            "running": running,
            "capacity": shared.cfg.queue_size,
        },
        "requests": {
            "completed": c.completed.load(Ordering::Relaxed),
            "cancelled": c.cancelled.load(Ordering::Relaxed),
            "failed": c.failed.load(Ordering::Relaxed),
            "rejected": c.rejected.load(Ordering::Relaxed),
            "generated_tokens": c.generated_tokens.load(Ordering::Relaxed),
        },
        "prefix_cache": shared
            .cache_stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map(|s| serde_json::to_value(s).unwrap_or(Value::Null)),
    })
}

async fn health(State(app): State<AppState>) -> Response {
    axum::Json(health_json(&app.shared)).into_response()
}

fn model_card(app: &App) -> Value {
    json!({
        "id": app.shared.cfg.model_name,
        "object": "model",
        "created": app.created,
        "owned_by": "yomi",
        "max_model_len": app.engine.context_size,
    })
}

async fn models(State(app): State<AppState>) -> Response {
    axum::Json(json!({"object": "list", "data": [model_card(&app)]})).into_response()
}

async fn model(
    State(app): State<AppState>,
    id: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Response {
    // A path that does not decode (e.g. `%FF`) is a client error in the API's JSON shape, not
    // axum's plain-text rejection.
    let Path(id) = match id {
        Ok(p) => p,
        Err(e) => return ApiError::bad_request(format!("invalid path: {e}")).into_response(),
    };
    if id == app.shared.cfg.model_name {
        axum::Json(model_card(&app)).into_response()
    } else {
        unknown_model(&app, &id).into_response()
    }
}

fn unknown_model(app: &App, name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!(
            "the model `{name}` does not exist (this server serves `{}`)",
            app.shared.cfg.model_name
        ),
    )
    .with_param("model")
    .with_code("model_not_found")
}

async fn not_found(req: Request) -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("no route {} {}", req.method(), req.uri().path()),
    )
    .into_response()
}

async fn method_not_allowed(req: Request) -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
    .into_response()
}

/// The credentials of `Authorization: Bearer <token>`; the scheme name is case-insensitive
/// (RFC 9110 §11.1), so `bearer` and `BEARER` work too.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Whether `given` equals `key`, in a time that does not depend on where they first differ
/// (an early exit would let a client find the key byte by byte from response times). Only
/// the key's length may show.
fn same_key(given: &[u8], key: &[u8]) -> bool {
    let mut diff = given.len() ^ key.len();
    for (i, &g) in given.iter().enumerate() {
        diff |= usize::from(g ^ key.get(i).copied().unwrap_or(0));
    }
    std::hint::black_box(diff) == 0
}

/// `--api-key`: every route but `/health` needs `Authorization: Bearer <key>`.
async fn auth(State(app): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(key) = &app.shared.cfg.api_key
        && req.uri().path() != "/health"
    {
        let header_str = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
        // Anthropic's clients send the key as `x-api-key` instead.
        let given = [
            header_str(header::AUTHORIZATION.as_str()).and_then(bearer_token),
            header_str("x-api-key").map(str::trim),
        ];
        let given = given.iter().flatten();
        if !given
            .clone()
            .any(|g| same_key(g.as_bytes(), key.as_bytes()))
        {
            let msg = if given.count() == 0 {
                "missing API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`)"
            } else {
                "incorrect API key"
            };
            return ApiError::new(StatusCode::UNAUTHORIZED, "invalid_request_error", msg)
                .with_code("invalid_api_key")
                .into_response();
        }
    }
    next.run(req).await
}

/// The host name of a `Host` header value, without the port or IPv6 brackets, lower-cased
/// and without a trailing dot.
fn host_name(value: &str) -> String {
    let v = value.trim();
    let name = if let Some(rest) = v.strip_prefix('[') {
        rest.split(']').next().unwrap_or(rest)
    } else if v.matches(':').count() == 1 {
        v.split(':').next().unwrap_or(v)
    } else {
        v
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// Whether a request for `host` (a [`host_name`]) may be served without an API key.
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    // A DNS rebinding attack needs a name whose address the attacker controls: `localhost`
    // and its subdomains resolve to loopback in browsers (RFC 6761), and a page loaded from
    // an IP address is the server's own origin, so these cannot carry one.
    host == "localhost"
        || host.ends_with(".localhost")
        || host.parse::<std::net::IpAddr>().is_ok()
        || allowed.iter().any(|a| a == "*" || host_name(a) == host)
}

/// The longest request target (path and query) served, and the most header bytes: every
/// route's URI is short and no client needs large headers, so longer ones are refused in the
/// API's JSON shape (414 / 431) before anything else runs. hyper's own, larger limits stay as
/// the last line (it answers those with an empty body).
const MAX_URI_BYTES: usize = 8 << 10;
const MAX_HEADER_BYTES: usize = 64 << 10;

async fn size_guard(req: Request, next: Next) -> Response {
    let uri = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if uri > MAX_URI_BYTES {
        return ApiError::new(
            StatusCode::URI_TOO_LONG,
            "invalid_request_error",
            format!("the request path is {uri} bytes; at most {MAX_URI_BYTES} are served"),
        )
        .with_code("uri_too_long")
        .into_response();
    }
    let headers: usize = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    if headers > MAX_HEADER_BYTES {
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "invalid_request_error",
            format!(
                "the request headers are {headers} bytes; at most {MAX_HEADER_BYTES} are served"
            ),
        )
        .with_code("headers_too_large")
        .into_response();
    }
    next.run(req).await
}

/// Without an API key, anything that can reach the port may use the server, and that
/// includes any web page the user opens: a page can make the browser POST a form (or a
/// `text/plain` body) to `http://127.0.0.1:8000` without asking, and a page on a name the
/// attacker points at 127.0.0.1 (DNS rebinding) can even read the replies. So when no key is
/// set, requests must name the server by a localhost name, an IP address or an
/// `--allow-host` name (403 otherwise), and POST bodies must be declared
/// `application/json` (415 otherwise), which a page cannot send elsewhere without the CORS
/// preflight this server never grants. With a key set, a page cannot send the key.
async fn browser_guard(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let cfg = &app.shared.cfg;
    if cfg.api_key.is_some() {
        return next.run(req).await;
    }
    // HTTP/1.0 clients may send no `Host`; browsers always do.
    if let Some(value) = req.headers().get(header::HOST) {
        let host = value.to_str().map(host_name).unwrap_or_default();
        if !host_allowed(&host, &cfg.allowed_hosts) {
            let shown: String = host.chars().take(100).collect();
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "invalid_request_error",
                format!(
                    "requests for host `{shown}` are refused: without an API key only \
                     localhost names, IP addresses and --allow-host names are served (this \
                     guards against web pages that reach the server through the browser)"
                ),
            )
            .with_code("host_not_allowed")
            .into_response();
        }
    }
    if req.method() == axum::http::Method::POST {
        let json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_request_error",
                "the request body must be sent with `Content-Type: application/json`",
            )
            .with_code("unsupported_media_type")
            .into_response();
        }
    }
    next.run(req).await
}

fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        "the request body is too large",
    )
    .with_code("request_too_large")
}

/// Bodies over the limit are read and thrown away up to this many times the limit before the
/// 413 goes out. Many clients (Python's `http.client`, and so `requests`) send the whole body
/// before they read anything: a server that answers and closes while bytes are still coming
/// makes the kernel reset the connection, and such a client sees a broken pipe instead of the
/// 413. Beyond this the 413 goes out at once, and the client may see the reset.
const DRAIN_FACTOR: u64 = 4;

/// The 413 for a body over the limit, once what is left of it (up to [`DRAIN_FACTOR`] times
/// the limit in all, `read` bytes already) was read and dropped within the body deadline.
async fn refuse_too_large(
    mut data: axum::body::BodyDataStream,
    read: u64,
    max: usize,
    deadline: tokio::time::Instant,
) -> Response {
    let budget = (max as u64).saturating_mul(DRAIN_FACTOR);
    let mut read = read;
    while read <= budget {
        match tokio::time::timeout_at(deadline, data.next()).await {
            Ok(Some(Ok(chunk))) => read += chunk.len() as u64,
            _ => break,
        }
    }
    too_large().into_response()
}

/// A `Content-Length` beyond the body limit gets 413 without the body being kept: at once when
/// it is beyond what is worth draining ([`DRAIN_FACTOR`]), else once the body was read and
/// dropped (within the body timeout: a client may never send it).
async fn declared_length(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let cfg = &app.shared.cfg;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(n) if n > (cfg.max_body_bytes as u64).saturating_mul(DRAIN_FACTOR) => {
            too_large().into_response()
        }
        Some(n) if n > cfg.max_body_bytes as u64 => {
            let deadline = tokio::time::Instant::now() + cfg.body_timeout;
            let data = req.into_body().into_data_stream();
            refuse_too_large(data, 0, cfg.max_body_bytes, deadline).await
        }
        _ => next.run(req).await,
    }
}

/// Reads the whole request body within the body timeout (408 after it: a client that sends
/// headers and then too little of its body would otherwise hold a connection and a task for
/// ever) and within the size limit (413 beyond, chunked bodies included).
async fn read_body(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let cfg = &app.shared.cfg;
    let deadline = tokio::time::Instant::now() + cfg.body_timeout;
    let (parts, body) = req.into_parts();
    let mut data = body.into_data_stream();
    let mut buf = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, data.next()).await {
            Err(_) => {
                let mut r = ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "invalid_request_error",
                    format!(
                        "the request body did not arrive within {} s",
                        cfg.body_timeout.as_secs_f64()
                    ),
                )
                .with_code("request_timeout")
                .into_response();
                // The rest of the body may still come: the connection cannot carry another
                // request.
                r.headers_mut().insert(
                    header::CONNECTION,
                    header::HeaderValue::from_static("close"),
                );
                return r;
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return ApiError::bad_request(format!("cannot read the request body: {e}"))
                    .into_response();
            }
            Ok(Some(Ok(chunk))) => {
                if buf.len() + chunk.len() > cfg.max_body_bytes {
                    let read = (buf.len() + chunk.len()) as u64;
                    drop(buf);
                    return refuse_too_large(data, read, cfg.max_body_bytes, deadline).await;
                }
                buf.extend_from_slice(&chunk);
            }
        }
    }
    next.run(Request::from_parts(parts, axum::body::Body::from(buf)))
        .await
}

/// A body that could not be read: 413 beyond the size limit, else 400.
fn body_error(rej: BytesRejection) -> ApiError {
    let status = rej.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        too_large()
    } else {
        ApiError::new(
            if status.is_client_error() {
                status
            } else {
                StatusCode::BAD_REQUEST
            },
            "invalid_request_error",
            format!("cannot read the request body: {}", rej.body_text()),
        )
    }
}

async fn chat(State(app): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    let stats = StatsRecorder::start();
    let parsed = body.map_err(body_error).and_then(|b| api::parse_chat(&b));
    match parsed {
        Ok(p) => complete(app, p, stats).await,
        Err(e) => e.into_response(),
    }
}

async fn completions(State(app): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    let stats = StatsRecorder::start();
    let parsed = body
        .map_err(body_error)
        .and_then(|b| api::parse_completion(&b));
    match parsed {
        Ok(p) => complete(app, p, stats).await,
        Err(e) => e.into_response(),
    }
}

/// A request turned into what the engine runs.
struct Prepared {
    prompt_ids: Vec<u32>,
    params: GenerateParams,
    starts_thinking: bool,
    /// The grammar the output must match, compiled for this request.
    constraint: Option<Constraint>,
}

fn context_error(msg: String) -> ApiError {
    ApiError::bad_request(msg).with_code("context_length_exceeded")
}

/// The longest prompt text, in bytes, that might fit the context: anything longer is refused
/// before it is tokenized. Tokenizing costs about 100 bytes of memory and most of a
/// microsecond per byte of text (an 8 MiB prompt: over 1 GB and seconds of CPU), only to be
/// refused afterwards for being longer than the context; the byte length alone tells.
///
/// Why it never refuses a prompt that fits: every token stands for at most as many bytes of
/// text as its vocabulary string has (byte-level BPE spells each byte as one character of at
/// least one byte, e.g. `Ġ` for a space; SentencePiece spells text as itself, a space as the
/// three-byte `▁`; byte-fallback tokens like `<0x0A>` are longer than their byte). So a text
/// of `n` bytes has at least `n / longest` tokens, `longest` being the longest vocabulary
/// string in bytes. The floor of 64 bytes a token keeps a margin for normalizers that shrink
/// text (NFKC turns some 3-byte characters into 2 bytes) and costs nothing that matters: a
/// 32k context still tokenizes at most 2 MiB.
fn prompt_byte_bound(engine: &Engine) -> usize {
    let longest = engine
        .tokenizer
        .inner()
        .get_vocab(true)
        .keys()
        .map(String::len)
        .max()
        .unwrap_or(0);
    engine.context_size.saturating_mul(longest.max(64))
}

/// Refuses a prompt text that is too long to fit the context whatever its tokens
/// ([`prompt_byte_bound`]), before it is tokenized.
fn check_prompt_bytes(text: &str, bound: usize, ctx: usize, param: &str) -> Result<(), ApiError> {
    if text.len() > bound {
        return Err(context_error(format!(
            "this model's maximum context length is {ctx} tokens, but the prompt is {} bytes \
             long, more than the {bound} bytes that {ctx} tokens can hold",
            text.len()
        ))
        .with_param(param));
    }
    Ok(())
}

/// Renders a conversation with the model's chat template and tokenizes it; also tells whether
/// the prompt leaves the model inside a thinking block.
fn chat_prompt<M: serde::Serialize + ?Sized>(
    engine: &Engine,
    max_prompt_bytes: usize,
    messages: &M,
    tools: Option<&Value>,
    enable_thinking: Option<bool>,
    kwargs: Option<&serde_json::Map<String, Value>>,
) -> Result<(Vec<u32>, bool), ApiError> {
    let tpl = engine.template.as_ref().ok_or_else(|| {
        ApiError::bad_request(
            "this model has no chat template; use /v1/completions with a text prompt",
        )
    })?;
    let text = tpl
        .render_with(messages, tools, true, enable_thinking, kwargs)
        .map_err(|e| ApiError::bad_param("messages", format!("{e:#}")))?;
    check_prompt_bytes(&text, max_prompt_bytes, engine.context_size, "messages")?;
    let ids = engine
        .tokenizer
        .encode(&text, false)
        .map_err(|e| ApiError::bad_param("messages", format!("{e:#}")))?;
    Ok((ids, prompt_opens_thinking(&text)))
}

/// Templates and tokenizes, then checks everything that needs the model.
fn prepare(
    engine: &Engine,
    cfg: &ServerConfig,
    max_prompt_bytes: usize,
    p: &ParsedRequest,
) -> Result<Prepared, ApiError> {
    let ctx = engine.context_size;
    let mut starts_thinking = false;
    let ids = match &p.prompt {
        PromptSpec::Chat {
            messages,
            enable_thinking,
            kwargs,
        } => {
            let extra = (!kwargs.is_empty()).then_some(kwargs);
            let (ids, thinking) = chat_prompt(
                engine,
                max_prompt_bytes,
                messages.as_slice(),
                None,
                *enable_thinking,
                extra,
            )?;
            starts_thinking = thinking;
            ids
        }
        PromptSpec::ChatJson {
            messages,
            tools,
            enable_thinking,
        } => {
            let (ids, thinking) = chat_prompt(
                engine,
                max_prompt_bytes,
                messages.as_slice(),
                tools.as_ref(),
                *enable_thinking,
                None,
            )?;
            starts_thinking = thinking;
            ids
        }
        PromptSpec::ChatWithTools(chat) => {
            let tools = chat.template_tools();
            let extra = (!chat.kwargs.is_empty()).then_some(&chat.kwargs);
            let (ids, thinking) = chat_prompt(
                engine,
                max_prompt_bytes,
                chat.messages.as_slice(),
                tools.as_ref(),
                chat.enable_thinking,
                extra,
            )?;
            starts_thinking = thinking;
            ids
        }
        PromptSpec::Text(t) => {
            check_prompt_bytes(t, max_prompt_bytes, ctx, "prompt")?;
            engine
                .tokenizer
                .encode(t, true)
                .map_err(|e| ApiError::bad_param("prompt", format!("{e:#}")))?
        }
        PromptSpec::Ids(ids) => ids.clone(),
    };
    let param = if p.kind == ApiKind::Chat {
        "messages"
    } else {
        "prompt"
    };
    if ids.is_empty() {
        return Err(ApiError::bad_param(param, "the prompt is empty"));
    }
    let vocab = engine.model.cfg.vocab_size;
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        return Err(ApiError::bad_param(
            param,
            format!("token id {bad} is outside the vocabulary of {vocab} tokens"),
        ));
    }
    if ids.len() >= ctx {
        return Err(context_error(format!(
            "this model's maximum context length is {ctx} tokens, but the prompt has {} tokens",
            ids.len()
        ))
        .with_param(param));
    }
    let room = ctx - ids.len();
    let max_tokens = match (p.max_tokens, p.kind) {
        (Some(n), _) if n > room => {
            return Err(context_error(format!(
                "this model's maximum context length is {ctx} tokens; the prompt has {} tokens \
                 and {n} more were requested ({} at most)",
                ids.len(),
                room
            ))
            .with_param("max_tokens"));
        }
        (Some(n), _) => n,
        // OpenAI's default for text completions; chat may use the rest of the context.
        (None, ApiKind::Completion) => 16.min(room),
        (None, ApiKind::Chat) => room,
    };
    let d = &engine.defaults;
    let sampler = SamplerParams {
        temperature: p.temperature.or(d.temperature).unwrap_or(1.0),
        top_k: p.top_k.or(d.top_k).unwrap_or(0),
        top_p: p.top_p.or(d.top_p).unwrap_or(1.0),
        min_p: p.min_p.or(d.min_p).unwrap_or(0.0),
        seed: p.seed.unwrap_or_else(random_u64),
    };
    sampler.validate().map_err(|m| {
        let param = ["temperature", "top_p", "min_p"]
            .into_iter()
            .find(|k| m.contains(k))
            .unwrap_or("temperature");
        ApiError::bad_param(param, m)
    })?;
    let params = GenerateParams {
        max_tokens,
        sampler,
        stop: p.stop.clone(),
        draft: cfg.draft,
        draft_budget: cfg.draft_budget,
    };
    params
        .validate()
        .map_err(|m| ApiError::internal(format!("bad server settings: {m}")))?;
    let constraint = output_constraint(engine, &p.output, starts_thinking)?;
    Ok(Prepared {
        prompt_ids: ids,
        params,
        starts_thinking,
        constraint,
    })
}

/// The compiled grammar of a request's output form, if it has one: calls in the model's own
/// tool format, after free reasoning when the prompt leaves the model thinking. A grammar that
/// does not compile (an unsupported or contradictory schema) is the client's error.
fn output_constraint(
    engine: &Engine,
    spec: &OutputSpec,
    starts_thinking: bool,
) -> Result<Option<Constraint>, ApiError> {
    let format = ToolFormat::from_template(engine.template.as_ref().map(|t| t.source()));
    let think = starts_thinking.then(|| match special_token(engine, THINK_CLOSE) {
        Some(id) => ThinkClose::Token(id),
        None => ThinkClose::Text(THINK_CLOSE.to_string()),
    });
    let Some(grammar) = structured::grammar(spec, format, think.as_ref()) else {
        return Ok(None);
    };
    engine
        .constraint(&grammar)
        .map(Some)
        .map_err(|e| ApiError::bad_param(spec.param(), format!("{e:#}")))
}

/// A place in the queue taken by a request that has not reached the engine thread yet: freed
/// when the request fails before that, or when its handler is dropped (the client left while
/// its prompt was being tokenized).
struct Slot(Option<Arc<Shared>>);

impl Slot {
    /// The job holding the place reached the engine thread, which frees it when the job ends.
    fn hand_over(mut self) {
        self.0 = None;
    }
}

/// Counts a request as preparing (see [`Counters::preparing`]) while it lives, also when the
/// request is dropped mid-way (its client went away).
struct Preparing(Arc<Shared>);

impl Preparing {
    fn start(shared: &Arc<Shared>) -> Self {
        shared.counters.preparing.fetch_add(1, Ordering::AcqRel);
        Preparing(Arc::clone(shared))
    }
}

impl Drop for Preparing {
    fn drop(&mut self) {
        self.0.counters.preparing.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(shared) = &self.0 {
            shared.admitted.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

async fn complete(app: AppState, p: ParsedRequest, stats: StatsRecorder) -> Response {
    match start(app, p, stats).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// A request handed to the engine thread.
struct Submitted {
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    cut: tokio::sync::watch::Receiver<bool>,
    /// The request's number, for its response id.
    n: u64,
    prompt_tokens: usize,
}

async fn start(
    app: AppState,
    p: ParsedRequest,
    stats: StatsRecorder,
) -> Result<Response, ApiError> {
    let s = submit(&app, &p, stats).await?;
    let prefix = match p.kind {
        ApiKind::Chat => "chatcmpl",
        ApiKind::Completion => "cmpl",
    };
    let meta = ResponseMeta {
        id: format!("{prefix}-{:016x}{:08x}", app.id_salt, s.n),
        created: unix_now(),
        model: app.shared.cfg.model_name.clone(),
        kind: p.kind,
        include_usage: p.stream && p.include_usage,
    };
    let tools = tool_parser(&app.engine, &p, &meta);
    if p.stream {
        Ok(stream_response(meta, s.events, s.cut, tools))
    } else {
        collect_response(meta, s.events, s.cut, tools).await
    }
}

/// The parser that takes tool calls out of a chat request's output, when it offers tools.
fn tool_parser(engine: &Engine, p: &ParsedRequest, meta: &ResponseMeta) -> Option<ToolCallParser> {
    let PromptSpec::ChatWithTools(chat) = &p.prompt else {
        return None;
    };
    let template = engine.template.as_ref().map(|t| t.source());
    chat.parser(template, chat_tools::id_base(&meta.id))
}

/// Checks the model, takes a place in the queue, templates and tokenizes the request and
/// hands it to the engine thread (what every route shares).
async fn submit(
    app: &AppState,
    p: &ParsedRequest,
    stats: StatsRecorder,
) -> Result<Submitted, ApiError> {
    if let Some(m) = &p.model
        && !m.is_empty()
        && *m != app.shared.cfg.model_name
    {
        return Err(unknown_model(app, m));
    }
    // Admission first: the running request plus `queue_size` waiting ones, counting those
    // still being templated and tokenized. That work costs memory and CPU in proportion to
    // the prompt, so taking the place before it bounds how many requests do it at once; a
    // request refused for a full queue costs nothing.
    let limit = app.shared.cfg.queue_size + 1;
    let admitted = app
        .shared
        .admitted
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < limit).then_some(n + 1)
        });
    if admitted.is_err() {
        app.shared.counters.rejected.fetch_add(1, Ordering::Relaxed);
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            format!(
                "the server is busy: {} requests are already waiting; retry later",
                app.shared.cfg.queue_size
            ),
        )
        .with_code("queue_full")
        .with_retry_after(RETRY_AFTER_SECS));
    }
    let slot = Slot(Some(Arc::clone(&app.shared)));
    let engine = Arc::clone(&app.engine);
    let shared = Arc::clone(&app.shared);
    let bound = app.max_prompt_bytes;
    let p2 = p.clone();
    let preparing = Preparing::start(&app.shared);
    let prepared = tokio::task::spawn_blocking(move || prepare(&engine, &shared.cfg, bound, &p2))
        .await
        .map_err(|e| ApiError::internal(format!("request preparation failed: {e}")));
    drop(preparing);
    let prepared = prepared??;
    let prompt_tokens = prepared.prompt_ids.len();
    let (tx, rx) = unbounded_channel();
    let job = Job {
        prompt_ids: prepared.prompt_ids,
        params: prepared.params,
        constraint: prepared.constraint,
        stats: Some(stats),
        split_reasoning: p.kind == ApiKind::Chat,
        starts_thinking: prepared.starts_thinking,
        events: tx,
    };
    let sent = app.jobs.lock().unwrap_or_else(|e| e.into_inner()).send(job);
    if sent.is_err() {
        return Err(ApiError::internal("the engine thread has stopped"));
    }
    slot.hand_over();
    Ok(Submitted {
        events: rx,
        cut: app.shared.cutoff.subscribe(),
        n: app.next_id.fetch_add(1, Ordering::Relaxed),
        prompt_tokens,
    })
}

fn sse(v: &Value) -> Result<SseEvent, Infallible> {
    Ok(SseEvent::default().data(v.to_string()))
}

/// Resolves once the shutdown grace period is over (never if the server is gone without one).
async fn cut_off(cut: &mut tokio::sync::watch::Receiver<bool>) {
    let cut = cut.wait_for(|&c| c).await.is_ok();
    if !cut {
        std::future::pending::<()>().await;
    }
}

/// What a request still waiting for the engine gets when the shutdown grace period ends.
fn shutting_down() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "the server is shutting down: the request did not finish within the grace period",
    )
    .with_code("server_shutting_down")
}

/// Server-sent events: the role chunk, text chunks, the finish chunk, the usage chunk when
/// asked for, then `[DONE]`. An engine failure mid-stream sends an error object and ends; a
/// stream cut by shutdown sends an error object and `[DONE]`, so that clients see why it
/// ended rather than a connection closed mid-chunk.
fn stream_response(
    meta: ResponseMeta,
    rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
    cut: tokio::sync::watch::Receiver<bool>,
    tools: Option<ToolCallParser>,
) -> Response {
    let head: Vec<Result<SseEvent, Infallible>> = meta.role_chunk().iter().map(sse).collect();
    let tools = tools.map(ToolStream::new);
    let events = stream::unfold(Some((rx, cut, meta, tools)), |state| async move {
        let (mut rx, mut cut, meta, mut tools) = state?;
        let ev = tokio::select! {
            ev = rx.recv() => ev?,
            () = cut_off(&mut cut) => {
                let out = vec![
                    sse(&shutting_down().body()),
                    Ok(SseEvent::default().data("[DONE]")),
                ];
                return Some((out, None));
            }
        };
        let mut out = Vec::new();
        let mut last = false;
        match ev {
            Event::Text(Split { reasoning, content }) => {
                if !reasoning.is_empty() {
                    out.push(sse(&meta.text_chunk(&reasoning, true)));
                }
                if let Some(t) = &mut tools {
                    out.extend(t.push(&meta, &content).iter().map(sse));
                } else if !content.is_empty() {
                    out.push(sse(&meta.text_chunk(&content, false)));
                }
            }
            Event::Done(o) => {
                match &mut tools {
                    Some(t) => out.extend(t.finish(&meta, &o).iter().map(sse)),
                    None => out.push(sse(&meta.finish_chunk(&o))),
                }
                if meta.include_usage {
                    out.push(sse(&meta.usage_chunk(&o)));
                }
                out.push(Ok(SseEvent::default().data("[DONE]")));
                last = true;
            }
            Event::Failed(e) => {
                out.push(sse(&e.body()));
                last = true;
            }
        }
        // Nothing follows the end, even if shutdown comes before the channel closes.
        Some((out, (!last).then_some((rx, cut, meta, tools))))
    })
    .flat_map(stream::iter);
    Sse::new(stream::iter(head).chain(events))
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn collect_response(
    meta: ResponseMeta,
    rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
    cut: tokio::sync::watch::Receiver<bool>,
    tools: Option<ToolCallParser>,
) -> Result<Response, ApiError> {
    let (reasoning, content, o) = collect(rx, cut).await?;
    let full = chat_tools::full_response(&meta, &reasoning, &content, &o, tools);
    Ok(axum::Json(full).into_response())
}

/// A request's whole output: reasoning, content and how it ended.
async fn collect(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
    mut cut: tokio::sync::watch::Receiver<bool>,
) -> Result<(String, String, Box<Outcome>), ApiError> {
    let mut reasoning = String::new();
    let mut content = String::new();
    let mut outcome: Option<Box<Outcome>> = None;
    loop {
        let ev = tokio::select! {
            ev = rx.recv() => ev,
            () = cut_off(&mut cut) => return Err(shutting_down()),
        };
        let Some(ev) = ev else { break };
        match ev {
            Event::Text(s) => {
                reasoning.push_str(&s.reasoning);
                content.push_str(&s.content);
            }
            Event::Done(o) => outcome = Some(o),
            Event::Failed(e) => return Err(e),
        }
    }
    let o = outcome.ok_or_else(|| ApiError::internal("the engine dropped the request"))?;
    Ok((reasoning, content, o))
}

/// A bound listener, ready to serve.
pub struct Bound {
    listener: std::net::TcpListener,
    addr: SocketAddr,
}

impl Bound {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Binds `host:port` (a clear error when the address is taken or invalid).
pub fn bind(host: &str, port: u16) -> Result<Bound> {
    let host_port = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let listener = std::net::TcpListener::bind(&host_port).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => " (is another server running? pick another --port)",
            std::io::ErrorKind::PermissionDenied => " (ports below 1024 need privileges)",
            _ => "",
        };
        anyhow::anyhow!("cannot listen on {host_port}: {e}{hint}")
    })?;
    listener
        .set_nonblocking(true)
        .context("cannot make the listener non-blocking")?;
    let addr = listener.local_addr()?;
    Ok(Bound { listener, addr })
}

/// Keeps large allocations in their own mappings. Prefix-cache entries and the drafter's
/// history are megabyte buffers allocated and freed as requests come and go; glibc's malloc
/// raises its mmap threshold after the first such free and then serves them from its heap,
/// whose fragmentation makes a long-running server's RSS creep. A fixed threshold returns
/// every freed large buffer to the OS at once.
fn pin_malloc_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::ffi::c_int;
        unsafe extern "C" {
            fn mallopt(param: c_int, value: c_int) -> c_int;
        }
        const M_MMAP_THRESHOLD: c_int = -3;
        // SAFETY: mallopt only tunes glibc's allocator; the value is in its valid range.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 128 * 1024);
        }
    }
}

fn build_app(engine: Engine, cfg: ServerConfig) -> (Router, Arc<Shared>) {
    pin_malloc_mmap_threshold();
    let think = ThinkTokens {
        open: special_token(&engine, THINK_OPEN),
        close: special_token(&engine, THINK_CLOSE),
    };
    let max_body = cfg.max_body_bytes;
    let shared = Arc::new(Shared {
        cfg,
        admitted: AtomicUsize::new(0),
        counters: Counters::default(),
        gate: Gate::default(),
        cache_stats: Mutex::new(None),
        think,
        cutoff: tokio::sync::watch::Sender::new(false),
    });
    let max_prompt_bytes = prompt_byte_bound(&engine);
    let engine = Arc::new(engine);
    let (jobs_tx, jobs_rx) = std::sync::mpsc::channel();
    {
        let engine = Arc::clone(&engine);
        let shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("yomi-engine".into())
            .spawn(move || worker::run(engine, shared, jobs_rx))
            .expect("cannot start the engine thread");
    }
    let app = Arc::new(App {
        engine,
        shared: Arc::clone(&shared),
        jobs: Mutex::new(jobs_tx),
        created: unix_now(),
        next_id: AtomicU64::new(0),
        id_salt: random_u64() & 0xffff_ffff_ffff,
        max_prompt_bytes,
    });
    let router = Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/messages", post(anthropic::messages))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(Arc::clone(&app), read_body))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&app),
            declared_length,
        ))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), auth))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&app),
            browser_guard,
        ))
        .layer(middleware::from_fn(size_guard))
        .layer(middleware::from_fn(anthropic::error_shape))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(app);
    (router, shared)
}

/// A server running on background threads (tests, embedding).
pub struct ServerHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServerHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Holds the engine thread before its next job (the running one finishes).
    pub fn pause(&self) {
        self.shared.gate.set(true);
    }

    pub fn resume(&self) {
        self.shared.gate.set(false);
    }

    /// What `GET /health` reports.
    pub fn health(&self) -> Value {
        health_json(&self.shared)
    }

    /// Stops serving and waits for the server thread.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.resume();
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Accepts and serves connections until `shutdown` resolves, then stops accepting, lets each
/// connection finish the request it is serving (closing idle ones) within the grace period
/// (or until `hurry` resolves), ends the requests still running after it ([`ServerConfig::shutdown_grace`]), and returns
/// once every connection is closed (or shortly after, if some client does not read).
///
/// hyper serves each connection with a timer, so the header timeout holds (axum's `serve`
/// runs hyper without one: half-sent headers and idle keep-alive connections stayed open for
/// ever, and enough of them starved everyone else); [`read_body`] bounds the body. Past
/// `max_connections` open at once, a new connection is closed as soon as it is accepted, so
/// a flood cannot exhaust file descriptors or memory.
async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shared: Arc<Shared>,
    shutdown: impl std::future::Future<Output = ()>,
    hurry: impl std::future::Future<Output = ()>,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;

    let cfg = &shared.cfg;
    // `Semaphore` holds at most `usize::MAX >> 3` permits, and waiting for all takes a `u32`.
    let max_conns = cfg.max_connections.clamp(1, u32::MAX as usize);
    let open = Arc::new(tokio::sync::Semaphore::new(max_conns));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(cfg.header_timeout);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(_) => {
                    // Out of file descriptors or the like: wait for some to close rather
                    // than spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let conn = http.serve_connection(
            TokioIo::new(stream),
            TowerToHyperService::new(router.clone()),
        );
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = async { stop.wait_for(|&s| s).await.map(|_| ()) } => {
                    // Finish the request in progress, then close (at once when idle).
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    drop(listener);
    stop_tx.send_replace(true);
    let all = max_conns as u32;
    // `hurry` (a second Ctrl-C) ends the grace period early.
    let drained = tokio::select! {
        r = tokio::time::timeout(cfg.shutdown_grace, open.acquire_many(all)) => r.is_ok(),
        () = hurry => false,
    };
    if !drained {
        shared.cutoff.send_replace(true);
        // The cut requests send their last events and close; a client that stopped reading
        // must not hold the exit.
        let _ = tokio::time::timeout(CLOSE_AFTER_CUT, open.acquire_many(all)).await;
    }
}

/// How long connections have to close after the grace period's requests were cut.
const CLOSE_AFTER_CUT: Duration = Duration::from_secs(2);

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("yomi-http")
        .build()
        .context("cannot start the async runtime")
}

/// Serves on background threads from an already bound listener.
pub fn spawn(engine: Engine, cfg: ServerConfig, bound: Bound) -> Result<ServerHandle> {
    let (router, shared) = build_app(engine, cfg);
    let served = Arc::clone(&shared);
    let rt = runtime()?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let addr = bound.addr;
    let listener = {
        let _guard = rt.enter();
        tokio::net::TcpListener::from_std(bound.listener)?
    };
    let thread = std::thread::Builder::new()
        .name("yomi-server".into())
        .spawn(move || {
            rt.block_on(async move {
                let stop = async move {
                    let _ = rx.await;
                };
                serve(listener, router, served, stop, std::future::pending()).await;
            });
            rt.shutdown_timeout(Duration::from_secs(1));
        })?;
    Ok(ServerHandle {
        addr,
        shared,
        shutdown: Some(tx),
        thread: Some(thread),
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// Serves in the foreground until Ctrl-C or SIGTERM, then shuts down gracefully (see
/// [`ServerConfig::shutdown_grace`]). `on_ready` runs once the server is
/// listening (e.g. to print the address).
pub fn run(
    engine: Engine,
    cfg: ServerConfig,
    bound: Bound,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<()> {
    let (router, shared) = build_app(engine, cfg);
    let rt = runtime()?;
    let addr = bound.addr;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(bound.listener)?;
        on_ready(addr);
        let grace = shared.cfg.shutdown_grace;
        let stop = async move {
            shutdown_signal().await;
            // Not `eprintln!`: it panics when stderr is gone (a closed pipe), which would end
            // the process without the grace period.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "yomi: stopping: requests in flight have {} s to finish (Ctrl-C again: now)",
                grace.as_secs_f64()
            );
        };
        // Polled only once stopping: a later Ctrl-C or SIGTERM, not the first.
        let hurry = async {
            shutdown_signal().await;
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "yomi: stopping now");
        };
        serve(listener, router, shared, stop, hurry).await;
        anyhow::Ok(())
    })?;
    // Streams still open were ended by `serve`; their generations stop at the next token.
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

/// The name a model is served under by default: its directory or file name without the
/// extension.
pub fn default_model_name(path: &std::path::Path) -> String {
    let name = if path.is_dir() {
        path.file_name()
    } else {
        path.file_stem()
    };
    name.and_then(|n| n.to_str())
        .filter(|n| !n.is_empty())
        .unwrap_or("default")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_bearer_tokens() {
        assert!(same_key(b"sekret", b"sekret"));
        for wrong in [&b"sekre"[..], b"sekretx", b"sekrex", b"", b"SEKRET"] {
            assert!(!same_key(wrong, b"sekret"), "{wrong:?}");
        }
        assert!(same_key(b"", b""));
        assert_eq!(bearer_token("Bearer k"), Some("k"));
        assert_eq!(bearer_token("bearer  k "), Some("k"));
        assert_eq!(bearer_token("BeArEr k"), Some("k"));
        assert_eq!(bearer_token("Basic k"), None);
        assert_eq!(bearer_token("Bearerk"), None);
    }

    #[test]
    fn hosts() {
        assert_eq!(host_name("LocalHost:8000"), "localhost");
        assert_eq!(host_name("[::1]:8000"), "::1");
        assert_eq!(host_name("::1"), "::1");
        assert_eq!(host_name("example.com."), "example.com");
        let allowed = vec!["Models.Internal:9000".to_string()];
        for ok in [
            "localhost",
            "a.localhost",
            "127.0.0.1",
            "::1",
            "10.0.0.7",
            "models.internal",
        ] {
            assert!(host_allowed(ok, &allowed), "{ok}");
        }
        for bad in [
            "evil.example",
            "localhost.evil.example",
            "",
            "models.internal.evil",
        ] {
            assert!(!host_allowed(bad, &allowed), "{bad}");
        }
        assert!(host_allowed("evil.example", &["*".to_string()]));
    }
}
