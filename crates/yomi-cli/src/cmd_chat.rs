//! `yomi chat`: a multi-turn conversation in the terminal. Replies stream as they are
//! generated, thinking shown apart from the answer, with short stats after each reply; the
//! prefix cache makes each turn prefill only what is new.

use anyhow::{Context, Result, bail};
use clap::Args;
use std::io::{BufRead, IsTerminal, Write};
use std::sync::Mutex;
use yomi_engine::generate::GenerateHooks;
use yomi_engine::prefix_cache::{PrefixCache, PrefixCacheConfig};
use yomi_engine::stats::{GenerationStats, StatsRecorder};
use yomi_engine::template::ChatMessage;
use yomi_engine::{Engine, GenerateParams};
use yomi_server::reasoning::{
    ReasoningSplitter, Split, THINK_CLOSE, THINK_OPEN, prompt_opens_thinking,
};
use yomi_spec::Drafter;

use crate::common::{DraftArgs, ModelArgs, SamplingArgs, load_engine};
use crate::settings::Settings;

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub drafting: DraftArgs,
    /// A system message to start the conversation with.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Most tokens per reply.
    #[arg(long, default_value_t = 2048, value_name = "N")]
    pub max_tokens: usize,
    /// Ask a thinking model to answer without thinking.
    #[arg(long)]
    pub no_think: bool,
    /// Turn the prefix cache off: every turn prefills the whole conversation.
    #[arg(long)]
    pub no_prefix_cache: bool,
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

pub fn run(a: ChatArgs, settings: &Settings) -> Result<()> {
    let draft = a.drafting.draft;
    let mut engine = load_engine(&a.model, settings)?;
    a.drafting.attach(&mut engine)?;
    let Some(template) = engine.template.clone() else {
        bail!(
            "{} has no chat template, so it cannot chat (try `yomi run --raw`)",
            a.model.model.display()
        );
    };
    let sampler = a.sampling.sampler(&engine.defaults)?;
    let enable_thinking = a.no_think.then_some(false);
    let mut cache = (!a.no_prefix_cache).then(|| PrefixCache::new(PrefixCacheConfig::default()));
    let mut state = engine.new_state();
    let mut drafter = engine.new_drafter(draft);
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
            draft_budget: a.drafting.draft_budget,
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
            Some(d) => Some(d.as_mut()),
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
