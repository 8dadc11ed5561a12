//! The `yomi` command-line tool.

mod cmd_bench;
mod cmd_chat;
mod cmd_logits;
mod cmd_perplexity;
mod cmd_pull;
mod cmd_quantize;
mod cmd_run;
mod cmd_serve;
mod common;
mod hub;
mod settings;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "yomi",
    version,
    about = "yomi — a fast local LLM inference engine (batch one, CPU now, CUDA next)",
    long_about = "yomi runs large language models on your own machine, one user at a time.\n\n\
        A model is a Hugging Face directory (config.json, *.safetensors, tokenizer.json) or a \
        .gguf file, or one in the local Hugging Face cache by name (hf:ORG/NAME[:FILE.gguf], \
        downloaded by `yomi pull ORG/NAME` or any other Hugging Face tool). Supported \
        architectures: Qwen3.5/3.6 (Gated DeltaNet hybrid), Llama, Qwen2, Qwen3 and SmolLM.\n\n\
        Examples:\n  \
        yomi run --model ./SmolLM2-135M-Instruct.Q4_1.gguf -m \"Write a haiku about Rust.\"\n  \
        yomi pull HuggingFaceTB/SmolLM2-135M-Instruct\n  \
        yomi run --model hf:HuggingFaceTB/SmolLM2-135M-Instruct -m \"Hello\"\n  \
        yomi run --model ./qwen3.5-dir -m \"Explain GDN\" --temperature 0.7 --seed 1 --json\n  \
        yomi logits --model ./model-dir --tokens 1,2,3 --out logits.safetensors"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Answer one prompt, streaming the text, then print speed and memory stats.
    Run(cmd_run::RunArgs),
    /// Write the [T, V] float32 logits of one forward pass (a prompt, or a draft tree hung off
    /// it) to a safetensors file, and with --hidden-out its residual stream at every layer (a
    /// tracing tool to compare against any reference).
    Logits(cmd_logits::LogitsArgs),
    /// Perplexity of a text file in fixed windows (llama-perplexity style), to compare
    /// quantization formats on quality.
    Perplexity(cmd_perplexity::PerplexityArgs),
    /// Chat with a model in the terminal: streamed replies, thinking shown apart, stats after
    /// each reply; /reset, /stats, /exit.
    Chat(cmd_chat::ChatArgs),
    /// Serve a model over an OpenAI-compatible HTTP API (chat and text completions,
    /// streaming, prefix cache).
    Serve(cmd_serve::ServeArgs),
    /// Measure any OpenAI-compatible server: time to first token, end-to-end time, decode
    /// tok/s and tokens per pass, medians over runs.
    Bench(cmd_bench::BenchArgs),
    /// Download a model from the Hugging Face hub (HF_ENDPOINT) into the local Hugging Face
    /// cache, where `--model hf:ORG/NAME` finds it: `yomi pull ORG/NAME[:FILE.gguf]`.
    Pull(cmd_pull::PullArgs),
    /// Convert a Hugging Face model or a GGUF file into yomi's 4-bit (m) or 8-bit (l) format,
    /// with the Hadamard rotation that spreads outliers: `yomi quantize --model DIR --format m
    /// --out DIR2`.
    Quantize(cmd_quantize::QuantizeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The environment is read here, once (see settings.rs); nothing else reads it.
    let result = settings::Settings::from_env().and_then(|s| {
        s.install()?;
        match cli.command {
            Command::Run(a) => cmd_run::run(a, &s),
            Command::Logits(a) => cmd_logits::run(a, &s),
            Command::Perplexity(a) => cmd_perplexity::run(a, &s),
            Command::Chat(a) => cmd_chat::run(a, &s),
            Command::Serve(a) => cmd_serve::run(a, &s),
            Command::Bench(a) => cmd_bench::run(a, &s),
            Command::Pull(a) => cmd_pull::run(a, &s),
            Command::Quantize(a) => cmd_quantize::run(a, &s),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            common::print_error(&e);
            ExitCode::from(1)
        }
    }
}
