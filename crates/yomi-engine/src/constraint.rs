//! Constrained decoding: a grammar (a JSON schema or a Lark grammar, compiled by
//! `llguidance`) decides which tokens the sampler may pick at each position of a request.
//!
//! The engine compiles grammars against its vocabulary ([`Engine::constraint`]; the token
//! environment is built once per engine, see `token_env.rs`) and the generate loop drives the
//! resulting [`Constraint`]: before every pick it sets the logits of the tokens the grammar
//! forbids to −∞ ([`Constraint::apply`]), then tells it the token picked
//! ([`Constraint::accept`]). The loop does that at every position along the accepted path of a
//! speculative pass too, in the order the acceptance walk samples, so a draft the grammar
//! forbids can never equal the sample and the output is token for token that of constrained
//! plain decoding. The masks are applied to full logits: a device that ranks candidates itself
//! is asked for full rows while a constraint is on (the candidates of a masked row are not the
//! candidates of the row).
//!
//! A grammar ends in one of two ways: the model picks an end-of-sequence token where the grammar
//! may end (the mask allows the engine's EOS ids there), or the grammar can take nothing more
//! ([`Constraint::finished_at`]); the loop then stops as it does at EOS.

use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};

use crate::engine::Engine;

/// What a request's output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// JSON matching this JSON schema (`{}` or `{"type": "object"}` for any JSON object).
    JsonSchema(Value),
    /// llguidance's Lark-like syntax (which embeds JSON schemas as `%json { … }`).
    Lark(String),
}

/// How JSON is laid out under a schema unless the schema says otherwise (its `x-guidance`
/// key): on one line, `", "` between items and `": "` after keys, as Python's `json.dumps`
/// writes it and models have seen most. No free whitespace: a model (above all a random one)
/// that may put whitespace anywhere can put it everywhere and never finish.
pub fn json_layout() -> Value {
    json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
    })
}

/// `schema` with [`json_layout`] unless it sets its own `x-guidance`.
pub fn with_json_layout(schema: &Value) -> Value {
    let mut s = schema.clone();
    if let Value::Object(o) = &mut s
        && !o.contains_key("x-guidance")
    {
        o.insert("x-guidance".into(), json_layout());
    }
    s
}

/// Compiles grammars for one vocabulary: what llguidance precomputes per tokenizer.
pub(crate) struct Grammars {
    factory: ParserFactory,
}

impl Grammars {
    pub(crate) fn new(env: TokEnv) -> Result<Self> {
        let mut factory = ParserFactory::new_simple(&env)?;
        // A library prints nothing; errors come back as values.
        factory.quiet();
        Ok(Grammars { factory })
    }
}

impl Engine {
    /// A fresh constraint for one request's output, compiled from `grammar` against this
    /// engine's vocabulary. The error says what is wrong with the grammar (or that the
    /// vocabulary's bytes are unknown).
    pub fn constraint(&self, grammar: &Grammar) -> Result<Constraint> {
        let grammars = self
            .grammars
            .get_or_init(|| {
                crate::token_env::tok_env(
                    &self.tokenizer,
                    self.model.cfg.vocab_size,
                    &self.eos_token_ids,
                )
                .and_then(Grammars::new)
                .map(Arc::new)
                .map_err(|e| format!("{e:#}"))
            })
            .as_ref()
            .map_err(|e| anyhow!("constrained decoding is not available for this model: {e}"))?;
        let top = match grammar {
            Grammar::JsonSchema(schema) => {
                if !schema.is_object() && !schema.is_boolean() {
                    bail!("a JSON schema must be an object");
                }
                TopLevelGrammar::from_json_schema(with_json_layout(schema))
            }
            Grammar::Lark(src) => TopLevelGrammar::from_lark(src.clone()),
        };
        // llguidance catches its own panics; this guards the few paths outside its guard, so
        // that no schema can take the engine down.
        let parser = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            grammars.factory.create_parser(top)
        }))
        .map_err(|_| anyhow!("the grammar could not be compiled"))?
        .map_err(|e| anyhow!("{e}"))
        .context("invalid grammar")?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            bail!("invalid grammar: {e}");
        }
        Ok(Constraint {
            matcher,
            eos: self.eos_token_ids.clone(),
            consumed: 0,
            finished_at: None,
        })
    }
}

/// One request's grammar state: which tokens may come next, and whether it is complete.
pub struct Constraint {
    matcher: Matcher,
    /// The engine's end-of-sequence ids (allowed where the grammar may end, and after it).
    eos: Vec<u32>,
    /// Tokens accepted so far.
    consumed: usize,
    /// Tokens accepted when the grammar became complete and could take nothing more.
    finished_at: Option<usize>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("consumed", &self.consumed)
            .field("finished_at", &self.finished_at)
            .finish()
    }
}

impl Constraint {
    /// The tokens the grammar allows next (the EOS ids where it may end). After the grammar is
    /// complete only the EOS ids are allowed (the loop has stopped before it asks).
    pub fn mask(&mut self) -> Result<SimpleVob> {
        let m = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| anyhow!("the grammar failed: {e}"))?;
        if m.is_zero() {
            bail!("the grammar allows no token after the output so far");
        }
        Ok(m)
    }

    /// Sets the logits of the tokens the grammar forbids next to −∞ (`logits` is one row of the
    /// model's vocabulary).
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<()> {
        let mask = self.mask()?;
        apply_mask(&mask, logits);
        Ok(())
    }

    /// The next token of the output (one the mask allowed). Tokens after the grammar is
    /// complete are not its business and are ignored.
    pub fn accept(&mut self, token: u32) -> Result<()> {
        if self.finished_at.is_some() {
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| anyhow!("the grammar refused token {token}: {e}"))?;
        self.consumed += 1;
        if self.matcher.is_stopped() && !self.eos.contains(&token) {
            self.finished_at = Some(self.consumed);
        }
        Ok(())
    }

    /// The output length (in tokens) at which the grammar was complete with nothing more it
    /// could take, if it is: generation stops there. (An output that ends with an EOS token
    /// the grammar allowed stops at that token as any output does.)
    pub fn finished_at(&self) -> Option<usize> {
        self.finished_at
    }

    /// Tokens accepted so far.
    pub fn consumed(&self) -> usize {
        self.consumed
    }
}

/// −∞ for every token of `logits` the mask does not allow (ids past the mask's size too).
pub fn apply_mask(mask: &SimpleVob, logits: &mut [f32]) {
    let words = mask.as_slice();
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let bits = words.get(w).copied().unwrap_or(0);
        if bits == u32::MAX && chunk.len() == 32 {
            continue;
        }
        for (b, l) in chunk.iter_mut().enumerate() {
            if bits & (1 << b) == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}
