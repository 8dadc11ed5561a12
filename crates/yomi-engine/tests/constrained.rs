//! Constrained decoding: on every fixture model (random weights) and on SmolLM2, output under a
//! JSON schema parses and satisfies the schema, and stops where the grammar is complete; with
//! drafting (the suffix drafter, an adversarial drafter that proposes what the grammar forbids,
//! and the DFlash fixture drafter) the output is token for token that of constrained plain
//! decoding, greedy and seeded. Bad grammars are errors, not panics.
//!
//! The schemas bound every string, number and array (maxLength, enum, maximum, maxItems) and
//! forbid other keys, so that a random model, which picks among the allowed tokens at random,
//! finishes well within the token limit.

use std::path::PathBuf;

use serde_json::{Value, json};
use yomi_core::SamplerParams;
use yomi_engine::dflash_drafter::DraftShape;
use yomi_engine::generate::DraftMode;
use yomi_engine::stats::StatsRecorder;
use yomi_engine::template::ChatMessage;
use yomi_engine::{
    Constraint, Engine, EngineOptions, FinishReason, GenerateParams, Generation, Grammar, Prompt,
};
use yomi_models::KvDtype;
use yomi_spec::{DraftTree, Drafter, SuffixDrafter};

#[path = "../../../tests/support/smollm2.rs"]
mod smollm2;

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

fn engine(path: PathBuf) -> Engine {
    let opts = EngineOptions {
        context_size: Some(1024),
        kv_cache: Some(KvDtype::F32),
        ..Default::default()
    };
    Engine::load(&path, &opts, &mut |_, _| {}).expect("load engine")
}

/// The fixture models: every architecture and tokenizer kind yomi loads.
fn fixtures() -> Vec<(&'static str, PathBuf)> {
    vec![
        ("qwen35-tiny", repo("../shared/fixtures/qwen35-tiny")),
        ("llama-tiny", repo("tests/data/llama-tiny")),
        ("qwen2-tiny", repo("tests/data/qwen2-tiny")),
        ("qwen3-tiny", repo("tests/data/qwen3-tiny")),
        (
            "qwen35-tiny-gguf q8_0",
            repo("tests/data/qwen35-tiny-gguf/qwen35-tiny-q8_0.gguf"),
        ),
        (
            "llama-tiny-spm-gguf",
            repo("tests/data/llama-tiny-spm-gguf/llama-tiny-spm-f16.gguf"),
        ),
    ]
}

/// A person record: every value bounded.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "member": {"type": "boolean"},
            "color": {"enum": ["red", "green", "blue"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
        },
        "required": ["name", "age", "member", "color", "tags"],
        "additionalProperties": false,
    })
}

/// Checks `v` against [`person_schema`], keyword by keyword (the tests' own reading of the
/// schema, independent of the grammar engine).
fn check_person(v: &Value) -> Result<(), String> {
    let o = v.as_object().ok_or("not an object")?;
    let keys: Vec<&str> = o.keys().map(String::as_str).collect();
    if keys != ["name", "age", "member", "color", "tags"] {
        return Err(format!("keys {keys:?}"));
    }
    let name = o["name"].as_str().ok_or("name is not a string")?;
    if name.chars().count() > 8 {
        return Err(format!("name {name:?} is too long"));
    }
    match o["age"].as_i64() {
        Some(a) if (0..=120).contains(&a) && o["age"].is_i64() => {}
        _ => return Err(format!("age {}", o["age"])),
    }
    if !o["member"].is_boolean() {
        return Err(format!("member {}", o["member"]));
    }
    if !["red", "green", "blue"].contains(&o["color"].as_str().unwrap_or("")) {
        return Err(format!("color {}", o["color"]));
    }
    let tags = o["tags"].as_array().ok_or("tags is not an array")?;
    if tags.len() > 2
        || tags
            .iter()
            .any(|t| t.as_str().is_none_or(|s| s.chars().count() > 4))
    {
        return Err(format!("tags {}", o["tags"]));
    }
    Ok(())
}

fn greedy() -> SamplerParams {
    SamplerParams::greedy()
}

fn seeded(seed: u64) -> SamplerParams {
    SamplerParams {
        temperature: 0.9,
        top_p: 0.95,
        seed,
        ..Default::default()
    }
}

fn params(draft: DraftMode, sampler: SamplerParams, max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampler,
        stop: Vec::new(),
        draft,
        draft_budget: 16,
    }
}

