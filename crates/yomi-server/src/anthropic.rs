//! Anthropic's Messages API: `POST /v1/messages`.
//!
//! A request becomes the same [`ParsedRequest`] the OpenAI chat route makes (the model's own
//! chat template renders it) and takes the same way through the queue and the engine thread;
//! only the shapes differ. The answer is a `message` object, or with `stream` the server-sent
//! events Anthropic sends: `message_start`, then per content block `content_block_start`,
//! `content_block_delta`s and `content_block_stop`, then `message_delta` (stop reason, usage)
//! and `message_stop`; `ping` is the keep-alive. Text the model writes inside think tags
//! becomes a `thinking` block (with an empty signature: nothing here signs it).
//!
//! Tools: `tools` reach the template as OpenAI-style function tools, and the history's
//! `tool_use` and `tool_result` blocks as the assistant's `tool_calls` (arguments as objects)
//! and `tool` messages ([`PromptSpec::ChatJson`]). Calls the model writes, in the format its
//! template teaches, are read by [`crate::tools`] and come back as `tool_use` blocks (streamed
//! as `input_json_delta`s) with `stop_reason: "tool_use"`; a call written badly stays text.
//! `tool_choice` `any` makes the answer calls to the offered tools and `tool` calls to the
//! named one, with inputs that match their `input_schema`, by constrained decoding
//! ([`crate::structured`]).
//!
//! Thinking is off unless the request turns it on (`thinking: {"type": "enabled"}`), as with
//! Anthropic's models: the template is rendered with `enable_thinking` false otherwise.
//! `usage.input_tokens` counts the prompt tokens that were prefilled and
//! `cache_read_input_tokens` those the prefix cache supplied, so their sum is the prompt, as
//! Anthropic counts them.
//!
//! Every failure on the route is answered in Anthropic's error shape,
//! `{"type": "error", "error": {"type", "message"}}`: the handler's own errors directly, and
//! those of the middleware in front of it (API key, body size and timeout, content type) by
//! `error_shape`, which rewrites the OpenAI-shaped ones. A full queue is 529
//! `overloaded_error`, as Anthropic answers when it is overloaded.

use std::collections::HashMap;
use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use futures_util::stream;
use serde_json::{Map, Value, json};
use yomi_engine::generate::validate_stop;
use yomi_engine::stats::StatsRecorder;
use yomi_engine::tokenizer::StreamDecoder;
use yomi_engine::{Engine, FinishReason, Generation};

use crate::api::{
    ApiKind, Outcome, ParsedRequest, PromptSpec, field, kind_name, opt_bool, opt_f32, opt_int,
    opt_str, parse_object, yomi_stats,
};
use crate::error::ApiError;
use crate::reasoning::Split;
use crate::structured::{self, CallSpec, OutputSpec};
use crate::tools::{ParsedOutput, ToolCallParser, ToolEvent, ToolFormat, ToolSet};
use crate::worker::Event;
use crate::{AppState, body_error, cut_off, shutting_down, submit};

/// The route's path; [`error_shape`] rewrites errors under it.
const PATH: &str = "/v1/messages";

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// Anthropic's error type for a status, and the status Anthropic uses for it: its overloaded
/// error is 529, which its clients know to retry later.
fn error_type(status: StatusCode) -> (StatusCode, &'static str) {
    match status.as_u16() {
        401 => (status, "authentication_error"),
        403 => (status, "permission_error"),
        404 => (status, "not_found_error"),
        413 => (status, "request_too_large"),
        429 => (status, "rate_limit_error"),
        503 | 529 => (
            StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            "overloaded_error",
        ),
        s if s >= 500 => (status, "api_error"),
        _ => (status, "invalid_request_error"),
    }
}

/// The JSON of an Anthropic error.
fn error_body(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

/// An error in Anthropic's shape; the parameter at fault, if any, leads the message as in
/// Anthropic's own (`max_tokens: Field required`).
fn error_json(e: &ApiError) -> (StatusCode, Value) {
    let (status, kind) = error_type(e.status);
    let message = match &e.param {
        Some(p) if !e.message.starts_with(p.as_str()) => format!("{p}: {}", e.message),
        _ => e.message.clone(),
    };
    (status, error_body(kind, &message))
}

/// The response for an error.
pub(crate) fn error_response(e: &ApiError) -> Response {
    let (status, body) = error_json(e);
    let mut r = (status, axum::Json(body)).into_response();
    if let Some(s) = e.retry_after {
        r.headers_mut().insert(header::RETRY_AFTER, s.into());
    }
    r
}

/// Error bodies of other layers are small; anything larger is not one of them.
const MAX_ERROR_BODY: usize = 64 << 10;

/// Middleware: on this route, an error answered by the layers in front of the handler (or
/// the method fallback) in the OpenAI shape is rewritten in Anthropic's, keeping its status
/// (but 529 for 503) and headers such as `Retry-After` and `Connection: close`.
pub(crate) async fn error_shape(req: Request, next: Next) -> Response {
    let ours = req.uri().path() == PATH;
    let r = next.run(req).await;
    if !ours || r.status().is_success() {
        return r;
    }
    let (mut parts, body) = r.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_ERROR_BODY)
        .await
        .unwrap_or_default();
    let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if v.get("type").and_then(Value::as_str) == Some("error") {
        // The handler's own: already in shape.
        return Response::from_parts(parts, axum::body::Body::from(bytes));
    }
    let message = match v.pointer("/error/message").and_then(Value::as_str) {
        Some(m) => m.to_string(),
        None if !bytes.is_empty() => String::from_utf8_lossy(&bytes).into_owned(),
        None => parts
            .status
            .canonical_reason()
            .unwrap_or("request failed")
            .to_string(),
    };
    let (status, kind) = error_type(parts.status);
    let body = error_body(kind, &message).to_string();
    parts.status = status;
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, axum::body::Body::from(body))
}

// ---------------------------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------------------------

/// A required field.
fn required<'a>(m: &'a Map<String, Value>, key: &str) -> Result<&'a Value, ApiError> {
    field(m, key).ok_or_else(|| ApiError::bad_param(key, "Field required"))
}

/// The text of a list of text blocks (`system`, a tool result's content): other block types
/// are refused, since yomi's models read only text.
fn text_blocks(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut text = String::new();
            for (j, b) in blocks.iter().enumerate() {
                let param = format!("{param}.{j}");
                match block_type(b, &param)? {
                    "text" => text.push_str(block_text(b, &param)?),
                    other => return Err(unsupported_block(other, &param)),
                }
            }
            Ok(text)
        }
        other => Err(ApiError::bad_param(
            param,
            format!(
                "must be a string or a list of text blocks, got {}",
                kind_name(other)
            ),
        )),
    }
}

/// A content block's `type`.
fn block_type<'a>(b: &'a Value, param: &str) -> Result<&'a str, ApiError> {
    let Value::Object(o) = b else {
        return Err(ApiError::bad_param(
            param,
            format!("a content block must be an object, got {}", kind_name(b)),
        ));
    };
    match o.get("type") {
        Some(Value::String(t)) => Ok(t),
        _ => Err(ApiError::bad_param(
            &format!("{param}.type"),
            "a content block needs a string `type`",
        )),
    }
}

