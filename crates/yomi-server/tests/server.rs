//! The server end to end on loopback with the qwen35-tiny fixture: OpenAI shapes (streamed and
//! not) that match the engine's own output, the prefix cache over HTTP, reasoning split from
//! content, and every failure mode answered with an OpenAI-style error — malformed bodies
//! (400), bad parameters (400), unknown model (404), oversized bodies (413), context overflow
//! (400), missing API key (401), a full queue (503) — and a disconnect that frees the engine.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use yomi_core::SamplerParams;
use yomi_engine::stats::StatsRecorder;
use yomi_engine::template::ChatMessage;
use yomi_engine::{DraftMode, Engine, EngineOptions, GenerateParams, Prompt};
use yomi_server::client::{Endpoint, Response, get, post_json, request};
use yomi_server::{ServerConfig, ServerHandle};

const NAME: &str = "tiny";
const T: Duration = Duration::from_secs(60);

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name)
}

fn engine_at(path: &Path, ctx: usize) -> Engine {
    let opts = EngineOptions {
        context_size: Some(ctx),
        threads: Some(1),
        ..Default::default()
    };
    Engine::load(path, &opts, &mut |_, _| {}).expect("load engine")
}

fn engine(ctx: usize) -> Engine {
    engine_at(&fixture("qwen35-tiny"), ctx)
}

fn config() -> ServerConfig {
    ServerConfig {
        model_name: NAME.into(),
        ..Default::default()
    }
}

fn serve_engine(e: Engine, cfg: ServerConfig) -> (ServerHandle, Endpoint) {
    let bound = yomi_server::bind("127.0.0.1", 0).expect("bind");
    let h = yomi_server::spawn(e, cfg, bound).expect("spawn");
    let ep = Endpoint::parse(&h.url()).expect("endpoint");
    (h, ep)
}

fn serve(cfg: ServerConfig) -> (ServerHandle, Endpoint) {
    serve_engine(engine(1024), cfg)
}

fn post(ep: &Endpoint, path: &str, body: &Value) -> (u16, Value) {
    let r = post_json(ep, path, body, None, T).expect("request");
    let status = r.status;
    (status, r.json().expect("json body"))
}

fn post_raw(ep: &Endpoint, path: &str, body: &[u8]) -> (u16, Value) {
    let r = request(ep, "POST", path, Some(body), None, T).expect("request");
    let status = r.status;
    (status, r.json().expect("json body"))
}

/// An OpenAI-style error with this status, type and (when given) param/code.
fn assert_error(got: (u16, Value), status: u16, param: Option<&str>, code: Option<&str>) {
    let (s, v) = got;
    assert_eq!(s, status, "{v}");
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{v}");
    }
    if let Some(c) = code {
        assert_eq!(e["code"], c, "{v}");
    }
}

