//! Tool calls in a model's output: pure text in, calls and the remaining text out.
//!
//! Models write tool calls in the format their chat template taught them:
//!
//! - [`ToolFormat::QwenXml`] (Qwen3.5/3.6, Qwen3-Coder): `<tool_call>\n<function=NAME>\n
//!   <parameter=ARG>\nVALUE\n</parameter>\n</function>\n</tool_call>`. Values are plain text;
//!   they become JSON by the type the tool's schema gives the parameter (a string stays a
//!   string, anything else is read as JSON when it parses), as vLLM's parser does.
//! - [`ToolFormat::Hermes`] (Hermes, Qwen2.5, Qwen3): `<tool_call>{"name": …, "arguments":
//!   {…}}</tool_call>`.
//! - [`ToolFormat::Llama3Json`] (Llama 3.x): the whole message is `{"name": …, "parameters":
//!   {…}}` (several may follow each other, separated by `;`), optionally after
//!   `<|python_tag|>`.
//!
//! [`ToolCallParser`] takes the text as it streams and gives back [`ToolEvent`]s: text outside
//! calls, a call's start (id and name), and pieces of its arguments (JSON text that,
//! concatenated, is the arguments object). Text that might be the start of a call tag is held
//! back until it is decided. [`parse_tool_calls`] is the same machine run over a whole text,
//! so a streamed response and a non-streamed one always agree.
//!
//! A call the model writes badly (JSON that does not parse, a function the request did not
//! offer, a tag that does not continue as the format says) is given back as the text it was,
//! never dropped and never an error. A call counts as written once its function name is known
//! and valid: for the XML format that is `<function=NAME>`, whose parameters then stream one by
//! one (the arguments object is built here, so it is always valid JSON, and a call cut off by
//! the end of the output is closed). The JSON formats are held until the call is whole and
//! parses, since JSON that goes wrong half-way could not be taken back once sent.
//!
//! Whitespace between text and a call (the newline before `<tool_call>`, the one between
//! calls) is dropped, so `content` is the text as a reader would see it.

use serde_json::{Map, Value};

/// Opens and closes a call in the tag formats.
pub const TOOL_CALL_OPEN: &str = "<tool_call>";
pub const TOOL_CALL_CLOSE: &str = "</tool_call>";
/// Llama 3's marker before a call (a special token, so usually absent from decoded text).
pub const PYTHON_TAG: &str = "<|python_tag|>";

const FUNCTION_OPEN: &str = "<function=";
const FUNCTION_CLOSE: &str = "</function>";
const PARAMETER_OPEN: &str = "<parameter=";
const PARAMETER_CLOSE: &str = "</parameter>";
/// A function or parameter name longer than this is not a name (the tag is text).
const MAX_NAME_BYTES: usize = 256;

/// How a model writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call><function=NAME><parameter=ARG>VALUE</parameter></function></tool_call>`.
    QwenXml,
    /// `<tool_call>{"name": …, "arguments": {…}}</tool_call>`.
    Hermes,
    /// `{"name": …, "parameters": {…}}` as the whole message.
    Llama3Json,
}

impl ToolFormat {
    /// The format a chat template teaches its model, from the template's text: the one place
    /// the parser is chosen. Templates that show none (or no template) get [`Self::Hermes`],
    /// the format most models fine-tuned for tools write.
    pub fn from_template(source: Option<&str>) -> ToolFormat {
        let Some(src) = source else {
            return ToolFormat::Hermes;
        };
        if src.contains(FUNCTION_OPEN) && src.contains(PARAMETER_OPEN) {
            ToolFormat::QwenXml
        } else if src.contains(TOOL_CALL_OPEN) {
            ToolFormat::Hermes
        } else if src.contains(PYTHON_TAG)
            || (src.contains("ipython") && src.contains("\"parameters\""))
        {
            ToolFormat::Llama3Json
        } else {
            ToolFormat::Hermes
        }
    }
}

/// One parsed call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as a JSON object's text (OpenAI's `function.arguments`).
    pub arguments_json: String,
}

/// What the parser gives back as text streams through it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolEvent {
    /// Text outside calls.
    Text(String),
    /// A call starts: its index among the calls (0, 1, …), id and function name.
    CallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// The next piece of the arguments of call `index` (JSON text).
    CallArgs { index: usize, piece: String },
}

/// A function's name and its parameters' schemas (`parameters.properties`).
type ToolDef = (String, Option<Map<String, Value>>);

/// The functions a request offers, by name, with their parameters' JSON schemas.
#[derive(Clone, Debug, Default)]
pub struct ToolSet {
    /// `None`: any name is accepted (nothing to check against).
    tools: Option<Vec<ToolDef>>,
}

impl ToolSet {
    /// Accepts any function name; parameter values of the XML format stay strings.
    pub fn any() -> ToolSet {
        ToolSet { tools: None }
    }

