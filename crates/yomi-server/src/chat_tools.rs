//! Tool calling in `/v1/chat/completions`: the request's `tools`, `tool_choice` and
//! `parallel_tool_calls`, the messages that carry calls and their results, rendering them with
//! the model's own template, and turning the output into `tool_calls` (whole, or as stream
//! chunks). The text parsing itself is [`crate::tools`].
//!
//! Templates get what transformers' `apply_chat_template(messages, tools=…)` gives them: `tools`
//! as a list of `{"type": "function", "function": {name, description, parameters}}`, assistant
//! messages with `tool_calls` whose `function.arguments` is a mapping (Qwen's and Llama's
//! templates iterate it or pass it to `tojson`; OpenAI clients send it as a JSON string, which
//! is parsed here as vLLM does), and `role: "tool"` messages with `tool_call_id` and `content`.

use serde_json::{Map, Value, json};
use yomi_engine::FinishReason;
use yomi_engine::template::ChatTemplate;

use crate::api::{Outcome, ResponseMeta};
use crate::error::ApiError;
use crate::tools::{ParsedOutput, ToolCallParser, ToolEvent, ToolFormat, ToolSet};

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (the default).
    Auto,
    /// No tools: they are not rendered and the output is not parsed for calls.
    None,
    /// The model must call a tool.
    Required,
    /// The model must call this function.
    Named(String),
}

/// A chat request that involves tools: offered functions, or earlier calls and results in
/// the conversation.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolChat {
    /// The messages as the template sees them (OpenAI's shape, arguments as mappings).
    pub messages: Vec<Value>,
    pub enable_thinking: Option<bool>,
    /// Extra template kwargs (`chat_template_kwargs`).
    pub kwargs: Map<String, Value>,
    /// The offered functions, checked, in OpenAI's shape (may be empty).
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true): false reports at most one call.
    pub parallel: bool,
}

impl ToolChat {
    /// The `tools` the template gets: none under `tool_choice: "none"`.
    pub fn template_tools(&self) -> Option<Value> {
        (!self.tools.is_empty() && self.choice != ToolChoice::None)
            .then(|| Value::Array(self.tools.clone()))
    }

    /// Renders the conversation with the model's template, ready for the answer.
    ///
    /// `tool_choice: "required"` and a named function render the tools as `"auto"` does:
    /// what makes the model call one (with arguments that match their schema) is the grammar
    /// its output is decoded under ([`crate::structured`]), not the prompt.
    pub fn render(&self, tpl: &ChatTemplate) -> anyhow::Result<String> {
        let tools = self.template_tools();
        let extra = (!self.kwargs.is_empty()).then_some(&self.kwargs);
        tpl.render_with(
            self.messages.as_slice(),
            tools.as_ref(),
            true,
            self.enable_thinking,
            extra,
        )
    }

    /// The parser for this request's output, `None` when there is nothing to parse (no
    /// tools, or `tool_choice: "none"`). `template` is the model's template text, which tells
    /// the format; `id_base` makes call ids unique to the response.
    pub fn parser(&self, template: Option<&str>, id_base: &str) -> Option<ToolCallParser> {
        if self.tools.is_empty() || self.choice == ToolChoice::None {
            return None;
        }
        let mut set = ToolSet::from_openai(&self.tools);
        if let ToolChoice::Named(name) = &self.choice {
            set = set.only(name);
        }
        let p = ToolCallParser::new(ToolFormat::from_template(template), set, id_base);
        Some(if self.parallel {
            p
        } else {
            p.with_max_calls(1)
        })
    }
}

fn bad(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::bad_param(param, msg)
}

