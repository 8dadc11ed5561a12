//! The model's own chat template (DESIGN §2), rendered with minijinja the way Hugging Face
//! transformers renders it with jinja2, and the generation defaults of an HF model directory.
//!
//! transformers compiles chat templates in an `ImmutableSandboxedEnvironment(trim_blocks=True,
//! lstrip_blocks=True, extensions=[loopcontrols, AssistantTracker])` with its own `tojson`
//! filter (no HTML escaping, `json.dumps` separators), the globals `raise_exception` and
//! `strftime_now`, and renders with `messages`, `tools`, `documents`, `add_generation_prompt`,
//! the tokenizer's special tokens and any extra template kwargs (`enable_thinking`). Python
//! string/dict/list methods come from `minijinja_contrib::pycompat`.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use minijinja::value::{Kwargs, Rest, Serde, Value, ValueKind, ValueOrKwargs, from_args};
use minijinja::{Environment, Error, ErrorKind, State};
use serde::{Deserialize, Serialize};

use crate::tokenizer::TextTokenizer;

/// One chat message as the template sees it (`message.role`, `message.content`,
/// `message.reasoning_content` — the last only when present).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            reasoning_content: None,
        }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// Name of the one template in the environment (no extension: no auto-escaping).
const TEMPLATE_NAME: &str = "chat_template";

/// Context keys the caller's extra kwargs may not override (transformers passes them
/// explicitly, so a duplicate would be an error there).
/// minijinja's budget for one render, in its fuel: one per instruction and one per 64 bytes of
/// data the template creates. A template is a program from the model's files (or a GGUF
/// header): without a budget, one that loops for ever hangs its request and one that builds
/// strings without end takes all memory. The budget grows with the input (messages, tools,
/// kwargs as JSON): this base, plus one fuel per [`INPUT_BYTES_PER_FUEL`] bytes. Real templates
/// take a few hundred fuel a message plus about a tenth of the input's bytes (8 MiB of
/// messages: 400 000 to 800 000, a few ms), so they stay far below it, while a hostile one stops
/// within some 60 ms and 128 MiB of data, and as much again per 4 MiB of input.
pub const BASE_RENDER_FUEL: u64 = 2_000_000;
/// See [`BASE_RENDER_FUEL`].
pub const INPUT_BYTES_PER_FUEL: u64 = 2;
/// The longest rendered prompt is this plus twice the input's bytes: a template that writes
/// more is stopped there (real ones write the messages and a little markup around each).
pub const BASE_RENDERED_BYTES: usize = 16 << 20;

/// Collects the rendered text up to `limit` bytes, then fails the render.
struct BoundedOutput {
    buf: Vec<u8>,
    limit: usize,
    over: bool,
}

