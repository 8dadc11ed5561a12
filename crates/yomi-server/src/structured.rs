//! Structured output and forced tool calls: the grammar a request's output must match, for
//! the engine's constrained decoding ([`yomi_engine::constraint`]).
//!
//! - `response_format` `{"type": "json_object"}` is any JSON object, `{"type": "json_schema",
//!   "json_schema": {"name", "schema", "strict"}}` JSON matching the schema (always enforced,
//!   whatever `strict` says), laid out as `yomi_engine::constraint::json_layout` says unless the schema's own
//!   `x-guidance` key sets the layout.
//! - `tool_choice: "required"` (Anthropic: `any`) makes the output one or more calls to the
//!   offered functions, a named function (Anthropic: `tool`) calls to that one, in the format
//!   the model's template teaches ([`ToolFormat`]), so that [`crate::tools`] reads them back:
//!   Hermes/Qwen2.5 JSON in `<tool_call>` tags and Llama 3's bare JSON carry the arguments as a
//!   JSON object constrained by the function's `parameters` schema; Qwen3.5's XML-style calls
//!   carry one `<parameter=NAME>` per declared parameter (the required ones always, in the
//!   schema's order; undeclared names never), each value as [`xml_value`] says.
//! - Tools offered with `tool_choice: "auto"` and a JSON `response_format`: the output is
//!   either calls or the JSON answer. Without a `response_format`, `auto` leaves the output
//!   free, as before.
//!
//! A prompt that leaves the model inside a thinking block gets the reasoning first, free text
//! up to the model's think-close tag, then what the grammar asks for.

use serde_json::{Map, Value, json};
use yomi_engine::Grammar;
use yomi_engine::constraint::with_json_layout;

use crate::error::ApiError;
use crate::tools::ToolFormat;

/// A function a call may name: its name and its `parameters` JSON schema.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub name: String,
    pub parameters: Value,
}

/// Tool calls the output may or must consist of.
#[derive(Clone, Debug, PartialEq)]
pub struct CallSpec {
    /// The functions a call may name (one, for a named choice).
    pub functions: Vec<Function>,
    /// More than one call may follow the first.
    pub parallel: bool,
    /// The output must be calls (`required`, a named function); otherwise calls are an
    /// alternative to a JSON answer.
    pub forced: bool,
}

/// What a request asks of its output's form, as parsed (the grammar needs the model: its tool
/// format and think tags).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OutputSpec {
    /// `response_format`'s JSON schema (`{"type": "object"}` for `json_object`).
    pub answer: Option<Value>,
    /// Tools offered (and not turned off by `tool_choice: "none"`).
    pub calls: Option<CallSpec>,
}

impl OutputSpec {
    /// Whether the output is constrained at all.
    pub fn constrains(&self) -> bool {
        self.answer.is_some() || self.calls.as_ref().is_some_and(|c| c.forced)
    }

    /// The parameter an error in the grammar is blamed on.
    pub fn param(&self) -> &'static str {
        if self.calls.as_ref().is_some_and(|c| c.forced) {
            "tools"
        } else {
            "response_format"
        }
    }
}

fn kind_name(v: &Value) -> &'static str {
    crate::api::kind_name(v)
}