    /// From OpenAI's `tools` list (`[{"type": "function", "function": {"name", "parameters"}}]`);
    /// entries without a name are skipped (requests are checked before this).
    pub fn from_openai(tools: &[Value]) -> ToolSet {
        let list = tools
            .iter()
            .filter_map(|t| {
                let f = t.get("function")?;
                let name = f.get("name")?.as_str()?.to_string();
                let props = f
                    .get("parameters")
                    .and_then(|p| p.get("properties"))
                    .and_then(Value::as_object)
                    .cloned();
                Some((name, props))
            })
            .collect();
        ToolSet { tools: Some(list) }
    }

    /// From `(name, parameters schema)` pairs (e.g. Anthropic's `tools`, whose
    /// `input_schema` is the parameters schema).
    pub fn from_schemas<'a>(tools: impl IntoIterator<Item = (&'a str, Option<&'a Value>)>) -> Self {
        let list = tools
            .into_iter()
            .map(|(name, schema)| {
                let props = schema
                    .and_then(|p| p.get("properties"))
                    .and_then(Value::as_object)
                    .cloned();
                (name.to_string(), props)
            })
            .collect();
        ToolSet { tools: Some(list) }
    }

    /// Only the function `name` (a named `tool_choice`).
    pub fn only(&self, name: &str) -> ToolSet {
        match &self.tools {
            None => ToolSet {
                tools: Some(vec![(name.to_string(), None)]),
            },
            Some(list) => ToolSet {
                tools: Some(list.iter().filter(|(n, _)| n == name).cloned().collect()),
            },
        }
    }

    fn allows(&self, name: &str) -> bool {
        valid_name(name)
            && self
                .tools
                .as_ref()
                .is_none_or(|l| l.iter().any(|(n, _)| n == name))
    }

    /// The declared schema of a parameter (`None`: not declared, or nothing is known).
    fn param_schema(&self, function: &str, param: &str) -> Option<&Value> {
        self.tools
            .as_ref()?
            .iter()
            .find(|(n, _)| n == function)?
            .1
            .as_ref()?
            .get(param)
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && !name
            .chars()
            .any(|c| c.is_whitespace() || c == '<' || c == '>')
}

/// The JSON value of an XML-format parameter, by its declared type: strings stay strings
/// (so `"007"` is not turned into 7); numbers, booleans, objects and arrays are read as JSON
/// when they parse (Python's `True`/`False`/`None` too, which models trained on Python write);
/// a parameter the schema does not declare stays a string.
fn xml_param_value(raw: &str, schema: Option<&Value>) -> Value {
    let as_string = Value::String(raw.to_string());
    let Some(schema) = schema else {
        return as_string;
    };
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if types.len() == 1 && types[0] == "string" {
        return as_string;
    }
    let t = raw.trim();
    if let Ok(v) = serde_json::from_str::<Value>(t) {
        // A schema that allows strings keeps a value that only parses as something else it
        // does not allow (e.g. `["string", "null"]` and `123`) as the string written.
        let kind = match &v {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        };
        let allowed = types.is_empty()
            || types.contains(&kind)
            || (kind == "integer" && types.contains(&"number"));
        if allowed || !types.contains(&"string") {
            return v;
        }
        return as_string;
    }
    match t {
        "True" if !types.contains(&"string") => Value::Bool(true),
        "False" if !types.contains(&"string") => Value::Bool(false),
        "None" if !types.contains(&"string") => Value::Null,
        _ => as_string,
    }
}

/// The arguments of a JSON-format call: an object, or a string holding one (some models
/// write the arguments as OpenAI sends them back, JSON in a string), or absent (`{}`).
fn json_arguments(v: Option<&Value>) -> Option<Map<String, Value>> {
    match v {
        None | Some(Value::Null) => Some(Map::new()),
        Some(Value::Object(m)) => Some(m.clone()),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(m)) => Some(m),
            _ => None,
        },
        Some(_) => None,
    }
}

/// A JSON-format call object: `{"name": …, "arguments" | "parameters": {…}}`.
fn json_call(v: &Value, tools: &ToolSet) -> Option<(String, String)> {
    let o = v.as_object()?;
    let name = o.get("name")?.as_str()?;
    if !tools.allows(name) {
        return None;
    }
    let args = json_arguments(o.get("arguments").or_else(|| o.get("parameters")))?;
    let json = serde_json::to_string(&Value::Object(args)).ok()?;
    Some((name.to_string(), json))
}

/// The longest suffix of `s` that is a proper prefix of `tag` (a tag that may still be
/// arriving), in bytes.
fn partial_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && s.ends_with(&tag[..n]))
        .unwrap_or(0)
}

/// Whether `s` is a proper prefix of `tag` (more may make it the tag).
fn may_become(s: &str, tag: &str) -> bool {
    s.len() < tag.len() && tag.starts_with(s)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Llama 3: the message may be a call (nothing but whitespace seen yet).
    Start,
    /// Text; for the tag formats, watching for `<tool_call>`.
    Text,
    /// Llama 3: the message looks like a call; held to the end.
    LlamaHold,
    /// A JSON call in tags, held until `</tool_call>`.
    JsonInTags,
    /// XML: after `<tool_call>`, before `<function=NAME>`.
    XmlHead,
    /// XML: inside the function of call `index`; `first`: no parameter yet.
    XmlBody { index: usize, first: bool },
    /// XML: after `</function>`, before `</tool_call>`.
    XmlTail,
}

