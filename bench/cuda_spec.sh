#!/usr/bin/env bash
# Speculative decoding on the lent GPU, the model drafters against plain decoding and the
# suffix drafter, through `yomi run --device cuda` (bench/spec_eval.py: the modes take turns on
# each prompt; greedy; every mode's output must equal plain decoding's):
#   - SmolLM2-135M-Instruct Q4_1 with the DFlash drafter trained here
#     (models/smollm2-135m-instruct-dflash), on the held-out chat prompts of tools/train;
#   - yomi-code-hybrid with its MTP block, on the held-out code prompts.
#
#   here:  bash bench/cuda_check.sh stage, and put its payload parts there (see that script:
#          the GGUF and the hybrid's shards land in ~/yomi-cuda-check);
#          cargo build --release -p yomi-cli && strip -o .device/bin/yomi target/release/yomi
#   there: OUT=$OUT bash bench/cuda_spec.sh [dflash|mtp|both]     carry: .device/bin/yomi
#
# N_DFLASH / N_MTP prompts (default 16 / 12: a call runs at most 10 minutes, and every
# `yomi run` loads the model and its kernels again). Each table also goes to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
home="$HOME/yomi-cuda-check"
gguf="$home/smollm2.gguf"
cp "$home"/model-0000?-of-00003.safetensors models/yomi-code-hybrid/ 2>/dev/null
mkdir -p target/release
cp .device/bin/yomi target/release/yomi && chmod +x target/release/yomi
yomi=target/release/yomi
what=${1:-both}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "$what" != mtp ]; then
    # The first run compiles the kernels; not a measurement.
    "$yomi" run -M "$gguf" --device cuda --max-tokens 4 -m hi >/dev/null 2>&1
    d="--draft dflash --draft-model models/smollm2-135m-instruct-dflash --draft-tree"
    python3 bench/spec_eval.py --yomi "$yomi" --device cuda --model "$gguf" \
        --prompts tools/train/data/eval.jsonl.gz --n "${N_DFLASH:-16}" --max-tokens 128 \
        --mode "none=--draft none" --mode "suffix=--draft suffix" \
        --mode "dflash chain=$d chain" --mode "dflash tree=$d tree" \
        --mode "dflash mixed=$d mixed" | tee "${OUT:-/tmp}/cuda_dflash.txt"
fi
if [ "$what" != dflash ]; then
    m="--draft mtp --draft-tree"
    python3 bench/spec_eval.py --yomi "$yomi" --device cuda --model models/yomi-code-hybrid \
        --raw --prompts tools/train/data/code_eval.jsonl.gz --n "${N_MTP:-12}" \
        --max-tokens 128 --mode "none=--draft none" --mode "suffix=--draft suffix" \
        --mode "mtp chain 1=$m chain --mtp-steps 1" --mode "mtp chain 3=$m chain --mtp-steps 3" \
        --mode "mtp tree 3=$m tree --mtp-steps 3" --mode "mtp mixed 3=$m mixed --mtp-steps 3" |
        tee "${OUT:-/tmp}/cuda_mtp.txt"
fi