/// One run under `grammar` (none: unconstrained), with `drafter` if given.
fn run(
    e: &Engine,
    ids: &[u32],
    p: &GenerateParams,
    grammar: Option<&Grammar>,
    drafter: Option<&mut dyn Drafter>,
) -> Generation {
    let mut c: Option<Constraint> = grammar.map(|g| e.constraint(g).expect("compiles"));
    let mut st = e.new_state();
    e.generate_constrained(
        &mut st,
        ids,
        p,
        drafter,
        c.as_mut(),
        StatsRecorder::start(),
        &mut |_| true,
    )
    .expect("generate")
}

fn prompt_ids(e: &Engine, text: &str) -> Vec<u32> {
    let prompt = if e.template.is_some() {
        Prompt::Chat {
            messages: vec![ChatMessage::user(text.to_string())],
            enable_thinking: Some(false),
        }
    } else {
        Prompt::Text(text.to_string())
    };
    e.prompt_ids(&prompt).expect("prompt")
}

const ASK: &str = "Describe a person as JSON with name, age, member, color and tags.";

/// Every fixture model and SmolLM2, greedy and three seeds: the text is JSON that satisfies the
/// schema, and the run ends because the grammar is complete (not at the token limit).
#[test]
fn schema_output_is_valid_on_every_fixture_model() {
    let grammar = Grammar::JsonSchema(person_schema());
    let mut models = fixtures();
    models.push(("smollm2", smollm2::gguf_path()));
    for (name, path) in models {
        let e = engine(path);
        let ids = prompt_ids(&e, ASK);
        for sampler in [greedy(), seeded(1), seeded(2), seeded(3)] {
            let what = format!("{name} {sampler:?}");
            let g = run(
                &e,
                &ids,
                &params(DraftMode::None, sampler, 200),
                Some(&grammar),
                None,
            );
            assert_eq!(g.finish_reason, FinishReason::Stop, "{what}: {:?}", g.text);
            let v: Value = serde_json::from_str(&g.text)
                .unwrap_or_else(|err| panic!("{what}: {:?} is not JSON: {err}", g.text));
            check_person(&v).unwrap_or_else(|err| panic!("{what}: {}: {err}", g.text));
            // The grammar ended the run, not an EOS token: nothing follows the JSON.
            assert!(g.text.ends_with('}'), "{what}: {:?}", g.text);
            eprintln!("{what}: {}", g.text);
        }
    }
}

/// The same runs without the grammar are not JSON (the random models write whatever): the
/// constraint is what makes them valid.
#[test]
fn unconstrained_random_models_do_not_write_the_json() {
    for (name, path) in fixtures() {
        let e = engine(path);
        let ids = prompt_ids(&e, ASK);
        let g = run(&e, &ids, &params(DraftMode::None, greedy(), 60), None, None);
        let ok = serde_json::from_str::<Value>(&g.text)
            .ok()
            .is_some_and(|v| check_person(&v).is_ok());
        assert!(!ok, "{name}: {:?}", g.text);
    }
}

/// Proposes, at each pass, the unconstrained output's continuation (tokens the grammar mostly
/// forbids) as the first branch and the constrained output's as the second, each cut short at
/// a pseudo-random depth: the walk must refuse the forbidden branch and take the right one.
struct Adversary {
    constrained: Vec<u32>,
    unconstrained: Vec<u32>,
    state: u64,
    proposed: usize,
    accepted: usize,
}

impl Adversary {
    fn new(prompt: &[u32], constrained: &[u32], unconstrained: &[u32]) -> Self {
        let full = |out: &[u32]| [prompt, out].concat();
        Adversary {
            constrained: full(constrained),
            unconstrained: full(unconstrained),
            state: 0x5eed,
            proposed: 0,
            accepted: 0,
        }
    }

    fn rand(&mut self, n: u64) -> u64 {
        self.state = self
            .state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.state >> 33) % n
    }
}

impl Drafter for Adversary {
    fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree) {
        out.reset(*context.last().expect("a context"));
        assert!(
            self.constrained.starts_with(context),
            "the context left the constrained output"
        );
        let pos = context.len();
        let wrong_len = (1 + self.rand(4) as usize).min(budget / 2);
        let mut cur = 0;
        for k in 0..wrong_len {
            match self.unconstrained.get(pos + k) {
                Some(&t) => cur = out.push(cur, t),
                None => break,
            }
        }
        let right_len = (1 + self.rand(12) as usize).min(budget - out.num_drafts());
        let mut cur = 0;
        for k in 0..right_len {
            match self.constrained.get(pos + k) {
                Some(&t) => {
                    // A sibling equal to the wrong branch's first token would break sibling
                    // uniqueness: the branches then share that row.
                    let existing = (1..out.len())
                        .find(|&r| out.parents()[r] == cur as i32 && out.tokens()[r] == t);
                    cur = match existing {
                        Some(r) => r,
                        None => out.push(cur, t),
                    };
                }
                _ => break,
            }
        }
        out.check().expect("a well-formed tree");
    }

    fn observe(&mut self, accepted: usize, proposed: usize) {
        self.accepted += accepted;
        self.proposed += proposed;
    }
}