/// The streaming tool-call parser (see the module notes).
#[derive(Clone, Debug)]
pub struct ToolCallParser {
    format: ToolFormat,
    tools: ToolSet,
    id_base: String,
    max_calls: usize,
    state: State,
    /// Text not yet decided.
    buf: String,
    /// The text of the call being read, from its opening tag, given back if it goes wrong.
    raw: String,
    /// Calls written (including those over `max_calls`, which are not reported).
    calls: usize,
    /// The current call is over `max_calls`: it is read but not reported.
    muted: bool,
    /// The current call's function (for its parameters' schemas).
    current_fn: String,
    /// Trailing whitespace of the text so far, held: dropped if a call follows.
    ws: String,
    /// A call ended and no text came after it yet: leading whitespace is dropped.
    after_call: bool,
}

impl ToolCallParser {
    /// `id_base` makes the call ids unique to the response: `call_<id_base><index>`.
    pub fn new(format: ToolFormat, tools: ToolSet, id_base: &str) -> Self {
        ToolCallParser {
            format,
            tools,
            id_base: id_base.to_string(),
            max_calls: usize::MAX,
            state: if format == ToolFormat::Llama3Json {
                State::Start
            } else {
                State::Text
            },
            buf: String::new(),
            raw: String::new(),
            calls: 0,
            muted: false,
            current_fn: String::new(),
            ws: String::new(),
            after_call: false,
        }
    }

    /// At most `n` calls are reported (`parallel_tool_calls: false` is 1); later ones are
    /// read and dropped (their text is not content either: it was meant as a call).
    pub fn with_max_calls(mut self, n: usize) -> Self {
        self.max_calls = n;
        self
    }

    /// Calls reported so far.
    pub fn call_count(&self) -> usize {
        self.calls.min(self.max_calls)
    }