impl std::io::Write for BoundedOutput {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + b.len() > self.limit {
            self.over = true;
            return Err(std::io::Error::other("the rendered prompt is too long"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const RESERVED_KEYS: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// A compiled chat template plus the special-token strings it may reference.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// `bos_token`, `eos_token`, … → string; only tokens that are set are passed.
    special_tokens: Vec<(String, String)>,
    /// The template's text as given.
    source: std::sync::Arc<str>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("special_tokens", &self.special_tokens)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles a template source (e.g. GGUF's `tokenizer.chat_template`).
    pub fn new(source: &str, bos: Option<String>, eos: Option<String>) -> Result<Self> {
        let mut special = Vec::new();
        if let Some(b) = bos {
            special.push(("bos_token".to_string(), b));
        }
        if let Some(e) = eos {
            special.push(("eos_token".to_string(), e));
        }
        Self::with_special_tokens(source, special)
    }

    /// Compiles a template with an arbitrary set of special-token variables
    /// (`bos_token`, `eos_token`, `pad_token`, `unk_token`, …).
    pub fn with_special_tokens(
        source: &str,
        special_tokens: Vec<(String, String)>,
    ) -> Result<Self> {
        let env = build_environment(source)?;
        Ok(Self {
            env,
            special_tokens,
            source: source.into(),
        })
    }

    /// The template of an HF model directory: `chat_template.jinja` if present, else
    /// `tokenizer_config.json`'s `chat_template` (a string, or a list of `{name, template}` of
    /// which "default" is used), else `chat_template.json`. `Ok(None)` when the model has no
    /// template. Special tokens come from `tokenizer_config.json`.
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Option<Self>> {
        let dir = dir.as_ref();
        let config_path = dir.join("tokenizer_config.json");
        let config = read_json_if_exists(&config_path)?;

        let jinja_path = dir.join("chat_template.jinja");
        let source = if jinja_path.is_file() {
            Some(
                std::fs::read_to_string(&jinja_path)
                    .with_context(|| format!("cannot read {}", jinja_path.display()))?,
            )
        } else if let Some(src) = config
            .as_ref()
            .and_then(|c| c.get("chat_template"))
            .filter(|v| !v.is_null())
        {
            Some(
                template_from_json(src)
                    .with_context(|| format!("bad chat_template in {}", config_path.display()))?,
            )
        } else {
            let json_path = dir.join("chat_template.json");
            match read_json_if_exists(&json_path)? {
                Some(v) => match v.get("chat_template").filter(|v| !v.is_null()) {
                    Some(src) => Some(template_from_json(src).with_context(|| {
                        format!("bad chat_template in {}", json_path.display())
                    })?),
                    None => None,
                },
                None => None,
            }
        };
        let Some(source) = source else {
            return Ok(None);
        };

        let mut special = Vec::new();
        if let Some(cfg) = &config {
            for key in ["bos_token", "eos_token", "unk_token", "pad_token"] {
                if let Some(s) = cfg.get(key).and_then(token_string) {
                    special.push((key.to_string(), s));
                }
            }
        }
        Self::with_special_tokens(&source, special)
            .with_context(|| format!("chat template of {}", dir.display()))
            .map(Some)
    }

    /// The template's text, e.g. to tell which tool-call format it teaches.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The `bos_token` string, if the template was given one.
    pub fn bos_token(&self) -> Option<&str> {
        self.special_token("bos_token")
    }

    /// The `eos_token` string, if the template was given one.
    pub fn eos_token(&self) -> Option<&str> {
        self.special_token("eos_token")
    }

    fn special_token(&self, name: &str) -> Option<&str> {
        self.special_tokens
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Renders a conversation. `enable_thinking` is passed to the template only when `Some`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
    ) -> Result<String> {
        self.render_with(messages, None, add_generation_prompt, enable_thinking, None)
    }

    /// Renders any serialisable message list (e.g. OpenAI-style messages with `tool_calls`),
    /// with optional `tools` (JSON schemas, as a list) and extra template kwargs (the server's
    /// `chat_template_kwargs`; they override special tokens, and `enable_thinking` when that is
    /// `None`).
    pub fn render_with<M: Serialize + ?Sized>(
        &self,
        messages: &M,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
        extra: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String> {
        let mut ctx: Vec<(String, Value)> = Vec::new();
        let set = |ctx: &mut Vec<(String, Value)>, k: &str, v: Value| {
            if let Some(slot) = ctx.iter_mut().find(|(key, _)| key == k) {
                slot.1 = v;
            } else {
                ctx.push((k.to_string(), v));
            }
        };
        for (k, v) in &self.special_tokens {
            set(&mut ctx, k, Value::from(v.as_str()));
        }
        if let Some(extra) = extra {
            for (k, v) in extra {
                if !RESERVED_KEYS.contains(&k.as_str()) {
                    set(&mut ctx, k, Value::from(Serde(v)));
                }
            }
        }
        set(&mut ctx, "messages", Value::from(Serde(messages)));
        set(
            &mut ctx,
            "tools",
            tools.map_or(Value::from(()), |t| Value::from(Serde(t))),
        );
        set(&mut ctx, "documents", Value::from(()));
        set(
            &mut ctx,
            "add_generation_prompt",
            Value::from(add_generation_prompt),
        );
        if let Some(t) = enable_thinking {
            set(&mut ctx, "enable_thinking", Value::from(t));
        }
        let ctx = Value::from_pairs(ctx);

        let input = json_len(messages) + tools.map_or(0, json_len) + extra.map_or(0, json_len);
        let fuel = BASE_RENDER_FUEL.saturating_add(input as u64 / INPUT_BYTES_PER_FUEL);
        // Fuel is per environment; a clone shares the compiled template.
        let mut env = self.env.clone();
        env.set_fuel(Some(fuel));
        let tmpl = env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| template_error("chat template failed", &e))?;
        let limit = BASE_RENDERED_BYTES.saturating_add(input.saturating_mul(2));
        let mut out = BoundedOutput {
            buf: Vec::new(),
            limit,
            over: false,
        };
        match tmpl.render_captured_to(ctx, &mut out) {
            Ok(_) => String::from_utf8(out.buf)
                .map_err(|_| anyhow!("chat template failed: its output is not UTF-8")),
            Err(_) if out.over => bail!(
                "chat template failed: its output passed {limit} bytes (a template that \
                 writes without end?)"
            ),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => bail!(
                "chat template failed: it ran past its budget of {fuel} steps (a template \
                 that loops or builds data without end?)"
            ),
            Err(e) => Err(template_error("chat template failed", &e)),
        }
    }
}

/// The length of a value as JSON (what a render's budget grows with).
fn json_len<T: Serialize + ?Sized>(v: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// A one-line anyhow error from a minijinja error (its cause chain flattened).
fn template_error(what: &str, e: &Error) -> anyhow::Error {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let _ = write!(msg, ": {s}");
        source = s.source();
    }
    anyhow!("{what}: {}", msg.replace('\n', " "))
}

fn read_json_if_exists(path: &Path) -> Result<Option<serde_json::Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let v = serde_json::from_str(&text)
        .with_context(|| format!("malformed JSON in {}", path.display()))?;
    Ok(Some(v))
}

/// `chat_template` as a string or as a list of `{name, template}` (the "default" one).
fn template_from_json(v: &serde_json::Value) -> Result<String> {
    match v {
        serde_json::Value::String(s) => Ok(s.clone()),
        serde_json::Value::Array(list) => {
            let mut names = Vec::new();
            for item in list {
                let name = item.get("name").and_then(|n| n.as_str());
                let tmpl = item.get("template").and_then(|t| t.as_str());
                match (name, tmpl) {
                    (Some("default"), Some(t)) => return Ok(t.to_string()),
                    (Some(n), Some(_)) => names.push(n.to_string()),
                    _ => bail!("chat_template list entries must be {{\"name\", \"template\"}}"),
                }
            }
            bail!(
                "chat_template list has no \"default\" template (has: {})",
                names.join(", ")
            )
        }
        other => bail!("chat_template must be a string or a list, not {other}"),
    }
}

/// A special token in `tokenizer_config.json`: a string, `null`, or `{"content": …}`.
fn token_string(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

fn build_environment(source: &str) -> Result<Environment<'static>> {
    let mut env = Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| template_error("chat template syntax config", &e))?,
    );
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(python_formatter);
    env.add_filter("tojson", tojson_filter);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    let source = rewrite_generation_tags(source).into_owned();
    env.add_template_owned(TEMPLATE_NAME, source)
        .map_err(|e| template_error("chat template does not compile", &e))?;
    Ok(env)
}

/// transformers' `AssistantTracker` extension adds a `{% generation %}…{% endgeneration %}`
/// block that only marks assistant text; minijinja has no such tag, so it becomes
/// `{% if true %}…{% endif %}` (whitespace-control markers kept).
fn rewrite_generation_tags(src: &str) -> Cow<'_, str> {
    if !src.contains("generation") {
        return Cow::Borrowed(src);
    }
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    let mut changed = false;
    while let Some(pos) = rest.find("{%") {
        out.push_str(&rest[..pos]);
        let tag = &rest[pos..];
        match parse_generation_tag(tag) {
            Some((len, lead, word, trail)) => {
                let body = if word == "generation" {
                    "if true"
                } else {
                    "endif"
                };
                let _ = write!(out, "{{%{lead} {body} {trail}%}}");
                rest = &tag[len..];
                changed = true;
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    if changed {
        Cow::Owned(out)
    } else {
        Cow::Borrowed(src)
    }
}

/// Parses `{%[-+]? (end)?generation [-+]?%}` at the start of `s`: (length, lead, word, trail).
fn parse_generation_tag(s: &str) -> Option<(usize, &str, &str, &str)> {
    let mut i = 2;
    let b = s.as_bytes();
    let lead_start = i;
    if matches!(b.get(i), Some(b'-' | b'+')) {
        i += 1;
    }
    let lead = &s[lead_start..i];
    while matches!(b.get(i), Some(c) if c.is_ascii_whitespace()) {
        i += 1;
    }
    let word_start = i;
    while matches!(b.get(i), Some(c) if c.is_ascii_alphanumeric() || *c == b'_') {
        i += 1;
    }
    let word = &s[word_start..i];
    if word != "generation" && word != "endgeneration" {
        return None;
    }
    while matches!(b.get(i), Some(c) if c.is_ascii_whitespace()) {
        i += 1;
    }
    let trail_start = i;
    if matches!(b.get(i), Some(b'-' | b'+')) {
        i += 1;
    }
    let trail = &s[trail_start..i];
    if s.get(i..i + 2) != Some("%}") {
        return None;
    }
    Some((i + 2, lead, word, trail))
}

/// `{{ x }}` as Python's `str(x)`: `None`, `True`/`False`, and Python reprs of lists and dicts.
fn python_formatter(
    out: &mut minijinja::Output,
    state: &mut State,
    value: &Value,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Seq | ValueKind::Map => {
            let mut s = String::new();
            py_str(&mut s, value, 0)?;
            out.write_str(&s)
                .map_err(|_| Error::new(ErrorKind::WriteFailure, "formatter write failed"))
        }
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// Python's `str(value)` (`repr` for items inside containers).
fn py_str(out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
    if depth > 64 {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "value nested too deeply",
        ));
    }
    match value.kind() {
        ValueKind::None | ValueKind::Undefined => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::String if depth > 0 => py_repr_str(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_str(out, &item, depth + 1)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let item = value.get_item(&key)?;
                py_str(out, &key, depth + 1)?;
                out.push_str(": ");
                py_str(out, &item, depth + 1)?;
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
    Ok(())
}

/// Python's `repr(str)`.
fn py_repr_str(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)` — no HTML escaping, Python's separators.
fn tojson_filter(value: &Value, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let args = args.0.into_iter().map(Value::from).collect::<Vec<_>>();
    let (pos, kwargs): (&[Value], Kwargs) = from_args(&args)?;
    if pos.len() > 4 {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 positional arguments",
        ));
    }
    let pick = |i: usize, name: &str| -> Result<Option<Value>, Error> {
        let kw: Option<Value> = kwargs.get(name)?;
        Ok(kw.or_else(|| pos.get(i).cloned()))
    };
    let ensure_ascii = pick(0, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match pick(1, "indent")? {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) if v.kind() == ValueKind::String => {
            Some(v.as_str().unwrap_or_default().to_string())
        }
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            None => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson indent must be an integer or a string",
                ));
            }
        },
    };
    let separators = match pick(2, "separators")? {
        Some(v) if !(v.is_none() || v.is_undefined()) => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => Some((
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                )),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson separators must be a pair of strings",
                    ));
                }
            }
        }
        _ => None,
    };
    let sort_keys = pick(3, "sort_keys")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;

    let json = serde_json::to_value(value).map_err(|e| {
        Error::new(
            ErrorKind::InvalidOperation,
            "value is not JSON serializable",
        )
        .with_source(e)
    })?;
    let (item_sep, key_sep) = separators.unwrap_or_else(|| {
        let item = if indent.is_some() { "," } else { ", " };
        (item.to_string(), ": ".to_string())
    });
    let opts = PyJsonOpts {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    let mut out = String::new();
    py_json(&mut out, &json, &opts, 0);
    Ok(Value::from_safe_string(out))
}

struct PyJsonOpts {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// Python's `json.dumps` layout.
fn py_json(out: &mut String, v: &serde_json::Value, o: &PyJsonOpts, level: usize) {
    use serde_json::Value as J;
    let newline = |out: &mut String, level: usize| {
        if let Some(ind) = &o.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    };
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Number(n) => {
            if let Some(i) = n.as_i64() {
                let _ = write!(out, "{i}");
            } else if let Some(u) = n.as_u64() {
                let _ = write!(out, "{u}");
            } else {
                py_float(out, n.as_f64().unwrap_or(f64::NAN));
            }
        }
        J::String(s) => py_json_str(out, s, o.ensure_ascii),
        J::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(out, level + 1);
                py_json(out, item, o, level + 1);
            }
            newline(out, level);
            out.push(']');
        }
        J::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            let mut entries: Vec<(&String, &J)> = map.iter().collect();
            if o.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(out, level + 1);
                py_json_str(out, k, o.ensure_ascii);
                out.push_str(&o.key_sep);
                py_json(out, item, o, level + 1);
            }
            newline(out, level);
            out.push('}');
        }
    }
}

/// Python's `repr(float)` as `json.dumps` writes it.
fn py_float(out: &mut String, f: f64) {
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        let sci = format!("{f:e}");
        let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        if (-4..16).contains(&exp) {
            let s = format!("{f}");
            out.push_str(&s);
            if !s.contains('.') {
                out.push_str(".0");
            }
        } else {
            let sign = if exp < 0 { '-' } else { '+' };
            let _ = write!(out, "{mantissa}e{sign}{:02}", exp.abs());
        }
    }
}

/// A JSON string as Python's `json.dumps` escapes it.
fn py_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current time (UTC) formatted like Python's `strftime`.
fn strftime_now(format: String) -> Result<Value, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Ok(Value::from(strftime_utc(&format, secs)))
}

const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Civil date of a day count since 1970-01-01 (H. Hinnant's algorithm): (year, month, day).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A subset of C `strftime` over a UTC timestamp: `%a %A %b %B %d %e %H %I %j %m %M %p %S %y %Y
/// %Z %z %%`, with glibc's `%-x` (no padding). Unknown directives are copied as they are.
fn strftime_utc(format: &str, secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (sod / 3600, (sod / 60) % 60, sod % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[month as usize - 1] + day as i64 + i64::from(leap && month > 2);
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let no_pad = chars.peek() == Some(&'-');
        if no_pad {
            chars.next();
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let num = |out: &mut String, v: i64, width: usize| {
            if no_pad {
                let _ = write!(out, "{v}");
            } else {
                let _ = write!(out, "{v:0width$}");
            }
        };
        match d {
            'a' => out.push_str(&WEEKDAYS[weekday][..3]),
            'A' => out.push_str(WEEKDAYS[weekday]),
            'b' | 'h' => out.push_str(&MONTHS[month as usize - 1][..3]),
            'B' => out.push_str(MONTHS[month as usize - 1]),
            'd' => num(&mut out, i64::from(day), 2),
            'e' => {
                let _ = write!(out, "{day:>2}");
            }
            'H' => num(&mut out, hour, 2),
            'I' => num(&mut out, hour12, 2),
            'j' => num(&mut out, yday, 3),
            'm' => num(&mut out, i64::from(month), 2),
            'M' => num(&mut out, minute, 2),
            'p' => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            'S' => num(&mut out, second, 2),
            'y' => num(&mut out, year.rem_euclid(100), 2),
            'Y' => {
                let _ = write!(out, "{year}");
            }
            'Z' => out.push_str("UTC"),
            'z' => out.push_str("+0000"),
            '%' => out.push('%'),
            other => {
                out.push('%');
                if no_pad {
                    out.push('-');
                }
                out.push(other);
            }
        }
    }
    out
}

/// Generation defaults of an HF model directory (`generation_config.json` and friends).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GenerationDefaults {
    /// Ids that end generation; deduplicated, in the order found.
    pub eos_token_ids: Vec<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
}

impl GenerationDefaults {
    /// Reads eos ids from `generation_config.json`'s `eos_token_id` (an int or a list), else
    /// `config.json`'s (top level or `text_config`), plus the id of `tokenizer_config.json`'s
    /// `eos_token` when the tokenizer knows it; sampling defaults from `generation_config.json`.
    /// Missing files are fine; malformed JSON is an error naming the file.
    pub fn from_hf_dir(dir: impl AsRef<Path>, tokenizer: &TextTokenizer) -> Result<Self> {
        let dir = dir.as_ref();
        let gen_path = dir.join("generation_config.json");
        let generation = read_json_if_exists(&gen_path)?;
        let config = read_json_if_exists(&dir.join("config.json"))?;
        let tok_config = read_json_if_exists(&dir.join("tokenizer_config.json"))?;

        let mut ids = Vec::new();
        let from_gen = generation
            .as_ref()
            .and_then(|g| g.get("eos_token_id"))
            .filter(|v| !v.is_null());
        let eos_value = from_gen.or_else(|| {
            let c = config.as_ref()?;
            c.get("eos_token_id")
                .filter(|v| !v.is_null())
                .or_else(|| c.get("text_config")?.get("eos_token_id"))
                .filter(|v| !v.is_null())
        });
        if let Some(v) = eos_value {
            ids.extend(
                parse_ids(v).with_context(|| format!("bad eos_token_id in {}", dir.display()))?,
            );
        }
        if let Some(id) = tok_config
            .as_ref()
            .and_then(|t| t.get("eos_token"))
            .and_then(token_string)
            .and_then(|s| tokenizer.token_to_id(&s))
        {
            ids.push(id);
        }
        let mut eos_token_ids: Vec<u32> = Vec::with_capacity(ids.len());
        for id in ids {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }

        let get_f32 = |key: &str| -> Option<f32> {
            generation.as_ref()?.get(key)?.as_f64().map(|x| x as f32)
        };
        let top_k = generation
            .as_ref()
            .and_then(|g| g.get("top_k"))
            .and_then(|v| v.as_u64())
            .and_then(|k| usize::try_from(k).ok());
        Ok(Self {
            eos_token_ids,
            temperature: get_f32("temperature"),
            top_p: get_f32("top_p"),
            top_k,
            min_p: get_f32("min_p"),
        })
    }
}

/// An `eos_token_id` value: an integer or a list of integers.
fn parse_ids(v: &serde_json::Value) -> Result<Vec<u32>> {
    let one = |x: &serde_json::Value| -> Result<u32> {
        x.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| anyhow!("expected a token id, got {x}"))
    };
    match v {
        serde_json::Value::Array(list) => list.iter().map(one).collect(),
        other => Ok(vec![one(other)?]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/fixtures/qwen35-tiny"
    );

    /// A scratch directory removed on drop.
    struct TempDir(std::path::PathBuf);
    impl TempDir {
        fn new(name: &str) -> Self {
            let p = std::env::temp_dir()
                .join(format!("yomi-template-test-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).expect("mkdir");
            Self(p)
        }
        fn write(&self, name: &str, text: &str) {
            std::fs::write(self.0.join(name), text).expect("write");
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn conversation() -> Vec<ChatMessage> {
        vec![
            ChatMessage::system("You are helpful."),
            ChatMessage::user("Hi"),
        ]
    }

    /// Templates that loop, build data or write without end are stopped within their budget
    /// (issue 43: one hung its request for ever, another took all memory), with an error
    /// that says why; real templates with a large conversation stay well within it.
    #[test]
    fn hostile_templates_are_stopped() {
        let lines = "x".repeat(1000);
        let flood = format!(
            "{{% for i in range(100000) %}}{{% for j in range(100000) %}}{lines}\
             {{% endfor %}}{{% endfor %}}"
        );
        for (src, needle) in [
            (
                "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                "budget",
            ),
            (
                "{% set ns = namespace(s='x') %}{% for i in range(100) %}\
                 {% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
                "budget",
            ),
            ("{{ ('x' * 90000000) * 90000000 }}", "budget"),
            (flood.as_str(), "output passed"),
        ] {
            let t = ChatTemplate::new(src, None, None).expect("compile");
            let t0 = std::time::Instant::now();
            let e = t.render(&conversation(), true, None).unwrap_err();
            let msg = format!("{e:#}");
            assert!(msg.contains(needle), "{src:.60}: {msg}");
            assert!(!msg.contains('\n'), "{msg}");
            let took = t0.elapsed();
            assert!(
                took < std::time::Duration::from_secs(5),
                "{src:.60}: {took:?}"
            );
        }
        // 8 MiB of conversation through a real template.
        let msgs: Vec<ChatMessage> = (0..1000)
            .map(|i| match i % 2 {
                0 => ChatMessage::user("x".repeat(8000)),
                _ => ChatMessage::assistant(format!(
                    "<think>\n{}\n</think>\n\n{}",
                    "y".repeat(4000),
                    "z".repeat(4000)
                )),
            })
            .collect();
        let t = ChatTemplate::new(QWEN3_LIKE, None, Some("<|im_end|>".into())).expect("compile");
        let out = t.render(&msgs, true, None).expect("render");
        assert!(out.len() > 6_000_000);
        let t = ChatTemplate::from_hf_dir(FIXTURE)
            .expect("load")
            .expect("template");
        let out = t.render(&msgs, true, None).expect("render");
        assert!(out.len() > 8_000_000);
    }

    #[test]
    fn fixture_template_renders_chatml() {
        let t = ChatTemplate::from_hf_dir(FIXTURE)
            .expect("load")
            .expect("has a template");
        assert_eq!(t.eos_token(), Some("<|im_end|>"));
        assert_eq!(t.bos_token(), None);
        let base = "<|im_start|>system\nYou are helpful.<|im_end|>\n\
                    <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
        let msgs = conversation();
        assert_eq!(t.render(&msgs, true, None).expect("render"), base);
        assert_eq!(t.render(&msgs, true, Some(true)).expect("render"), base);
        assert_eq!(
            t.render(&msgs, true, Some(false)).expect("render"),
            format!("{base}<think>\n\n</think>\n\n")
        );
        assert_eq!(
            t.render(&msgs, false, Some(false)).expect("render"),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        );
    }

    /// A Qwen3-like template exercising what transformers' jinja2 environment provides.
    const QWEN3_LIKE: &str = r#"{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- for tool in tools %}
{{- "\n" }}{{- tool | tojson }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages %}
    {%- if message.role == "user" %}{% set ns.last_user = loop.index0 %}{% endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == "system" and not loop.first %}
        {{- raise_exception('System message must be at the beginning.') }}
    {%- endif %}
    {%- if message.role == "assistant" %}
        {%- set content = message.content %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- else %}
            {%- set reasoning = '' %}
        {%- endif %}
        {%- if loop.index0 > ns.last_user %}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.content.startswith('<tool_response>') %}
        {{- '<|im_start|>tool\n' + message.content + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' }}
        {%- if not loop.last %}{{- '\n' }}{% endif %}
    {%- endif %}
    {%- if message.content == 'STOP' %}{% break %}{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '\n<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"#;

    #[test]
    fn qwen3_like_template_with_tools() {
        let t = ChatTemplate::new(QWEN3_LIKE, None, Some("<|im_end|>".into())).expect("compile");
        let tools: serde_json::Value = serde_json::from_str(
            r#"[{"type": "function", "function": {"name": "f", "description": "a <&> b \"q\" é",
                "parameters": {"n": 1, "x": 0.5, "big": 1e20, "l": [true, null], "e": {}}}}]"#,
        )
        .expect("json");
        let msgs = vec![
            ChatMessage::system("S"),
            ChatMessage::user("Q"),
            ChatMessage::assistant("<think>\nhmm\n</think>\n\nA"),
            ChatMessage::user("<tool_response>r"),
        ];
        let out = t
            .render_with(&msgs, Some(&tools), true, Some(false), None)
            .expect("render");
        let expected = concat!(
            "<|im_start|>system\n\n",
            r#"{"type": "function", "function": {"name": "f", "description": "a <&> b \"q\" é", "#,
            r#""parameters": {"n": 1, "x": 0.5, "big": 1e+20, "l": [true, null], "e": {}}}}"#,
            "<|im_end|>\n",
            "<|im_start|>system\nS<|im_end|>\n",
            "<|im_start|>user\nQ<|im_end|>\n",
            "<|im_start|>assistant\nA<|im_end|>\n",
            "<|im_start|>tool\n<tool_response>r<|im_end|>\n",
            "\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        );
        assert_eq!(out, expected);
    }

    #[test]
    fn qwen3_like_template_reasoning_and_loop_controls() {
        let t = ChatTemplate::new(QWEN3_LIKE, None, None).expect("compile");
        let mut a = ChatMessage::assistant("A");
        a.reasoning_content = Some("\nR\n".into());
        let msgs = vec![
            ChatMessage::user("Q"),
            a,
            ChatMessage::user("STOP"),
            ChatMessage::user("never rendered"),
        ];
        let out = t.render(&msgs, false, None).expect("render");
        assert_eq!(
            out,
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n\
             <|im_start|>user\nSTOP<|im_end|>\n"
        );
        // After the last user turn the reasoning is shown.
        let mut a = ChatMessage::assistant("A");
        a.reasoning_content = Some("\nR\n".into());
        let out = t
            .render(&[ChatMessage::user("Q"), a], false, None)
            .expect("render");
        assert_eq!(
            out,
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nR\n</think>\n\nA<|im_end|>\n"
        );
    }

    #[test]
    fn raise_exception_is_a_clear_one_line_error() {
        let t = ChatTemplate::new(QWEN3_LIKE, None, None).expect("compile");
        let msgs = vec![ChatMessage::user("Q"), ChatMessage::system("late")];
        let err = t.render(&msgs, true, None).unwrap_err().to_string();
        assert!(err.starts_with("chat template failed: "), "{err}");
        assert!(
            err.contains("System message must be at the beginning."),
            "{err}"
        );
        assert!(!err.contains('\n'), "{err}");
        let err = ChatTemplate::new("{% for %}", None, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("chat template"), "{err}");
    }

    #[test]
    fn trim_and_lstrip_blocks_like_transformers() {
        // Without `-` markers: trim_blocks eats the newline after a block tag and lstrip_blocks
        // the indentation before it; the trailing newline of the template is dropped.
        let src = "{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n    {% endif %}\n{% endfor %}\nEND\n";
        let t = ChatTemplate::new(src, None, None).expect("compile");
        let out = t
            .render(
                &[ChatMessage::user("a"), ChatMessage::assistant("b")],
                false,
                None,
            )
            .expect("render");
        assert_eq!(out, "U:a\nEND");
    }

    #[test]
    fn python_values_tojson_options_and_globals() {
        let src = concat!(
            "{{ none }}|{{ true }}|{{ [1, 'a', none, {'k': false}] }}|{{ bos_token }}|",
            "{{ {'b': 1, 'a': [1, 2]} | tojson(indent=2, sort_keys=true) }}|",
            "{{ {'x': 'é<'} | tojson(ensure_ascii=true, separators=[',', ':']) }}|",
            "{{ 'a,b'.split(',') | length }}|{{ {'k': 'v'}.items() | list | length }}|",
            "{% if strftime_now('%Y-%m-%d') | length == 10 %}date{% endif %}|",
            "{% generation %}gen{% endgeneration %}|{{ extra }}"
        );
        let t = ChatTemplate::new(src, Some("<s>".into()), None).expect("compile");
        let mut extra = serde_json::Map::new();
        extra.insert("extra".into(), serde_json::json!("X"));
        extra.insert("messages".into(), serde_json::json!("ignored"));
        let out = t
            .render_with(&conversation(), None, false, None, Some(&extra))
            .expect("render");
        assert_eq!(
            out,
            "None|True|[1, 'a', None, {'k': False}]|<s>|\
             {\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": 1\n}|\
             {\"x\":\"\\u00e9<\"}|2|1|date|gen|X"
        );
    }

    #[test]
    fn strftime_matches_known_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(
            strftime_utc("%Y-%m-%d %H:%M:%S %a %A %b %B %j %I%p %y %-d %e %% %Q", t),
            "2024-02-29 13:05:09 Thu Thursday Feb February 060 01PM 24 29 29 % %Q"
        );
        assert_eq!(strftime_utc("%d %b %Y", 0), "01 Jan 1970");
        assert_eq!(strftime_utc("%Y-%m-%d %a", -86_400), "1969-12-31 Wed");
        assert_eq!(strftime_utc("%j", 951_782_400), "060"); // 2000-02-29
    }

    #[test]
    fn python_float_repr() {
        let f = |x: f64| {
            let mut s = String::new();
            py_float(&mut s, x);
            s
        };
        assert_eq!(f(0.5), "0.5");
        assert_eq!(f(1.0), "1.0");
        assert_eq!(f(-2.0), "-2.0");
        assert_eq!(f(1e16), "1e+16");
        assert_eq!(f(1.5e-5), "1.5e-05");
        assert_eq!(f(0.0001), "0.0001");
        assert_eq!(f(123456789012345.6), "123456789012345.6");
        assert_eq!(f(f64::NAN), "NaN");
    }

    #[test]
    fn from_hf_dir_variants() {
        let d = TempDir::new("variants");
        assert!(ChatTemplate::from_hf_dir(&d.0).expect("ok").is_none());

        d.write(
            "tokenizer_config.json",
            r#"{"chat_template": [{"name": "tool_use", "template": "T"},
                                  {"name": "default", "template": "D{{ bos_token }}{{ eos_token }}"}],
                "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": null}"#,
        );
        let t = ChatTemplate::from_hf_dir(&d.0).expect("ok").expect("some");
        assert_eq!(t.render(&[], false, None).expect("render"), "D<s>");

        d.write("chat_template.jinja", "J{{ messages | length }}");
        let t = ChatTemplate::from_hf_dir(&d.0).expect("ok").expect("some");
        assert_eq!(
            t.render(&conversation(), false, None).expect("render"),
            "J2"
        );

        std::fs::remove_file(d.0.join("chat_template.jinja")).expect("rm");
        d.write(
            "tokenizer_config.json",
            r#"{"chat_template": [{"name": "tool_use", "template": "T"}]}"#,
        );
        let err = format!("{:#}", ChatTemplate::from_hf_dir(&d.0).unwrap_err());
        assert!(err.contains("default") && err.contains("tool_use"), "{err}");

        d.write("tokenizer_config.json", "{ not json");
        let err = format!("{:#}", ChatTemplate::from_hf_dir(&d.0).unwrap_err());
        assert!(err.contains("tokenizer_config.json"), "{err}");
    }

    fn fixture_tokenizer() -> TextTokenizer {
        TextTokenizer::from_file(format!("{FIXTURE}/tokenizer.json")).expect("tokenizer")
    }

    #[test]
    fn generation_defaults_from_fixture() {
        let tok = fixture_tokenizer();
        let g = GenerationDefaults::from_hf_dir(FIXTURE, &tok).expect("defaults");
        assert_eq!(g.eos_token_ids, vec![2]);
        assert_eq!(g.temperature, None);
        assert_eq!(g.top_k, None);
    }

    #[test]
    fn generation_defaults_sources() {
        let tok = fixture_tokenizer();
        let d = TempDir::new("gen");
        let g = GenerationDefaults::from_hf_dir(&d.0, &tok).expect("empty dir is fine");
        assert_eq!(g, GenerationDefaults::default());

        // config.json's text_config, plus the tokenizer's eos_token.
        d.write("config.json", r#"{"text_config": {"eos_token_id": 0}}"#);
        d.write(
            "tokenizer_config.json",
            r#"{"eos_token": {"content": "<|im_end|>"}}"#,
        );
        let g = GenerationDefaults::from_hf_dir(&d.0, &tok).expect("ok");
        assert_eq!(g.eos_token_ids, vec![0, 2]);

        // generation_config.json wins over config.json; duplicates are dropped.
        d.write(
            "generation_config.json",
            r#"{"eos_token_id": [2, 1, 2], "temperature": 0.6, "top_p": 0.95, "top_k": 20}"#,
        );
        let g = GenerationDefaults::from_hf_dir(&d.0, &tok).expect("ok");
        assert_eq!(g.eos_token_ids, vec![2, 1]);
        assert_eq!(g.temperature, Some(0.6));
        assert_eq!(g.top_p, Some(0.95));
        assert_eq!(g.top_k, Some(20));

        d.write("generation_config.json", "{\"eos_token_id\": ");
        let err = format!(
            "{:#}",
            GenerationDefaults::from_hf_dir(&d.0, &tok).unwrap_err()
        );
        assert!(err.contains("generation_config.json"), "{err}");
    }
}
