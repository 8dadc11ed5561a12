//! `yomi bench`: a client that measures any OpenAI-compatible server (yomi, llama-server,
//! vLLM, …) the same way: streamed chat requests, time to first token, end-to-end time,
//! decode tok/s = (completion_tokens − 1) / (t_last − t_first) and, when the server reports
//! `usage.spec_verify_ct`, tokens per verify pass; medians over the runs.

use anyhow::{Context, Result, bail};
use clap::Args;
use serde::Serialize;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use yomi_server::client::{Endpoint, error_message, post_json};

use crate::settings::Settings;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The server's base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine).
    #[arg(long, value_name = "URL")]
    pub endpoint: String,
    /// The model name to send.
    #[arg(long, value_name = "NAME")]
    pub model: String,
    /// The prompt (a user message).
    #[arg(long, short = 'm', value_name = "TEXT", conflicts_with = "prompts")]
    pub message: Option<String>,
    /// A file of prompts, one per line (blank lines skipped); each run sends each of them.
    #[arg(long, value_name = "FILE")]
    pub prompts: Option<PathBuf>,
    /// Measured runs.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub runs: usize,
    /// Unmeasured warm-up requests first.
    #[arg(long, default_value_t = 1, value_name = "K")]
    pub warmup: usize,
    /// max_tokens of every request.
    #[arg(long, default_value_t = 128, value_name = "N")]
    pub max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0, value_name = "T")]
    pub temperature: f32,
    /// Seed to send (default: none).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Ask a thinking model not to think (chat_template_kwargs.enable_thinking = false).
    #[arg(long)]
    pub no_think: bool,
    /// Bearer token (default: $YOMI_API_KEY when set).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Seconds to wait for a connection or for the next piece of a response.
    #[arg(long, default_value_t = 600, value_name = "S")]
    pub timeout: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// One measured request.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    pub ttft_s: f64,
    pub e2e_s: f64,
    pub completion_tokens: usize,
    /// The server's own count (else the number of streamed text chunks).
    pub usage_reported: bool,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub decode_tokens_per_s: Option<f64>,
    pub spec_verify_ct: Option<u64>,
    pub tokens_per_pass: Option<f64>,
    pub finish_reason: Option<String>,
}

fn text_of(choice: &Value) -> usize {
    let d = choice.get("delta").unwrap_or(choice);
    ["content", "reasoning_content", "reasoning", "text"]
        .iter()
        .filter_map(|k| d.get(*k).and_then(Value::as_str))
        .map(str::len)
        .sum()
}

/// Sends one streamed chat request and times it.
pub fn measure(ep: &Endpoint, a: &BenchArgs, prompt: &str) -> Result<Sample> {
    let mut body = json!({
        "model": a.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": a.max_tokens,
        "temperature": a.temperature,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(s) = a.seed {
        body["seed"] = json!(s);
    }
    if a.no_think {
        body["chat_template_kwargs"] = json!({"enable_thinking": false});
    }
    let timeout = Duration::from_secs(a.timeout.max(1));
    let t0 = Instant::now();
    let mut resp = post_json(
        ep,
        &ep.v1("/chat/completions"),
        &body,
        a.api_key.as_deref(),
        timeout,
    )?;
    if resp.status != 200 {
        let status = resp.status;
        let text = resp.text().unwrap_or_default();
        bail!("{ep} answered HTTP {status}: {}", error_message(&text));
    }
    let mut t_first: Option<f64> = None;
    let mut t_last = 0.0;
    let mut chunks = 0usize;
    let mut usage: Option<Value> = None;
    let mut finish = None;
    while let Some(data) = resp.next_event()? {
        if data.trim() == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(&data)
            .with_context(|| format!("{ep} sent an event that is not JSON: {data:.200}"))?;
        if let Some(e) = v.get("error") {
            bail!(
                "{ep} failed mid-stream: {}",
                error_message(&json!({"error": e}).to_string())
            );
        }
        if let Some(choice) = v.get("choices").and_then(|c| c.get(0)) {
            if text_of(choice) > 0 {
                let t = t0.elapsed().as_secs_f64();
                t_first.get_or_insert(t);
                t_last = t;
                chunks += 1;
            }
            if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
                finish = Some(f.to_string());
            }
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            usage = Some(u.clone());
        }
    }
    let e2e = t0.elapsed().as_secs_f64();
    let Some(t_first) = t_first else {
        bail!("{ep} streamed no text (finish reason {finish:?})");
    };
    let get = |k: &str| {
        usage
            .as_ref()
            .and_then(|u| u.get(k))
            .and_then(Value::as_u64)
    };
    let reported = get("completion_tokens");
    let n = reported.map_or(chunks, |c| c as usize);
    let decode = (n > 1 && t_last > t_first).then(|| (n - 1) as f64 / (t_last - t_first));
    let verify = get("spec_verify_ct").filter(|&v| v > 0);
    Ok(Sample {
        ttft_s: t_first,
        e2e_s: e2e,
        completion_tokens: n,
        usage_reported: reported.is_some(),
        prompt_tokens: get("prompt_tokens"),
        cached_tokens: usage
            .as_ref()
            .and_then(|u| u.get("prompt_tokens_details"))
            .and_then(|d| d.get("cached_tokens"))
            .and_then(Value::as_u64),
        decode_tokens_per_s: decode,
        spec_verify_ct: verify,
        tokens_per_pass: verify.map(|v| n.saturating_sub(1) as f64 / v as f64),
        finish_reason: finish,
    })
}

/// The median of the values present.
pub fn median(mut xs: Vec<f64>) -> Option<f64> {
    xs.retain(|x| x.is_finite());
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    let m = xs.len() / 2;
    Some(if xs.len() % 2 == 1 {
        xs[m]
    } else {
        (xs[m - 1] + xs[m]) / 2.0
    })
}

fn load_prompts(a: &BenchArgs) -> Result<Vec<String>> {
    match (&a.message, &a.prompts) {
        (Some(m), _) => {
            if m.trim().is_empty() {
                bail!("the prompt is empty");
            }
            Ok(vec![m.clone()])
        }
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let prompts: Vec<String> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect();
            if prompts.is_empty() {
                bail!("{} has no prompts", path.display());
            }
            Ok(prompts)
        }
        (None, None) => bail!("give a prompt with -m \"…\" or a file with --prompts FILE"),
    }
}