/// The suffix drafter with its default row cost (deaf to the machine's pass timings).
struct FixedCost(SuffixDrafter);

impl Drafter for FixedCost {
    fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree) {
        self.0.propose(context, budget, out)
    }
    fn observe(&mut self, accepted: usize, proposed: usize) {
        self.0.observe(accepted, proposed)
    }
}

/// Constrained drafting equals constrained plain decoding, greedy and seeded, with the suffix
/// drafter and with the adversary, whose forbidden branch is never taken while its right one
/// is (drafts are accepted).
fn drafting_is_lossless(name: &str, e: &Engine, ids: &[u32], grammar: &Grammar) {
    let (mut proposed, mut accepted) = (0, 0);
    for sampler in [greedy(), seeded(5), seeded(6)] {
        let what = format!("{name} {sampler:?}");
        let p = params(DraftMode::None, sampler.clone(), 200);
        let plain = run(e, ids, &p, Some(grammar), None);
        assert_eq!(plain.finish_reason, FinishReason::Stop, "{what}");
        let free = run(e, ids, &p, None, None);
        let mut adv = Adversary::new(ids, &plain.output_ids, &free.output_ids);
        let spec = run(e, ids, &p, Some(grammar), Some(&mut adv));
        assert_eq!(spec.output_ids, plain.output_ids, "{what}: adversary");
        assert_eq!(spec.text, plain.text, "{what}");
        assert_eq!(spec.finish_reason, plain.finish_reason, "{what}");
        assert!(
            spec.stats.verify_passes < plain.stats.verify_passes,
            "{what}"
        );
        proposed += adv.proposed;
        accepted += adv.accepted;
        let mut suffix = FixedCost(SuffixDrafter::default());
        let spec = run(e, ids, &p, Some(grammar), Some(&mut suffix));
        assert_eq!(spec.output_ids, plain.output_ids, "{what}: suffix");
        let engine_suffix = params(DraftMode::Suffix, sampler, 200);
        let spec = run(e, ids, &engine_suffix, Some(grammar), None);
        assert_eq!(spec.output_ids, plain.output_ids, "{what}: engine's suffix");
    }
    assert!(
        accepted > 0 && accepted < proposed,
        "{name}: {accepted} of {proposed}"
    );
}

#[test]
fn constrained_drafting_is_lossless_on_the_fixtures() {
    let grammar = Grammar::JsonSchema(person_schema());
    for (name, path) in fixtures() {
        let e = engine(path);
        let ids = prompt_ids(&e, ASK);
        drafting_is_lossless(name, &e, &ids, &grammar);
    }
}

#[test]
fn constrained_drafting_is_lossless_on_smollm2() {
    let e = engine(smollm2::gguf_path());
    let ids = prompt_ids(&e, ASK);
    drafting_is_lossless("smollm2", &e, &ids, &Grammar::JsonSchema(person_schema()));
}

/// A drafter told that verifying rows costs nothing, so the random DFlash fixture drafter
/// drafts its whole budget whatever this machine measures (as in dflash_drafting.rs).
struct FreeRows(Box<dyn Drafter>);

impl Drafter for FreeRows {
    fn propose(&mut self, context: &[u32], budget: usize, out: &mut DraftTree) {
        self.0.set_pass_costs(&[]);
        self.0.set_row_cost(0.0);
        self.0.set_row_cost_growth(0.0);
        self.0.propose(context, budget, out)
    }
    fn observe(&mut self, accepted: usize, proposed: usize) {
        self.0.observe(accepted, proposed)
    }
    fn start_request(&mut self) {
        self.0.start_request()
    }
    fn hidden_points(&self) -> &[usize] {
        self.0.hidden_points()
    }
    fn committed(&mut self, start: usize, tokens: &[u32], hidden: &[&[f32]]) {
        self.0.committed(start, tokens, hidden)
    }
}