/// OpenAI's `response_format`: `None` for text (or absent), else the answer's JSON schema.
pub fn parse_response_format(v: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let bad = |param: &str, msg: String| ApiError::bad_param(param, msg);
    let o = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(v) => {
            return Err(bad(
                "response_format",
                format!("`response_format` must be an object, got {}", kind_name(v)),
            ));
        }
    };
    match o.get("type") {
        Some(Value::String(t)) if t == "text" => Ok(None),
        Some(Value::String(t)) if t == "json_object" => Ok(Some(json!({"type": "object"}))),
        Some(Value::String(t)) if t == "json_schema" => {
            let Some(Value::Object(js)) = o.get("json_schema") else {
                return Err(bad(
                    "response_format.json_schema",
                    "`json_schema` must be an object with a `name` and a `schema`".into(),
                ));
            };
            match js.get("name") {
                Some(Value::String(n)) if !n.is_empty() && n.len() <= 64 => {}
                _ => {
                    return Err(bad(
                        "response_format.json_schema.name",
                        "`name` must be a string of 1 to 64 characters".into(),
                    ));
                }
            }
            if js
                .get("strict")
                .is_some_and(|s| !s.is_null() && !s.is_boolean())
            {
                return Err(bad(
                    "response_format.json_schema.strict",
                    "`strict` must be a boolean".into(),
                ));
            }
            match js.get("schema") {
                // OpenAI's default: any JSON object.
                None | Some(Value::Null) => Ok(Some(json!({"type": "object"}))),
                Some(s @ (Value::Object(_) | Value::Bool(true))) => Ok(Some(s.clone())),
                Some(v) => Err(bad(
                    "response_format.json_schema.schema",
                    format!(
                        "`schema` must be a JSON schema object, got {}",
                        kind_name(v)
                    ),
                )),
            }
        }
        Some(Value::String(t)) => {
            let shown: String = t.chars().take(64).collect();
            Err(bad(
                "response_format.type",
                format!(
                    "unknown `response_format` type {shown:?} (expected \"text\", \
                     \"json_object\" or \"json_schema\")"
                ),
            ))
        }
        _ => Err(bad(
            "response_format.type",
            "`response_format` needs a `type`".into(),
        )),
    }
}

/// The functions of OpenAI-shaped tools (`[{"type": "function", "function": {name,
/// parameters}}]`), only `only` when given. A function without `parameters` takes none.
pub fn functions(tools: &[Value], only: Option<&str>) -> Vec<Function> {
    tools
        .iter()
        .filter_map(|t| {
            let f = t.get("function")?;
            let name = f.get("name")?.as_str()?.to_string();
            if only.is_some_and(|o| o != name) {
                return None;
            }
            let parameters = match f.get("parameters") {
                Some(p @ Value::Object(_)) => p.clone(),
                _ => json!({"type": "object", "properties": {}, "additionalProperties": false}),
            };
            Some(Function { name, parameters })
        })
        .collect()
}

/// How the model closes a thinking block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ThinkClose {
    /// A special token (absent from the decoded text).
    Token(u32),
    /// Text (e.g. `</think>` spelled by ordinary tokens).
    Text(String),
}

