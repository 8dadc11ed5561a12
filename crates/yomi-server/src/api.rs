//! The OpenAI request bodies yomi accepts, parsed field by field so that an error names the
//! parameter at fault, and the response and chunk shapes it sends.

use serde_json::{Map, Value, json};
use yomi_engine::FinishReason;
use yomi_engine::generate::validate_stop;
use yomi_engine::stats::GenerationStats;
use yomi_engine::template::ChatMessage;

use crate::chat_tools::{self, ToolChat, ToolChoice};
use crate::error::ApiError;
use crate::structured::{self, CallSpec, OutputSpec};

/// Which API a request came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiKind {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Completion,
}

/// What to generate from.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptSpec {
    /// A conversation for the chat template, with its extra template kwargs.
    Chat {
        messages: Vec<ChatMessage>,
        enable_thinking: Option<bool>,
        kwargs: Map<String, Value>,
    },
    /// A conversation as JSON messages in the template's own terms, as Anthropic's route makes
    /// them (assistant `tool_calls` whose `function.arguments` are objects, `tool` messages
    /// with `tool_call_id`), and OpenAI-style function tools for the template.
    ChatJson {
        messages: Vec<Value>,
        tools: Option<Value>,
        enable_thinking: Option<bool>,
    },
    /// A conversation that involves tools (offered functions, or calls and their results in
    /// the messages), its messages in the shape the template reads ([`crate::chat_tools`]).
    ChatWithTools(Box<ToolChat>),
    /// Raw text.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
}

/// A parsed, type-checked request (range checks that need the model come later).
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedRequest {
    pub kind: ApiKind,
    pub model: Option<String>,
    pub prompt: PromptSpec,
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// 0 = off (−1 is accepted as off, as vLLM does).
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// What the output's form must be (`response_format`, forced tool calls).
    pub output: OutputSpec,
}

pub(crate) fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("the request body is not valid JSON: {e}"))
            .with_code("invalid_json")
    })?;
    match v {
        Value::Object(m) => Ok(m),
        other => Err(ApiError::bad_request(format!(
            "the request body must be a JSON object, got {}",
            kind_name(&other)
        ))),
    }
}

pub(crate) fn kind_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A field, `None` when missing or null.
pub(crate) fn field<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    m.get(key).filter(|v| !v.is_null())
}

pub(crate) fn opt_f32(m: &Map<String, Value>, key: &str) -> Result<Option<f32>, ApiError> {
    match field(m, key) {
        None => Ok(None),
        Some(Value::Number(n)) => n
            .as_f64()
            .filter(|x| x.is_finite())
            .map(|x| Some(x as f32))
            .ok_or_else(|| ApiError::bad_param(key, format!("`{key}` must be a finite number"))),
        Some(v) => Err(ApiError::bad_param(
            key,
            format!("`{key}` must be a number, got {}", kind_name(v)),
        )),
    }
}

/// An integer field; i128 holds every JSON integer serde_json parses (i64 and u64), so a
/// value above i64::MAX is not wrapped to a negative one.
pub(crate) fn opt_int(m: &Map<String, Value>, key: &str) -> Result<Option<i128>, ApiError> {
    match field(m, key) {
        None => Ok(None),
        Some(Value::Number(n)) => {
            if let Some(i) = n.as_i64() {
                Ok(Some(i.into()))
            } else if let Some(u) = n.as_u64() {
                Ok(Some(u.into()))
            } else {
                Err(ApiError::bad_param(
                    key,
                    format!("`{key}` must be an integer, got {n}"),
                ))
            }
        }
        Some(v) => Err(ApiError::bad_param(
            key,
            format!("`{key}` must be an integer, got {}", kind_name(v)),
        )),
    }
}

pub(crate) fn opt_bool(m: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match field(m, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(ApiError::bad_param(
            key,
            format!("`{key}` must be a boolean, got {}", kind_name(v)),
        )),
    }
}

pub(crate) fn opt_str(m: &Map<String, Value>, key: &str) -> Result<Option<String>, ApiError> {
    match field(m, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(ApiError::bad_param(
            key,
            format!("`{key}` must be a string, got {}", kind_name(v)),
        )),
    }
}