/// A text block's `text`.
fn block_text<'a>(b: &'a Value, param: &str) -> Result<&'a str, ApiError> {
    b.get("text").and_then(Value::as_str).ok_or_else(|| {
        ApiError::bad_param(
            &format!("{param}.text"),
            "a text block needs a string `text`",
        )
    })
}

fn unsupported_block(kind: &str, param: &str) -> ApiError {
    let shown: String = kind.chars().take(64).collect();
    ApiError::bad_param(
        &format!("{param}.type"),
        format!("content blocks of type {shown:?} are not supported here"),
    )
}

/// A string field of a content block.
fn block_str<'a>(b: &'a Value, key: &str, param: &str, kind: &str) -> Result<&'a str, ApiError> {
    b.get(key).and_then(Value::as_str).ok_or_else(|| {
        ApiError::bad_param(
            &format!("{param}.{key}"),
            format!("a {kind} block needs a string `{key}`"),
        )
    })
}

/// The function names of the calls made so far, by call id: a tool result names the call it
/// answers only by id, and templates that show the function's name take it from here.
type CallNames = HashMap<String, String>;

/// One message of `messages`, appended to `out` as the template's messages: an assistant
/// message's `tool_use` blocks become its `tool_calls` (arguments as objects, as templates
/// iterate them), and each `tool_result` block of a user message becomes a `tool` message of
/// its own, in place among the user's text.
fn parse_message(
    i: usize,
    v: &Value,
    names: &mut CallNames,
    out: &mut Vec<Value>,
) -> Result<(), ApiError> {
    let param = format!("messages.{i}");
    let Value::Object(o) = v else {
        return Err(ApiError::bad_param(
            &param,
            format!("a message must be an object, got {}", kind_name(v)),
        ));
    };
    let role = match opt_str(o, "role").map_err(|e| e.with_param(&format!("{param}.role")))? {
        Some(r) if r == "user" || r == "assistant" => r,
        Some(r) => {
            let shown: String = r.chars().take(64).collect();
            return Err(ApiError::bad_param(
                &format!("{param}.role"),
                format!(
                    "unexpected role {shown:?} (messages are `user` or `assistant`; the system \
                     prompt goes in the top-level `system` field)"
                ),
            ));
        }
        None => {
            return Err(ApiError::bad_param(
                &format!("{param}.role"),
                "Field required",
            ));
        }
    };
    let param = format!("{param}.content");
    let blocks = match o.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        Some(other) => {
            return Err(ApiError::bad_param(
                &param,
                format!(
                    "must be a string or a list of content blocks, got {}",
                    kind_name(other)
                ),
            ));
        }
        None => return Err(ApiError::bad_param(&param, "Field required")),
    };
    let mut text = String::new();
    if role == "assistant" {
        let mut reasoning = String::new();
        let mut calls = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            let param = format!("{param}.{j}");
            match block_type(b, &param)? {
                "text" => text.push_str(block_text(b, &param)?),
                // An earlier answer's reasoning, for templates that show it.
                "thinking" => reasoning.push_str(block_str(b, "thinking", &param, "thinking")?),
                // Encrypted reasoning of Anthropic's models: nothing a local model reads.
                "redacted_thinking" => {}
                "tool_use" => {
                    let id = block_str(b, "id", &param, "tool_use")?;
                    let name = block_str(b, "name", &param, "tool_use")?;
                    let Some(input @ Value::Object(_)) = b.get("input") else {
                        return Err(ApiError::bad_param(
                            &format!("{param}.input"),
                            "a tool_use block needs an object `input`",
                        ));
                    };
                    names.insert(id.to_string(), name.to_string());
                    calls.push(json!({
                        "id": id,
                        "type": "function",
                        "function": {"name": name, "arguments": input},
                    }));
                }
                other => return Err(unsupported_block(other, &param)),
            }
        }
        let mut msg = json!({"role": "assistant", "content": text});
        if !reasoning.is_empty() {
            msg["reasoning_content"] = json!(reasoning);
        }
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        out.push(msg);
        return Ok(());
    }
    let mut results = false;
    for (j, b) in blocks.iter().enumerate() {
        let param = format!("{param}.{j}");
        match block_type(b, &param)? {
            "text" => text.push_str(block_text(b, &param)?),
            "tool_result" => {
                // Text before a result stays before it, as a user turn of its own.
                if !text.is_empty() {
                    out.push(json!({"role": "user", "content": std::mem::take(&mut text)}));
                }
                let id = block_str(b, "tool_use_id", &param, "tool_result")?;
                let mut content = match field_of(b, "content") {
                    None => String::new(),
                    Some(c) => text_blocks(c, &format!("{param}.content"))?,
                };
                match field_of(b, "is_error") {
                    None | Some(Value::Bool(false)) => {}
                    // Templates have no flag for it: the model reads it.
                    Some(Value::Bool(true)) => content = format!("Error: {content}"),
                    Some(v) => {
                        return Err(ApiError::bad_param(
                            &format!("{param}.is_error"),
                            format!("must be a boolean, got {}", kind_name(v)),
                        ));
                    }
                }
                let mut msg = json!({"role": "tool", "tool_call_id": id, "content": content});
                if let Some(name) = names.get(id) {
                    msg["name"] = json!(name);
                }
                out.push(msg);
                results = true;
            }
            other => return Err(unsupported_block(other, &param)),
        }
    }
    if !text.is_empty() || !results {
        out.push(json!({"role": "user", "content": text}));
    }
    Ok(())
}

/// A field of a JSON object value, `None` when missing or null.
fn field_of<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get(key).filter(|x| !x.is_null())
}

/// `thinking`: `{"type": "enabled", "budget_tokens": n}` (or `adaptive`) turns the template's
/// thinking on, `{"type": "disabled"}` or no field off. The budget cannot be enforced (the
/// model decides when to stop thinking) and is only type-checked.
fn parse_thinking(m: &Map<String, Value>) -> Result<bool, ApiError> {
    let Some(v) = field(m, "thinking") else {
        return Ok(false);
    };
    let Value::Object(o) = v else {
        return Err(ApiError::bad_param(
            "thinking",
            format!("must be an object, got {}", kind_name(v)),
        ));
    };
    opt_int(o, "budget_tokens").map_err(|e| e.with_param("thinking.budget_tokens"))?;
    match o.get("type").and_then(Value::as_str) {
        Some("enabled") | Some("adaptive") => Ok(true),
        Some("disabled") => Ok(false),
        _ => Err(ApiError::bad_param(
            "thinking.type",
            "must be \"enabled\", \"adaptive\" or \"disabled\"",
        )),
    }
}

/// What a request's `tools` and `tool_choice` ask for.
#[derive(Clone, Debug)]
pub struct ToolPlan {
    /// The tools as OpenAI-style function tools, for the template; `None` when there are none
    /// or `tool_choice` is `none` (the model is not shown them).
    pub template_tools: Option<Value>,
    /// The functions whose calls are read out of the answer; `None`: the answer is all text.
    pub calls: Option<ToolSet>,
    /// At most this many calls are reported (`disable_parallel_tool_use`: 1).
    pub max_calls: usize,
    /// The calls the answer may (`auto`) or must (`any`, `tool`) consist of, for the grammar.
    pub spec: Option<CallSpec>,
}

