//! `yomi chat`: a multi-turn conversation in the terminal. Replies stream as they are
//! generated, thinking shown apart from the answer, with short stats after each reply; the
//! prefix cache makes each turn prefill only what is new.

use anyhow::{Context, Result, bail};
use clap::Args;
use std::io::{BufRead, IsTerminal, Write};
use std::sync::Mutex;
use yomi_core::SamplerParams;
use yomi_engine::generate::{DEFAULT_DRAFT_BUDGET, DraftMode, GenerateHooks, MAX_DRAFT_BUDGET};
use yomi_engine::prefix_cache::{PrefixCache, PrefixCacheConfig};
use yomi_engine::stats::{GenerationStats, StatsRecorder};
use yomi_engine::template::ChatMessage;
use yomi_engine::{Engine, GenerateParams};
use yomi_server::reasoning::{
    ReasoningSplitter, Split, THINK_CLOSE, THINK_OPEN, prompt_opens_thinking,
};
use yomi_spec::{Drafter, SuffixDrafter};

use crate::common::{ModelArgs, load_engine};

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A system message to start the conversation with.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Most tokens per reply.
    #[arg(long, default_value_t = 2048, value_name = "N")]
    pub max_tokens: usize,
    /// Sampling temperature; 0 = greedy (default: the model's generation_config, else 0).
    #[arg(long, value_name = "T")]
    pub temperature: Option<f32>,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches P (1 = off).
    #[arg(long, value_name = "P")]
    pub top_p: Option<f32>,
    /// Drop tokens less likely than MIN_P × the most likely one (0 = off).
    #[arg(long, value_name = "P")]
    pub min_p: Option<f32>,
    /// Seed of the sampling noise (default: random).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Ask a thinking model to answer without thinking.
    #[arg(long)]
    pub no_think: bool,
    /// Turn the prefix cache off: every turn prefills the whole conversation.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Speculative drafter: none or suffix (lossless either way).
    #[arg(long, default_value = "suffix", value_name = "MODE", value_parser = ["none", "suffix"])]
    pub draft: String,
    /// Most draft tokens verified per pass (1..=64).
    #[arg(long, default_value_t = DEFAULT_DRAFT_BUDGET, value_name = "N")]
    pub draft_budget: usize,
}

const HELP: &str =
    "/reset clears the conversation, /stats shows the last reply's stats, /exit quits";

/// Prints a reply: thinking dimmed (or marked) apart from the answer.
struct Printer {
    splitter: ReasoningSplitter,
    styled: bool,
    in_thinking: bool,
    wrote_thinking: bool,
    reasoning: String,
    content: String,
    ok: bool,
}

impl Printer {
    fn show(&mut self, s: Split) {
        let mut out = std::io::stdout().lock();
        let mut w = |t: &str| {
            if out.write_all(t.as_bytes()).is_err() {
                self.ok = false;
            }
        };
        if !s.reasoning.is_empty() {
            if !self.in_thinking {
                self.in_thinking = true;
                self.wrote_thinking = true;
                w(if self.styled {
                    "\x1b[2m"
                } else {
                    "[thinking] "
                });
            }
            w(&s.reasoning);
            self.reasoning.push_str(&s.reasoning);
        }
        if !s.content.is_empty() {
            if self.in_thinking {
                self.in_thinking = false;
                w(if self.styled {
                    "\x1b[0m\n\n"
                } else {
                    "\n[answer] "
                });
            }
            w(&s.content);
            self.content.push_str(&s.content);
        }
        let _ = out.flush();
    }

    fn end(&mut self) {
        let rest = self.splitter.finish();
        self.show(rest);
        if self.in_thinking && self.styled {
            print!("\x1b[0m");
        }
        println!();
    }
}

struct TokenHook<'a> {
    printer: &'a Mutex<Printer>,
    open: Option<u32>,
    close: Option<u32>,
}

impl GenerateHooks for TokenHook<'_> {
    fn token(&mut self, id: u32) {
        let open = if Some(id) == self.open {
            true
        } else if Some(id) == self.close {
            false
        } else {
            return;
        };
        let mut p = self.printer.lock().unwrap_or_else(|e| e.into_inner());
        let s = p.splitter.special_tag(open);
        p.show(s);
    }
}

fn special_token(engine: &Engine, tag: &str) -> Option<u32> {
    let id = engine.tokenizer.token_to_id(tag)?;
    let text = engine.tokenizer.decode(&[id], true).ok()?;
    text.is_empty().then_some(id)
}

fn short_stats(s: &GenerationStats, cached: usize) -> String {
    let mut line = format!(
        "[{} tokens · {:.1} tok/s · first token {:.2} s · prefill {} tokens",
        s.generated_tokens, s.generation_tokens_per_s, s.time_to_first_token_s, s.prefill_tokens
    );
    if cached > 0 {
        line.push_str(&format!(" ({cached} cached)"));
    }
    if s.verify_passes > 0 {
        line.push_str(&format!(" · {:.2} tokens/pass", s.tokens_per_forward_pass));
    }
    line.push(']');
    line
}

fn random_seed() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