/// `stop`: a string or a list of strings, within the engine's limits on their number and
/// length ([`validate_stop`]).
fn parse_stop(m: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let stop = match field(m, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str().map(str::to_string).ok_or_else(|| {
                    ApiError::bad_param("stop", "`stop` must be a string or a list of strings")
                })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::bad_param(
                "stop",
                "`stop` must be a string or a list of strings",
            ));
        }
    };
    validate_stop(&stop).map_err(|e| ApiError::bad_param("stop", format!("`stop`: {e}")))?;
    Ok(stop)
}

/// Parameters that would change the output in ways yomi does not implement are refused
/// rather than ignored.
fn refuse_unsupported(m: &Map<String, Value>) -> Result<(), ApiError> {
    if let Some(n) = opt_int(m, "n")?
        && n != 1
    {
        return Err(ApiError::bad_param(
            "n",
            format!("only n = 1 is supported, got {n}"),
        ));
    }
    for key in ["frequency_penalty", "presence_penalty"] {
        if let Some(x) = opt_f32(m, key)?
            && x != 0.0
        {
            return Err(ApiError::bad_param(
                key,
                format!("`{key}` is not supported (only 0)"),
            ));
        }
    }
    match field(m, "logprobs") {
        None | Some(Value::Bool(false)) => {}
        Some(_) => {
            return Err(ApiError::bad_param(
                "logprobs",
                "logprobs are not supported",
            ));
        }
    }
    match field(m, "logit_bias") {
        None => {}
        Some(Value::Object(o)) if o.is_empty() => {}
        Some(Value::Object(_)) => {
            return Err(ApiError::bad_param(
                "logit_bias",
                "`logit_bias` is not supported",
            ));
        }
        Some(v) => {
            return Err(ApiError::bad_param(
                "logit_bias",
                format!(
                    "`logit_bias` must be an object (and is not supported), got {}",
                    kind_name(v)
                ),
            ));
        }
    }
    if let Some(b) = opt_int(m, "best_of")?
        && b != 1
    {
        return Err(ApiError::bad_param(
            "best_of",
            format!("only best_of = 1 is supported, got {b}"),
        ));
    }
    if opt_bool(m, "echo")? == Some(true) {
        return Err(ApiError::bad_param("echo", "`echo` is not supported"));
    }
    if let Some(s) = opt_str(m, "suffix")?
        && !s.is_empty()
    {
        return Err(ApiError::bad_param("suffix", "`suffix` is not supported"));
    }
    Ok(())
}

/// The fields both APIs share.
fn parse_common(
    m: &Map<String, Value>,
    kind: ApiKind,
    prompt: PromptSpec,
) -> Result<ParsedRequest, ApiError> {
    refuse_unsupported(m)?;
    let max_tokens = match opt_int(m, "max_completion_tokens")? {
        Some(n) => Some(("max_completion_tokens", n)),
        None => opt_int(m, "max_tokens")?.map(|n| ("max_tokens", n)),
    };
    let max_tokens = match max_tokens {
        None => None,
        Some((key, n)) if n < 1 => {
            return Err(ApiError::bad_param(
                key,
                format!("`{key}` must be at least 1, got {n}"),
            ));
        }
        Some((_, n)) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
    };
    let top_k = match opt_int(m, "top_k")? {
        None => None,
        Some(-1) | Some(0) => Some(0),
        Some(k) if k < 0 => {
            return Err(ApiError::bad_param(
                "top_k",
                format!("`top_k` must be ≥ 0 (or −1 for off), got {k}"),
            ));
        }
        Some(k) => Some(usize::try_from(k).unwrap_or(usize::MAX)),
    };
    let stream = opt_bool(m, "stream")?.unwrap_or(false);
    let include_usage = match field(m, "stream_options") {
        None => false,
        Some(Value::Object(o)) => opt_bool(o, "include_usage")
            .map_err(|e| e.with_param("stream_options.include_usage"))?
            .unwrap_or(false),
        Some(v) => {
            return Err(ApiError::bad_param(
                "stream_options",
                format!("`stream_options` must be an object, got {}", kind_name(v)),
            ));
        }
    };
    Ok(ParsedRequest {
        kind,
        model: opt_str(m, "model")?,
        prompt,
        max_tokens,
        temperature: opt_f32(m, "temperature")?,
        top_p: opt_f32(m, "top_p")?,
        top_k,
        min_p: opt_f32(m, "min_p")?,
        seed: opt_int(m, "seed")?.map(|s| s as u64),
        stop: parse_stop(m)?,
        stream,
        include_usage,
        output: OutputSpec {
            answer: structured::parse_response_format(field(m, "response_format"))?,
            calls: None,
        },
    })
}