/// Anthropic's rule for tool names.
fn valid_tool_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `tools` (`[{name, description, input_schema}]`) and `tool_choice` (`auto`, `any`, `tool`
/// with a `name`, `none`; `disable_parallel_tool_use`). `any` and `tool` force calls (to that
/// tool only, for `tool`). Anthropic's server tools (`web_search_…`, `bash_…`, …) run on
/// Anthropic's side and are refused.
fn parse_tools(m: &Map<String, Value>) -> Result<ToolPlan, ApiError> {
    let list: &[Value] = match field(m, "tools") {
        None => &[],
        Some(Value::Array(a)) => a,
        Some(v) => {
            return Err(ApiError::bad_param(
                "tools",
                format!("must be a list, got {}", kind_name(v)),
            ));
        }
    };
    let mut functions = Vec::with_capacity(list.len());
    let mut schemas: Vec<(String, Value)> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let param = format!("tools.{i}");
        let Value::Object(o) = t else {
            return Err(ApiError::bad_param(
                &param,
                format!("a tool must be an object, got {}", kind_name(t)),
            ));
        };
        match o.get("type") {
            None | Some(Value::Null) => {}
            Some(Value::String(t)) if t == "custom" => {}
            Some(Value::String(t)) => {
                let shown: String = t.chars().take(64).collect();
                return Err(ApiError::bad_param(
                    &format!("{param}.type"),
                    format!(
                        "tools of type {shown:?} (Anthropic's server tools) are not supported; \
                         give `name`, `description` and `input_schema`"
                    ),
                ));
            }
            Some(v) => {
                return Err(ApiError::bad_param(
                    &format!("{param}.type"),
                    format!("must be a string, got {}", kind_name(v)),
                ));
            }
        }
        let name = opt_str(o, "name")
            .map_err(|e| e.with_param(&format!("{param}.name")))?
            .ok_or_else(|| ApiError::bad_param(&format!("{param}.name"), "Field required"))?;
        if !valid_tool_name(&name) {
            return Err(ApiError::bad_param(
                &format!("{param}.name"),
                "must be 1 to 128 letters, digits, `_` or `-`",
            ));
        }
        if schemas.iter().any(|(n, _)| *n == name) {
            return Err(ApiError::bad_param(
                &format!("{param}.name"),
                format!("tool names must be unique; {name:?} comes twice"),
            ));
        }
        let description =
            opt_str(o, "description").map_err(|e| e.with_param(&format!("{param}.description")))?;
        let schema = match o.get("input_schema") {
            Some(s @ Value::Object(_)) => s.clone(),
            None | Some(Value::Null) => {
                return Err(ApiError::bad_param(
                    &format!("{param}.input_schema"),
                    "Field required",
                ));
            }
            Some(v) => {
                return Err(ApiError::bad_param(
                    &format!("{param}.input_schema"),
                    format!("must be an object (a JSON schema), got {}", kind_name(v)),
                ));
            }
        };
        let mut function = json!({"name": name, "parameters": schema});
        if let Some(d) = description {
            function["description"] = json!(d);
        }
        functions.push(json!({"type": "function", "function": function}));
        schemas.push((name, schema));
    }
    let (choice, named, parallel) = match field(m, "tool_choice") {
        None => ("auto".to_string(), None, true),
        Some(Value::Object(o)) => {
            let kind = opt_str(o, "type")
                .map_err(|e| e.with_param("tool_choice.type"))?
                .unwrap_or_default();
            let named = opt_str(o, "name").map_err(|e| e.with_param("tool_choice.name"))?;
            let parallel = !opt_bool(o, "disable_parallel_tool_use")
                .map_err(|e| e.with_param("tool_choice.disable_parallel_tool_use"))?
                .unwrap_or(false);
            (kind, named, parallel)
        }
        Some(v) => {
            return Err(ApiError::bad_param(
                "tool_choice",
                format!("must be an object, got {}", kind_name(v)),
            ));
        }
    };
    if !matches!(choice.as_str(), "auto" | "any" | "tool" | "none") {
        return Err(ApiError::bad_param(
            "tool_choice.type",
            "must be \"auto\", \"any\", \"tool\" or \"none\"",
        ));
    }
    let named = match (choice.as_str(), named) {
        ("tool", Some(n)) if schemas.iter().any(|(s, _)| *s == n) => Some(n),
        ("tool", Some(n)) => {
            let shown: String = n.chars().take(128).collect();
            return Err(ApiError::bad_param(
                "tool_choice.name",
                format!("no tool named {shown:?} is in `tools`"),
            ));
        }
        ("tool", None) => {
            return Err(ApiError::bad_param("tool_choice.name", "Field required"));
        }
        _ => None,
    };
    if choice == "any" && functions.is_empty() {
        return Err(ApiError::bad_param(
            "tool_choice",
            "`any` needs at least one tool in `tools`",
        ));
    }
    if functions.is_empty() || choice == "none" {
        return Ok(ToolPlan {
            template_tools: None,
            calls: None,
            max_calls: usize::MAX,
            spec: None,
        });
    }
    let spec = CallSpec {
        functions: structured::functions(&functions, named.as_deref()),
        parallel,
        forced: choice == "any" || choice == "tool",
    };
    let set = ToolSet::from_schemas(schemas.iter().map(|(n, s)| (n.as_str(), Some(s))));
    Ok(ToolPlan {
        template_tools: Some(Value::Array(functions)),
        calls: Some(match named {
            Some(n) => set.only(&n),
            None => set,
        }),
        max_calls: if parallel { usize::MAX } else { 1 },
        spec: Some(spec),
    })
}