/// Sends a hand-written request (`head`: the request line and headers, without the blank
/// line) and `body` as given; returns the status, a header (lower-case name) and the JSON
/// body. Panics when no answer comes within 10 s.
fn raw_request(
    ep: &Endpoint,
    head: &str,
    body: &[u8],
    header: &str,
) -> (u16, Option<String>, Value) {
    let mut s = std::net::TcpStream::connect((ep.host.as_str(), ep.port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("{head}\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").into_bytes();
    req.extend_from_slice(body);
    s.write_all(&req).expect("send");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let (status, value, want) = loop {
        let n = s.read(&mut buf).expect("no answer from the server");
        assert!(
            n > 0,
            "connection closed: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).to_string();
        let Some(end) = text.find("\r\n\r\n") else {
            continue;
        };
        let head = text[..end].to_ascii_lowercase();
        let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
        let find = |name: &str| {
            head.lines().find_map(|l| {
                l.strip_prefix(&format!("{name}:"))
                    .map(|v| v.trim().to_string())
            })
        };
        let len: usize = find("content-length")
            .expect("content-length")
            .parse()
            .unwrap();
        if got.len() >= end + 4 + len {
            let v = serde_json::from_slice(&got[end + 4..end + 4 + len]).expect("json body");
            break (status, v, find(header));
        }
    };
    (status, want, value)
}

fn chat_body(content: &str, max_tokens: usize) -> Value {
    json!({
        "model": NAME,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// All events of a stream, `[DONE]` included.
fn events(mut r: Response) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(e) = r.next_event().expect("event") {
        out.push(e);
    }
    out
}

fn cold_text(e: &Engine, ids: &[u32], max_tokens: usize) -> (String, usize) {
    let mut st = e.new_state();
    let p = GenerateParams {
        max_tokens,
        sampler: SamplerParams::greedy(),
        stop: Vec::new(),
        draft: DraftMode::None,
        draft_budget: 8,
    };
    let g = e
        .generate(&mut st, ids, &p, StatsRecorder::start(), &mut |_| true)
        .expect("generate");
    (g.text, g.output_ids.len())
}

/// Text without whitespace (the reasoning split drops whitespace after `</think>`).
fn no_ws(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn health_models_and_unknown_routes() {
    let (h, ep) = serve(config());
    let r = get(&ep, "/health", None, T).expect("health");
    assert_eq!(r.status, 200);
    let v = r.json().expect("json");
    assert_eq!(v["status"], "ok");
    assert_eq!(v["model"], NAME);
    let r = get(&ep, "/v1/models", None, T).expect("models");
    let v = r.json().expect("json");
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], NAME);
    assert_eq!(v["data"][0]["object"], "model");
    let r = get(&ep, &format!("/v1/models/{NAME}"), None, T).expect("model");
    assert_eq!(r.status, 200);
    let r = get(&ep, "/v1/models/other", None, T).expect("model");
    let s = r.status;
    assert_error(
        (s, r.json().expect("json")),
        404,
        Some("model"),
        Some("model_not_found"),
    );
    let r = get(&ep, "/v1/nothing", None, T).expect("route");
    let s = r.status;
    assert_error((s, r.json().expect("json")), 404, None, None);
    h.shutdown();
}

/// Non-streamed chat and text completions give the engine's own greedy output, with usage.
#[test]
fn completions_match_the_engine() {
    let e = engine(1024);
    let msgs = vec![ChatMessage::user("def add(a, b):")];
    let ids = e
        .prompt_ids(&Prompt::Chat {
            messages: msgs,
            enable_thinking: None,
        })
        .expect("ids");
    let (want, n) = cold_text(&e, &ids, 24);
    let text_ids = e
        .prompt_ids(&Prompt::Text("import os\n".into()))
        .expect("ids");
    let (want_text, n_text) = cold_text(&e, &text_ids, 16);
    let (h, ep) = serve_engine(e, config());

    let (s, v) = post(
        &ep,
        "/v1/chat/completions",
        &chat_body("def add(a, b):", 24),
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["model"], NAME);
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["role"], "assistant");
    let got = format!(
        "{}{}",
        msg["reasoning_content"].as_str().unwrap_or(""),
        msg["content"].as_str().unwrap()
    );
    assert_eq!(no_ws(&got), no_ws(&want), "{v}");
    let u = &v["usage"];
    assert_eq!(u["prompt_tokens"], ids.len());
    assert_eq!(u["completion_tokens"], n);
    assert_eq!(u["total_tokens"], ids.len() + n);
    assert!(u["spec_verify_ct"].as_u64().is_some_and(|c| c >= 1), "{u}");
    let finish = v["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(finish == "stop" || finish == "length");

    // Text completions: the default max_tokens is 16, as OpenAI's.
    let (s, v) = post(
        &ep,
        "/v1/completions",
        &json!({"model": NAME, "prompt": "import os\n", "temperature": 0}),
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], want_text);
    assert_eq!(v["usage"]["completion_tokens"], n_text);
    assert_eq!(v["usage"]["prompt_tokens"], text_ids.len());
    // Token-id prompts work too.
    let (s, v) = post(
        &ep,
        "/v1/completions",
        &json!({"model": NAME, "prompt": text_ids, "temperature": 0, "max_tokens": 16}),
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], want_text);
    h.shutdown();
}

/// A stream: the role chunk, text deltas that add up to the non-streamed answer, the finish
/// chunk, the usage chunk (with `stream_options.include_usage`), then `[DONE]`.
#[test]
fn streaming_chunks_add_up() {
    let (h, ep) = serve(config());
    let body = chat_body("class Foo:", 20);
    let (_, full) = post(&ep, "/v1/chat/completions", &body);
    let full_msg = &full["choices"][0]["message"];
    for include_usage in [false, true] {
        let mut b = body.clone();
        b["stream"] = json!(true);
        if include_usage {
            b["stream_options"] = json!({"include_usage": true});
        }
        let r = post_json(&ep, "/v1/chat/completions", &b, None, T).expect("stream");
        assert_eq!(r.status, 200);
        assert!(
            r.header("content-type")
                .unwrap()
                .starts_with("text/event-stream")
        );
        let evs = events(r);
        assert_eq!(evs.last().map(String::as_str), Some("[DONE]"));
        let chunks: Vec<Value> = evs[..evs.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).expect("chunk json"))
            .collect();
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let mut content = String::new();
        let mut reasoning = String::new();
        let mut finish = None;
        let mut usage = None;
        for c in &chunks {
            assert_eq!(c["object"], "chat.completion.chunk");
            assert_eq!(c["id"], chunks[0]["id"]);
            assert_eq!(c.get("usage").is_some(), include_usage, "{c}");
            if let Some(ch) = c["choices"].get(0) {
                let d = &ch["delta"];
                content.push_str(d["content"].as_str().unwrap_or(""));
                reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
                if let Some(f) = ch["finish_reason"].as_str() {
                    finish = Some(f.to_string());
                }
            } else {
                assert_eq!(c["choices"], json!([]));
                usage = Some(c["usage"].clone());
            }
        }
        assert_eq!(content, full_msg["content"].as_str().unwrap());
        assert_eq!(
            reasoning,
            full_msg["reasoning_content"].as_str().unwrap_or("")
        );
        assert_eq!(
            finish.as_deref(),
            full["choices"][0]["finish_reason"].as_str()
        );
        if include_usage {
            let u = usage.expect("usage chunk");
            assert_eq!(u["completion_tokens"], full["usage"]["completion_tokens"]);
            assert_eq!(u["prompt_tokens"], full["usage"]["prompt_tokens"]);
            // The last chunk before [DONE] is the usage chunk.
            assert_eq!(chunks.last().unwrap()["choices"], json!([]));
        } else {
            assert!(usage.is_none());
        }
    }
    // Text completions stream too.
    let r = post_json(
        &ep,
        "/v1/completions",
        &json!({"model": NAME, "prompt": "x = ", "max_tokens": 8, "stream": true, "temperature": 0}),
        None,
        T,
    )
    .expect("stream");
    let evs = events(r);
    assert_eq!(evs.last().map(String::as_str), Some("[DONE]"));
    let first: Value = serde_json::from_str(&evs[0]).unwrap();
    assert_eq!(first["object"], "text_completion");
    h.shutdown();
}

#[test]
fn bad_requests_get_openai_errors() {
    let (h, ep) = serve_engine(
        engine(256),
        ServerConfig {
            max_body_bytes: 4096,
            ..config()
        },
    );
    let chat = "/v1/chat/completions";
    assert_error(
        post_raw(&ep, chat, b"{\"messages\": [}"),
        400,
        None,
        Some("invalid_json"),
    );
    assert_error(post_raw(&ep, chat, b""), 400, None, Some("invalid_json"));
    assert_error(post_raw(&ep, chat, b"[1, 2]"), 400, None, None);
    assert_error(post_raw(&ep, chat, b"{}"), 400, Some("messages"), None);
    let mut b = chat_body("hi", 4);
    b["temperature"] = json!(-1);
    assert_error(post(&ep, chat, &b), 400, Some("temperature"), None);
    let mut b = chat_body("hi", 4);
    b["top_p"] = json!(0);
    assert_error(post(&ep, chat, &b), 400, Some("top_p"), None);
    let mut b = chat_body("hi", 4);
    b["max_tokens"] = json!("many");
    assert_error(post(&ep, chat, &b), 400, Some("max_tokens"), None);
    let mut b = chat_body("hi", 4);
    b["messages"][0]["role"] = json!("wizard");
    assert_error(post(&ep, chat, &b), 400, Some("messages[0].role"), None);
    let mut b = chat_body("hi", 4);
    b["model"] = json!("gpt-9");
    assert_error(
        post(&ep, chat, &b),
        404,
        Some("model"),
        Some("model_not_found"),
    );
    // Too large a body: 413.
    let big = chat_body(&"x".repeat(10_000), 4);
    assert_error(post(&ep, chat, &big), 413, None, Some("request_too_large"));
    // A prompt longer than the context (256 tokens), or room for fewer tokens than asked.
    let long = chat_body(&"def f(x): return x\n".repeat(60), 4);
    assert_error(
        post(&ep, chat, &long),
        400,
        Some("messages"),
        Some("context_length_exceeded"),
    );
    let greedy = chat_body("hi", 1000);
    assert_error(
        post(&ep, chat, &greedy),
        400,
        Some("max_tokens"),
        Some("context_length_exceeded"),
    );
    assert_error(
        post(&ep, "/v1/completions", &json!({"prompt": [1, 2, 99999]})),
        400,
        Some("prompt"),
        None,
    );
    // Still serving.
    let (s, v) = post(&ep, chat, &chat_body("hi", 4));
    assert_eq!(s, 200, "{v}");
    h.shutdown();
}

/// A prompt too long in bytes to fit the context is refused before it is tokenized (issue 43:
/// an 8 MiB prompt under the body limit took over a GB and seconds of CPU to tokenize, only to
/// be refused afterwards): at once, with OpenAI's `context_length_exceeded`.
#[test]
fn an_oversized_prompt_is_refused_before_tokenizing() {
    let (h, ep) = serve(config());
    // 7 MiB of text under the 8 MiB body limit; the context is 1024 tokens.
    let text = "def f(x): return x\n".repeat((7 << 20) / 19);
    for (path, body, param) in [
        (
            "/v1/completions",
            json!({"model": NAME, "prompt": text, "max_tokens": 2}),
            "prompt",
        ),
        ("/v1/chat/completions", chat_body(&text, 2), "messages"),
    ] {
        let t0 = Instant::now();
        let got = post(&ep, path, &body);
        let took = t0.elapsed();
        let msg = got.1["error"]["message"].as_str().unwrap_or("").to_string();
        assert_error(got, 400, Some(param), Some("context_length_exceeded"));
        assert!(msg.contains("bytes"), "refused after tokenizing: {msg}");
        assert!(took < Duration::from_secs(2), "{path} took {took:?}");
    }
    // Still serving, with every place in the queue free again.
    let (s, v) = post(&ep, "/v1/chat/completions", &chat_body("hi", 2));
    assert_eq!(s, 200, "{v}");
    assert_eq!(h.health()["queue"]["waiting"], 0);
    h.shutdown();
}

fn connect(ep: &Endpoint) -> std::net::TcpStream {
    let s = std::net::TcpStream::connect((ep.host.as_str(), ep.port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Reads until the server closes the connection: how long that took and what came. Panics
/// when it is still open after 10 s.
fn until_closed(s: &mut std::net::TcpStream) -> (Duration, String) {
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!(
                    "the connection is still open after {:?}: {}",
                    t0.elapsed(),
                    String::from_utf8_lossy(&got)
                )
            }
            // Reset: closed too.
            Err(_) => break,
        }
    }
    (t0.elapsed(), String::from_utf8_lossy(&got).into_owned())
}

/// Clients that send too little, too slowly or nothing at all are disconnected after the
/// timeouts (issue 43: axum's `serve` ran hyper without a timer, so such connections stayed
/// open for ever); a stream that outlasts them is not cut.
#[test]
fn slow_and_idle_connections_are_cut() {
    let (h, ep) = serve(ServerConfig {
        header_timeout: Duration::from_secs(1),
        body_timeout: Duration::from_secs(1),
        token_delay: Some(Duration::from_millis(50)),
        draft: DraftMode::None,
        ..config()
    });
    let quick = Duration::from_secs(5);
    // Half the headers.
    let mut s = connect(&ep);
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
        .unwrap();
    let (took, _) = until_closed(&mut s);
    assert!(took < quick, "half-sent headers held for {took:?}");
    // Nothing at all.
    let mut s = connect(&ep);
    let (took, _) = until_closed(&mut s);
    assert!(took < quick, "a silent connection held for {took:?}");
    // An idle keep-alive connection after its response.
    let mut s = connect(&ep);
    s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let (took, got) = until_closed(&mut s);
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(took < quick, "an idle connection held for {took:?}");
    // A body that never arrives: 408.
    let mut s = connect(&ep);
    s.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\
          Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\"",
    )
    .unwrap();
    let (took, got) = until_closed(&mut s);
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("request_timeout"), "{got}");
    assert!(took < quick, "a missing body held for {took:?}");
    // A stream of over 2 s (greedy decoding ends after some 50 pieces of text, 50 ms each)
    // outlasts the 1 s timeouts.
    let body = json!({
        "model": NAME,
        "prompt": "import numpy as np\n",
        "max_tokens": 250,
        "temperature": 0,
        "stream": true,
    });
    let t0 = Instant::now();
    let ev = events(post_json(&ep, "/v1/completions", &body, None, T).expect("stream"));
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{ev:?}");
    assert!(t0.elapsed() > Duration::from_secs(2), "{:?}", t0.elapsed());
    let (s, v) = post(&ep, "/v1/chat/completions", &chat_body("hi", 2));
    assert_eq!(s, 200, "{v}");
    h.shutdown();
}