/// DFlash drafting (the tiny fixture drafter on qwen35-tiny, chains and trees) under a grammar
/// equals constrained plain decoding, greedy and seeded, and it does draft.
#[test]
fn constrained_dflash_drafting_is_lossless() {
    let grammar = Grammar::JsonSchema(person_schema());
    let plain_engine = engine(repo("../shared/fixtures/qwen35-tiny"));
    let ids = prompt_ids(&plain_engine, ASK);
    for shape in [DraftShape::Chain, DraftShape::Tree] {
        let mut e = engine(repo("../shared/fixtures/qwen35-tiny"));
        e.attach_dflash(&repo("crates/yomi-models/tests/data/dflash-tiny"), shape)
            .expect("attach the drafter");
        for sampler in [greedy(), seeded(7)] {
            let p = params(DraftMode::None, sampler.clone(), 200);
            let want = run(&plain_engine, &ids, &p, Some(&grammar), None);
            let mut d = FreeRows(e.new_drafter(DraftMode::DFlash).expect("a DFlash drafter"));
            let got = run(&e, &ids, &p, Some(&grammar), Some(&mut d));
            assert_eq!(got.output_ids, want.output_ids, "{shape} {sampler:?}");
            assert!(
                got.stats.drafted_tokens_per_pass > 0.0,
                "{shape}: nothing drafted ({:?})",
                got.stats
            );
        }
    }
}

/// A grammar with one possible text stops right after it, without an EOS token, plainly and
/// with drafts; a grammar that may end allows the EOS token there.
#[test]
fn a_complete_grammar_stops_the_run() {
    let e = engine(repo("tests/data/llama-tiny"));
    let ids = prompt_ids(&e, "say hello");
    let fixed = Grammar::Lark(r#"start: "hello, world""#.to_string());
    for sampler in [greedy(), seeded(9)] {
        let p = params(DraftMode::None, sampler.clone(), 100);
        let g = run(&e, &ids, &p, Some(&fixed), None);
        assert_eq!(g.text, "hello, world");
        assert_eq!(g.finish_reason, FinishReason::Stop);
        assert!(!e.eos_token_ids.contains(g.output_ids.last().unwrap()));
        let s = run(
            &e,
            &ids,
            &params(DraftMode::Suffix, sampler, 100),
            Some(&fixed),
            None,
        );
        assert_eq!(s.output_ids, g.output_ids);
    }
    // "a" then any number of "b"s: only the EOS token can end it, and it is allowed after "a".
    let open = Grammar::Lark(r#"start: "a" /b*/"#.to_string());
    let mut c = e.constraint(&open).expect("compiles");
    let a = e.tokenizer.encode("a", false).unwrap();
    assert_eq!(a.len(), 1);
    let mask = c.mask().unwrap();
    assert!(mask.is_allowed(a[0]));
    assert!(!mask.is_allowed(e.eos_token_ids[0]), "EOS before the text");
    c.accept(a[0]).unwrap();
    let mask = c.mask().unwrap();
    assert!(mask.is_allowed(e.eos_token_ids[0]), "EOS where it may end");
    assert!(!mask.is_allowed(a[0]));
    assert_eq!(c.finished_at(), None);
    // A forbidden token is refused, not taken.
    assert!(c.accept(a[0]).is_err());
}

/// Masking sets exactly the forbidden logits to −∞.
#[test]
fn the_mask_is_applied_to_the_logits() {
    let e = engine(repo("tests/data/llama-tiny"));
    let mut c = e
        .constraint(&Grammar::Lark(r#"start: /[0-9]+/"#.to_string()))
        .expect("compiles");
    let v = e.model.cfg.vocab_size;
    let mask = c.mask().unwrap();
    let mut logits: Vec<f32> = (0..v).map(|i| i as f32 * 0.01).collect();
    c.apply(&mut logits).unwrap();
    let mut allowed = 0;
    for (i, l) in logits.iter().enumerate() {
        let text = e.tokenizer.decode(&[i as u32], false).unwrap();
        let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
        assert_eq!(mask.is_allowed(i as u32), digits, "token {i} {text:?}");
        if digits {
            assert_eq!(*l, i as f32 * 0.01);
            allowed += 1;
        } else {
            assert_eq!(*l, f32::NEG_INFINITY, "token {i} {text:?}");
        }
    }
    assert!(allowed >= 10, "{allowed}");
}

/// Bad grammars are errors that say what is wrong.
#[test]
fn bad_grammars_are_errors() {
    let e = engine(repo("tests/data/llama-tiny"));
    for (g, want) in [
        (Grammar::JsonSchema(json!({"type": 5})), ""),
        (Grammar::JsonSchema(json!({"type": "no-such-type"})), ""),
        (Grammar::JsonSchema(json!([1, 2])), "object"),
        (Grammar::JsonSchema(json!({"$ref": "#/$defs/missing"})), ""),
        (
            Grammar::JsonSchema(json!({"type": "integer", "minimum": 5, "maximum": 1})),
            "",
        ),
        (Grammar::Lark("start: (".to_string()), ""),
        (Grammar::Lark("start: undefined_rule".to_string()), ""),
    ] {
        let err = e
            .constraint(&g)
            .err()
            .unwrap_or_else(|| panic!("{g:?} compiled"));
        let msg = format!("{err:#}");
        assert!(msg.contains(want), "{g:?}: {msg}");
    }
}