/// A message's `content`: a string, null, or a list of text parts.
fn message_content(v: Option<&Value>, i: usize) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (Some(other), _) if other != "text" => {
                        return Err(ApiError::bad_param(
                            &param,
                            format!("content parts of type {other:?} are not supported"),
                        ));
                    }
                    _ => {
                        return Err(ApiError::bad_param(
                            &param,
                            "a content part must be {\"type\": \"text\", \"text\": \"…\"}",
                        ));
                    }
                }
            }
            Ok(text)
        }
        Some(other) => Err(ApiError::bad_param(
            &param,
            format!(
                "`content` must be a string or a list of parts, got {}",
                kind_name(other)
            ),
        )),
    }
}

/// Parses a `/v1/chat/completions` body.
pub fn parse_chat(body: &[u8]) -> Result<ParsedRequest, ApiError> {
    let m = parse_object(body)?;
    let list = match field(&m, "messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => {
            return Err(ApiError::bad_param("messages", "`messages` is empty"));
        }
        Some(v) => {
            return Err(ApiError::bad_param(
                "messages",
                format!("`messages` must be a list, got {}", kind_name(v)),
            ));
        }
        None => {
            return Err(ApiError::bad_param("messages", "`messages` is required"));
        }
    };
    let mut messages = Vec::with_capacity(list.len());
    // Each message's tool fields (`tool_calls`, `tool_call_id`, `name`), when it has any.
    let mut tool_fields: Vec<Option<Map<String, Value>>> = Vec::with_capacity(list.len());
    for (i, msg) in list.iter().enumerate() {
        let Value::Object(o) = msg else {
            return Err(ApiError::bad_param(
                &format!("messages[{i}]"),
                format!("a message must be an object, got {}", kind_name(msg)),
            ));
        };
        let role = opt_str(o, "role")
            .map_err(|e| e.with_param(&format!("messages[{i}].role")))?
            .ok_or_else(|| {
                ApiError::bad_param(&format!("messages[{i}].role"), "a message needs a `role`")
            })?;
        let role = match role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            other => {
                let shown: String = other.chars().take(64).collect();
                return Err(ApiError::bad_param(
                    &format!("messages[{i}].role"),
                    format!(
                        "unsupported role {shown:?} (expected system, developer, user, assistant \
                         or tool)"
                    ),
                ));
            }
        };
        let content = message_content(o.get("content"), i)?;
        let reasoning = opt_str(o, "reasoning_content")
            .map_err(|e| e.with_param(&format!("messages[{i}].reasoning_content")))?;
        let mut cm = ChatMessage::new(role, content);
        if role == "assistant" {
            cm.reasoning_content = reasoning.filter(|r| !r.is_empty());
        }
        messages.push(cm);
        let mut extra = Map::new();
        if role == "assistant"
            && let Some(calls) = field(o, "tool_calls")
        {
            let calls =
                chat_tools::parse_message_tool_calls(calls, &format!("messages[{i}].tool_calls"))?;
            if !calls.is_empty() {
                extra.insert("tool_calls".into(), Value::Array(calls));
            }
        }
        if role == "tool"
            && let Some(id) = opt_str(o, "tool_call_id")
                .map_err(|e| e.with_param(&format!("messages[{i}].tool_call_id")))?
        {
            extra.insert("tool_call_id".into(), Value::String(id));
        }
        if let Some(name) =
            opt_str(o, "name").map_err(|e| e.with_param(&format!("messages[{i}].name")))?
        {
            // Some templates show a tool result's function name.
            if role == "tool" {
                extra.insert("name".into(), Value::String(name));
            }
        }
        tool_fields.push((!extra.is_empty()).then_some(extra));
    }
    let mut kwargs = match field(&m, "chat_template_kwargs") {
        None => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(v) => {
            return Err(ApiError::bad_param(
                "chat_template_kwargs",
                format!(
                    "`chat_template_kwargs` must be an object, got {}",
                    kind_name(v)
                ),
            ));
        }
    };
    let enable_thinking = match kwargs.remove("enable_thinking") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(b),
        Some(_) => {
            return Err(ApiError::bad_param(
                "chat_template_kwargs.enable_thinking",
                "`enable_thinking` must be a boolean",
            ));
        }
    };
    let tools = chat_tools::parse_tools(field(&m, "tools"))?;
    let choice = chat_tools::parse_tool_choice(field(&m, "tool_choice"), &tools)?;
    let parallel = opt_bool(&m, "parallel_tool_calls")?.unwrap_or(true);
    let calls = match &choice {
        _ if tools.is_empty() => None,
        ToolChoice::None => None,
        ToolChoice::Auto | ToolChoice::Required => Some(CallSpec {
            functions: structured::functions(&tools, None),
            parallel,
            forced: choice == ToolChoice::Required,
        }),
        ToolChoice::Named(name) => Some(CallSpec {
            functions: structured::functions(&tools, Some(name)),
            parallel,
            forced: true,
        }),
    };
    let prompt = if tools.is_empty() && tool_fields.iter().all(Option::is_none) {
        PromptSpec::Chat {
            messages,
            enable_thinking,
            kwargs,
        }
    } else {
        // The template reads the messages as JSON objects, tool fields included.
        let messages = messages
            .iter()
            .zip(tool_fields)
            .map(|(cm, extra)| {
                let mut v = serde_json::to_value(cm).unwrap_or(Value::Null);
                if let (Value::Object(o), Some(extra)) = (&mut v, extra) {
                    o.extend(extra);
                }
                v
            })
            .collect();
        PromptSpec::ChatWithTools(Box::new(ToolChat {
            messages,
            enable_thinking,
            kwargs,
            tools,
            choice,
            parallel,
        }))
    };
    let mut p = parse_common(&m, ApiKind::Chat, prompt)?;
    p.output.calls = calls;
    Ok(p)
}

