#!/usr/bin/env bash
# Tokens per pass and decode speed of DFlash drafting against plain decoding and the suffix
# drafter, on the held-out eval prompts of tools/train (never used for training or tuning),
# through `yomi run` (greedy; the output must be the same token for token in every mode).
#
#   [DEVICE=cuda] bash bench/dflash_eval.sh MODEL DRAFTER_DIR [N_PROMPTS] [MAX_TOKENS]
#
# bench/spec_eval.py runs the modes in turns per prompt and prints one line per mode.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: bench/dflash_eval.sh MODEL DRAFTER_DIR [N] [MAX_TOKENS]}
drafter=${2:?drafter directory}
dflash="--draft dflash --draft-model $drafter --draft-tree"
python3 bench/spec_eval.py --yomi "${YOMI_BIN:-target/release/yomi}" --device "${DEVICE:-cpu}" --model "$model" \
    --prompts tools/train/data/eval.jsonl.gz --n "${3:-20}" --max-tokens "${4:-128}" \
    --mode "none=--draft none" --mode "suffix=--draft suffix" \
    --mode "dflash chain=$dflash chain" --mode "dflash tree=$dflash tree" \
    --mode "dflash mixed=$dflash mixed"
