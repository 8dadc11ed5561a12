#!/usr/bin/env bash
# Tokens per pass and decode speed of MTP drafting (the model's own block, `--draft mtp`)
# against plain decoding and the suffix drafter, on the held-out code-completion prompts of
# tools/train (data/code_eval.jsonl.gz: functions of files the model never trained on; never
# used for tuning), through `yomi run --raw` (greedy; the output must be the same token for
# token in every mode).
#
#   [DEVICE=cuda] bash bench/mtp_eval.sh [MODEL] [N_PROMPTS] [MAX_TOKENS]
#
# MODEL defaults to models/yomi-code-hybrid (run its restore_weights.sh first). The drafting
# head covers the first 16,384 ids (`--mtp-vocab`'s default) but in `mtp chain 3 all`.
# bench/spec_eval.py runs the modes in turns per prompt and prints one line per mode.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/yomi-code-hybrid}
mtp="--draft mtp --draft-tree"
python3 bench/spec_eval.py --yomi "${YOMI_BIN:-target/release/yomi}" --device "${DEVICE:-cpu}" --model "$model" --raw \
    --prompts tools/train/data/code_eval.jsonl.gz --n "${2:-32}" --max-tokens "${3:-128}" \
    --mode "none=--draft none" --mode "suffix=--draft suffix" \
    --mode "mtp chain 1=$mtp chain --mtp-steps 1" \
    --mode "mtp chain 2=$mtp chain --mtp-steps 2" \
    --mode "mtp chain 3=$mtp chain --mtp-steps 3" \
    --mode "mtp chain 3 all=$mtp chain --mtp-steps 3 --mtp-vocab 0" \
    --mode "mtp tree 3=$mtp tree --mtp-steps 3" \
    --mode "mtp mixed 3=$mtp mixed --mtp-steps 3"