    /// Takes the next piece of output text; returns what can be reported now.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out, false) {}
        out
    }

    /// The output ended: reports everything still held.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        while self.step(&mut out, true) {}
        if !self.buf.is_empty() {
            let rest = std::mem::take(&mut self.buf);
            self.text(&mut out, &rest);
        }
        if !self.after_call && !self.ws.is_empty() {
            let ws = std::mem::take(&mut self.ws);
            push_text(&mut out, ws);
        }
        self.ws.clear();
        out
    }

    /// Text outside calls, with whitespace next to calls dropped.
    fn text(&mut self, out: &mut Vec<ToolEvent>, s: &str) {
        let mut s = s;
        if self.after_call {
            s = s.trim_start();
            if s.is_empty() {
                return;
            }
            self.after_call = false;
        }
        let body = s.trim_end();
        if body.is_empty() {
            self.ws.push_str(s);
            return;
        }
        let mut t = std::mem::take(&mut self.ws);
        t.push_str(body);
        push_text(out, t);
        self.ws = s[body.len()..].to_string();
    }

    /// A call is written (its name is known and valid): whitespace before it is dropped.
    fn start_call(&mut self, out: &mut Vec<ToolEvent>, name: &str) -> usize {
        self.ws.clear();
        self.after_call = false;
        let index = self.calls;
        self.calls += 1;
        self.muted = index >= self.max_calls;
        self.current_fn = name.to_string();
        if !self.muted {
            out.push(ToolEvent::CallStart {
                index,
                id: format!("call_{}{index}", self.id_base),
                name: name.to_string(),
            });
        }
        index
    }

    fn args(&mut self, out: &mut Vec<ToolEvent>, index: usize, piece: String) {
        if !self.muted && !piece.is_empty() {
            out.push(ToolEvent::CallArgs { index, piece });
        }
    }

    fn end_call(&mut self) {
        self.raw.clear();
        self.after_call = true;
        self.muted = false;
        self.state = State::Text;
    }

    /// The call being read was not one: its text goes out as text and reading goes on after
    /// the opening tag's text.
    fn give_back(&mut self, out: &mut Vec<ToolEvent>) {
        let raw = std::mem::take(&mut self.raw);
        self.text(out, &raw);
        self.state = State::Text;
    }

    /// Moves `n` bytes of the buffer into the current call's raw text.
    fn consume(&mut self, n: usize) {
        self.raw.push_str(&self.buf[..n]);
        self.buf.drain(..n);
    }

    /// One step of the machine; false when nothing more can be decided without more text.
    fn step(&mut self, out: &mut Vec<ToolEvent>, eof: bool) -> bool {
        match self.state {
            State::Start => {
                let t = self.buf.trim_start();
                if t.starts_with(PYTHON_TAG) || t.starts_with('{') {
                    self.state = State::LlamaHold;
                    return true;
                }
                if !eof && (t.is_empty() || may_become(t, PYTHON_TAG)) {
                    return false;
                }
                self.state = State::Text;
                true
            }
            State::LlamaHold => {
                if !eof {
                    return false;
                }
                let text = std::mem::take(&mut self.buf);
                match self.llama_calls(&text) {
                    Some(calls) => {
                        for (name, args) in calls {
                            let index = self.start_call(out, &name);
                            self.args(out, index, args);
                            self.end_call();
                        }
                    }
                    None => {
                        self.state = State::Text;
                        self.text(out, &text);
                    }
                }
                self.state = State::Text;
                false
            }
            State::Text => {
                if self.format == ToolFormat::Llama3Json {
                    let all = std::mem::take(&mut self.buf);
                    self.text(out, &all);
                    return false;
                }
                if let Some(i) = self.buf.find(TOOL_CALL_OPEN) {
                    let before = self.buf[..i].to_string();
                    self.text(out, &before);
                    self.buf.drain(..i);
                    self.raw.clear();
                    self.consume(TOOL_CALL_OPEN.len());
                    self.state = if self.format == ToolFormat::QwenXml {
                        State::XmlHead
                    } else {
                        State::JsonInTags
                    };
                    return true;
                }
                let hold = if eof {
                    0
                } else {
                    partial_suffix(&self.buf, TOOL_CALL_OPEN)
                };
                let cut = self.buf.len() - hold;
                if cut > 0 {
                    let now = self.buf[..cut].to_string();
                    self.buf.drain(..cut);
                    self.text(out, &now);
                }
                false
            }
            State::JsonInTags => {
                let (inner_len, close_len) = match self.buf.find(TOOL_CALL_CLOSE) {
                    Some(i) => (i, TOOL_CALL_CLOSE.len()),
                    // A call the output ended in, unclosed, is taken if its JSON is whole.
                    None if eof => (self.buf.len(), 0),
                    None => return false,
                };
                let parsed = serde_json::from_str::<Value>(self.buf[..inner_len].trim())
                    .ok()
                    .and_then(|v| json_call(&v, &self.tools));
                self.consume(inner_len + close_len);
                match parsed {
                    Some((name, args)) => {
                        let index = self.start_call(out, &name);
                        self.args(out, index, args);
                        self.end_call();
                    }
                    None => self.give_back(out),
                }
                true
            }
            State::XmlHead => self.xml_head(out, eof),
            State::XmlBody { index, first } => self.xml_body(out, eof, index, first),
            State::XmlTail => {
                let ws = self.buf.len() - self.buf.trim_start().len();
                self.buf.drain(..ws);
                if self.buf.starts_with(TOOL_CALL_CLOSE) {
                    self.buf.drain(..TOOL_CALL_CLOSE.len());
                    self.end_call();
                    return true;
                }
                if !eof && may_become(&self.buf, TOOL_CALL_CLOSE) {
                    return false;
                }
                // No closing tag: the call ended with its function.
                self.end_call();
                true
            }
        }
    }

    fn xml_head(&mut self, out: &mut Vec<ToolEvent>, eof: bool) -> bool {
        let ws = self.buf.len() - self.buf.trim_start().len();
        let t = &self.buf[ws..];
        if t.starts_with('{') {
            // Some XML-format models fall back to JSON in the tags.
            self.state = State::JsonInTags;
            return true;
        }
        if let Some(rest) = t.strip_prefix(FUNCTION_OPEN) {
            if let Some(end) = rest.find('>') {
                let name = rest[..end].trim().to_string();
                self.consume(ws + FUNCTION_OPEN.len() + end + 1);
                if self.tools.allows(&name) {
                    let index = self.start_call(out, &name);
                    self.raw.clear();
                    self.state = State::XmlBody { index, first: true };
                } else {
                    self.give_back(out);
                }
                return true;
            }
            if eof || rest.len() > MAX_NAME_BYTES || rest.contains(['\n', '<']) {
                self.give_back(out);
                return true;
            }
            return false;
        }
        if !eof && (t.is_empty() || may_become(t, FUNCTION_OPEN)) {
            return false;
        }
        self.give_back(out);
        true
    }

    fn xml_body(&mut self, out: &mut Vec<ToolEvent>, eof: bool, index: usize, first: bool) -> bool {
        let ws = self.buf.len() - self.buf.trim_start().len();
        self.buf.drain(..ws);
        let close = |p: &mut Self, out: &mut Vec<ToolEvent>| {
            p.args(out, index, if first { "{}" } else { "}" }.to_string());
        };
        if self.buf.starts_with(FUNCTION_CLOSE) {
            self.buf.drain(..FUNCTION_CLOSE.len());
            close(self, out);
            self.state = State::XmlTail;
            return true;
        }
        if self.buf.starts_with(TOOL_CALL_CLOSE) {
            self.buf.drain(..TOOL_CALL_CLOSE.len());
            close(self, out);
            self.end_call();
            return true;
        }
        if let Some(rest) = self.buf.strip_prefix(PARAMETER_OPEN) {
            let Some(name_end) = rest.find('>') else {
                if eof {
                    self.buf.clear();
                    close(self, out);
                    self.end_call();
                    return true;
                }
                return false;
            };
            let name = rest[..name_end].trim().to_string();
            let value_start = PARAMETER_OPEN.len() + name_end + 1;
            let value_region = &self.buf[value_start..];
            // A value ends at its closing tag, or (when the model forgot it) where the next
            // parameter, the function or the call begins, or at the end of the output.
            let ends = [
                PARAMETER_CLOSE,
                PARAMETER_OPEN,
                FUNCTION_CLOSE,
                TOOL_CALL_CLOSE,
            ]
            .iter()
            .filter_map(|tag| value_region.find(tag).map(|i| (i, *tag)))
            .min_by_key(|(i, _)| *i);
            let (value_len, consumed) = match ends {
                Some((i, PARAMETER_CLOSE)) => (i, i + PARAMETER_CLOSE.len()),
                Some((i, _)) => (i, i),
                None if eof => (value_region.len(), value_region.len()),
                None => return false,
            };
            let mut value = &value_region[..value_len];
            value = value.strip_prefix('\n').unwrap_or(value);
            value = value.strip_suffix('\n').unwrap_or(value);
            let v = xml_param_value(value, self.tools.param_schema(&self.current_fn, &name));
            let piece = format!(
                "{}{}: {}",
                if first { "{" } else { ", " },
                Value::String(name),
                v
            );
            self.buf.drain(..value_start + consumed);
            self.args(out, index, piece);
            self.state = State::XmlBody {
                index,
                first: false,
            };
            return true;
        }
        if !eof
            && (self.buf.is_empty()
                || [FUNCTION_CLOSE, TOOL_CALL_CLOSE, PARAMETER_OPEN]
                    .iter()
                    .any(|tag| may_become(&self.buf, tag)))
        {
            return false;
        }
        if eof && self.buf.is_empty() {
            close(self, out);
            self.end_call();
            return false;
        }
        // Stray text inside a call that is already reported: skipped up to the next tag.
        match self.buf[1..].find('<') {
            Some(i) => {
                self.buf.drain(..i + 1);
            }
            None => self.buf.clear(),
        }
        true
    }

    /// Llama 3: the whole message as one or more calls, or `None` if it is not.
    fn llama_calls(&self, text: &str) -> Option<Vec<(String, String)>> {
        let mut rest = text.trim_start();
        rest = rest.strip_prefix(PYTHON_TAG).unwrap_or(rest);
        let mut calls = Vec::new();
        loop {
            rest = rest.trim_start();
            while let Some(r) = rest.strip_prefix(';') {
                rest = r.trim_start();
            }
            if rest.is_empty() {
                break;
            }
            let mut it = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
            let v = it.next()?.ok()?;
            let used = it.byte_offset();
            calls.push(json_call(&v, &self.tools)?);
            rest = &rest[used..];
        }
        (!calls.is_empty()).then_some(calls)
    }
}