pub fn run(a: ChatArgs) -> Result<()> {
    if !(1..=MAX_DRAFT_BUDGET).contains(&a.draft_budget) {
        bail!(
            "--draft-budget must be in 1..={MAX_DRAFT_BUDGET}, got {}",
            a.draft_budget
        );
    }
    let draft = a.draft.parse::<DraftMode>().map_err(anyhow::Error::msg)?;
    let engine = load_engine(&a.model)?;
    let Some(template) = engine.template.clone() else {
        bail!(
            "{} has no chat template, so it cannot chat (try `yomi run --raw`)",
            a.model.model.display()
        );
    };
    let d = &engine.defaults;
    let sampler = SamplerParams {
        temperature: a.temperature.or(d.temperature).unwrap_or(0.0),
        top_k: a.top_k.or(d.top_k).unwrap_or(0),
        top_p: a.top_p.or(d.top_p).unwrap_or(1.0),
        min_p: a.min_p.or(d.min_p).unwrap_or(0.0),
        seed: a.seed.unwrap_or_else(random_seed),
    };
    sampler.validate().map_err(anyhow::Error::msg)?;
    let enable_thinking = a.no_think.then_some(false);
    let mut cache = (!a.no_prefix_cache).then(|| PrefixCache::new(PrefixCacheConfig::default()));
    let mut state = engine.new_state();
    let mut drafter = (draft != DraftMode::None).then(SuffixDrafter::default);
    let think_open = special_token(&engine, THINK_OPEN);
    let think_close = special_token(&engine, THINK_CLOSE);
    let styled = std::io::stdout().is_terminal();
    let interactive = std::io::stdin().is_terminal();

    let system: Vec<ChatMessage> = a.system.iter().map(ChatMessage::system).collect();
    let mut messages = system.clone();
    let mut last: Option<(GenerationStats, usize)> = None;
    eprintln!(
        "yomi chat: {} (context {} tokens). {HELP}.",
        a.model.model.display(),
        engine.context_size
    );
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!("> ");
            let _ = std::io::stderr().flush();
        }
        let Some(line) = lines.next() else {
            break;
        };
        let line = line.context("cannot read the input")?;
        let input = line.trim();
        if input.is_empty() {
            continue;
        }
        match input {
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = system.clone();
                last = None;
                eprintln!("(conversation cleared)");
                continue;
            }
            "/stats" => {
                match &last {
                    Some((s, cached)) => {
                        eprintln!("{s}");
                        eprintln!("cached prompt tokens: {cached}");
                    }
                    None => eprintln!("(no reply yet)"),
                }
                if let Some(c) = &cache {
                    let s = c.stats();
                    eprintln!(
                        "prefix cache: {} entries, {:.1} MiB, {} of {} lookups hit, {} tokens resumed, {} prefilled",
                        s.entries,
                        s.bytes as f64 / (1 << 20) as f64,
                        s.hits,
                        s.lookups,
                        s.cached_tokens,
                        s.prefilled_tokens
                    );
                }
                continue;
            }
            "/help" => {
                eprintln!("{HELP}");
                continue;
            }
            s if s.starts_with('/') => {
                eprintln!("unknown command {s} ({HELP})");
                continue;
            }
            _ => {}
        }
        let stats = StatsRecorder::start();
        messages.push(ChatMessage::user(input));
        let prompt = template
            .render(&messages, true, enable_thinking)
            .and_then(|text| {
                let ids = engine.prompt_ids(&yomi_engine::Prompt::Ids(
                    engine.tokenizer.encode(&text, false)?,
                ))?;
                Ok((prompt_opens_thinking(&text), ids))
            });
        let (starts_thinking, ids) = match prompt {
            Ok(p) => p,
            Err(e) => {
                messages.pop();
                eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
                continue;
            }
        };
        let params = GenerateParams {
            max_tokens: a.max_tokens,
            sampler: sampler.clone(),
            stop: Vec::new(),
            draft,
            draft_budget: a.draft_budget,
        };
        let printer = Mutex::new(Printer {
            splitter: ReasoningSplitter::new(starts_thinking),
            styled,
            in_thinking: false,
            wrote_thinking: false,
            reasoning: String::new(),
            content: String::new(),
            ok: true,
        });
        let mut hook = TokenHook {
            printer: &printer,
            open: think_open,
            close: think_close,
        };
        let d: Option<&mut dyn Drafter> = match &mut drafter {
            Some(d) => Some(d),
            None => None,
        };
        let result = engine.generate_cached(
            cache.as_mut(),
            &mut state,
            &ids,
            &params,
            d,
            stats,
            &mut hook,
            &mut |t: &str| {
                let mut p = printer.lock().unwrap_or_else(|e| e.into_inner());
                let s = p.splitter.push(t);
                p.show(s);
                p.ok
            },
        );
        let mut p = printer.into_inner().unwrap_or_else(|e| e.into_inner());
        p.end();
        let g = match result {
            Ok(g) => g,
            Err(e) => {
                messages.pop();
                eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
                continue;
            }
        };
        if !p.ok {
            break;
        }
        eprintln!("{}", short_stats(&g.stats, g.cached_tokens));
        let mut reply = ChatMessage::assistant(p.content.clone());
        if p.wrote_thinking {
            reply.reasoning_content = Some(p.reasoning.clone());
        }
        messages.push(reply);
        last = Some((g.stats, g.cached_tokens));
    }
    Ok(())
}