/// Parses a `/v1/messages` body into the request the chat route runs, and what it asks of
/// tools.
pub fn parse_messages(body: &[u8]) -> Result<(ParsedRequest, ToolPlan), ApiError> {
    let m = parse_object(body)?;
    let model = match required(&m, "model")? {
        Value::String(s) => s.clone(),
        v => {
            return Err(ApiError::bad_param(
                "model",
                format!("must be a string, got {}", kind_name(v)),
            ));
        }
    };
    let max_tokens = match opt_int(&m, "max_tokens")? {
        None => return Err(ApiError::bad_param("max_tokens", "Field required")),
        Some(n) if n < 1 => {
            return Err(ApiError::bad_param(
                "max_tokens",
                format!("must be at least 1, got {n}"),
            ));
        }
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
    };
    let mut messages = Vec::new();
    if let Some(system) = field(&m, "system") {
        let text = text_blocks(system, "system")?;
        if !text.is_empty() {
            messages.push(json!({"role": "system", "content": text}));
        }
    }
    let list = match required(&m, "messages")? {
        Value::Array(a) if !a.is_empty() => a,
        Value::Array(_) => {
            return Err(ApiError::bad_param(
                "messages",
                "at least one message is required",
            ));
        }
        v => {
            return Err(ApiError::bad_param(
                "messages",
                format!("must be a list, got {}", kind_name(v)),
            ));
        }
    };
    let mut names = CallNames::new();
    for (i, msg) in list.iter().enumerate() {
        parse_message(i, msg, &mut names, &mut messages)?;
    }
    let stop = match field(&m, "stop_sequences") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str().map(str::to_string).ok_or_else(|| {
                    ApiError::bad_param("stop_sequences", "must be a list of strings")
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(v) => {
            return Err(ApiError::bad_param(
                "stop_sequences",
                format!("must be a list of strings, got {}", kind_name(v)),
            ));
        }
    };
    validate_stop(&stop).map_err(|e| ApiError::bad_param("stop_sequences", e))?;
    let top_k = match opt_int(&m, "top_k")? {
        None => None,
        Some(k) if k < 0 => {
            return Err(ApiError::bad_param(
                "top_k",
                format!("must be at least 0, got {k}"),
            ));
        }
        Some(k) => Some(usize::try_from(k).unwrap_or(usize::MAX)),
    };
    let tools = parse_tools(&m)?;
    // `metadata` (a user id for abuse tracking) means nothing to a local server.
    let request = ParsedRequest {
        kind: ApiKind::Chat,
        model: Some(model),
        prompt: PromptSpec::ChatJson {
            messages,
            tools: tools.template_tools.clone(),
            enable_thinking: Some(parse_thinking(&m)?),
        },
        max_tokens: Some(max_tokens),
        temperature: opt_f32(&m, "temperature")?,
        top_p: opt_f32(&m, "top_p")?,
        top_k,
        min_p: None,
        seed: None,
        stop,
        stream: opt_bool(&m, "stream")?.unwrap_or(false),
        include_usage: false,
        output: OutputSpec {
            answer: None,
            calls: tools.spec.clone(),
        },
    };
    Ok((request, tools))
}

// ---------------------------------------------------------------------------------------------
// Responses
// ---------------------------------------------------------------------------------------------

/// The stop string that ended a generation, if one did: the engine cuts the text where a stop
/// string starts and reports only `Stop`, as it does for an end-of-sequence token (which is
/// kept as the last output id). So when the last id is not one, the output is decoded again
/// as the engine decoded it, and the stop string is the one found where the text was cut.
pub(crate) fn matched_stop(
    engine: &Engine,
    prompt: &[u32],
    g: &Generation,
    stop: &[String],
) -> Option<String> {
    if g.finish_reason != FinishReason::Stop
        || stop.is_empty()
        || g.output_ids
            .last()
            .is_none_or(|t| engine.eos_token_ids.contains(t))
    {
        return None;
    }
    let mut dec = StreamDecoder::with_context(&engine.tokenizer, prompt, true).ok()?;
    let mut full = String::new();
    for &id in &g.output_ids {
        if let Ok(Some(d)) = dec.push(&engine.tokenizer, id) {
            full.push_str(&d);
        }
    }
    if let Some(d) = dec.flush() {
        full.push_str(&d);
    }
    let rest = full.get(g.text.len()..).unwrap_or("");
    // The engine cuts at the earliest match; at one place the longest string is the one that
    // matched whole.
    stop.iter()
        .filter(|s| !s.is_empty() && rest.starts_with(s.as_str()))
        .max_by_key(|s| s.len())
        .or_else(|| {
            stop.iter()
                .find(|s| !s.is_empty() && rest.contains(s.as_str()))
        })
        .cloned()
}

/// Identity of one response.
#[derive(Clone, Debug)]
struct Meta {
    id: String,
    model: String,
    prompt_tokens: usize,
}

/// `stop_reason` and `stop_sequence`: a call the model made ends its turn as `tool_use`
/// unless the token limit cut it.
fn stop_reason(o: &Outcome, called: bool) -> (&'static str, Option<&str>) {
    match (o.finish, &o.stop_sequence) {
        (FinishReason::Length, _) => ("max_tokens", None),
        (_, Some(s)) => ("stop_sequence", Some(s)),
        _ if called => ("tool_use", None),
        _ => ("end_turn", None),
    }
}

fn usage(o: &Outcome) -> Value {
    json!({
        "input_tokens": o.prompt_tokens.saturating_sub(o.cached_tokens),
        "output_tokens": o.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": o.cached_tokens,
    })
}

/// A call's id as Anthropic spells them (`toolu_…`).
fn tool_id(id: &str) -> String {
    match id.strip_prefix("call_") {
        Some(rest) => format!("toolu_{rest}"),
        None => id.to_string(),
    }
}

/// A `tool_use` block; `input` is empty while a stream has still to send the arguments.
fn tool_use_block(id: &str, name: &str, input: Value) -> Value {
    json!({"type": "tool_use", "id": tool_id(id), "name": name, "input": input})
}

impl Meta {
    /// The non-streaming response: thinking, then the text, then the calls read out of it.
    /// It always has a block, if only an empty text one, since clients commonly read
    /// `content[0]`.
    fn message(
        &self,
        reasoning: &str,
        content: &str,
        o: &Outcome,
        parser: Option<ToolCallParser>,
    ) -> Value {
        let parsed = match parser {
            Some(mut p) => {
                let mut out = ParsedOutput::default();
                out.absorb(p.push(content));
                out.absorb(p.finish());
                out
            }
            None => ParsedOutput {
                content: content.to_string(),
                calls: Vec::new(),
            },
        };
        let mut blocks = Vec::new();
        if !reasoning.is_empty() {
            blocks.push(json!({"type": "thinking", "thinking": reasoning, "signature": ""}));
        }
        if !parsed.content.is_empty() || (blocks.is_empty() && parsed.calls.is_empty()) {
            blocks.push(json!({"type": "text", "text": parsed.content}));
        }
        for c in &parsed.calls {
            // The parser gives valid JSON objects; an empty input is the fallback all the same.
            let input = serde_json::from_str::<Value>(&c.arguments_json)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({}));
            blocks.push(tool_use_block(&c.id, &c.name, input));
        }
        let (reason, seq) = stop_reason(o, !parsed.calls.is_empty());
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": blocks,
            "stop_reason": reason,
            "stop_sequence": seq,
            "usage": usage(o),
            "yomi": yomi_stats(o),
        })
    }

    fn message_start(&self) -> Value {
        json!({
            "type": "message_start",
            "message": {
                "id": self.id,
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                // The prefix cache's share is known only at the end (`message_delta`).
                "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
            },
        })
    }
}

/// The kinds of content block a stream opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    ToolUse,
}

