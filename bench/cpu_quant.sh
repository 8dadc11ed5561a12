#!/usr/bin/env bash
# yomi's own formats against llama.cpp's on the CPU, same run: prompt processing (512 tokens)
# and decoding (128 tokens), 2 threads, the median of RUNS runs. The models are made from one
# f32 source by each tool's own quantizer:
#   yomi quantize --model SRC --format m --out M_DIR      (and --format l --out L_DIR)
#   llama.cpp: convert_hf_to_gguf.py SRC --outtype f32, then llama-quantize to Q4_0 and Q8_0
#   (built by hand from llama.cpp's source, outside this repo).
# Usage: LLAMA_BENCH=/path/to/llama-bench bash bench/cpu_quant.sh M_DIR Q4_0.gguf L_DIR Q8_0.gguf
# (the pairs are compared row by row; YOMI_BIN=/path/to/yomi measures that binary).
set -euo pipefail
cd "$(dirname "$0")/.."
YOMI=${YOMI_BIN:-./target/release/yomi}
RUNS=${RUNS:-3}
PROMPT=$(python3 -c "print(' '.join(['The quick brown fox jumps over the lazy dog near the river bank.'] * 36) + ' The quick brown fox jumps over the lazy')")
stat() { tail -1 | python3 -c "import json,sys; print(json.load(sys.stdin)['stats']['$1'])"; }
med() { python3 -c "import sys,statistics; print(round(statistics.median(float(x) for x in sys.argv[1:]),1))" "$@"; }
echo "| model | engine | pp512 tok/s | tg128 tok/s |"
echo "|---|---|---|---|"
while [ $# -ge 2 ]; do
  ours=$1 theirs=$2; shift 2
  pps=(); tgs=()
  for _ in $(seq "$RUNS"); do
    pps+=("$($YOMI run -M "$ours" --device cpu --raw -m "$PROMPT" --ctx-size 1024 --max-tokens 1 --draft none --threads 2 --json 2>/dev/null | stat prefill_tokens_per_s)")
    tgs+=("$($YOMI run -M "$ours" --device cpu --raw -m "Once upon a time" --max-tokens 129 --draft none --threads 2 --json 2>/dev/null | stat generation_tokens_per_s)")
  done
  echo "| $(basename "$ours") | yomi | $(med "${pps[@]}") | $(med "${tgs[@]}") |"
  out=$("${LLAMA_BENCH:?set LLAMA_BENCH}" -m "$theirs" -p 512 -n 128 -t 2 -r "$RUNS" -o json 2>/dev/null)
  lpp=$(echo "$out" | python3 -c "import json,sys; d=json.load(sys.stdin); print(round([r['avg_ts'] for r in d if r['n_prompt']>0][0],1))")
  ltg=$(echo "$out" | python3 -c "import json,sys; d=json.load(sys.stdin); print(round([r['avg_ts'] for r in d if r['n_gen']>0][0],1))")
  echo "| $(basename "$theirs") | llama.cpp | $lpp | $ltg |"
done