fn kind_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A function name the parser can find again in the output.
fn check_name(v: Option<&Value>, param: &str) -> Result<String, ApiError> {
    match v {
        Some(Value::String(s))
            if !s.is_empty()
                && s.len() <= 256
                && !s.chars().any(|c| c.is_whitespace() || c == '<' || c == '>') =>
        {
            Ok(s.clone())
        }
        Some(Value::String(_)) => Err(bad(
            param,
            "a function name must be 1 to 256 bytes, without spaces or angle brackets",
        )),
        Some(v) => Err(bad(
            param,
            format!("a function name must be a string, got {}", kind_name(v)),
        )),
        None => Err(bad(param, "a function needs a `name`")),
    }
}

/// `tools`: a list of `{"type": "function", "function": {"name", "description"?,
/// "parameters"?}}`. Returned as given (the template sees what the client sent).
pub fn parse_tools(v: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(v) => {
            return Err(bad(
                "tools",
                format!("`tools` must be a list, got {}", kind_name(v)),
            ));
        }
    };
    for (i, t) in list.iter().enumerate() {
        let param = format!("tools[{i}]");
        let Value::Object(o) = t else {
            return Err(bad(
                &param,
                format!("a tool must be an object, got {}", kind_name(t)),
            ));
        };
        match o.get("type") {
            Some(Value::String(s)) if s == "function" => {}
            Some(Value::String(s)) => {
                let shown: String = s.chars().take(64).collect();
                return Err(bad(
                    &format!("{param}.type"),
                    format!("tools of type {shown:?} are not supported (only \"function\")"),
                ));
            }
            _ => {
                return Err(bad(
                    &format!("{param}.type"),
                    "a tool needs `\"type\": \"function\"`",
                ));
            }
        }
        let Some(Value::Object(f)) = o.get("function") else {
            return Err(bad(
                &format!("{param}.function"),
                "a tool needs a `function` object",
            ));
        };
        check_name(f.get("name"), &format!("{param}.function.name"))?;
        for (key, ok, what) in [
            (
                "description",
                f.get("description")
                    .is_none_or(|v| v.is_null() || v.is_string()),
                "a string",
            ),
            (
                "parameters",
                f.get("parameters")
                    .is_none_or(|v| v.is_null() || v.is_object()),
                "a JSON schema object",
            ),
            (
                "strict",
                f.get("strict")
                    .is_none_or(|v| v.is_null() || v.is_boolean()),
                "a boolean",
            ),
        ] {
            if !ok {
                let got = f.get(key).map_or("nothing", kind_name);
                return Err(bad(
                    &format!("{param}.function.{key}"),
                    format!("`{key}` must be {what}, got {got}"),
                ));
            }
        }
    }
    Ok(list.clone())
}

/// `tool_choice`, checked against the tools offered.
pub fn parse_tool_choice(v: Option<&Value>, tools: &[Value]) -> Result<ToolChoice, ApiError> {
    let choice = match v {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                let shown: String = other.chars().take(64).collect();
                return Err(bad(
                    "tool_choice",
                    format!(
                        "unknown `tool_choice` {shown:?} (expected \"auto\", \"none\", \
                         \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": …}}}})"
                    ),
                ));
            }
        },
        Some(Value::Object(o)) => {
            if o.get("type").and_then(Value::as_str) != Some("function") {
                return Err(bad(
                    "tool_choice.type",
                    "a named `tool_choice` needs `\"type\": \"function\"`",
                ));
            }
            let name = check_name(
                o.get("function").and_then(|f| f.get("name")),
                "tool_choice.function.name",
            )?;
            let offered = tools.iter().any(|t| {
                t.get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    == Some(name.as_str())
            });
            if !offered {
                let shown: String = name.chars().take(64).collect();
                return Err(bad(
                    "tool_choice.function.name",
                    format!("`tool_choice` names {shown:?}, which is not among `tools`"),
                ));
            }
            ToolChoice::Named(name)
        }
        Some(v) => {
            return Err(bad(
                "tool_choice",
                format!(
                    "`tool_choice` must be a string or an object, got {}",
                    kind_name(v)
                ),
            ));
        }
    };
    if tools.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
        return Err(bad(
            "tool_choice",
            "`tool_choice` \"required\" or a named function needs `tools`",
        ));
    }
    Ok(choice)
}