/// Past `max_connections` open at once, a new connection is closed at once; closing one makes
/// room again.
#[test]
fn connections_beyond_the_limit_are_closed() {
    let (h, ep) = serve(ServerConfig {
        max_connections: 4,
        ..config()
    });
    let held: Vec<_> = (0..4).map(|_| connect(&ep)).collect();
    let mut extra = connect(&ep);
    let (took, got) = until_closed(&mut extra);
    assert!(
        got.is_empty() && took < Duration::from_secs(5),
        "{took:?} {got}"
    );
    drop(held);
    wait_for("room for a connection", || {
        get(&ep, "/health", None, T).is_ok_and(|r| r.status == 200)
    });
    h.shutdown();
}

/// Sends a whole hand-written request (`Connection: close` is added) and returns the status
/// and the JSON body.
fn exchange(ep: &Endpoint, head: &str, body: &str) -> (u16, Value) {
    let mut s = connect(ep);
    let req = format!(
        "{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let (_, got) = until_closed(&mut s);
    let (head, body) = got.split_once("\r\n\r\n").expect("a response");
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok());
    let value = serde_json::from_str(body).unwrap_or(Value::Null);
    (status.expect("a status"), value)
}

/// Without an API key, requests from web pages are refused (issue 43: any page could make the
/// server generate with a form post, and DNS rebinding could read the replies): a `Host` that
/// is not a localhost name, an IP address or an allowed name gets 403, and a POST body not
/// declared JSON gets 415. With a key, neither applies.
#[test]
fn browser_requests_are_refused_without_an_api_key() {
    let (h, ep) = serve(ServerConfig {
        allowed_hosts: vec!["models.internal".into()],
        ..config()
    });
    let chat = "POST /v1/chat/completions HTTP/1.1";
    let body = chat_body("hi", 2).to_string();
    let json = "Content-Type: application/json";
    for host in [
        "evil.example",
        "evil.example:8000",
        "localhost.evil.example",
        "127.0.0.1.nip.io",
    ] {
        for (head, b) in [
            (format!("GET /health HTTP/1.1\r\nHost: {host}"), ""),
            (format!("{chat}\r\nHost: {host}\r\n{json}"), body.as_str()),
        ] {
            let got = exchange(&ep, &head, b);
            assert_error(got, 403, None, Some("host_not_allowed"));
        }
    }
    for host in [
        "localhost:8000",
        "LOCALHOST",
        "127.0.0.1",
        "[::1]:8000",
        "192.168.1.9:8000",
        "models.internal:8000",
    ] {
        let (s, v) = exchange(&ep, &format!("{chat}\r\nHost: {host}\r\n{json}"), &body);
        assert_eq!(s, 200, "{host}: {v}");
    }
    // What a form or a plain `fetch` sends, and no type at all.
    for ct in [
        "\r\nContent-Type: application/x-www-form-urlencoded",
        "\r\nContent-Type: text/plain",
        "\r\nContent-Type: multipart/form-data; boundary=x",
        "",
    ] {
        let got = exchange(&ep, &format!("{chat}\r\nHost: 127.0.0.1{ct}"), &body);
        assert_error(got, 415, None, Some("unsupported_media_type"));
    }
    let (s, v) = exchange(
        &ep,
        &format!("{chat}\r\nHost: 127.0.0.1\r\nContent-Type: Application/JSON; charset=utf-8"),
        &body,
    );
    assert_eq!(s, 200, "{v}");
    h.shutdown();
    // With an API key, the key is the guard.
    let (h, ep) = serve(ServerConfig {
        api_key: Some("sekret".into()),
        ..config()
    });
    let (s, v) = exchange(
        &ep,
        &format!(
            "{chat}\r\nHost: evil.example\r\nContent-Type: text/plain\r\nAuthorization: Bearer sekret"
        ),
        &body,
    );
    assert_eq!(s, 200, "{v}");
    h.shutdown();
}