/// A Lark string literal (Lark takes JSON's string syntax).
fn lit(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// A Lark `%json` item for `schema` (laid out as `json_layout` says unless it says otherwise).
fn json_item(schema: &Value) -> String {
    let schema = match schema {
        // `true` is the schema that takes anything; %json wants an object.
        Value::Bool(true) => json!({}),
        s => s.clone(),
    };
    format!("%json {}", with_json_layout(&schema))
}

/// The JSON object of a JSON-format call: `{"name": NAME, KEY: ARGUMENTS}` for each function,
/// `KEY` being `arguments` (Hermes) or `parameters` (Llama 3), with the name first.
fn json_call_schema(functions: &[Function], key: &str) -> Value {
    let one = |f: &Function| {
        let mut props = Map::new();
        props.insert("name".into(), json!({"const": f.name}));
        props.insert(key.into(), f.parameters.clone());
        json!({
            "type": "object",
            "properties": props,
            "required": ["name", key],
            "additionalProperties": false,
        })
    };
    match functions {
        [f] => one(f),
        fs => json!({"anyOf": fs.iter().map(one).collect::<Vec<_>>()}),
    }
}

/// The value of an XML-format parameter, as [`crate::tools`] reads it back: a parameter
/// declared a string (`"type": "string"`, or an `enum`/`const` of strings) is raw text — one
/// of its values, or one line without `<` of at most `maxLength` characters (and at least
/// `minLength`); its `pattern` and `format` are not enforced. Anything else is JSON text that
/// matches the parameter's schema, fully enforced.
fn xml_value(schema: &Value) -> String {
    let strings = |v: &Value| -> Option<Vec<String>> {
        v.as_array()?
            .iter()
            .map(|x| x.as_str().map(str::to_string))
            .collect()
    };
    if let Some(c) = schema.get("const").and_then(Value::as_str) {
        return lit(c);
    }
    if let Some(values) = schema.get("enum").and_then(strings)
        && !values.is_empty()
    {
        let alts: Vec<String> = values.iter().map(|v| lit(v)).collect();
        return format!("({})", alts.join(" | "));
    }
    if schema.get("type").and_then(Value::as_str) == Some("string") {
        let n = |k: &str| schema.get(k).and_then(Value::as_u64);
        let min = n("minLength").unwrap_or(0);
        let reps = match n("maxLength") {
            Some(max) => format!("{{{min},{}}}", max.max(min)),
            None => format!("{{{min},}}"),
        };
        return format!("/[^<\\n]{reps}/");
    }
    json_item(schema)
}

/// Lark rules named `calls` (and helpers prefixed `c_`) for calls in `format`.
fn calls_rules(format: ToolFormat, spec: &CallSpec) -> String {
    let mut g = String::new();
    let sep = match format {
        ToolFormat::Llama3Json => "\"; \"",
        ToolFormat::Hermes | ToolFormat::QwenXml => "\"\\n\"",
    };
    if spec.parallel {
        g.push_str(&format!("calls: c_call ({sep} c_call)*\n"));
    } else {
        g.push_str("calls: c_call\n");
    }
    match format {
        ToolFormat::Hermes => {
            let schema = json_call_schema(&spec.functions, "arguments");
            g.push_str(&format!(
                "c_call: {} c_json {}\nc_json: {}\n",
                lit("<tool_call>\n"),
                lit("\n</tool_call>"),
                json_item(&schema)
            ));
        }
        ToolFormat::Llama3Json => {
            let schema = json_call_schema(&spec.functions, "parameters");
            g.push_str(&format!("c_call: {}\n", json_item(&schema)));
        }
        ToolFormat::QwenXml => {
            let fns: Vec<String> = (0..spec.functions.len())
                .map(|i| format!("c_fn_{i}"))
                .collect();
            g.push_str(&format!(
                "c_call: {} ({}) {}\n",
                lit("<tool_call>\n"),
                fns.join(" | "),
                lit("</tool_call>")
            ));
            for (i, f) in spec.functions.iter().enumerate() {
                let props = f
                    .parameters
                    .get("properties")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                let required: Vec<&str> = f
                    .parameters
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let mut body = Vec::new();
                for (j, (name, schema)) in props.iter().enumerate() {
                    let rule = format!("c_p_{i}_{j}");
                    g.push_str(&format!(
                        "{rule}: {} {} {}\n",
                        lit(&format!("<parameter={name}>\n")),
                        xml_value(schema),
                        lit("\n</parameter>\n")
                    ));
                    let opt = if required.contains(&name.as_str()) {
                        ""
                    } else {
                        "?"
                    };
                    body.push(format!("{rule}{opt}"));
                }
                g.push_str(&format!(
                    "c_fn_{i}: {} {} {}\n",
                    lit(&format!("<function={}>\n", f.name)),
                    body.join(" "),
                    lit("</function>\n")
                ));
            }
        }
    }
    g
}

/// The grammar of a request's output, or `None` when it is free. `format` is the model's tool
/// format; `think` the think-close tag when the prompt leaves the model inside a thinking
/// block.
pub fn grammar(
    spec: &OutputSpec,
    format: ToolFormat,
    think: Option<&ThinkClose>,
) -> Option<Grammar> {
    if !spec.constrains() {
        return None;
    }
    let mut g = String::new();
    let body = match (&spec.calls, &spec.answer) {
        (Some(c), _) if c.forced => {
            g.push_str(&calls_rules(format, c));
            "calls"
        }
        (Some(c), Some(answer)) => {
            g.push_str(&calls_rules(format, c));
            g.push_str(&format!("answer: {}\n", json_item(answer)));
            "(calls | answer)"
        }
        (_, Some(answer)) => {
            g.push_str(&format!("answer: {}\n", json_item(answer)));
            "answer"
        }
        (_, None) => return None,
    };
    let start = match think {
        None => format!("start: {body}\n"),
        // The reasoning is free text up to the close tag; the answer may follow a blank line.
        Some(ThinkClose::Token(id)) => {
            format!("start: think <[{id}]> /\\n{{0,2}}/ {body}\nthink: /(?s:.*)/\n")
        }
        Some(ThinkClose::Text(tag)) => format!(
            "start: think /\\n{{0,2}}/ {body}\nthink[suffix={}]: /(?s:.*)/\n",
            lit(tag)
        ),
    };
    Some(Grammar::Lark(start + &g))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{ToolSet, parse_tool_calls};

    fn weather() -> Function {
        Function {
            name: "get_weather".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 12},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                    "unit": {"enum": ["c", "f"]},
                },
                "required": ["city", "days"],
                "additionalProperties": false,
            }),
        }
    }

    fn forced(functions: Vec<Function>, parallel: bool) -> OutputSpec {
        OutputSpec {
            answer: None,
            calls: Some(CallSpec {
                functions,
                parallel,
                forced: true,
            }),
        }
    }

    fn lark(g: Option<Grammar>) -> String {
        match g {
            Some(Grammar::Lark(s)) => s,
            other => panic!("not a Lark grammar: {other:?}"),
        }
    }

    #[test]
    fn response_formats_parse() {
        assert_eq!(parse_response_format(None).unwrap(), None);
        assert_eq!(
            parse_response_format(Some(&json!({"type": "text"}))).unwrap(),
            None
        );
        assert_eq!(
            parse_response_format(Some(&json!({"type": "json_object"}))).unwrap(),
            Some(json!({"type": "object"}))
        );
        let s = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let rf = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": s, "strict": true}});
        assert_eq!(parse_response_format(Some(&rf)).unwrap(), Some(s));
        for (bad, param) in [
            (json!("json"), "response_format"),
            (json!({"type": "yaml"}), "response_format.type"),
            (json!({}), "response_format.type"),
            (
                json!({"type": "json_schema"}),
                "response_format.json_schema",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"schema": {}}}),
                "response_format.json_schema.name",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"name": "x", "strict": "yes"}}),
                "response_format.json_schema.strict",
            ),
        ] {
            let e = parse_response_format(Some(&bad)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{bad}");
        }
    }

    #[test]
    fn free_output_has_no_grammar() {
        assert_eq!(
            grammar(&OutputSpec::default(), ToolFormat::Hermes, None),
            None
        );
        let auto = OutputSpec {
            answer: None,
            calls: Some(CallSpec {
                functions: vec![weather()],
                parallel: true,
                forced: false,
            }),
        };
        assert_eq!(grammar(&auto, ToolFormat::Hermes, None), None);
    }

    #[test]
    fn grammars_have_the_expected_shape() {
        let g = lark(grammar(
            &forced(vec![weather()], false),
            ToolFormat::Hermes,
            None,
        ));
        assert!(g.starts_with("start: calls\ncalls: c_call\n"), "{g}");
        assert!(
            g.contains(r#""<tool_call>\n" c_json "\n</tool_call>""#),
            "{g}"
        );
        assert!(g.contains(r#""const":"get_weather""#), "{g}");
        let g = lark(grammar(
            &forced(vec![weather()], true),
            ToolFormat::Llama3Json,
            None,
        ));
        assert!(g.contains(r#"calls: c_call ("; " c_call)*"#), "{g}");
        assert!(g.contains(r#""required":["name","parameters"]"#), "{g}");
        let g = lark(grammar(
            &forced(vec![weather()], false),
            ToolFormat::QwenXml,
            None,
        ));
        assert!(
            g.contains(r#"c_p_0_0: "<parameter=city>\n" /[^<\n]{0,12}/"#),
            "{g}"
        );
        assert!(
            g.contains(r#"c_p_0_2: "<parameter=unit>\n" ("c" | "f")"#),
            "{g}"
        );
        assert!(g.contains("c_p_0_0 c_p_0_1 c_p_0_2?"), "{g}");
        let answer = OutputSpec {
            answer: Some(json!({"type": "object"})),
            calls: None,
        };
        let g = lark(grammar(
            &answer,
            ToolFormat::Hermes,
            Some(&ThinkClose::Token(4)),
        ));
        assert!(
            g.starts_with("start: think <[4]> /\\n{0,2}/ answer\n"),
            "{g}"
        );
        let g = lark(grammar(
            &answer,
            ToolFormat::Hermes,
            Some(&ThinkClose::Text("</think>".into())),
        ));
        assert!(g.contains(r#"think[suffix="</think>"]"#), "{g}");
    }

    fn engine() -> yomi_engine::Engine {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/fixtures/qwen35-tiny");
        let opts = yomi_engine::EngineOptions {
            context_size: Some(256),
            ..Default::default()
        };
        yomi_engine::Engine::load(&dir, &opts, &mut |_, _| {}).expect("fixture engine")
    }

    /// Whether the grammar takes `text` whole (fed as the tokenizer splits it, `think` token
    /// ids first) and may end after it.
    fn accepts(e: &yomi_engine::Engine, g: &Grammar, pre: &[u32], text: &str) -> bool {
        let mut c = e.constraint(g).expect("compiles");
        let mut ids = pre.to_vec();
        ids.extend(e.tokenizer.encode(text, false).unwrap());
        for t in ids {
            if !c.mask().unwrap().is_allowed(t) {
                return false;
            }
            c.accept(t).unwrap();
        }
        c.finished_at().is_some() || c.mask().unwrap().is_allowed(e.eos_token_ids[0])
    }

    const HERMES_CALL: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n</tool_call>";
    const LLAMA_CALL: &str =
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"days\": 2}}";
    const XML_CALL: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>";

    /// Each format's grammar takes a well-formed call and refuses calls to other functions,
    /// with undeclared or missing parameters or values outside their schema.
    #[test]
    fn call_grammars_take_good_calls_and_refuse_bad_ones() {
        let e = engine();
        let time = Function {
            name: "get_time".into(),
            parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
        };
        let both = forced(vec![weather(), time.clone()], true);
        let one = forced(vec![weather()], false);
        for (format, good, bad) in [
            (
                ToolFormat::Hermes,
                HERMES_CALL,
                vec![
                    HERMES_CALL.replace("Oslo", "a city name too long"),
                    HERMES_CALL.replace("\"days\": 2", "\"days\": 9"),
                    HERMES_CALL.replace(", \"days\": 2", ""),
                    HERMES_CALL.replace("get_weather", "get_wether"),
                    HERMES_CALL.replace("}}", ", \"x\": 1}}"),
                ],
            ),
            (
                ToolFormat::Llama3Json,
                LLAMA_CALL,
                vec![
                    LLAMA_CALL.replace("parameters", "arguments"),
                    LLAMA_CALL.replace("\"days\": 2", "\"days\": \"2\""),
                ],
            ),
            (
                ToolFormat::QwenXml,
                XML_CALL,
                vec![
                    XML_CALL.replace("\n2\n", "\n0\n"),
                    XML_CALL.replace("Oslo", "Os<lo"),
                    XML_CALL.replace("<parameter=city>\nOslo\n</parameter>\n", ""),
                    XML_CALL.replace("=days>", "=weeks>"),
                    XML_CALL.replace("get_weather", "get_time"),
                ],
            ),
        ] {
            let g1 = grammar(&one, format, None).unwrap();
            assert!(accepts(&e, &g1, &[], good), "{format:?}: {good}");
            for b in &bad {
                assert!(!accepts(&e, &g1, &[], b), "{format:?} took {b}");
            }
            // Two calls, the second to the other function, under the parallel grammar only.
            let other = match format {
                ToolFormat::Hermes => {
                    "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"
                }
                ToolFormat::Llama3Json => "; {\"name\": \"get_time\", \"parameters\": {}}",
                ToolFormat::QwenXml => {
                    "\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>"
                }
            };
            let two = format!("{good}{other}");
            let g2 = grammar(&both, format, None).unwrap();
            assert!(accepts(&e, &g2, &[], &two), "{format:?}: {two}");
            assert!(!accepts(&e, &g1, &[], &two), "{format:?}: {two}");
        }
    }

    /// A JSON answer after free reasoning closed by the think token; calls or the answer when
    /// tools are offered with `auto` and a JSON format.
    #[test]
    fn answers_reasoning_and_alternatives() {
        let e = engine();
        let answer = json!({"type": "object", "properties": {"n": {"type": "integer"}},
            "required": ["n"], "additionalProperties": false});
        let spec = OutputSpec {
            answer: Some(answer.clone()),
            calls: None,
        };
        let g = grammar(&spec, ToolFormat::Hermes, None).unwrap();
        assert!(accepts(&e, &g, &[], "{\"n\": 3}"));
        assert!(!accepts(&e, &g, &[], "{\"n\":3}"), "the layout is fixed");
        assert!(!accepts(&e, &g, &[], " {\"n\": 3}"));
        let close = e.tokenizer.token_to_id("</think>").unwrap();
        let g = grammar(&spec, ToolFormat::Hermes, Some(&ThinkClose::Token(close))).unwrap();
        let mut pre = e.tokenizer.encode("let me see", false).unwrap();
        pre.push(close);
        assert!(accepts(&e, &g, &pre, "\n\n{\"n\": 3}"));
        assert!(
            !accepts(&e, &g, &[], "{\"n\": 3}"),
            "the reasoning comes first"
        );
        let either = OutputSpec {
            answer: Some(answer),
            calls: Some(CallSpec {
                functions: vec![weather()],
                parallel: false,
                forced: false,
            }),
        };
        let g = grammar(&either, ToolFormat::Hermes, None).unwrap();
        assert!(accepts(&e, &g, &[], "{\"n\": 3}"));
        assert!(accepts(&e, &g, &[], HERMES_CALL));
        assert!(!accepts(&e, &g, &[], "hello"));
    }

    /// Text each grammar allows, read back by the tool-call parser: the calls and arguments
    /// the grammar is meant to force are what the server reports.
    #[test]
    fn forced_call_texts_read_back_as_calls() {
        let set = ToolSet::from_openai(&[json!({"type": "function", "function": {
            "name": "get_weather", "parameters": weather().parameters}})]);
        for (format, text) in [
            (
                ToolFormat::Hermes,
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n</tool_call>",
            ),
            (
                ToolFormat::Llama3Json,
                "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"days\": 2}}",
            ),
            (
                ToolFormat::QwenXml,
                "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
            ),
        ] {
            let p = parse_tool_calls(text, format, set.clone(), "x");
            assert_eq!(p.content, "", "{format:?}");
            assert_eq!(p.calls.len(), 1, "{format:?}");
            let args: Value = serde_json::from_str(&p.calls[0].arguments_json).unwrap();
            assert_eq!(args, json!({"city": "Oslo", "days": 2}), "{format:?}");
        }
    }
}