/// Parses a `/v1/completions` body (one prompt: a string, a list of one string, or token ids).
pub fn parse_completion(body: &[u8]) -> Result<ParsedRequest, ApiError> {
    let m = parse_object(body)?;
    let bad = || {
        ApiError::bad_param(
            "prompt",
            "`prompt` must be a string or a list of token ids (one prompt per request)",
        )
    };
    let ids = |a: &[Value]| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(bad)
            })
            .collect()
    };
    let prompt = match field(&m, "prompt") {
        None => return Err(ApiError::bad_param("prompt", "`prompt` is required")),
        Some(Value::String(s)) => PromptSpec::Text(s.clone()),
        Some(Value::Array(a)) => match a.as_slice() {
            [Value::String(s)] => PromptSpec::Text(s.clone()),
            [Value::Array(inner)] => PromptSpec::Ids(ids(inner)?),
            a if !a.is_empty() && a.iter().all(Value::is_number) => PromptSpec::Ids(ids(a)?),
            _ => return Err(bad()),
        },
        Some(_) => return Err(bad()),
    };
    // Tools are a chat feature: the chat template is what shows them to the model.
    match field(&m, "tools") {
        None => {}
        Some(Value::Array(t)) if t.is_empty() => {}
        Some(_) => {
            return Err(ApiError::bad_param(
                "tools",
                "`tools` needs /v1/chat/completions (a text prompt has no template to show them)",
            ));
        }
    }
    parse_common(&m, ApiKind::Completion, prompt)
}

/// The finish reason as OpenAI names it (a cancelled request has no reader anyway).
pub fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    }
}