fn fmt(x: Option<f64>, digits: usize) -> String {
    x.map_or_else(|| "n/a".into(), |v| format!("{v:.digits$}"))
}

pub fn run(mut a: BenchArgs, settings: &Settings) -> Result<()> {
    if a.api_key.is_none() {
        a.api_key = settings.api_key.clone();
    }
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if a.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    let ep = Endpoint::parse(&a.endpoint)?;
    let prompts = load_prompts(&a)?;
    for i in 0..a.warmup {
        measure(&ep, &a, &prompts[i % prompts.len()]).context("warm-up request failed")?;
    }
    let mut samples = Vec::with_capacity(a.runs * prompts.len());
    for r in 0..a.runs {
        for (pi, p) in prompts.iter().enumerate() {
            let s = measure(&ep, &a, p)
                .with_context(|| format!("run {} (prompt {}) failed", r + 1, pi + 1))?;
            if !a.json {
                eprintln!(
                    "run {:>3}: ttft {:.3} s, e2e {:.3} s, {} tokens, {} tok/s{}",
                    samples.len() + 1,
                    s.ttft_s,
                    s.e2e_s,
                    s.completion_tokens,
                    fmt(s.decode_tokens_per_s, 1),
                    s.tokens_per_pass
                        .map_or(String::new(), |t| format!(", {t:.2} tokens/pass")),
                );
            }
            samples.push(s);
        }
    }
    let col = |f: &dyn Fn(&Sample) -> Option<f64>| median(samples.iter().filter_map(f).collect());
    let ttft = col(&|s| Some(s.ttft_s));
    let e2e = col(&|s| Some(s.e2e_s));
    let decode = col(&|s| s.decode_tokens_per_s);
    let tpp = col(&|s| s.tokens_per_pass);
    let tokens = col(&|s| Some(s.completion_tokens as f64));
    let cached = col(&|s| s.cached_tokens.map(|c| c as f64));
    if a.json {
        let obj = json!({
            "endpoint": ep.to_string(),
            "model": a.model,
            "runs": a.runs,
            "prompts": prompts.len(),
            "warmup": a.warmup,
            "max_tokens": a.max_tokens,
            "median": {
                "ttft_s": ttft,
                "e2e_s": e2e,
                "decode_tokens_per_s": decode,
                "tokens_per_pass": tpp,
                "completion_tokens": tokens,
                "cached_tokens": cached,
            },
            "samples": samples,
        });
        println!("{obj}");
        return Ok(());
    }
    println!(
        "endpoint {ep}  model {}  {} request(s), {} warm-up, max_tokens {}",
        a.model,
        samples.len(),
        a.warmup,
        a.max_tokens
    );
    println!("{:<22} {:>12}", "metric", "median");
    println!("{:<22} {:>12}", "time to first token s", fmt(ttft, 3));
    println!("{:<22} {:>12}", "end-to-end s", fmt(e2e, 3));
    println!("{:<22} {:>12}", "decode tok/s", fmt(decode, 1));
    println!("{:<22} {:>12}", "tokens per pass", fmt(tpp, 2));
    println!("{:<22} {:>12}", "completion tokens", fmt(tokens, 0));
    println!("{:<22} {:>12}", "cached prompt tokens", fmt(cached, 0));
    if samples.iter().any(|s| !s.usage_reported) {
        println!("(the server sent no usage: completion tokens are counted as streamed chunks)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![3.0]), Some(3.0));
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![f64::NAN, 1.0]), Some(1.0));
    }
}