/// An assistant message's `tool_calls`, in the shape templates read: `function.arguments` a
/// mapping when the client sent a JSON object as a string (as OpenAI's clients do), kept as
/// sent otherwise.
pub fn parse_message_tool_calls(v: &Value, param: &str) -> Result<Vec<Value>, ApiError> {
    let Value::Array(list) = v else {
        return Err(bad(
            param,
            format!("`tool_calls` must be a list, got {}", kind_name(v)),
        ));
    };
    let mut out = Vec::with_capacity(list.len());
    for (j, c) in list.iter().enumerate() {
        let param = format!("{param}[{j}]");
        let Value::Object(o) = c else {
            return Err(bad(
                &param,
                format!("a tool call must be an object, got {}", kind_name(c)),
            ));
        };
        let id = match o.get("id") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(v) => {
                return Err(bad(
                    &format!("{param}.id"),
                    format!("`id` must be a string, got {}", kind_name(v)),
                ));
            }
        };
        match o.get("type") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "function" => {}
            Some(_) => {
                return Err(bad(
                    &format!("{param}.type"),
                    "only tool calls of type \"function\" are supported",
                ));
            }
        }
        let Some(Value::Object(f)) = o.get("function") else {
            return Err(bad(
                &format!("{param}.function"),
                "a tool call needs a `function` object",
            ));
        };
        let Some(Value::String(name)) = f.get("name") else {
            return Err(bad(
                &format!("{param}.function.name"),
                "a tool call needs a string `name`",
            ));
        };
        let arguments = match f.get("arguments") {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(v @ Value::Object(_)) => v,
                // Not an object: the template gets the text as the model wrote it.
                _ => Value::String(s.clone()),
            },
            Some(v @ Value::Object(_)) => v.clone(),
            Some(v) => {
                return Err(bad(
                    &format!("{param}.function.arguments"),
                    format!(
                        "`arguments` must be a JSON string or an object, got {}",
                        kind_name(v)
                    ),
                ));
            }
        };
        let mut call = json!({
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        });
        if let Some(id) = id {
            call["id"] = Value::String(id);
        }
        out.push(call);
    }
    Ok(out)
}

/// The call ids' base for a response: the hex part of its id (unique per response).
pub fn id_base(response_id: &str) -> &str {
    response_id
        .rsplit_once('-')
        .map_or(response_id, |(_, hex)| hex)
}

fn calls_json(p: &ParsedOutput) -> Value {
    Value::Array(
        p.calls
            .iter()
            .map(|c| {
                json!({
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments_json},
                })
            })
            .collect(),
    )
}

/// OpenAI's `finish_reason` when the output made calls: `tool_calls`, unless the output was
/// cut by the token limit (then the last call may be cut too, and `length` says so).
fn finish_with_calls(o: &Outcome) -> &'static str {
    match o.finish {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Cancelled => "tool_calls",
    }
}

/// The non-streaming chat response, with the output's calls taken out of `content`: the text
/// outside calls (null when there is none) and `tool_calls`. Without a parser (no tools, or
/// `tool_choice: "none"`), the plain response.
pub fn full_response(
    meta: &ResponseMeta,
    reasoning: &str,
    content: &str,
    o: &Outcome,
    parser: Option<ToolCallParser>,
) -> Value {
    let Some(mut parser) = parser else {
        return meta.full(reasoning, content, o);
    };
    let mut parsed = ParsedOutput::default();
    parsed.absorb(parser.push(content));
    parsed.absorb(parser.finish());
    let mut v = meta.full(reasoning, &parsed.content, o);
    if !parsed.calls.is_empty() {
        let choice = &mut v["choices"][0];
        if parsed.content.is_empty() {
            choice["message"]["content"] = Value::Null;
        }
        choice["message"]["tool_calls"] = calls_json(&parsed);
        choice["finish_reason"] = json!(finish_with_calls(o));
    }
    v
}