/// What a finished request reports.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    pub finish: FinishReason,
    pub stats: GenerationStats,
    /// A drafter proposed tokens (then `spec_verify_ct` is reported).
    pub drafting: bool,
    /// The stop string that ended the output, if one did (Anthropic's `stop_sequence`).
    pub stop_sequence: Option<String>,
}

/// `usage`: OpenAI's three counts, `prompt_tokens_details.cached_tokens`, yomi's
/// `prefill_tokens` (prompt tokens actually prefilled) and, when drafting ran,
/// `spec_verify_ct` (target verify passes).
pub fn usage(o: &Outcome) -> Value {
    let mut u = json!({
        "prompt_tokens": o.prompt_tokens,
        "completion_tokens": o.completion_tokens,
        "total_tokens": o.prompt_tokens + o.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": o.cached_tokens},
        "prefill_tokens": o.prompt_tokens - o.cached_tokens,
    });
    if o.drafting {
        u["spec_verify_ct"] = json!(o.stats.verify_passes);
    }
    u
}

/// yomi's own stats block (DESIGN §8 definitions).
pub fn yomi_stats(o: &Outcome) -> Value {
    let mut s = serde_json::to_value(&o.stats).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut s {
        m.insert("cached_tokens".into(), json!(o.cached_tokens));
    }
    s
}

/// Identity of one response.
#[derive(Clone, Debug)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub kind: ApiKind,
    pub include_usage: bool,
}

pub const SYSTEM_FINGERPRINT: &str = concat!("yomi-", env!("CARGO_PKG_VERSION"));

impl ResponseMeta {
    /// The non-streaming response.
    pub fn full(&self, reasoning: &str, content: &str, o: &Outcome) -> Value {
        let choice = match self.kind {
            ApiKind::Chat => {
                let mut msg = json!({"role": "assistant", "content": content});
                if !reasoning.is_empty() {
                    msg["reasoning_content"] = json!(reasoning);
                }
                json!({
                    "index": 0,
                    "message": msg,
                    "logprobs": null,
                    "finish_reason": finish_name(o.finish),
                })
            }
            ApiKind::Completion => json!({
                "index": 0,
                "text": content,
                "logprobs": null,
                "finish_reason": finish_name(o.finish),
            }),
        };
        json!({
            "id": self.id,
            "object": match self.kind {
                ApiKind::Chat => "chat.completion",
                ApiKind::Completion => "text_completion",
            },
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [choice],
            "usage": usage(o),
            "yomi": yomi_stats(o),
        })
    }

    fn chunk(&self, choices: Value) -> Value {
        let mut c = json!({
            "id": self.id,
            "object": match self.kind {
                ApiKind::Chat => "chat.completion.chunk",
                ApiKind::Completion => "text_completion",
            },
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": choices,
        });
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }

    /// The first chunk of a chat stream: the assistant role.
    pub fn role_chunk(&self) -> Option<Value> {
        (self.kind == ApiKind::Chat).then(|| {
            self.chunk(json!([{
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": null,
                "finish_reason": null,
            }]))
        })
    }

    /// A text chunk: reasoning or content.
    pub fn text_chunk(&self, text: &str, reasoning: bool) -> Value {
        match self.kind {
            ApiKind::Chat => {
                let key = if reasoning {
                    "reasoning_content"
                } else {
                    "content"
                };
                self.chunk(json!([{
                    "index": 0,
                    "delta": {key: text},
                    "logprobs": null,
                    "finish_reason": null,
                }]))
            }
            ApiKind::Completion => self.chunk(json!([{
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": null,
            }])),
        }
    }

    /// The chunk that carries the finish reason.
    pub fn finish_chunk(&self, o: &Outcome) -> Value {
        match self.kind {
            ApiKind::Chat => self.chunk(json!([{
                "index": 0,
                "delta": {},
                "logprobs": null,
                "finish_reason": finish_name(o.finish),
            }])),
            ApiKind::Completion => self.chunk(json!([{
                "index": 0,
                "text": "",
                "logprobs": null,
                "finish_reason": finish_name(o.finish),
            }])),
        }
    }

