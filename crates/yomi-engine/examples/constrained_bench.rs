//! What constrained decoding costs: the time to build a vocabulary's grammar environment and
//! to compile a schema, the time per token of the grammar's mask (computing it and setting the
//! forbidden logits to −∞), and decode tok/s under the schema against plain decoding of as
//! many tokens, in one process with the two alternating (plain first in even rounds), so that
//! a VM whose speed drifts moves both sides of a round alike.
//!
//! The schema is a realistic one: a product record with bounded strings, numbers, an enum, a
//! nested object and an array of objects. The prompt asks the model for it through its chat
//! template; the constrained runs are greedy and must all be the same tokens (checked).
//!
//! Usage: cargo run --release -p yomi-engine --example constrained_bench -- MODEL [ROUNDS (5)]
//! Prints a markdown table.

use std::path::Path;
use std::time::Instant;

use anyhow::{Result, bail};
use serde_json::json;
use yomi_engine::constraint::apply_mask;
use yomi_engine::generate::DraftMode;
use yomi_engine::stats::StatsRecorder;
use yomi_engine::template::ChatMessage;
use yomi_engine::{Engine, GenerateParams, Generation, Grammar, Prompt};

#[path = "common/options.rs"]
mod options;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, rest @ ..] = args.as_slice() else {
        bail!("usage: constrained_bench MODEL [ROUNDS]");
    };
    let rounds: usize = rest.first().map_or(Ok(5), |a| a.parse())?;
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
            "price": {"type": "number", "minimum": 0},
            "currency": {"enum": ["USD", "EUR", "GBP"]},
            "in_stock": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
            "dimensions": {
                "type": "object",
                "properties": {
                    "width_cm": {"type": "number"},
                    "height_cm": {"type": "number"},
                    "depth_cm": {"type": "number"},
                },
                "required": ["width_cm", "height_cm", "depth_cm"],
                "additionalProperties": false,
            },
            "reviews": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "author": {"type": "string", "maxLength": 24},
                        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
                        "comment": {"type": "string", "maxLength": 80},
                    },
                    "required": ["author", "rating", "comment"],
                    "additionalProperties": false,
                },
                "maxItems": 2,
            },
        },
        "required": ["name", "sku", "price", "currency", "in_stock", "tags", "dimensions", "reviews"],
        "additionalProperties": false,
    });
    let grammar = Grammar::JsonSchema(schema);
    let engine = Engine::load(
        Path::new(model),
        &options::engine_options_from_env(),
        &mut |_, _| {},
    )?;
    println!("device: {}", engine.device());
    let ids = engine.prompt_ids(&Prompt::Chat {
        messages: vec![ChatMessage::user(
            "Write the catalogue record of a wooden desk lamp as JSON: name, sku, price, \
             currency, in_stock, tags, dimensions and two short reviews.",
        )],
        enable_thinking: None,
    })?;

    // The first constraint builds the vocabulary's environment; later ones only compile.
    let t = Instant::now();
    engine.constraint(&grammar)?;
    let first = t.elapsed().as_secs_f64();
    let mut compile = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        engine.constraint(&grammar)?;
        compile.push(t.elapsed().as_secs_f64());
    }
    let compile = median(&mut compile);

    let mut state = engine.new_state();
    let mut run = |constrained: bool, max_tokens: usize| -> Result<Generation> {
        let params = GenerateParams {
            max_tokens,
            draft: DraftMode::None,
            ..Default::default()
        };
        let mut c = if constrained {
            Some(engine.constraint(&grammar)?)
        } else {
            None
        };
        engine.generate_constrained(
            &mut state,
            &ids,
            &params,
            None,
            c.as_mut(),
            StatsRecorder::start(),
            &mut |_| true,
        )
    };
    let reference = run(true, 1024)?;
    let n = reference.output_ids.len();
    serde_json::from_str::<serde_json::Value>(&reference.text)?;
    run(false, n)?;
    let (mut plain, mut masked, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let mut one = |constrained: bool| -> Result<f64> {
            let g = run(constrained, n)?;
            if constrained && g.output_ids != reference.output_ids {
                bail!("the constrained output changed between runs");
            }
            Ok(g.stats.generation_tokens_per_s)
        };
        let (p, m) = if r % 2 == 0 {
            let p = one(false)?;
            (p, one(true)?)
        } else {
            let m = one(true)?;
            (one(false)?, m)
        };
        plain.push(p);
        masked.push(m);
        ratio.push(m / p);
    }

    // The mask alone, token by token along the output: computing it, and applying it to a
    // row of logits.
    let v = engine.model.cfg.vocab_size;
    let mut logits = vec![0.5f32; v];
    let (mut compute, mut apply) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let mut c = engine.constraint(&grammar)?;
        for &tok in &reference.output_ids {
            let t = Instant::now();
            let mask = c.mask()?;
            let t1 = Instant::now();
            apply_mask(&mask, &mut logits);
            let t2 = Instant::now();
            compute.push((t1 - t).as_secs_f64() * 1e6);
            apply.push((t2 - t1).as_secs_f64() * 1e6);
            c.accept(tok)?;
        }
    }
    let total: Vec<f64> = compute.iter().zip(&apply).map(|(a, b)| a + b).collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!("output ({n} tokens): {}", reference.text);
    println!();
    println!("| measure | value |");
    println!("|---|---|");
    println!("| vocabulary | {v} tokens |");
    println!(
        "| first constraint (token trie and lexer slices + compile) | {:.0} ms |",
        first * 1e3
    );
    println!("| compile the schema | {:.1} ms |", compile * 1e3);
    let mut t = total.clone();
    println!(
        "| mask per token: mean / p50 / p99 / max | {:.0} / {:.0} / {:.0} / {:.0} µs |",
        mean(&t),
        percentile(&mut t, 0.5),
        percentile(&mut t, 0.99),
        percentile(&mut t, 1.0)
    );
    println!(
        "| of which computing / applying (mean) | {:.0} / {:.0} µs |",
        mean(&compute),
        mean(&apply)
    );
    println!(
        "| decode tok/s plain / constrained (median of {rounds}) | {:.1} / {:.1} |",
        median(&mut plain),
        median(&mut masked)
    );
    let lo = ratio.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = ratio.iter().cloned().fold(0.0, f64::max);
    println!(
        "| constrained / plain (median, range) | {:.3} ({lo:.3}–{hi:.3}) |",
        median(&mut ratio)
    );
    Ok(())
}
