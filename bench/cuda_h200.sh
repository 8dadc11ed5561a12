#!/usr/bin/env bash
# The CUDA benchmark in one command, sized for one 10-minute call on a lent H200:
#   1. a random-weight Qwen3.5-9B-shaped bf16 checkpoint made with transformers (bench/make_qwen35_9b.py);
#   2. its time per pass for T = 1 … 64 tree rows at 1k and 8k of context, the T = 1 pass against
#      the bandwidth floor (weight bytes / device-to-device copy bandwidth, same run), and its
#      prefill in chains of 2048 (crates/yomi-engine/examples/model_bench.rs);
#   3. SmolLM2-135M Q4_1 decode through `yomi run --device cuda`, plain and with the suffix
#      drafter, twice each;
#   4. llama.cpp's `llama-bench` on the same GGUF when LLAMA_BENCH points at one (build it by
#      hand from llama.cpp's source, outside this repo; this script never builds a peer).
#
# The machine has no cargo: build here and carry the binaries.
#   cargo build --release -p yomi-engine --example model_bench && cargo build --release -p yomi-cli
#   (copy target/release/examples/model_bench and target/release/yomi into BIN_DIR)
# Usage: [LLAMA_BENCH=/path/to/llama-bench] bash bench/cuda_h200.sh BIN_DIR SMOLLM2_GGUF
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:?usage: bench/cuda_h200.sh BIN_DIR SMOLLM2_GGUF}
GGUF=${2:?usage: bench/cuda_h200.sh BIN_DIR SMOLLM2_GGUF}
CKPT=${CKPT:-/tmp/q9b}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader

echo "== Qwen3.5-9B-shaped checkpoint"
[ -f "$CKPT/config.json" ] || python3 bench/make_qwen35_9b.py "$CKPT"

echo "== pass time against T and context, prefill"
"$BIN/model_bench" "$CKPT" --reps 15 --rows 1,2,4,8,16,32,64 --contexts 1024,8192 \
    --prefill-chunks 2048

echo "== SmolLM2-135M Q4_1 decode, yomi"
P="Write a Python function that returns the n-th Fibonacci number, with a docstring."
for draft in none suffix none suffix; do
    "$BIN/yomi" run --model "$GGUF" --device cuda --draft "$draft" --max-tokens 128 -m "$P" \
        --json | tail -1 | python3 -c "
import json, sys
d = json.loads(sys.stdin.read()); s = d.get('stats', d)
print('draft=$draft: {:.1f} tok/s decode, {:.2f} tokens per pass, time to first token {:.3f} s'.format(
    s['generation_tokens_per_s'], s['tokens_per_forward_pass'], s['time_to_first_token_s']))"
done

if [ -n "${LLAMA_BENCH:-}" ]; then
    echo "== SmolLM2-135M Q4_1, llama.cpp llama-bench"
    "$LLAMA_BENCH" -m "$GGUF" -ngl 99 -p 512 -n 128 -r 5
else
    echo "(LLAMA_BENCH not set: no llama.cpp run)"
fi