/// One server-sent event: its `event:` name and its data.
pub(crate) type Sent = (&'static str, Value);

/// Turns the engine's events into a stream's events, opening a block when the text switches
/// between reasoning, content and calls, and closing the one open before.
#[derive(Debug, Default)]
struct Blocks {
    /// The index of the open block, or of the next one.
    index: usize,
    open: Option<Block>,
    /// Reads calls out of the content, when the request offered tools.
    parser: Option<ToolCallParser>,
    calls: usize,
}

impl Blocks {
    fn new(parser: Option<ToolCallParser>) -> Self {
        Blocks {
            parser,
            ..Blocks::default()
        }
    }

    fn close(&mut self, out: &mut Vec<Sent>) {
        if self.open.take().is_some() {
            out.push((
                "content_block_stop",
                json!({"type": "content_block_stop", "index": self.index}),
            ));
            self.index += 1;
        }
    }

    fn start(&mut self, kind: Block, block: Value, out: &mut Vec<Sent>) {
        self.close(out);
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": self.index, "content_block": block}),
        ));
        self.open = Some(kind);
    }

    /// Opens a thinking or text block unless one of that kind is open.
    fn switch(&mut self, to: Block, out: &mut Vec<Sent>) {
        if self.open == Some(to) {
            return;
        }
        let block = match to {
            Block::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            _ => json!({"type": "text", "text": ""}),
        };
        self.start(to, block, out);
    }

    fn delta(&self, delta: Value, out: &mut Vec<Sent>) {
        out.push((
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.index, "delta": delta}),
        ));
    }

    fn content(&mut self, text: &str, out: &mut Vec<Sent>) {
        if text.is_empty() {
            return;
        }
        self.switch(Block::Text, out);
        self.delta(json!({"type": "text_delta", "text": text}), out);
    }

    /// What the tool-call parser reported: text, a call's start, its arguments as they come.
    fn tool_events(&mut self, events: Vec<ToolEvent>, out: &mut Vec<Sent>) {
        for ev in events {
            match ev {
                ToolEvent::Text(t) => self.content(&t, out),
                ToolEvent::CallStart { id, name, .. } => {
                    self.calls += 1;
                    self.start(Block::ToolUse, tool_use_block(&id, &name, json!({})), out);
                }
                // The parser finishes one call's arguments before the next call starts.
                ToolEvent::CallArgs { piece, .. } if self.open == Some(Block::ToolUse) => {
                    self.delta(
                        json!({"type": "input_json_delta", "partial_json": piece}),
                        out,
                    );
                }
                ToolEvent::CallArgs { .. } => {}
            }
        }
    }

    fn text(&mut self, s: &Split) -> Vec<Sent> {
        let mut out = Vec::new();
        if !s.reasoning.is_empty() {
            self.switch(Block::Thinking, &mut out);
            self.delta(
                json!({"type": "thinking_delta", "thinking": s.reasoning}),
                &mut out,
            );
        }
        if !s.content.is_empty() {
            match self.parser.as_mut().map(|p| p.push(&s.content)) {
                Some(events) => self.tool_events(events, &mut out),
                None => self.content(&s.content, &mut out),
            }
        }
        out
    }

    /// The end: what the parser still held, an empty text block if there was no block (as
    /// in [`Meta::message`]), the stop reason and the usage, `message_stop`.
    fn finish(&mut self, o: &Outcome) -> Vec<Sent> {
        let mut out = Vec::new();
        if let Some(events) = self.parser.as_mut().map(ToolCallParser::finish) {
            self.tool_events(events, &mut out);
        }
        if self.index == 0 && self.open.is_none() {
            self.switch(Block::Text, &mut out);
        }
        self.close(&mut out);
        let (reason, seq) = stop_reason(o, self.calls > 0);
        out.push((
            "message_delta",
            json!({
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": seq},
                "usage": usage(o),
            }),
        ));
        out.push(("message_stop", json!({"type": "message_stop"})));
        out
    }
}

/// The stream's events for one engine event, and whether the stream ends with them. A
/// failure ends the stream with an `error` event, as Anthropic's streams do.
fn stream_events(blocks: &mut Blocks, ev: Event) -> (Vec<Sent>, bool) {
    match ev {
        Event::Text(s) => (blocks.text(&s), false),
        Event::Done(o) => (blocks.finish(&o), true),
        Event::Failed(e) => (vec![("error", error_json(&e).1)], true),
    }
}

fn sse((name, data): Sent) -> Result<SseEvent, Infallible> {
    Ok(SseEvent::default().event(name).data(data.to_string()))
}

