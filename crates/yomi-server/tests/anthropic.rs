//! `/v1/messages` over HTTP with the qwen35-tiny fixture: a stream's `event:` lines name each
//! event's data in Anthropic's order and carry the same text as the whole message, and the
//! API key (`x-api-key` too) and the layers in front of the route answer in Anthropic's error
//! shape.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use yomi_engine::{Engine, EngineOptions};
use yomi_server::client::{Endpoint, post_json};
use yomi_server::{ServerConfig, ServerHandle};

const NAME: &str = "tiny";
const T: Duration = Duration::from_secs(60);

fn serve(api_key: Option<&str>) -> (ServerHandle, Endpoint) {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/qwen35-tiny");
    let opts = EngineOptions {
        context_size: Some(1024),
        threads: Some(1),
        ..Default::default()
    };
    let engine = Engine::load(&path, &opts, &mut |_, _| {}).expect("load engine");
    let cfg = ServerConfig {
        model_name: NAME.into(),
        api_key: api_key.map(str::to_string),
        ..Default::default()
    };
    let bound = yomi_server::bind("127.0.0.1", 0).expect("bind");
    let h = yomi_server::spawn(engine, cfg, bound).expect("spawn");
    let ep = Endpoint::parse(&h.url()).expect("endpoint");
    (h, ep)
}

/// The `(event, data)` pairs of a server-sent event stream (comments skipped).
fn sse_events(body: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for chunk in body.split("\n\n") {
        let mut name = None;
        let mut data = None;
        for line in chunk.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                name = Some(v.trim().to_string());
            } else if let Some(v) = line.strip_prefix("data:") {
                data = Some(serde_json::from_str::<Value>(v.trim()).expect("JSON data"));
            }
        }
        if let Some(d) = data {
            out.push((name.expect("every event is named"), d));
        }
    }
    out
}

fn request(stream: bool) -> Value {
    json!({
        "model": NAME, "max_tokens": 12, "temperature": 0, "stream": stream,
        "system": "be brief", "messages": [{"role": "user", "content": "def add(a, b):"}],
    })
}

#[test]
fn stream_events_in_anthropic_order_with_the_whole_message_text() {
    let (_h, ep) = serve(None);
    let r = post_json(&ep, "/v1/messages", &request(false), None, T).expect("request");
    assert_eq!(r.status, 200);
    let whole = r.json().expect("json");
    assert_eq!(whole["type"], "message");
    assert!(
        whole["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("msg_"))
    );
    let r = post_json(&ep, "/v1/messages", &request(true), None, T).expect("request");
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream"))
    );
    let events = sse_events(&r.text().expect("body"));
    for (name, data) in &events {
        assert_eq!(data["type"], name.as_str(), "{data}");
    }
    let names: Vec<&str> = events
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| *n != "ping")
        .collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"]);
    // Blocks open and close in turn, numbered from 0, with deltas only inside them.
    let mut open: Option<u64> = None;
    let mut next = 0;
    let mut blocks: Vec<Value> = Vec::new();
    for (name, data) in &events[1..events.len() - 2] {
        match name.as_str() {
            "content_block_start" => {
                assert_eq!((open, data["index"].as_u64()), (None, Some(next)));
                open = Some(next);
                blocks.push(data["content_block"].clone());
            }
            "content_block_delta" => {
                assert_eq!(data["index"].as_u64(), open);
                let b = blocks.last_mut().expect("an open block");
                match data["delta"]["type"].as_str() {
                    Some("text_delta") => {
                        let t = format!(
                            "{}{}",
                            b["text"].as_str().unwrap_or(""),
                            data["delta"]["text"].as_str().unwrap_or("")
                        );
                        b["text"] = json!(t);
                    }
                    Some("thinking_delta") => {
                        let t = format!(
                            "{}{}",
                            b["thinking"].as_str().unwrap_or(""),
                            data["delta"]["thinking"].as_str().unwrap_or("")
                        );
                        b["thinking"] = json!(t);
                    }
                    other => panic!("unexpected delta {other:?}"),
                }
            }
            "content_block_stop" => {
                assert_eq!(data["index"].as_u64(), open);
                open = None;
                next += 1;
            }
            "ping" => {}
            other => panic!("unexpected event {other}"),
        }
    }
    assert_eq!(open, None);
    assert_eq!(Value::Array(blocks), whole["content"]);
    let (_, end) = &events[events.len() - 2];
    assert_eq!(end["delta"]["stop_reason"], whole["stop_reason"]);
    assert_eq!(
        end["usage"]["output_tokens"],
        whole["usage"]["output_tokens"]
    );
}

/// Sends a request with the given extra header lines; returns the status and the JSON body.
fn raw(ep: &Endpoint, method: &str, headers: &str, body: &[u8]) -> (u16, Value) {
    let mut s = std::net::TcpStream::connect((ep.host.as_str(), ep.port)).expect("connect");
    s.set_read_timeout(Some(T)).expect("timeout");
    let head = format!(
        "{method} /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{headers}\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("send");
    s.write_all(body).expect("send");
    let mut got = String::new();
    s.read_to_string(&mut got).expect("read");
    let status = got
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    let (head, body) = got.split_once("\r\n\r\n").expect("head");
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        // One chunk is all a short JSON body takes.
        body.split_once("\r\n").map_or("", |(_, rest)| rest)
    } else {
        body
    };
    let end = body.rfind('}').map_or(0, |i| i + 1);
    (
        status,
        serde_json::from_str(&body[..end]).unwrap_or(Value::Null),
    )
}

fn assert_error(got: (u16, Value), status: u16, kind: &str) {
    let (s, v) = got;
    assert_eq!(s, status, "{v}");
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], kind, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
}

#[test]
fn keys_and_errors_in_anthropic_shape() {
    let (_h, ep) = serve(Some("sekret"));
    let body = serde_json::to_vec(&request(false)).expect("json");
    let json = "Content-Type: application/json\r\n";
    assert_error(raw(&ep, "POST", json, &body), 401, "authentication_error");
    let wrong = format!("{json}x-api-key: nope\r\n");
    assert_error(raw(&ep, "POST", &wrong, &body), 401, "authentication_error");
    let key = format!("{json}x-api-key: sekret\r\n");
    let (status, v) = raw(&ep, "POST", &key, &body);
    assert_eq!((status, v["type"].clone()), (200, json!("message")), "{v}");
    let bearer = format!("{json}Authorization: Bearer sekret\r\n");
    assert_eq!(raw(&ep, "POST", &bearer, &body).0, 200);
    assert_error(
        raw(&ep, "POST", &key, b"{oops"),
        400,
        "invalid_request_error",
    );
    assert_error(raw(&ep, "GET", &key, b""), 405, "invalid_request_error");
    let unknown = serde_json::to_vec(&json!({"model": "claude-x", "max_tokens": 1,
        "messages": [{"role": "user", "content": "x"}]}))
    .expect("json");
    assert_error(raw(&ep, "POST", &key, &unknown), 404, "not_found_error");
    let long = serde_json::to_vec(&json!({"model": NAME, "max_tokens": 1,
        "messages": [{"role": "user", "content": "def f(x): return x\n".repeat(2000)}]}))
    .expect("json");
    assert_error(raw(&ep, "POST", &key, &long), 400, "invalid_request_error");
}