    /// With `stream_options.include_usage`: the last chunk, no choices, the usage.
    pub fn usage_chunk(&self, o: &Outcome) -> Value {
        let mut c = self.chunk(json!([]));
        c["usage"] = usage(o);
        c["yomi"] = yomi_stats(o);
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(r: Result<ParsedRequest, ApiError>) -> ApiError {
        r.expect_err("expected an error")
    }

    #[test]
    fn chat_bodies_parse() {
        let body = br#"{"model":"m","messages":[
            {"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]},
            {"role":"assistant","content":"ok","reasoning_content":"thought"},
            {"role":"developer","content":"dev"}],
            "max_completion_tokens":7,"max_tokens":99,"temperature":0.5,"top_p":0.9,"top_k":-1,
            "min_p":0.1,"seed":-3,"stop":"END","stream":true,"stream_options":{"include_usage":true},
            "chat_template_kwargs":{"enable_thinking":false,"x":1},"n":1,"user":"ignored"}"#;
        let r = parse_chat(body).expect("parse");
        assert_eq!(r.model.as_deref(), Some("m"));
        assert_eq!(r.max_tokens, Some(7));
        assert_eq!(r.temperature, Some(0.5));
        assert_eq!(r.top_k, Some(0));
        assert_eq!(r.seed, Some((-3i64) as u64));
        assert_eq!(r.stop, vec!["END".to_string()]);
        assert!(r.stream && r.include_usage);
        let PromptSpec::Chat {
            messages,
            enable_thinking,
            kwargs,
        } = r.prompt
        else {
            panic!("not chat");
        };
        assert_eq!(enable_thinking, Some(false));
        assert_eq!(kwargs.get("x"), Some(&json!(1)));
        assert_eq!(messages[1].content, "hi there");
        assert_eq!(messages[2].reasoning_content.as_deref(), Some("thought"));
        assert_eq!(messages[3].role, "system");
    }