fn stream_response(
    meta: Meta,
    blocks: Blocks,
    rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
    cut: tokio::sync::watch::Receiver<bool>,
) -> Response {
    let head = [
        sse(("message_start", meta.message_start())),
        sse(("ping", json!({"type": "ping"}))),
    ];
    let events = stream::unfold(Some((rx, cut, blocks)), |state| async move {
        let (mut rx, mut cut, mut blocks) = state?;
        let ev = tokio::select! {
            ev = rx.recv() => ev?,
            () = cut_off(&mut cut) => {
                return Some((vec![sse(("error", error_json(&shutting_down()).1))], None));
            }
        };
        let (out, last) = stream_events(&mut blocks, ev);
        let out: Vec<_> = out.into_iter().map(sse).collect();
        // Nothing follows the end, even if shutdown comes before the channel closes.
        Some((out, (!last).then_some((rx, cut, blocks))))
    })
    .flat_map(stream::iter);
    let ping = SseEvent::default()
        .event("ping")
        .data(r#"{"type": "ping"}"#);
    Sse::new(stream::iter(head).chain(events))
        .keep_alive(KeepAlive::new().event(ping))
        .into_response()
}

/// `POST /v1/messages`.
pub(crate) async fn messages(
    State(app): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let stats = StatsRecorder::start();
    let (p, tools) = match body.map_err(body_error).and_then(|b| parse_messages(&b)) {
        Ok(r) => r,
        Err(e) => return error_response(&e),
    };
    let s = match submit(&app, &p, stats).await {
        Ok(s) => s,
        Err(e) => return error_response(&e),
    };
    let serial = format!("{:016x}{:08x}", app.id_salt, s.n);
    // Calls are read in the format the model's template teaches.
    let parser = tools.calls.map(|set| {
        let format = ToolFormat::from_template(app.engine.template.as_ref().map(|t| t.source()));
        ToolCallParser::new(format, set, &format!("{serial}_")).with_max_calls(tools.max_calls)
    });
    let meta = Meta {
        id: format!("msg_{serial}"),
        model: app.shared.cfg.model_name.clone(),
        prompt_tokens: s.prompt_tokens,
    };
    if p.stream {
        return stream_response(meta, Blocks::new(parser), s.events, s.cut);
    }
    match crate::collect(s.events, s.cut).await {
        Ok((reasoning, content, o)) => {
            axum::Json(meta.message(&reasoning, &content, &o, parser)).into_response()
        }
        Err(e) => error_response(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yomi_engine::stats::GenerationStats;

    fn err(body: &str) -> ApiError {
        parse_messages(body.as_bytes()).expect_err(body)
    }

    fn parse(body: &str) -> (ParsedRequest, ToolPlan) {
        parse_messages(body.as_bytes()).expect(body)
    }

    /// The template's messages, tools and thinking switch.
    fn chat(p: &ParsedRequest) -> (&[Value], Option<&Value>, Option<bool>) {
        match &p.prompt {
            PromptSpec::ChatJson {
                messages,
                tools,
                enable_thinking,
            } => (messages, tools.as_ref(), *enable_thinking),
            other => panic!("not chat: {other:?}"),
        }
    }

    #[test]
    fn requests_parse() {
        let (p, tools) = parse(
            r#"{"model":"m","max_tokens":9,"system":[{"type":"text","text":"be "},
            {"type":"text","text":"brief","cache_control":{"type":"ephemeral"}}],
            "messages":[{"role":"user","content":"hi"},
              {"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},
                {"type":"redacted_thinking","data":"x"},{"type":"text","text":"yo"}]},
              {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
            "stop_sequences":["END"],"temperature":0.5,"top_p":0.9,"top_k":3,"stream":true,
            "metadata":{"user_id":"u"},"thinking":{"type":"enabled","budget_tokens":1024}}"#,
        );
        assert_eq!(p.kind, ApiKind::Chat);
        assert_eq!(p.model.as_deref(), Some("m"));
        assert_eq!(p.max_tokens, Some(9));
        assert_eq!(p.stop, vec!["END".to_string()]);
        assert_eq!(
            (p.temperature, p.top_p, p.top_k),
            (Some(0.5), Some(0.9), Some(3))
        );
        assert!(p.stream);
        let (msgs, t, thinking) = chat(&p);
        assert_eq!(thinking, Some(true));
        assert!(t.is_none() && tools.calls.is_none());
        // The same messages the OpenAI route gives its template.
        assert_eq!(
            msgs,
            [
                json!({"role": "system", "content": "be brief"}),
                json!({"role": "user", "content": "hi"}),
                json!({"role": "assistant", "content": "yo", "reasoning_content": "hm"}),
                json!({"role": "user", "content": "ab"}),
            ]
        );
        // Thinking is off unless asked for; an empty system prompt adds no message.
        let (p, _) = parse(
            r#"{"model":"m","max_tokens":1,"system":"","messages":[{"role":"user","content":"x"}]}"#,
        );
        let (msgs, _, thinking) = chat(&p);
        assert_eq!((msgs.len(), thinking), (1, Some(false)));
        assert!(!p.stream && p.stop.is_empty());
    }

    const WEATHER: &str = r#"{"name":"get_weather","description":"Weather now",
        "input_schema":{"type":"object","properties":{"city":{"type":"string"},
        "days":{"type":"integer"}}}}"#;

    #[test]
    fn tools_and_tool_history() {
        let (p, plan) = parse(&format!(
            r#"{{"model":"m","max_tokens":9,"tools":[{WEATHER},{{"name":"now","input_schema":{{"type":"object"}}}}],
            "messages":[{{"role":"user","content":"weather?"}},
              {{"role":"assistant","content":[{{"type":"text","text":"Looking."}},
                {{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{{"city":"Paris"}}}},
                {{"type":"tool_use","id":"toolu_2","name":"now","input":{{}}}}]}},
              {{"role":"user","content":[
                {{"type":"tool_result","tool_use_id":"toolu_1","content":[{{"type":"text","text":"sunny"}}]}},
                {{"type":"tool_result","tool_use_id":"toolu_2","content":"boom","is_error":true}},
                {{"type":"text","text":"thanks"}}]}}]}}"#
        ));
        let (msgs, tools, _) = chat(&p);
        assert_eq!(
            tools,
            Some(&json!([
                {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                 "days": {"type": "integer"}}}}},
                {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}},
            ]))
        );
        assert_eq!(
            msgs,
            [
                json!({"role": "user", "content": "weather?"}),
                json!({"role": "assistant", "content": "Looking.", "tool_calls": [
                    {"id": "toolu_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                    {"id": "toolu_2", "type": "function",
                     "function": {"name": "now", "arguments": {}}}]}),
                json!({"role": "tool", "tool_call_id": "toolu_1", "content": "sunny",
                       "name": "get_weather"}),
                json!({"role": "tool", "tool_call_id": "toolu_2", "content": "Error: boom",
                       "name": "now"}),
                json!({"role": "user", "content": "thanks"}),
            ]
        );
        assert!(plan.calls.is_some() && plan.max_calls == usize::MAX);

        // A chat template sees them as it would see OpenAI's: the tools, the calls with their
        // arguments as objects, the results with the call's id and function name.
        let tpl = yomi_engine::template::ChatTemplate::new(
            concat!(
                "{%- if tools %}{% for t in tools %}[{{ t.function.name }}]{% endfor %}{% endif %}",
                "{%- for m in messages %}<{{ m.role }}>{{ m.content }}",
                "{%- for c in m.tool_calls or [] %}<call {{ c.id }} {{ c.function.name }}",
                "{%- for k, v in c.function.arguments | items %} {{ k }}={{ v }}{% endfor %}>",
                "{%- endfor %}{% if m.role == 'tool' %}({{ m.tool_call_id }} {{ m.name }})",
                "{%- endif %}{% endfor %}"
            ),
            None,
            None,
        )
        .expect("template");
        let text = tpl
            .render_with(msgs, tools, true, None, None)
            .expect("render");
        assert_eq!(
            text,
            "[get_weather][now]<user>weather?<assistant>Looking.<call toolu_1 get_weather \
             city=Paris><call toolu_2 now><tool>sunny(toolu_1 get_weather)<tool>Error: boom\
             (toolu_2 now)<user>thanks"
        );

        // tool_choice: a named tool narrows the calls read; none shows no tools; one call.
        let body = |choice: &str| {
            format!(
                r#"{{"model":"m","max_tokens":9,"tools":[{WEATHER}],"tool_choice":{choice},
                "messages":[{{"role":"user","content":"x"}}]}}"#
            )
        };
        let (p, plan) = parse(&body(r#"{"type":"none"}"#));
        assert!(chat(&p).1.is_none() && plan.calls.is_none());
        let (_, plan) = parse(&body(
            r#"{"type":"tool","name":"get_weather","disable_parallel_tool_use":true}"#,
        ));
        assert!(plan.calls.is_some() && plan.max_calls == 1);
        let (_, plan) = parse(&body(r#"{"type":"any"}"#));
        assert!(plan.calls.is_some());
        let (p, plan) = parse(
            r#"{"model":"m","max_tokens":9,"tools":[],"tool_choice":{"type":"auto"},"messages":[{"role":"user","content":"x"}]}"#,
        );
        assert!(chat(&p).1.is_none() && plan.calls.is_none());
    }

    #[test]
    fn bad_tools_name_the_field() {
        let m = r#""model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}]"#;
        for (extra, param) in [
            (r#""tools":{}"#.to_string(), "tools"),
            (r#""tools":[1]"#.to_string(), "tools.0"),
            (
                r#""tools":[{"input_schema":{}}]"#.to_string(),
                "tools.0.name",
            ),
            (
                r#""tools":[{"name":"a b","input_schema":{}}]"#.to_string(),
                "tools.0.name",
            ),
            (
                r#""tools":[{"name":"a"}]"#.to_string(),
                "tools.0.input_schema",
            ),
            (
                r#""tools":[{"name":"a","input_schema":"x"}]"#.to_string(),
                "tools.0.input_schema",
            ),
            (
                r#""tools":[{"type":"web_search_20250305","name":"web_search"}]"#.to_string(),
                "tools.0.type",
            ),
            (format!(r#""tools":[{WEATHER},{WEATHER}]"#), "tools.1.name"),
            (
                format!(r#""tools":[{WEATHER}],"tool_choice":"auto""#),
                "tool_choice",
            ),
            (
                format!(r#""tools":[{WEATHER}],"tool_choice":{{"type":"some"}}"#),
                "tool_choice.type",
            ),
            (
                format!(r#""tools":[{WEATHER}],"tool_choice":{{"type":"tool"}}"#),
                "tool_choice.name",
            ),
            (
                format!(r#""tools":[{WEATHER}],"tool_choice":{{"type":"tool","name":"x"}}"#),
                "tool_choice.name",
            ),
            (r#""tool_choice":{"type":"any"}"#.to_string(), "tool_choice"),
        ] {
            let e = err(&format!("{{{m},{extra}}}"));
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {e:?}");
        }
        let msgs = |content: &str, role: &str| {
            format!(
                r#"{{"model":"m","max_tokens":5,"messages":[{{"role":"{role}","content":[{content}]}}]}}"#
            )
        };
        for (content, role, param) in [
            (
                r#"{"type":"tool_use","name":"f","input":{}}"#,
                "assistant",
                "messages.0.content.0.id",
            ),
            (
                r#"{"type":"tool_use","id":"i","input":{}}"#,
                "assistant",
                "messages.0.content.0.name",
            ),
            (
                r#"{"type":"tool_use","id":"i","name":"f","input":[]}"#,
                "assistant",
                "messages.0.content.0.input",
            ),
            (
                r#"{"type":"tool_use","id":"i","name":"f","input":{}}"#,
                "user",
                "messages.0.content.0.type",
            ),
            (
                r#"{"type":"tool_result","content":"x"}"#,
                "user",
                "messages.0.content.0.tool_use_id",
            ),
            (
                r#"{"type":"tool_result","tool_use_id":"i","content":5}"#,
                "user",
                "messages.0.content.0.content",
            ),
            (
                r#"{"type":"tool_result","tool_use_id":"i","content":[{"type":"image"}]}"#,
                "user",
                "messages.0.content.0.content.0.type",
            ),
            (
                r#"{"type":"tool_result","tool_use_id":"i","is_error":"y"}"#,
                "user",
                "messages.0.content.0.is_error",
            ),
            (
                r#"{"type":"tool_result","tool_use_id":"i"}"#,
                "assistant",
                "messages.0.content.0.type",
            ),
        ] {
            let e = err(&msgs(content, role));
            assert_eq!(e.param.as_deref(), Some(param), "{content}: {e:?}");
        }
    }

    #[test]
    fn bad_requests_name_the_field() {
        let e = err("{nope");
        assert_eq!(
            (e.status, e.code),
            (StatusCode::BAD_REQUEST, Some("invalid_json"))
        );
        let m = r#""model":"m","messages":[{"role":"user","content":"x"}]"#;
        let mt = r#""max_tokens":5"#;
        for (body, param) in [
            (format!("{{{m}}}"), "max_tokens"),
            (format!(r#"{{{m},"max_tokens":0}}"#), "max_tokens"),
            (format!(r#"{{{m},"max_tokens":"5"}}"#), "max_tokens"),
            (format!(r#"{{"model":"m",{mt}}}"#), "messages"),
            (
                format!(r#"{{"messages":[{{"role":"user","content":"x"}}],{mt}}}"#),
                "model",
            ),
            (format!(r#"{{"model":"m",{mt},"messages":[]}}"#), "messages"),
            (
                format!(r#"{{"model":"m",{mt},"messages":{{}}}}"#),
                "messages",
            ),
            (
                format!(r#"{{"model":"m",{mt},"messages":[1]}}"#),
                "messages.0",
            ),
            (
                format!(r#"{{"model":"m",{mt},"messages":[{{"role":"system","content":"x"}}]}}"#),
                "messages.0.role",
            ),
            (
                format!(r#"{{"model":"m",{mt},"messages":[{{"role":"user"}}]}}"#),
                "messages.0.content",
            ),
            (
                format!(r#"{{"model":"m",{mt},"messages":[{{"role":"user","content":7}}]}}"#),
                "messages.0.content",
            ),
            (
                format!(
                    r#"{{"model":"m",{mt},"messages":[{{"role":"user","content":[{{"type":"image","source":{{}}}}]}}]}}"#
                ),
                "messages.0.content.0.type",
            ),
            (
                format!(
                    r#"{{"model":"m",{mt},"messages":[{{"role":"user","content":[{{"type":"text"}}]}}]}}"#
                ),
                "messages.0.content.0.text",
            ),
            (
                format!(
                    r#"{{"model":"m",{mt},"messages":[{{"role":"user","content":[{{"text":"x"}}]}}]}}"#
                ),
                "messages.0.content.0.type",
            ),
            (
                format!(r#"{{"model":"m",{mt},"messages":[{{"role":"user","content":["x"]}}]}}"#),
                "messages.0.content.0",
            ),
            (
                format!(
                    r#"{{"model":"m",{mt},"messages":[{{"role":"user","content":[{{"type":"thinking","thinking":"x"}}]}}]}}"#
                ),
                "messages.0.content.0.type",
            ),
            (format!(r#"{{{m},{mt},"system":5}}"#), "system"),
            (
                format!(r#"{{{m},{mt},"system":[{{"type":"image"}}]}}"#),
                "system.0.type",
            ),
            (
                format!(r#"{{{m},{mt},"stop_sequences":"x"}}"#),
                "stop_sequences",
            ),
            (
                format!(r#"{{{m},{mt},"stop_sequences":[1]}}"#),
                "stop_sequences",
            ),
            (
                format!(r#"{{{m},{mt},"stop_sequences":["a","b","c","d","e"]}}"#),
                "stop_sequences",
            ),
            (
                format!(r#"{{{m},{mt},"temperature":"hot"}}"#),
                "temperature",
            ),
            (format!(r#"{{{m},{mt},"top_k":-1}}"#), "top_k"),
            (format!(r#"{{{m},{mt},"stream":1}}"#), "stream"),
            (
                format!(r#"{{{m},{mt},"thinking":{{"type":"on"}}}}"#),
                "thinking.type",
            ),
            (format!(r#"{{{m},{mt},"thinking":true}}"#), "thinking"),
        ] {
            let e = err(&body);
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
            // Anthropic's shape, the field leading the message.
            let (status, v) = error_json(&e);
            assert_eq!(status, 400);
            assert_eq!(v["type"], "error");
            assert_eq!(v["error"]["type"], "invalid_request_error");
            let msg = v["error"]["message"].as_str().unwrap_or_default();
            assert!(msg.starts_with(param), "{msg}");
        }
    }

    #[test]
    fn error_types() {
        for (status, want, kind) in [
            (400, 400, "invalid_request_error"),
            (401, 401, "authentication_error"),
            (403, 403, "permission_error"),
            (404, 404, "not_found_error"),
            (408, 408, "invalid_request_error"),
            (413, 413, "request_too_large"),
            (415, 415, "invalid_request_error"),
            (500, 500, "api_error"),
            (503, 529, "overloaded_error"),
        ] {
            let s = StatusCode::from_u16(status).unwrap();
            let (got, k) = error_type(s);
            assert_eq!((got.as_u16(), k), (want, kind), "{status}");
        }
        let e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "busy")
            .with_retry_after(1);
        let r = error_response(&e);
        assert_eq!(r.status().as_u16(), 529);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
    }

    fn outcome(finish: FinishReason, stop: Option<&str>) -> Outcome {
        Outcome {
            prompt_tokens: 10,
            completion_tokens: 4,
            cached_tokens: 3,
            finish,
            stats: GenerationStats::default(),
            drafting: false,
            stop_sequence: stop.map(str::to_string),
        }
    }

    fn meta() -> Meta {
        Meta {
            id: "msg_1".into(),
            model: "m".into(),
            prompt_tokens: 10,
        }
    }

    #[test]
    fn messages_and_stop_reasons() {
        let m = meta().message("", "hi", &outcome(FinishReason::Stop, None), None);
        assert_eq!(m["type"], "message");
        assert_eq!(m["role"], "assistant");
        assert_eq!(m["content"], json!([{"type": "text", "text": "hi"}]));
        assert_eq!(m["stop_reason"], "end_turn");
        assert!(m["stop_sequence"].is_null());
        assert_eq!(
            m["usage"],
            json!({"input_tokens": 7, "output_tokens": 4, "cache_creation_input_tokens": 0,
                   "cache_read_input_tokens": 3})
        );
        let m = meta().message("r", "", &outcome(FinishReason::Stop, Some("END")), None);
        assert_eq!(
            m["content"],
            json!([{"type": "thinking", "thinking": "r", "signature": ""}])
        );
        assert_eq!(
            (m["stop_reason"].clone(), m["stop_sequence"].clone()),
            (json!("stop_sequence"), json!("END"))
        );
        let m = meta().message("", "", &outcome(FinishReason::Length, None), None);
        assert_eq!(m["content"], json!([{"type": "text", "text": ""}]));
        assert_eq!(m["stop_reason"], "max_tokens");
    }

    fn split(reasoning: &str, content: &str) -> Event {
        Event::Text(Split {
            reasoning: reasoning.into(),
            content: content.into(),
        })
    }

    /// The events of a whole stream.
    fn run(events: Vec<Event>) -> Vec<(String, Value)> {
        run_with(Blocks::default(), events)
    }

    fn run_with(mut b: Blocks, events: Vec<Event>) -> Vec<(String, Value)> {
        let mut out = vec![("message_start".to_string(), meta().message_start())];
        for ev in events {
            let (sent, last) = stream_events(&mut b, ev);
            out.extend(sent.into_iter().map(|(n, v)| (n.to_string(), v)));
            if last {
                break;
            }
        }
        out
    }

    fn names(events: &[(String, Value)]) -> Vec<&str> {
        events.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn stream_sequence() {
        let ev = run(vec![
            split("", "Hel"),
            split("", "lo"),
            Event::Done(Box::new(outcome(FinishReason::Length, None))),
        ]);
        assert_eq!(
            names(&ev),
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        // Each data's `type` is its event's name.
        for (n, v) in &ev {
            assert_eq!(v["type"], n.as_str(), "{v}");
        }
        let start = &ev[0].1["message"];
        assert_eq!(start["content"], json!([]));
        assert!(start["stop_reason"].is_null());
        assert_eq!(start["usage"]["input_tokens"], 10);
        assert_eq!(
            ev[1].1["content_block"],
            json!({"type": "text", "text": ""})
        );
        assert_eq!(
            ev[2].1["delta"],
            json!({"type": "text_delta", "text": "Hel"})
        );
        assert!(ev[1..5].iter().all(|(_, v)| v["index"] == 0));
        assert_eq!(ev[5].1["delta"]["stop_reason"], "max_tokens");
        assert_eq!(ev[5].1["usage"]["output_tokens"], 4);

        // Reasoning, then content: two blocks, the first closed before the second opens.
        let ev = run(vec![
            split("th", ""),
            split("ink", "an"),
            split("", "swer"),
            Event::Done(Box::new(outcome(FinishReason::Stop, Some("X")))),
        ]);
        assert_eq!(
            names(&ev),
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(ev[1].1["content_block"]["type"], "thinking");
        assert_eq!(
            ev[3].1["delta"],
            json!({"type": "thinking_delta", "thinking": "ink"})
        );
        assert_eq!(ev[4].1["index"], 0);
        assert_eq!(ev[5].1["index"], 1);
        assert_eq!(ev[5].1["content_block"]["type"], "text");
        assert_eq!(ev[8].1["index"], 1);
        assert_eq!(ev[9].1["delta"]["stop_reason"], "stop_sequence");
        assert_eq!(ev[9].1["delta"]["stop_sequence"], "X");

        // No text at all: still one (empty) text block.
        let ev = run(vec![Event::Done(Box::new(outcome(
            FinishReason::Stop,
            None,
        )))]);
        assert_eq!(
            names(&ev),
            [
                "message_start",
                "content_block_start",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(ev[3].1["delta"]["stop_reason"], "end_turn");

        // A failure ends the stream with an error event.
        let ev = run(vec![
            split("", "a"),
            Event::Failed(ApiError::internal("boom")),
            split("", "never"),
        ]);
        assert_eq!(
            names(&ev),
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "error"
            ]
        );
        assert_eq!(ev[3].1, error_body("api_error", "boom"));
    }

    #[test]
    fn tool_calls_streamed_and_whole_agree() {
        let schema = json!({"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}}});
        let set = ToolSet::from_schemas([("get_weather", Some(&schema))]);
        let parser = || Some(ToolCallParser::new(ToolFormat::QwenXml, set.clone(), "x_"));
        let text = "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n\
                    </parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
        let o = outcome(FinishReason::Stop, None);
        let m = meta().message("", text, &o, parser());
        let call = json!({"type": "tool_use", "id": "toolu_x_0", "name": "get_weather",
                          "input": {"city": "Paris", "days": 3}});
        assert_eq!(
            m["content"],
            json!([{"type": "text", "text": "Let me check."}, call])
        );
        assert_eq!(m["stop_reason"], "tool_use");
        // Cut off by the token limit, it is still `max_tokens`.
        let cut = meta().message("", text, &outcome(FinishReason::Length, None), parser());
        assert_eq!(cut["stop_reason"], "max_tokens");
        // Without tools the same text is text.
        let plain = meta().message("", text, &o, None);
        assert_eq!(plain["content"], json!([{"type": "text", "text": text}]));

        // Streamed three characters at a time: a text block, then a tool_use block whose
        // `input_json_delta`s make the same input.
        let chars: Vec<char> = text.chars().collect();
        let mut events: Vec<Event> = chars
            .chunks(3)
            .map(|c| split("", &c.iter().collect::<String>()))
            .collect();
        events.push(Event::Done(Box::new(o.clone())));
        let ev = run_with(Blocks::new(parser()), events);
        let starts: Vec<&Value> = ev
            .iter()
            .filter(|(n, _)| n == "content_block_start")
            .map(|(_, v)| v)
            .collect();
        assert_eq!(starts.len(), 2);
        assert_eq!(starts[0]["content_block"]["type"], "text");
        assert_eq!(
            starts[1],
            &json!({"type": "content_block_start", "index": 1, "content_block":
                    {"type": "tool_use", "id": "toolu_x_0", "name": "get_weather", "input": {}}})
        );
        let mut streamed_text = String::new();
        let mut json_text = String::new();
        for (n, v) in &ev {
            if n != "content_block_delta" {
                continue;
            }
            match v["delta"]["type"].as_str() {
                Some("text_delta") => {
                    assert_eq!(v["index"], 0);
                    streamed_text.push_str(v["delta"]["text"].as_str().unwrap_or_default());
                }
                Some("input_json_delta") => {
                    assert_eq!(v["index"], 1);
                    json_text.push_str(v["delta"]["partial_json"].as_str().unwrap_or_default());
                }
                other => panic!("unexpected delta {other:?}"),
            }
        }
        assert_eq!(streamed_text, "Let me check.");
        let input: Value = serde_json::from_str(&json_text).expect("arguments JSON");
        assert_eq!(input, call["input"]);
        let stops = ev.iter().filter(|(n, _)| n == "content_block_stop").count();
        assert_eq!(stops, 2);
        let delta = &ev[ev.len() - 2];
        assert_eq!(delta.0, "message_delta");
        assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");
    }
}