/// A chat stream's content with tool calls taken out: text goes out as `delta.content`, calls
/// as `delta.tool_calls` items (index, id, type and name first, then the arguments in pieces).
#[derive(Debug)]
pub struct ToolStream {
    parser: ToolCallParser,
}

impl ToolStream {
    pub fn new(parser: ToolCallParser) -> Self {
        ToolStream { parser }
    }

    fn chunks(meta: &ResponseMeta, events: Vec<ToolEvent>) -> Vec<Value> {
        events
            .into_iter()
            .map(|ev| match ev {
                ToolEvent::Text(t) => meta.text_chunk(&t, false),
                ToolEvent::CallStart { index, id, name } => tool_chunk(
                    meta,
                    json!({
                        "index": index,
                        "id": id,
                        "type": "function",
                        "function": {"name": name, "arguments": ""},
                    }),
                ),
                ToolEvent::CallArgs { index, piece } => tool_chunk(
                    meta,
                    json!({"index": index, "function": {"arguments": piece}}),
                ),
            })
            .collect()
    }

    /// The chunks for the next piece of content.
    pub fn push(&mut self, meta: &ResponseMeta, content: &str) -> Vec<Value> {
        let events = self.parser.push(content);
        Self::chunks(meta, events)
    }

    /// The output ended: the chunks still held, then the finish chunk (`tool_calls` when calls
    /// were made).
    pub fn finish(&mut self, meta: &ResponseMeta, o: &Outcome) -> Vec<Value> {
        let events = self.parser.finish();
        let mut out = Self::chunks(meta, events);
        let mut fin = meta.finish_chunk(o);
        if self.parser.call_count() > 0 {
            fin["choices"][0]["finish_reason"] = json!(finish_with_calls(o));
        }
        out.push(fin);
        out
    }
}

