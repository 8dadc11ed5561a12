//! `yomi serve`: the OpenAI-compatible HTTP server.

use anyhow::{Result, bail};
use clap::Args;
use std::time::Duration;
use yomi_engine::prefix_cache::PrefixCacheConfig;
use yomi_server::{
    DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_QUEUE_SIZE,
    DEFAULT_SHUTDOWN_GRACE, ServerConfig,
};

use crate::common::{DraftArgs, ModelArgs, load_engine};
use crate::settings::Settings;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub drafting: DraftArgs,
    /// Address to listen on (loopback by default; 0.0.0.0 exposes the server to the network).
    #[arg(long, default_value = "127.0.0.1", value_name = "ADDR")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000, value_name = "PORT")]
    pub port: u16,
    /// Turn the prefix cache off: every request prefills its whole prompt.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Memory bound of the prefix cache, in MiB (least recently used prefixes go first).
    #[arg(long, default_value_t = 1024, value_name = "MIB")]
    pub prefix_cache_mb: usize,
    /// Require `Authorization: Bearer KEY` on /v1/* (default: $YOMI_API_KEY when set).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// The model name clients send (default: the model's directory or file name).
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,
    /// Requests that may wait while one runs; more are answered 503.
    #[arg(long, default_value_t = DEFAULT_QUEUE_SIZE, value_name = "N")]
    pub queue_size: usize,
    /// Largest request body, in MiB (413 beyond).
    #[arg(long, default_value_t = 8, value_name = "MIB")]
    pub max_body_mb: usize,
    /// Seconds a client has to send a request's headers; an idle keep-alive connection is
    /// closed after as long.
    #[arg(long, default_value_t = DEFAULT_HEADER_TIMEOUT.as_secs_f64(), value_name = "SECS")]
    pub header_timeout: f64,
    /// Seconds a client has to send a request's body once its headers arrived (408 after).
    #[arg(long, default_value_t = DEFAULT_BODY_TIMEOUT.as_secs_f64(), value_name = "SECS")]
    pub body_timeout: f64,
    /// Connections open at once; more are closed as soon as they are accepted.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS, value_name = "N")]
    pub max_connections: usize,
    /// Without an API key, also serve requests that name the server by this host name (besides
    /// localhost names, IP addresses and --host); repeatable, `*` for any. Other names are
    /// refused, so that web pages cannot reach the server through DNS rebinding.
    #[arg(long, value_name = "NAME")]
    pub allow_host: Vec<String>,
    /// On Ctrl-C or SIGTERM, seconds that requests in flight have to finish; streams still
    /// open then end with an error event and `[DONE]`, other requests get 503. A second
    /// Ctrl-C or SIGTERM ends the wait at once.
    #[arg(long, default_value_t = DEFAULT_SHUTDOWN_GRACE.as_secs_f64(), value_name = "SECS")]
    pub shutdown_grace: f64,
    /// Testing aid: sleep this many milliseconds after every streamed piece of text.
    #[arg(long, value_name = "MS", hide = true)]
    pub debug_token_delay_ms: Option<u64>,
}

pub fn run(mut a: ServeArgs, settings: &Settings) -> Result<()> {
    if a.api_key.is_none() {
        a.api_key = settings.api_key.clone();
    }
    if a.max_body_mb == 0 {
        bail!("--max-body-mb must be at least 1");
    }
    let header_timeout = seconds("--header-timeout", a.header_timeout)?;
    let body_timeout = seconds("--body-timeout", a.body_timeout)?;
    // 0 is allowed: cut every request at once.
    let shutdown_grace = if a.shutdown_grace == 0.0 {
        Duration::ZERO
    } else {
        seconds("--shutdown-grace", a.shutdown_grace)?
    };
    if a.max_connections == 0 || a.max_connections > u32::MAX as usize {
        bail!("--max-connections must be between 1 and {}", u32::MAX);
    }
    if a.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        bail!("--api-key is empty");
    }
    // Bind before loading the model: a taken port fails at once.
    let bound = yomi_server::bind(&a.host, a.port)?;
    let mut engine = load_engine(&a.model, settings)?;
    a.drafting.attach(&mut engine)?;
    let name = a
        .served_model_name
        .clone()
        .unwrap_or_else(|| yomi_server::default_model_name(&a.model.model));
    let cfg = ServerConfig {
        model_name: name.clone(),
        api_key: a.api_key.clone(),
        prefix_cache: (!a.no_prefix_cache).then(|| PrefixCacheConfig {
            max_bytes: a.prefix_cache_mb << 20,
            ..Default::default()
        }),
        queue_size: a.queue_size,
        max_body_bytes: a.max_body_mb << 20,
        draft: a.drafting.draft,
        draft_budget: a.drafting.draft_budget,
        token_delay: a.debug_token_delay_ms.map(Duration::from_millis),
        header_timeout,
        body_timeout,
        max_connections: a.max_connections,
        shutdown_grace,
        // The name the server was bound by is its own.
        allowed_hosts: a
            .allow_host
            .iter()
            .cloned()
            .chain(std::iter::once(a.host.clone()))
            .collect(),
    };
    let ctx = engine.context_size;
    let cache = if a.no_prefix_cache {
        "off".to_string()
    } else {
        format!("{} MiB", a.prefix_cache_mb)
    };
    yomi_server::run(engine, cfg, bound, |addr| {
        eprintln!(
            "yomi: serving `{name}` on http://{addr} (context {ctx}, prefix cache {cache}, queue {}, draft {})",
            a.queue_size, a.drafting.draft
        );
    })
}

/// A timeout flag's seconds: finite, above zero and at most a day (a `Duration` cannot hold
/// every `f64`, and no client needs longer).
fn seconds(flag: &str, secs: f64) -> Result<Duration> {
    if !(secs > 0.0 && secs <= 86_400.0) {
        bail!("{flag} must be more than 0 and at most 86400 seconds (got {secs})");
    }
    Ok(Duration::from_secs_f64(secs))
}