    #[test]
    fn bad_chat_bodies_name_the_problem() {
        let e = err(parse_chat(b"{not json"));
        assert_eq!(e.status, 400);
        assert_eq!(e.code, Some("invalid_json"));
        assert!(err(parse_chat(b"[1]")).message.contains("object"));
        assert_eq!(err(parse_chat(b"{}")).param.as_deref(), Some("messages"));
        assert_eq!(
            err(parse_chat(br#"{"messages":[]}"#)).param.as_deref(),
            Some("messages")
        );
        let m = r#""messages":[{"role":"user","content":"x"}]"#;
        for (extra, param) in [
            (r#""temperature":"hot""#, "temperature"),
            (r#""max_tokens":0"#, "max_tokens"),
            (r#""max_tokens":1.5"#, "max_tokens"),
            (r#""top_k":-2"#, "top_k"),
            (r#""stop":[1]"#, "stop"),
            (r#""stream":"yes""#, "stream"),
            (r#""n":2"#, "n"),
            (r#""logprobs":true"#, "logprobs"),
            (r#""tools":[{"type":"function"}]"#, "tools[0].function"),
            (r#""presence_penalty":0.5"#, "presence_penalty"),
            (r#""tools":"f""#, "tools"),
            (r#""tool_choice":"required""#, "tool_choice"),
            (
                r#""response_format":{"type":"yaml"}"#,
                "response_format.type",
            ),
            (r#""logit_bias":{"1":5}"#, "logit_bias"),
            (r#""best_of":2"#, "best_of"),
            (r#""stop":["a","b","c","d","e"]"#, "stop"),
            (
                r#""stream_options":{"include_usage":1}"#,
                "stream_options.include_usage",
            ),
            (
                r#""chat_template_kwargs":{"enable_thinking":"no"}"#,
                "chat_template_kwargs.enable_thinking",
            ),
        ] {
            let body = format!("{{{m},{extra}}}");
            let e = err(parse_chat(body.as_bytes()));
            assert_eq!(e.status, 400, "{extra}");
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {e:?}");
        }
        let e = err(parse_chat(
            br#"{"messages":[{"role":"function","content":"x"}]}"#,
        ));
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        let e = err(parse_chat(
            br#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#,
        ));
        assert_eq!(e.param.as_deref(), Some("messages[0].content"));
        // Null and empty fields are as if absent.
        let body = format!(r#"{{{m},"temperature":null,"tools":[],"logprobs":false,"stop":null}}"#);
        assert!(parse_chat(body.as_bytes()).is_ok());
        let body = format!(
            r#"{{{m},"response_format":{{"type":"text"}},"logit_bias":{{}},"best_of":1,"tools":null}}"#
        );
        assert!(parse_chat(body.as_bytes()).is_ok());
        // JSON formats are read into the schema the output must match.
        let body = format!(r#"{{{m},"response_format":{{"type":"json_object"}}}}"#);
        let p = parse_chat(body.as_bytes()).unwrap();
        assert_eq!(p.output.answer, Some(json!({"type": "object"})));
        assert!(p.output.calls.is_none());
        // Integers past i64::MAX keep their value.
        let body = format!(r#"{{{m},"max_tokens":9223372036854775808}}"#);
        assert_eq!(
            parse_chat(body.as_bytes()).unwrap().max_tokens,
            Some(1usize << 63)
        );
    }

    #[test]
    fn completion_prompts() {
        let p = |b: &str| parse_completion(b.as_bytes()).map(|r| r.prompt);
        assert_eq!(
            p(r#"{"prompt":"abc"}"#).unwrap(),
            PromptSpec::Text("abc".into())
        );
        assert_eq!(
            p(r#"{"prompt":["abc"]}"#).unwrap(),
            PromptSpec::Text("abc".into())
        );
        assert_eq!(
            p(r#"{"prompt":[1,2,3]}"#).unwrap(),
            PromptSpec::Ids(vec![1, 2, 3])
        );
        assert_eq!(
            p(r#"{"prompt":[[4,5]]}"#).unwrap(),
            PromptSpec::Ids(vec![4, 5])
        );
        for bad in [
            r#"{}"#,
            r#"{"prompt":["a","b"]}"#,
            r#"{"prompt":[-1]}"#,
            r#"{"prompt":{}}"#,
            r#"{"prompt":[]}"#,
        ] {
            assert_eq!(
                p(bad).unwrap_err().param.as_deref(),
                Some("prompt"),
                "{bad}"
            );
        }
        assert!(parse_completion(br#"{"prompt":"x","echo":true}"#).is_err());
    }

    #[test]
    fn shapes() {
        let o = Outcome {
            prompt_tokens: 10,
            completion_tokens: 5,
            cached_tokens: 4,
            finish: FinishReason::Length,
            stats: GenerationStats {
                verify_passes: 3,
                ..Default::default()
            },
            drafting: true,
            stop_sequence: None,
        };
        let u = usage(&o);
        assert_eq!(u["total_tokens"], 15);
        assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 4);
        assert_eq!(u["prefill_tokens"], 6);
        assert_eq!(u["spec_verify_ct"], 3);
        let plain = usage(&Outcome {
            drafting: false,
            ..o.clone()
        });
        assert!(plain.get("spec_verify_ct").is_none());
        let meta = ResponseMeta {
            id: "chatcmpl-1".into(),
            created: 1,
            model: "m".into(),
            kind: ApiKind::Chat,
            include_usage: true,
        };
        let full = meta.full("r", "c", &o);
        assert_eq!(full["object"], "chat.completion");
        assert_eq!(full["choices"][0]["message"]["reasoning_content"], "r");
        assert_eq!(full["choices"][0]["finish_reason"], "length");
        let c = meta.text_chunk("x", true);
        assert_eq!(c["choices"][0]["delta"]["reasoning_content"], "x");
        assert!(c["usage"].is_null() && c.get("usage").is_some());
        let u = meta.usage_chunk(&o);
        assert_eq!(u["choices"], json!([]));
        assert_eq!(u["usage"]["completion_tokens"], 5);
        let no_reasoning = meta.full("", "c", &o);
        assert!(
            no_reasoning["choices"][0]["message"]
                .get("reasoning_content")
                .is_none()
        );
    }
}