/// A chat template that loops without end gets a 400 naming the problem, at once, and the
/// server goes on serving (issue 43: it hung the request for ever).
#[test]
fn a_hostile_chat_template_is_an_error() {
    let dir = std::env::temp_dir().join(format!("yomi-hostile-template-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in std::fs::read_dir(fixture("qwen35-tiny")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    let cfg = dir.join("tokenizer_config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["chat_template"] =
        json!("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
    std::fs::write(&cfg, v.to_string()).unwrap();
    let e = engine_at(&dir, 256);
    let _ = std::fs::remove_dir_all(&dir);
    let (h, ep) = serve_engine(e, config());
    let t0 = Instant::now();
    let got = post(&ep, "/v1/chat/completions", &chat_body("hi", 2));
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let msg = got.1["error"]["message"].as_str().unwrap_or("").to_string();
    assert_error(got, 400, Some("messages"), None);
    assert!(msg.contains("budget"), "{msg}");
    let (s, v) = post(
        &ep,
        "/v1/completions",
        &json!({"model": NAME, "prompt": "x", "max_tokens": 2}),
    );
    assert_eq!(s, 200, "{v}");
    assert_eq!(h.health()["queue"]["waiting"], 0);
    h.shutdown();
}

/// A body over the limit is read and dropped before the 413 goes out (up to 4 times the
/// limit), so that clients that send the whole body before reading (Python's `http.client`)
/// get the 413 rather than a connection reset mid-send.
#[test]
fn an_oversized_body_gets_its_413_after_it_is_sent() {
    let (h, ep) = serve(ServerConfig {
        max_body_bytes: 3 << 20,
        ..config()
    });
    let body = vec![b' '; 11 << 20];
    let mut s = connect(&ep);
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(&body)
        .expect("the server reset the connection while the body was being sent");
    let (_, got) = until_closed(&mut s);
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    assert!(got.contains("request_too_large"), "{got}");
    h.shutdown();
}

/// Parameters yomi does not implement are refused (400 naming them), never ignored; their
/// harmless values are accepted.
#[test]
fn unsupported_fields_are_refused() {
    let (h, ep) = serve(config());
    let chat = "/v1/chat/completions";
    for (field, value, param) in [
        ("response_format", json!({}), "response_format.type"),
        (
            "response_format",
            json!({"type": "yaml"}),
            "response_format.type",
        ),
        ("response_format", json!("json"), "response_format"),
        ("logit_bias", json!({"15": 100}), "logit_bias"),
        ("logit_bias", json!([1]), "logit_bias"),
        ("best_of", json!(2), "best_of"),
        ("tools", json!("get_weather"), "tools"),
        ("tools", json!({"type": "function"}), "tools"),
    ] {
        let mut b = chat_body("hi", 2);
        b[field] = value.clone();
        assert_error(post(&ep, chat, &b), 400, Some(param), None);
    }
    // JSON formats are taken (structured.rs): the output is decoded under their grammar.
    for value in [
        json!({"type": "json_object"}),
        json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
    ] {
        let mut b = chat_body("hi", 2);
        b["response_format"] = value;
        let (s, v) = post(&ep, chat, &b);
        assert_eq!(s, 200, "{v}");
    }
    let mut b = json!({"model": NAME, "prompt": "x", "max_tokens": 2});
    b["best_of"] = json!(3);
    assert_error(post(&ep, "/v1/completions", &b), 400, Some("best_of"), None);
    // The defaults and empty values change nothing.
    let mut b = chat_body("hi", 2);
    b["response_format"] = json!({"type": "text"});
    b["logit_bias"] = json!({});
    b["best_of"] = json!(1);
    b["tools"] = json!([]);
    let (s, v) = post(&ep, chat, &b);
    assert_eq!(s, 200, "{v}");
    // Tools are taken (chat_tools.rs); only malformed ones are refused.
    let mut b = chat_body("hi", 2);
    b["tools"] = json!([{"type": "function", "function": {"name": "f"}}]);
    let (s, v) = post(&ep, chat, &b);
    assert_eq!(s, 200, "{v}");
    h.shutdown();
}

/// At most 4 stop strings (OpenAI's limit) of at most 256 bytes each: each one is checked on
/// every token.
#[test]
fn stop_strings_are_bounded() {
    let (h, ep) = serve(config());
    let chat = "/v1/chat/completions";
    let cases = [
        json!(["a", "b", "c", "d", "e"]),
        json!("x".repeat(257)),
        json!(["ok", "é".repeat(129)]),
        json!("x".repeat(7 << 20)),
    ];
    for stop in cases {
        let mut b = chat_body("hi", 2);
        b["stop"] = stop;
        let (s, v) = post(&ep, chat, &b);
        assert_error((s, v.clone()), 400, Some("stop"), None);
        assert!(
            v["error"]["message"].as_str().unwrap().contains("stop"),
            "{v}"
        );
    }
    let mut b = json!({"model": NAME, "prompt": "x", "max_tokens": 2});
    b["stop"] = json!(["1", "2", "3", "4", "5"]);
    assert_error(post(&ep, "/v1/completions", &b), 400, Some("stop"), None);
    // The limits themselves are fine.
    let mut b = chat_body("hi", 2);
    b["stop"] = json!(["a", "b", "c", "x".repeat(256)]);
    let (s, v) = post(&ep, chat, &b);
    assert_eq!(s, 200, "{v}");
    h.shutdown();
}

/// Counts beyond i64 are reported as they were sent, not wrapped to negative numbers.
#[test]
fn huge_max_tokens_is_reported_as_sent() {
    let (h, ep) = serve(config());
    for (key, n) in [
        ("max_tokens", 1u64 << 63),
        ("max_tokens", u64::MAX),
        ("max_completion_tokens", 1u64 << 63),
    ] {
        let mut b = chat_body("hi", 2);
        b.as_object_mut().unwrap().remove("max_tokens");
        b[key] = json!(n);
        let (s, v) = post(&ep, "/v1/chat/completions", &b);
        let msg = v["error"]["message"].as_str().unwrap_or("").to_string();
        assert_error((s, v), 400, None, Some("context_length_exceeded"));
        assert!(msg.contains(&n.to_string()), "{msg}");
        assert!(!msg.contains('-'), "{msg}");
    }
    let (s, v) = post(
        &ep,
        "/v1/completions",
        &json!({"prompt": "x", "top_k": 1u64 << 63, "max_tokens": 2}),
    );
    assert_eq!(s, 200, "{v}");
    h.shutdown();
}

/// A declared body beyond the limit is refused at once, without waiting for the body.
#[test]
fn a_huge_content_length_is_refused_up_front() {
    let (h, ep) = serve_engine(
        engine(256),
        ServerConfig {
            max_body_bytes: 4096,
            ..config()
        },
    );
    let t0 = Instant::now();
    let (s, _, v) = raw_request(
        &ep,
        "POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 1000000000000",
        b"{\"messages\":",
        "x",
    );
    assert_error((s, v), 413, None, Some("request_too_large"));
    assert!(t0.elapsed() < Duration::from_secs(5));
    // Within the limit, a declared length is honoured as before.
    let body = serde_json::to_vec(&chat_body("hi", 2)).unwrap();
    let (s, _, v) = raw_request(
        &ep,
        &format!(
            "POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}",
            body.len()
        ),
        &body,
        "x",
    );
    assert_eq!(s, 200, "{v}");
    h.shutdown();
}

#[test]
fn api_key_is_required_when_set() {
    let (h, ep) = serve(ServerConfig {
        api_key: Some("sekret".into()),
        ..config()
    });
    let body = chat_body("hi", 2);
    let chat = "/v1/chat/completions";
    let r = post_json(&ep, chat, &body, None, T).expect("request");
    let s = r.status;
    assert_error((s, r.json().unwrap()), 401, None, Some("invalid_api_key"));
    let r = post_json(&ep, chat, &body, Some("wrong"), T).expect("request");
    assert_eq!(r.status, 401);
    let r = get(&ep, "/v1/models", None, T).expect("request");
    assert_eq!(r.status, 401);
    let r = post_json(&ep, chat, &body, Some("sekret"), T).expect("request");
    assert_eq!(r.status, 200);
    // Keys that share a prefix with the real one, or differ only in the last byte.
    for wrong in ["sekre", "sekretx", "sekrex", "", "SEKRET"] {
        let r = post_json(&ep, chat, &body, Some(wrong), T).expect("request");
        assert_eq!(r.status, 401, "{wrong:?}");
    }
    // The scheme name is case-insensitive; the key is not.
    for (auth, status) in [
        ("bearer sekret", 200),
        ("BEARER sekret", 200),
        ("Bearer  sekret ", 200),
        ("Basic sekret", 401),
        ("Bearersekret", 401),
        ("bearer Sekret", 401),
    ] {
        let (s, _, v) = raw_request(
            &ep,
            &format!("GET /v1/models HTTP/1.1\r\nAuthorization: {auth}"),
            b"",
            "x",
        );
        assert_eq!(s, status, "{auth}: {v}");
    }
    // Health needs no key.
    assert_eq!(get(&ep, "/health", None, T).expect("health").status, 200);
    h.shutdown();
}

/// With the engine held, one request runs (held), `queue_size` wait, and the next gets 503;
/// released, the admitted ones complete.
#[test]
fn a_full_queue_answers_503() {
    let (h, ep) = serve(ServerConfig {
        queue_size: 1,
        ..config()
    });
    h.pause();
    let waiting = |n: u64| {
        let ep = ep.clone();
        move || {
            let v = get(&ep, "/health", None, T).unwrap().json().unwrap();
            v["queue"]["waiting"].as_u64() == Some(n)
        }
    };
    let send = |ep: &Endpoint| {
        let ep = ep.clone();
        std::thread::spawn(move || post(&ep, "/v1/chat/completions", &chat_body("hi", 3)))
    };
    let a = send(&ep);
    wait_for("one admitted", waiting(1));
    let b = send(&ep);
    wait_for("two admitted", waiting(2));
    let r = post_json(&ep, "/v1/chat/completions", &chat_body("hi", 3), None, T).unwrap();
    assert_eq!(r.header("retry-after"), Some("1"), "{r:?}");
    let s = r.status;
    assert_error((s, r.json().unwrap()), 503, None, Some("queue_full"));
    // Streaming requests are refused the same way, before any event.
    let mut sb = chat_body("hi", 3);
    sb["stream"] = json!(true);
    assert_error(
        post(&ep, "/v1/chat/completions", &sb),
        503,
        None,
        Some("queue_full"),
    );
    h.resume();
    for t in [a, b] {
        let (s, v) = t.join().expect("thread");
        assert_eq!(s, 200, "{v}");
    }
    let v = h.health();
    assert_eq!(v["requests"]["rejected"], 2);
    // Other errors carry no Retry-After.
    let r = post_json(&ep, "/v1/chat/completions", &json!({}), None, T).unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.header("retry-after"), None);
    assert_eq!(v["requests"]["completed"], 2);
    // Room again.
    let (s, _) = post(&ep, "/v1/chat/completions", &chat_body("hi", 3));
    assert_eq!(s, 200);
    h.shutdown();
}

/// A client that disconnects mid-stream stops its generation: the engine is free for the
/// next request long before the abandoned one would have finished.
#[test]
fn a_disconnect_frees_the_engine() {
    let (h, ep) = serve(ServerConfig {
        token_delay: Some(Duration::from_millis(20)),
        draft: DraftMode::None,
        ..config()
    });
    // 600 tokens at 20 ms each would take 12 s (the prompt is chosen so that greedy decoding
    // does not stop early).
    let body = json!({
        "model": NAME,
        "prompt": "import numpy as np\n",
        "max_tokens": 600,
        "temperature": 0,
        "stream": true,
    });
    let t0 = Instant::now();
    let mut r = post_json(&ep, "/v1/completions", &body, None, T).expect("stream");
    for _ in 0..3 {
        r.next_event().expect("event").expect("an event");
    }
    drop(r);
    wait_for("the cancel", || h.health()["requests"]["cancelled"] == 1);
    // The next request runs at once.
    let (s, v) = post(
        &ep,
        "/v1/completions",
        &json!({"model": NAME, "prompt": "x", "max_tokens": 2}),
    );
    assert_eq!(s, 200, "{v}");
    let elapsed = t0.elapsed();
    assert!(elapsed < Duration::from_secs(6), "took {elapsed:?}");
    let v = h.health();
    assert_eq!(v["requests"]["completed"], 1, "{v}");
    assert!(
        v["requests"]["generated_tokens"].as_u64().unwrap() < 300,
        "{v}"
    );
    // A non-streamed request whose client leaves before it runs is skipped.
    h.pause();
    let ep2 = ep.clone();
    let gone = std::thread::spawn(move || {
        let b = json!({"model": NAME, "prompt": "y", "max_tokens": 50});
        let bytes = serde_json::to_vec(&b).unwrap();
        request(
            &ep2,
            "POST",
            "/v1/completions",
            Some(&bytes),
            None,
            Duration::from_millis(300),
        )
        .map(|r| r.status)
    });
    assert!(gone.join().unwrap().is_err(), "expected a client timeout");
    h.resume();
    wait_for("the abandoned job to be dropped", || {
        h.health()["requests"]["cancelled"] == 2
    });
    wait_for("the skipped job", || {
        h.health()["queue"]["waiting"] == 0 && h.health()["queue"]["running"] == false
    });
    let (s, _) = post(
        &ep,
        "/v1/completions",
        &json!({"model": NAME, "prompt": "x", "max_tokens": 2}),
    );
    assert_eq!(s, 200);
    h.shutdown();
}

/// Two requests sharing a long prefix: the second prefills only what is new and answers
/// exactly what a server without the cache answers.
#[test]
fn prefix_cache_over_http() {
    let system = "You are a careful Python reviewer. ".repeat(30);
    let body = |q: &str| {
        json!({
            "model": NAME,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
            "max_tokens": 12,
            "temperature": 0,
        })
    };
    let (h, ep) = serve(config());
    let (s1, v1) = post(&ep, "/v1/chat/completions", &body("def a(): pass"));
    assert_eq!(s1, 200, "{v1}");
    let (_, v2) = post(&ep, "/v1/chat/completions", &body("def b(): return 1"));
    let u1 = &v1["usage"];
    let u2 = &v2["usage"];
    assert_eq!(u1["prompt_tokens_details"]["cached_tokens"], 0);
    let cached = u2["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt = u2["prompt_tokens"].as_u64().unwrap();
    assert!(prompt > 300, "{u2}");
    // The hybrid model resumes at the last snapshot within the shared prefix (a chunk
    // boundary of 256 tokens here), so the second request prefills far fewer tokens.
    assert!(cached >= 256, "{u2}");
    assert_eq!(u2["prefill_tokens"].as_u64().unwrap(), prompt - cached);
    assert_eq!(v2["yomi"]["cached_tokens"], cached);
    // The same request again resumes its whole prompt.
    let (_, v3) = post(&ep, "/v1/chat/completions", &body("def b(): return 1"));
    assert_eq!(v3["usage"]["prefill_tokens"], 0, "{}", v3["usage"]);
    assert_eq!(v3["choices"], v2["choices"]);
    h.shutdown();

    let (h, ep) = serve(ServerConfig {
        prefix_cache: None,
        ..config()
    });
    let (_, c1) = post(&ep, "/v1/chat/completions", &body("def a(): pass"));
    let (_, c2) = post(&ep, "/v1/chat/completions", &body("def b(): return 1"));
    assert_eq!(c2["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(c2["usage"]["prefill_tokens"], c2["usage"]["prompt_tokens"]);
    assert_eq!(c1["choices"], v1["choices"]);
    assert_eq!(c2["choices"], v2["choices"]);
    h.shutdown();
}

/// A template whose generation prompt opens a thinking block: the output is reasoning until
/// `</think>` (a special token in this tokenizer), then content.
#[test]
fn thinking_streams_as_reasoning_content() {
    let src = fixture("qwen35-tiny");
    let dir = std::env::temp_dir().join(format!("yomi-server-think-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    let cfg_path = dir.join("tokenizer_config.json");
    let mut tc: Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    tc["chat_template"] = json!(
        "{%- for m in messages -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}{%- endfor -%}\
         {%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n<think>\\n' -}}{%- endif -%}"
    );
    std::fs::write(&cfg_path, tc.to_string()).unwrap();
    let e = engine_at(&dir, 1024);
    let ids = e
        .prompt_ids(&Prompt::Chat {
            messages: vec![ChatMessage::user("why?")],
            enable_thinking: None,
        })
        .unwrap();
    let (want, _) = cold_text(&e, &ids, 16);
    let (h, ep) = serve_engine(e, config());
    let (s, v) = post(&ep, "/v1/chat/completions", &chat_body("why?", 16));
    assert_eq!(s, 200, "{v}");
    let msg = &v["choices"][0]["message"];
    let reasoning = msg["reasoning_content"].as_str().unwrap_or("");
    let content = msg["content"].as_str().unwrap();
    assert!(!reasoning.is_empty(), "{v}");
    assert_eq!(no_ws(&format!("{reasoning}{content}")), no_ws(&want));
    // Streamed: reasoning deltas arrive as `reasoning_content`, never as `content`, before
    // any content.
    let mut b = chat_body("why?", 16);
    b["stream"] = json!(true);
    let evs = events(post_json(&ep, "/v1/chat/completions", &b, None, T).unwrap());
    let mut r = String::new();
    let mut c = String::new();
    for e in &evs[..evs.len() - 1] {
        let ch: Value = serde_json::from_str(e).unwrap();
        let d = &ch["choices"][0]["delta"];
        if let Some(t) = d["reasoning_content"].as_str() {
            assert!(c.is_empty(), "reasoning after content");
            r.push_str(t);
        }
        c.push_str(d["content"].as_str().unwrap_or(""));
    }
    assert_eq!(r, reasoning);
    assert_eq!(c, content);
    // Earlier assistant turns may carry reasoning_content.
    let mut b = chat_body("why?", 4);
    b["messages"] = json!([
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "reasoning_content": "because"},
        {"role": "user", "content": "c"},
    ]);
    let (s, v) = post(&ep, "/v1/chat/completions", &b);
    assert_eq!(s, 200, "{v}");
    h.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Errors of the HTTP layer come back in the API's JSON shape too: a path that does not decode
/// (400), a request target past 8 KiB (414) and headers past 64 KiB (431), each with its code.
#[test]
fn http_layer_errors_are_json() {
    let (h, ep) = serve(config());
    let (s, _, v) = raw_request(&ep, "GET /v1/models/%FF HTTP/1.1", b"", "content-type");
    assert_error((s, v), 400, None, None);
    let long = format!("GET /v1/models/{} HTTP/1.1", "a".repeat(9000));
    let (s, _, v) = raw_request(&ep, &long, b"", "content-type");
    assert_error((s, v), 414, None, Some("uri_too_long"));
    let big = format!("GET /health HTTP/1.1\r\nX-Big: {}", "a".repeat(70_000));
    let (s, _, v) = raw_request(&ep, &big, b"", "content-type");
    assert_error((s, v), 431, None, Some("headers_too_large"));
    // Just under both bounds the request is served.
    let ok = format!("GET /health HTTP/1.1\r\nX-Big: {}", "a".repeat(60_000));
    let (s, _, _) = raw_request(&ep, &ok, b"", "content-type");
    assert_eq!(s, 200);
    drop(h);
}