fn push_text(out: &mut Vec<ToolEvent>, s: String) {
    if s.is_empty() {
        return;
    }
    if let Some(ToolEvent::Text(last)) = out.last_mut() {
        last.push_str(&s);
    } else {
        out.push(ToolEvent::Text(s));
    }
}

/// A whole output's calls and the text around them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedOutput {
    /// Text outside calls (whitespace next to calls dropped).
    pub content: String,
    pub calls: Vec<ToolCall>,
}

impl ParsedOutput {
    /// Folds parser events into calls and text.
    pub fn absorb(&mut self, events: impl IntoIterator<Item = ToolEvent>) {
        for ev in events {
            match ev {
                ToolEvent::Text(t) => self.content.push_str(&t),
                ToolEvent::CallStart { id, name, .. } => self.calls.push(ToolCall {
                    id,
                    name,
                    arguments_json: String::new(),
                }),
                ToolEvent::CallArgs { index, piece } => {
                    if let Some(c) = self.calls.get_mut(index) {
                        c.arguments_json.push_str(&piece);
                    }
                }
            }
        }
    }
}

/// Parses a whole output (the streaming parser run over it at once).
pub fn parse_tool_calls(
    text: &str,
    format: ToolFormat,
    tools: ToolSet,
    id_base: &str,
) -> ParsedOutput {
    let mut p = ToolCallParser::new(format, tools, id_base);
    let mut out = ParsedOutput::default();
    out.absorb(p.push(text));
    out.absorb(p.finish());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn weather_tools() -> ToolSet {
        ToolSet::from_openai(&[
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "hours": {"type": "array"},
                "opts": {"type": "object"},
                "zip": {"type": "string"},
                "ratio": {"type": ["number", "null"]},
                "note": {"type": ["string", "null"]},
                "any": {}
            }}}}),
            json!({"type": "function", "function": {"name": "now"}}),
        ])
    }

    fn parse(text: &str, format: ToolFormat) -> ParsedOutput {
        parse_tool_calls(text, format, weather_tools(), "x")
    }

    fn args(p: &ParsedOutput, i: usize) -> Value {
        serde_json::from_str(&p.calls[i].arguments_json).expect("arguments are JSON")
    }

    /// Feeds `text` in the given pieces and folds the events.
    fn streamed(pieces: &[&str], format: ToolFormat, tools: ToolSet) -> ParsedOutput {
        let mut p = ToolCallParser::new(format, tools, "x");
        let mut out = ParsedOutput::default();
        for piece in pieces {
            out.absorb(p.push(piece));
        }
        out.absorb(p.finish());
        out
    }

    const XML: &str = "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";

    #[test]
    fn formats_come_from_the_template() {
        let qwen35 = "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{{- '<parameter=' + k + '>' }}";
        assert_eq!(ToolFormat::from_template(Some(qwen35)), ToolFormat::QwenXml);
        let hermes = "{{- '<tool_call>\\n{\"name\": \"' }}{{ tool_call.name }}";
        assert_eq!(ToolFormat::from_template(Some(hermes)), ToolFormat::Hermes);
        let llama = "{%- if message.role == 'ipython' %}{\"name\": function name, \"parameters\": dictionary}";
        assert_eq!(
            ToolFormat::from_template(Some(llama)),
            ToolFormat::Llama3Json
        );
        assert_eq!(
            ToolFormat::from_template(Some("<|python_tag|>")),
            ToolFormat::Llama3Json
        );
        assert_eq!(ToolFormat::from_template(Some("plain")), ToolFormat::Hermes);
        assert_eq!(ToolFormat::from_template(None), ToolFormat::Hermes);
    }

    #[test]
    fn qwen_xml_call_with_text_before() {
        let p = parse(XML, ToolFormat::QwenXml);
        assert_eq!(p.content, "Let me check.");
        assert_eq!(p.calls.len(), 1);
        assert_eq!(p.calls[0].name, "get_weather");
        assert_eq!(p.calls[0].id, "call_x0");
        assert_eq!(args(&p, 0), json!({"city": "Paris", "days": 3}));
        // Key order is the model's.
        assert_eq!(p.calls[0].arguments_json, r#"{"city": "Paris", "days": 3}"#);
    }

    #[test]
    fn qwen_xml_values_follow_the_schema() {
        let text = "<tool_call>\n<function=get_weather>\n\
            <parameter=city>\n  New York\n\n</parameter>\n\
            <parameter=zip>\n00123\n</parameter>\n\
            <parameter=metric>\nTrue\n</parameter>\n\
            <parameter=hours>\n[1, 2]\n</parameter>\n\
            <parameter=opts>\n{\"a\": {\"b\": null}}\n</parameter>\n\
            <parameter=ratio>\n0.5\n</parameter>\n\
            <parameter=note>\n12\n</parameter>\n\
            <parameter=days>\nthree\n</parameter>\n\
            <parameter=any>\n{\"k\": 1}\n</parameter>\n\
            <parameter=undeclared>\n42\n</parameter>\n\
            <parameter=multi>\nline one\nline \"two\" </parameter>\n\
            </function>\n</tool_call>";
        let p = parse(text, ToolFormat::QwenXml);
        assert_eq!(p.content, "");
        assert_eq!(
            args(&p, 0),
            json!({
                "city": "  New York\n",
                "zip": "00123",
                "metric": true,
                "hours": [1, 2],
                "opts": {"a": {"b": null}},
                "ratio": 0.5,
                "note": "12",
                "days": "three",
                "any": {"k": 1},
                "undeclared": "42",
                "multi": "line one\nline \"two\" ",
            })
        );
    }

    #[test]
    fn qwen_xml_several_calls_and_no_parameters() {
        let text = "<tool_call>\n<function=now>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>\nDone.";
        let p = parse(text, ToolFormat::QwenXml);
        assert_eq!(p.calls.len(), 2);
        assert_eq!(p.calls[0].name, "now");
        assert_eq!(p.calls[0].arguments_json, "{}");
        assert_eq!(p.calls[1].id, "call_x1");
        assert_eq!(args(&p, 1), json!({"city": "Oslo"}));
        assert_eq!(p.content, "Done.");
    }

    #[test]
    fn qwen_xml_lenient_once_the_call_is_written() {
        // Missing closing tags, cut off by the end of the output.
        let p = parse(
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome",
            ToolFormat::QwenXml,
        );
        assert_eq!(args(&p, 0), json!({"city": "Rome"}));
        let p = parse(
            "<tool_call><function=get_weather><parameter=city>Rome<parameter=days>2</function>",
            ToolFormat::QwenXml,
        );
        assert_eq!(args(&p, 0), json!({"city": "Rome", "days": 2}));
        let p = parse(
            "<tool_call>\n<function=now>\n</tool_call>after",
            ToolFormat::QwenXml,
        );
        assert_eq!(p.calls[0].arguments_json, "{}");
        assert_eq!(p.content, "after");
        // Stray text between parameters is skipped.
        let p = parse(
            "<tool_call><function=get_weather>junk<parameter=city>A</parameter> more junk </function></tool_call>",
            ToolFormat::QwenXml,
        );
        assert_eq!(args(&p, 0), json!({"city": "A"}));
        assert_eq!(p.content, "");
        // JSON inside the tags is read too.
        let p = parse(
            "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
            ToolFormat::QwenXml,
        );
        assert_eq!(p.calls[0].name, "now");
    }

    #[test]
    fn bad_calls_are_text() {
        for (text, format) in [
            // Unknown function.
            (
                "<tool_call>\n<function=rm_rf>\n<parameter=p>\n/\n</parameter>\n</function>\n</tool_call>",
                ToolFormat::QwenXml,
            ),
            // Not the format.
            ("<tool_call>\nhello\n</tool_call>", ToolFormat::QwenXml),
            ("<tool_call>", ToolFormat::QwenXml),
            ("<tool_call>\n<function=get_wea", ToolFormat::QwenXml),
            ("<tool_call>\n<function=a b\nc>", ToolFormat::QwenXml),
            // JSON that does not parse, lacks a name, or names an unknown function.
            (
                "<tool_call>{\"name\": \"now\", </tool_call>",
                ToolFormat::Hermes,
            ),
            (
                "<tool_call>{\"arguments\": {}}</tool_call>",
                ToolFormat::Hermes,
            ),
            (
                "<tool_call>{\"name\": \"nope\"}</tool_call>",
                ToolFormat::Hermes,
            ),
            (
                "<tool_call>{\"name\": \"now\", \"arguments\": [1]}</tool_call>",
                ToolFormat::Hermes,
            ),
            ("<tool_call>{\"name\": \"now\"", ToolFormat::Hermes),
            (
                "{\"name\": \"now\", \"parameters\": {}",
                ToolFormat::Llama3Json,
            ),
            (
                "{\"name\": \"nope\", \"parameters\": {}}",
                ToolFormat::Llama3Json,
            ),
            ("{\"answer\": 42}", ToolFormat::Llama3Json),
            (
                "{\"name\": \"now\", \"parameters\": {}} trailing words",
                ToolFormat::Llama3Json,
            ),
        ] {
            let p = parse(text, format);
            assert!(p.calls.is_empty(), "{text:?}: {p:?}");
            assert_eq!(p.content, text, "{text:?}");
        }
        // A bad call between good ones stays in place as text.
        let p = parse(
            "A <tool_call>{bad}</tool_call> B <tool_call>{\"name\": \"now\"}</tool_call>",
            ToolFormat::Hermes,
        );
        assert_eq!(p.content, "A <tool_call>{bad}</tool_call> B");
        assert_eq!(p.calls.len(), 1);
        assert_eq!(p.calls[0].id, "call_x0");
    }

    #[test]
    fn hermes_calls() {
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": \"{\\\"tz\\\": \\\"UTC\\\"}\"}\n</tool_call>";
        let p = parse(text, ToolFormat::Hermes);
        assert_eq!(p.content, "");
        assert_eq!(p.calls.len(), 2);
        assert_eq!(args(&p, 0), json!({"city": "Paris", "days": 2}));
        assert_eq!(p.calls[1].name, "now");
        assert_eq!(args(&p, 1), json!({"tz": "UTC"}));
        // `parameters` instead of `arguments`, none at all, an unclosed last call.
        let p = parse(
            "<tool_call>{\"name\": \"now\", \"parameters\": {\"a\": 1}}</tool_call><tool_call>{\"name\": \"now\"}</tool_call>\n<tool_call>{\"name\": \"now\"}",
            ToolFormat::Hermes,
        );
        assert_eq!(args(&p, 0), json!({"a": 1}));
        assert_eq!(args(&p, 1), json!({}));
        assert_eq!(args(&p, 2), json!({}));
        // The XML format's tags mean nothing here.
        let p = parse(XML, ToolFormat::Hermes);
        assert!(p.calls.is_empty());
        assert_eq!(p.content, XML);
    }

    #[test]
    fn llama3_calls() {
        let p = parse(
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Lima\"}}",
            ToolFormat::Llama3Json,
        );
        assert_eq!(p.content, "");
        assert_eq!(args(&p, 0), json!({"city": "Lima"}));
        let p = parse(
            "<|python_tag|>{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"get_weather\", \"arguments\": {\"city\": \"X\"}}\n",
            ToolFormat::Llama3Json,
        );
        assert_eq!(p.calls.len(), 2);
        assert_eq!(p.calls[1].name, "get_weather");
        // Text that is not a call streams as text, tags or not.
        let p = parse(
            "The weather: {\"name\": \"now\"} <tool_call>",
            ToolFormat::Llama3Json,
        );
        assert!(p.calls.is_empty());
        assert_eq!(p.content, "The weather: {\"name\": \"now\"} <tool_call>");
        let p = parse("  \n", ToolFormat::Llama3Json);
        assert_eq!(p.content, "  \n");
    }

    #[test]
    fn plain_text_is_unchanged() {
        for format in [
            ToolFormat::QwenXml,
            ToolFormat::Hermes,
            ToolFormat::Llama3Json,
        ] {
            for text in ["", "hi", "  a <b> c \n\n", "<tool", "x < y", "a\n<tool_cal"] {
                let p = parse(text, format);
                assert_eq!(p.content, text, "{format:?} {text:?}");
                assert!(p.calls.is_empty());
            }
        }
    }

    #[test]
    fn any_tool_set_accepts_any_name() {
        let p = parse_tool_calls(
            "<tool_call>\n<function=whatever>\n<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>",
            ToolFormat::QwenXml,
            ToolSet::any(),
            "y",
        );
        assert_eq!(p.calls[0].name, "whatever");
        // Nothing declares `n`: the value stays a string.
        assert_eq!(p.calls[0].arguments_json, r#"{"n": "5"}"#);
        let only = weather_tools().only("now");
        let p = parse_tool_calls(XML, ToolFormat::QwenXml, only, "y");
        assert!(p.calls.is_empty());
        let schemas =
            ToolSet::from_schemas([("f", Some(&json!({"properties": {"n": {"type": "number"}}})))]);
        let p = parse_tool_calls(
            "<tool_call><function=f><parameter=n>5</parameter></function></tool_call>",
            ToolFormat::QwenXml,
            schemas,
            "y",
        );
        assert_eq!(p.calls[0].arguments_json, r#"{"n": 5}"#);
    }

    #[test]
    fn max_calls_drops_later_calls() {
        let text = "<tool_call>{\"name\": \"now\"}</tool_call>\n<tool_call>{\"name\": \"get_weather\"}</tool_call> end";
        let mut p = ToolCallParser::new(ToolFormat::Hermes, weather_tools(), "x").with_max_calls(1);
        let mut out = ParsedOutput::default();
        out.absorb(p.push(text));
        out.absorb(p.finish());
        assert_eq!(out.calls.len(), 1);
        assert_eq!(out.calls[0].name, "now");
        assert_eq!(out.content, "end");
        assert_eq!(p.call_count(), 1);
    }

    #[test]
    fn streaming_holds_back_only_what_may_be_a_tag() {
        let mut p = ToolCallParser::new(ToolFormat::QwenXml, weather_tools(), "x");
        assert_eq!(p.push("Sure <tool"), vec![ToolEvent::Text("Sure".into())]);
        // Not a tag after all: the held text goes out with what follows.
        assert_eq!(
            p.push("box> ok"),
            vec![ToolEvent::Text(" <toolbox> ok".into())]
        );
        // Whitespace before a call is dropped; the call starts once its name is known, and
        // each parameter goes out as soon as it is closed.
        assert_eq!(p.push("\n<tool_call>\n<function=get_"), vec![]);
        assert_eq!(
            p.push("weather>\n<parameter=city>\nPa"),
            vec![ToolEvent::CallStart {
                index: 0,
                id: "call_x0".into(),
                name: "get_weather".into()
            }]
        );
        assert_eq!(
            p.push("ris\n</parameter>\n"),
            vec![ToolEvent::CallArgs {
                index: 0,
                piece: "{\"city\": \"Paris\"".into()
            }]
        );
        assert_eq!(
            p.push("</function>\n</tool_call>\n"),
            vec![ToolEvent::CallArgs {
                index: 0,
                piece: "}".into()
            }]
        );
        assert_eq!(p.finish(), vec![]);
    }

    /// Every way of cutting the text in two (at char boundaries), and one char at a time,
    /// gives what parsing it whole gives.
    fn check_splits(text: &str, format: ToolFormat) {
        let whole = parse(text, format);
        for cut in 0..=text.len() {
            if !text.is_char_boundary(cut) {
                continue;
            }
            let s = streamed(&[&text[..cut], &text[cut..]], format, weather_tools());
            assert_eq!(s, whole, "{format:?} cut at {cut} of {text:?}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(
            streamed(&pieces, format, weather_tools()),
            whole,
            "{format:?} char by char: {text:?}"
        );
    }

    #[test]
    fn streaming_matches_whole_at_every_split() {
        let cases: &[(&str, ToolFormat)] = &[
            (XML, ToolFormat::QwenXml),
            (
                "a<tool_call>\n<function=now>\n</function>\n</tool_call>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nMünchen — ü\n</parameter>\n<parameter=days>\n1\n</parameter>\n</function>\n</tool_call> z",
                ToolFormat::QwenXml,
            ),
            (
                "<tool_call>\n<function=nope>\n</function>\n</tool_call> <tool_cal <tool_call>x",
                ToolFormat::QwenXml,
            ),
            (
                "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome",
                ToolFormat::QwenXml,
            ),
            (
                "Hi!\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>\n<tool_call>{bad json}</tool_call>\n<tool_call>{\"name\": \"now\"}",
                ToolFormat::Hermes,
            ),
            (
                "<|python_tag|>{\"name\": \"now\", \"parameters\": {}}",
                ToolFormat::Llama3Json,
            ),
            (
                "  {\"name\": \"get_weather\", \"parameters\": {\"city\": \"é\"}}; {\"name\": \"now\", \"parameters\": {}}",
                ToolFormat::Llama3Json,
            ),
            ("<|python_ta plain text", ToolFormat::Llama3Json),
            ("{not a call", ToolFormat::Llama3Json),
            ("text then <tool_call> never closed", ToolFormat::Hermes),
            ("π ≈ 3.14 <tool_call", ToolFormat::QwenXml),
        ];
        for (text, format) in cases {
            check_splits(text, *format);
        }
    }

    #[test]
    fn arguments_are_always_json_objects() {
        // Whatever the XML format's values hold, the arguments built are valid JSON.
        for value in ["\"", "\\", "{", "}\n", "</par", "\u{0}", "ü\"\\n"] {
            let text = format!(
                "<tool_call><function=get_weather><parameter=city>{value}</parameter><parameter=opts>{value}</parameter></function></tool_call>"
            );
            let p = parse(&text, ToolFormat::QwenXml);
            let a = args(&p, 0);
            assert!(a.is_object(), "{value:?}");
            assert!(a["city"].is_string());
        }
    }
}