/// A chunk whose delta is one tool-call item.
fn tool_chunk(meta: &ResponseMeta, item: Value) -> Value {
    let mut c = meta.text_chunk("", false);
    c["choices"][0]["delta"] = json!({"tool_calls": [item]});
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ApiKind, PromptSpec, parse_chat};
    use yomi_engine::stats::GenerationStats;

    /// The Qwen3.5-shaped template the Python tests give the fixture model.
    const QWEN35_TOOLS: &str = include_str!("../../../tests/python/fixtures/qwen35_tools.jinja");

    /// Qwen2.5's way of writing calls back into the prompt (Hermes JSON in tags).
    const HERMES: &str = "{%- if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}\
        {%- for m in messages %}<{{ m.role }}>{{ m.content }}\
        {%- for tc in m.tool_calls or [] %}{%- if tc.function is defined %}{%- set tc = tc.function %}{%- endif %}\
        <tool_call>{\"name\": \"{{ tc.name }}\", \"arguments\": {{ tc.arguments | tojson }}}</tool_call>{%- endfor %}\
        {%- if m.tool_call_id %}[{{ m.tool_call_id }}]{% endif %}{%- endfor %}";

    fn chat(body: &str) -> ToolChat {
        match parse_chat(body.as_bytes()).expect("parses").prompt {
            PromptSpec::ChatWithTools(c) => *c,
            other => panic!("not a tool chat: {other:?}"),
        }
    }

    const WEATHER: &str = r#"{"type": "function", "function": {"name": "get_weather",
        "description": "Weather of a city", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}}"#;

    fn round_trip_body(extra: &str) -> String {
        format!(
            r#"{{"messages": [
                {{"role": "system", "content": "be brief"}},
                {{"role": "user", "content": "weather in Paris?"}},
                {{"role": "assistant", "content": null, "tool_calls": [{{"id": "call_1",
                  "type": "function", "function": {{"name": "get_weather",
                  "arguments": "{{\"city\": \"Paris\", \"days\": 2}}"}}}}]}},
                {{"role": "tool", "tool_call_id": "call_1", "content": "sunny"}}],
              "tools": [{WEATHER}]{extra}}}"#
        )
    }

    #[test]
    fn requests_with_tools_parse() {
        let c = chat(&round_trip_body(
            r#", "tool_choice": "auto", "parallel_tool_calls": false"#,
        ));
        assert_eq!(c.tools.len(), 1);
        assert_eq!(c.choice, ToolChoice::Auto);
        assert!(!c.parallel);
        // The arguments string became a mapping, in the model's key order.
        let call = &c.messages[2]["tool_calls"][0];
        assert_eq!(call["id"], "call_1");
        assert_eq!(
            call["function"]["arguments"],
            json!({"city": "Paris", "days": 2})
        );
        assert_eq!(c.messages[2]["content"], "");
        assert_eq!(c.messages[3]["role"], "tool");
        assert_eq!(c.messages[3]["tool_call_id"], "call_1");
        let named = chat(&round_trip_body(
            r#", "tool_choice": {"type": "function", "function": {"name": "get_weather"}}"#,
        ));
        assert_eq!(named.choice, ToolChoice::Named("get_weather".into()));
        assert_eq!(
            chat(&round_trip_body(r#", "tool_choice": "required""#)).choice,
            ToolChoice::Required
        );
        let none = chat(&round_trip_body(r#", "tool_choice": "none""#));
        assert_eq!(none.template_tools(), None);
        assert!(none.parser(None, "x").is_none());
        // Calls in the history without tools offered still reach the template.
        let body = r#"{"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}]},
            {"role": "tool", "content": "r"}]}"#;
        let c = chat(body);
        assert_eq!(
            c.messages[0]["tool_calls"][0]["function"]["arguments"],
            "not json"
        );
        assert!(c.parser(None, "x").is_none());
        // Without anything about tools, the plain chat prompt as before.
        let plain =
            parse_chat(br#"{"messages": [{"role": "user", "content": "hi"}], "tools": []}"#)
                .unwrap();
        assert!(matches!(plain.prompt, PromptSpec::Chat { .. }));
        assert_eq!(plain.kind, ApiKind::Chat);
    }

    #[test]
    fn bad_tool_requests_name_the_field() {
        let m = r#""messages": [{"role": "user", "content": "x"}]"#;
        for (extra, param) in [
            (r#""tools": {}"#, "tools"),
            (r#""tools": [1]"#, "tools[0]"),
            (r#""tools": [{"function": {"name": "f"}}]"#, "tools[0].type"),
            (
                r#""tools": [{"type": "code_interpreter"}]"#,
                "tools[0].type",
            ),
            (r#""tools": [{"type": "function"}]"#, "tools[0].function"),
            (
                r#""tools": [{"type": "function", "function": {}}]"#,
                "tools[0].function.name",
            ),
            (
                r#""tools": [{"type": "function", "function": {"name": 5}}]"#,
                "tools[0].function.name",
            ),
            (
                r#""tools": [{"type": "function", "function": {"name": "a b"}}]"#,
                "tools[0].function.name",
            ),
            (
                r#""tools": [{"type": "function", "function": {"name": ""}}]"#,
                "tools[0].function.name",
            ),
            (
                r#""tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]"#,
                "tools[0].function.parameters",
            ),
            (
                r#""tools": [{"type": "function", "function": {"name": "f", "description": 1}}]"#,
                "tools[0].function.description",
            ),
            (r#""tool_choice": "sometimes""#, "tool_choice"),
            (r#""tool_choice": 3"#, "tool_choice"),
            (r#""tool_choice": "required""#, "tool_choice"),
            (
                &format!(
                    r#""tools": [{WEATHER}], "tool_choice": {{"type": "function", "function": {{"name": "other"}}}}"#
                ),
                "tool_choice.function.name",
            ),
            (
                &format!(
                    r#""tools": [{WEATHER}], "tool_choice": {{"function": {{"name": "get_weather"}}}}"#
                ),
                "tool_choice.type",
            ),
            (r#""parallel_tool_calls": "yes""#, "parallel_tool_calls"),
        ] {
            let body = format!("{{{m}, {extra}}}");
            let e = parse_chat(body.as_bytes()).expect_err(extra);
            assert_eq!(e.status, 400, "{extra}");
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {e:?}");
        }
        for (msg, param) in [
            (
                r#"{"role": "assistant", "tool_calls": {}}"#,
                "messages[0].tool_calls",
            ),
            (
                r#"{"role": "assistant", "tool_calls": [1]}"#,
                "messages[0].tool_calls[0]",
            ),
            (
                r#"{"role": "assistant", "tool_calls": [{"id": 1, "function": {"name": "f"}}]}"#,
                "messages[0].tool_calls[0].id",
            ),
            (
                r#"{"role": "assistant", "tool_calls": [{"type": "x", "function": {"name": "f"}}]}"#,
                "messages[0].tool_calls[0].type",
            ),
            (
                r#"{"role": "assistant", "tool_calls": [{}]}"#,
                "messages[0].tool_calls[0].function",
            ),
            (
                r#"{"role": "assistant", "tool_calls": [{"function": {}}]}"#,
                "messages[0].tool_calls[0].function.name",
            ),
            (
                r#"{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 1}}]}"#,
                "messages[0].tool_calls[0].function.arguments",
            ),
            (
                r#"{"role": "tool", "content": "x", "tool_call_id": 7}"#,
                "messages[0].tool_call_id",
            ),
        ] {
            let body = format!(r#"{{"messages": [{msg}]}}"#);
            let e = parse_chat(body.as_bytes()).expect_err(msg);
            assert_eq!(e.param.as_deref(), Some(param), "{msg}: {e:?}");
        }
        // /v1/completions has no template to show tools.
        let e = crate::api::parse_completion(
            format!(r#"{{"prompt": "x", "tools": [{WEATHER}]}}"#).as_bytes(),
        )
        .expect_err("completions with tools");
        assert_eq!(e.param.as_deref(), Some("tools"));
    }

    #[test]
    fn qwen35_template_renders_tools_calls_and_results() {
        let tpl = ChatTemplate::new(QWEN35_TOOLS, None, None).expect("compiles");
        let c = chat(&round_trip_body(""));
        let text = c.render(&tpl).expect("renders");
        assert!(
            text.starts_with("<|im_start|>system\nbe brief\n\n# Tools"),
            "{text}"
        );
        assert!(
            text.contains("<name>get_weather</name>\n<description>Weather of a city</description>"),
            "{text}"
        );
        assert!(
            text.contains("<parameter>\n<name>days</name>\n<type>integer</type>"),
            "{text}"
        );
        assert!(
            text.contains("<|im_start|>assistant\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call><|im_end|>"),
            "{text}"
        );
        assert!(
            text.contains("<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>"),
            "{text}"
        );
        assert!(text.ends_with("<|im_start|>assistant\n"));
        // `tool_choice: "none"`: no tools shown (the history still is).
        let none = chat(&round_trip_body(r#", "tool_choice": "none""#))
            .render(&tpl)
            .unwrap();
        assert!(!none.contains("# Tools") && none.contains("<function=get_weather>"));
        // The format is read from this template.
        assert_eq!(
            ToolFormat::from_template(Some(tpl.source())),
            ToolFormat::QwenXml
        );
    }

    #[test]
    fn hermes_template_reads_arguments_as_a_mapping() {
        let tpl = ChatTemplate::new(HERMES, None, None).expect("compiles");
        let text = chat(&round_trip_body("")).render(&tpl).expect("renders");
        assert!(
            text.contains(r#"<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>"#),
            "{text}"
        );
        assert!(text.contains("<tool>sunny[call_1]"), "{text}");
        assert!(
            text.starts_with(r#"<tools>{"type": "function", "function": {"name": "get_weather""#),
            "{text}"
        );
        assert_eq!(
            ToolFormat::from_template(Some(tpl.source())),
            ToolFormat::Hermes
        );
    }

    fn meta() -> ResponseMeta {
        ResponseMeta {
            id: "chatcmpl-00000000000000ab00000001".into(),
            created: 1,
            model: "m".into(),
            kind: ApiKind::Chat,
            include_usage: false,
        }
    }

    fn outcome(finish: FinishReason) -> Outcome {
        Outcome {
            prompt_tokens: 3,
            completion_tokens: 4,
            cached_tokens: 0,
            finish,
            stats: GenerationStats::default(),
            drafting: false,
            stop_sequence: None,
        }
    }

    fn qwen_parser(body_extra: &str) -> ToolCallParser {
        let c = chat(&round_trip_body(body_extra));
        c.parser(Some(QWEN35_TOOLS), id_base(&meta().id))
            .expect("a parser")
    }

    const CALL_TEXT: &str = "I'll look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>";

    #[test]
    fn full_responses_carry_tool_calls() {
        let o = outcome(FinishReason::Stop);
        let v = full_response(&meta(), "", CALL_TEXT, &o, Some(qwen_parser("")));
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls");
        assert_eq!(c["message"]["content"], "I'll look.");
        let calls = c["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0]["id"], "call_00000000000000ab000000010");
        assert_eq!(calls[0]["type"], "function");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        let args: Value =
            serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "Paris", "days": 2}));
        // Only the call: content is null.
        let only = CALL_TEXT.split_once('\n').unwrap().1;
        let v = full_response(&meta(), "r", only, &o, Some(qwen_parser("")));
        assert!(v["choices"][0]["message"]["content"].is_null());
        assert_eq!(v["choices"][0]["message"]["reasoning_content"], "r");
        // Cut by the token limit: `length` says so.
        let v = full_response(
            &meta(),
            "",
            only,
            &outcome(FinishReason::Length),
            Some(qwen_parser("")),
        );
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        // No calls: the response is the plain one.
        let v = full_response(&meta(), "", "just text\n", &o, Some(qwen_parser("")));
        assert_eq!(v, meta().full("", "just text\n", &o));
        // A call to a function not offered is text.
        let bad = "<tool_call>\n<function=rm>\n</function>\n</tool_call>";
        let v = full_response(&meta(), "", bad, &o, Some(qwen_parser("")));
        assert_eq!(v["choices"][0]["message"]["content"], bad);
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        // `tool_choice: "none"` parses nothing.
        let v = full_response(&meta(), "", only, &o, None);
        assert_eq!(v["choices"][0]["message"]["content"], only);
        // `parallel_tool_calls: false`: one call.
        let two = format!("{only}\n{only}");
        let v = full_response(
            &meta(),
            "",
            &two,
            &o,
            Some(qwen_parser(r#", "parallel_tool_calls": false"#)),
        );
        assert_eq!(
            v["choices"][0]["message"]["tool_calls"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        let v = full_response(&meta(), "", &two, &o, Some(qwen_parser("")));
        assert_eq!(
            v["choices"][0]["message"]["tool_calls"][1]["id"],
            "call_00000000000000ab000000011"
        );
    }

    /// Streams `text` in `pieces`-byte deltas; returns the chunks.
    fn stream(text: &str, step: usize, finish: FinishReason) -> Vec<Value> {
        let mut s = ToolStream::new(qwen_parser(""));
        let mut out = Vec::new();
        let mut i = 0;
        while i < text.len() {
            let mut j = (i + step).min(text.len());
            while !text.is_char_boundary(j) {
                j += 1;
            }
            out.extend(s.push(&meta(), &text[i..j]));
            i = j;
        }
        out.extend(s.finish(&meta(), &outcome(finish)));
        out
    }

    #[test]
    fn stream_chunks_are_openai_shaped() {
        let chunks = stream(CALL_TEXT, 7, FinishReason::Stop);
        for c in &chunks {
            assert_eq!(c["object"], "chat.completion.chunk");
            assert_eq!(c["id"], meta().id);
        }
        let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
        let content: String = deltas
            .iter()
            .filter_map(|d| d["content"].as_str())
            .collect();
        assert_eq!(content, "I'll look.");
        let items: Vec<&Value> = deltas
            .iter()
            .filter_map(|d| d.get("tool_calls"))
            .map(|t| {
                assert_eq!(t.as_array().unwrap().len(), 1);
                &t[0]
            })
            .collect();
        // The first item names the call; the rest add to its arguments.
        assert_eq!(
            items[0],
            &json!({"index": 0, "id": "call_00000000000000ab000000010", "type": "function",
                    "function": {"name": "get_weather", "arguments": ""}})
        );
        assert!(items.len() >= 3, "arguments come in pieces: {items:?}");
        let mut args = String::new();
        for it in &items[1..] {
            assert_eq!(it["index"], 0);
            assert!(it.get("id").is_none() && it["function"].get("name").is_none());
            args.push_str(it["function"]["arguments"].as_str().unwrap());
        }
        let args: Value = serde_json::from_str(&args).unwrap();
        assert_eq!(args, json!({"city": "Paris", "days": 2}));
        let last = chunks.last().unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(last["choices"][0]["delta"], json!({}));
        assert!(
            chunks[..chunks.len() - 1]
                .iter()
                .all(|c| c["choices"][0]["finish_reason"].is_null())
        );
    }

    /// Streamed at any delta size, the chunks add up to the non-streaming response.
    #[test]
    fn streams_add_up_to_the_full_response() {
        let texts = [
            CALL_TEXT.to_string(),
            format!("{CALL_TEXT}\n{CALL_TEXT}\nand done"),
            "no calls <tool_cal here".to_string(),
            "<tool_call>\n<function=nope>\n</function>\n</tool_call>".to_string(),
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nRo".to_string(),
        ];
        let o = outcome(FinishReason::Stop);
        for text in &texts {
            let full = full_response(&meta(), "", text, &o, Some(qwen_parser("")));
            let msg = &full["choices"][0]["message"];
            for step in 1..=text.len() {
                let chunks = stream(text, step, FinishReason::Stop);
                let mut content = String::new();
                let mut calls: Vec<Value> = Vec::new();
                for c in &chunks {
                    let d = &c["choices"][0]["delta"];
                    if let Some(t) = d["content"].as_str() {
                        content.push_str(t);
                    }
                    for it in d["tool_calls"].as_array().into_iter().flatten() {
                        let i = it["index"].as_u64().unwrap() as usize;
                        if i == calls.len() {
                            calls.push(json!({"id": it["id"], "type": "function",
                                "function": {"name": it["function"]["name"], "arguments": ""}}));
                        }
                        let a = calls[i]["function"]["arguments"]
                            .as_str()
                            .unwrap()
                            .to_string()
                            + it["function"]["arguments"].as_str().unwrap();
                        calls[i]["function"]["arguments"] = json!(a);
                    }
                }
                assert_eq!(
                    msg["content"].as_str().unwrap_or(""),
                    content,
                    "step {step}: {text:?}"
                );
                assert_eq!(
                    msg.get("tool_calls").cloned().unwrap_or(json!([])),
                    Value::Array(calls),
                    "step {step}: {text:?}"
                );
                assert_eq!(
                    chunks.last().unwrap()["choices"][0]["finish_reason"],
                    full["choices"][0]["finish_reason"]
                );
            }
        }
    }
}
