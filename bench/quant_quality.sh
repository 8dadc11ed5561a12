#!/usr/bin/env bash
# Quality of yomi's quantized formats against their unquantized source, and of any other
# quantized files of the same source (e.g. llama.cpp's Q4_K_M / Q4_0 / Q8_0 GGUFs, made by hand
# with llama.cpp's own converter and llama-quantize), on one fixed stretch of text:
# `yomi perplexity --kl-reference SRC` (KL of the next-token distributions from the source's,
# top-1 agreement, perplexity), all through the same engine and the same windows.
#
#   bash bench/quant_quality.sh SRC_DIR TEXT [OTHER.gguf ...]
#
# The evaluation windows are fixed here, apart from the windows choices were tuned on: tuning
# used windows 0-15 (512 tokens each) of a text; this evaluation reads windows 64-127
# (SKIP/WINDOWS override; VARIANTS_ON=0 runs only the other files). Bits per weight count
# tensor data only (every tensor of the file, norms and the unused MTP block included, over the
# source's parameter count); headers and a GGUF's tokenizer are left out. Prints one markdown
# table row per model; a file yomi cannot load gets a row saying why.
set -euo pipefail
SRC=${1:?usage: quant_quality.sh SRC_DIR TEXT [OTHER.gguf ...]}
TEXT=${2:?usage: quant_quality.sh SRC_DIR TEXT [OTHER.gguf ...]}
shift 2
YOMI=${YOMI:-target/release/yomi}
SKIP=${SKIP:-64}
WINDOWS=${WINDOWS:-64}
WORK=${WORK:-$(mktemp -d)}
VARIANTS=(
    "--format m --group 32"
    "--format m --group 64"
    "--format m --group 128"
    "--format m --group 64 --no-rotation"
    "--format l --group 32"
    "--format l --group 128"
)

# Tensor-data bytes of a safetensors directory or a GGUF file, and the source's parameters.
sizes() {
    python3 - "$@" <<'EOF'
import json, os, struct, sys

def st_bytes(d):
    total, params = 0, 0
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors"):
            continue
        with open(os.path.join(d, f), "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            hdr = json.loads(fh.read(n))
        for k, v in hdr.items():
            if k == "__metadata__":
                continue
            a, b = v["data_offsets"]
            total += b - a
            numel = 1
            for s in v["shape"]:
                numel *= s
            params += numel
    return total, params

def gguf_bytes(p):
    from gguf import GGUFReader
    r = GGUFReader(p)
    return sum(int(t.n_bytes) for t in r.tensors), None

for p in sys.argv[1:]:
    b, n = gguf_bytes(p) if p.endswith(".gguf") else st_bytes(p)
    print(p, b, n if n is not None else 0)
EOF
}

src_params=$(sizes "$SRC" | awk '{print $3}')
row() {
    local name=$1 model=$2 bytes
    bytes=$(sizes "$model" | awk '{print $2}')
    local json err
    err=$(mktemp)
    if ! json=$("$YOMI" perplexity -M "$model" --kl-reference "$SRC" --device cpu --kv-cache f32 \
        --file "$TEXT" --window 512 --skip-windows "$SKIP" --max-windows "$WINDOWS" --json 2>"$err"); then
        echo "| $name | $(python3 -c "print('%.2f' % (8 * $bytes / $src_params))") | not loaded by yomi: $(grep -m1 error "$err") | | | | |"
        rm -f "$err"
        return
    fi
    rm -f "$err"
    echo "$json" |
        python3 -c "
import json, sys
name, b, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
d = json.load(sys.stdin)
k = d['kl']
print('| %s | %.2f | %.4f | %.4f | %.5f ± %.5f | %.4f | %.2f%% |' % (
    name, 8 * b / n, d['perplexity'], k['reference_perplexity'], k['mean_kl'],
    k['kl_stderr'], k['p99_kl'], 100 * k['top1_agreement']))
" "$name" "$bytes" "$src_params"
}

echo "| model | bits/weight | PPL | source PPL | mean KL (nats) | p99 KL | top-1 = source |"
echo "|---|---|---|---|---|---|---|"
# VARIANTS=0 leaves yomi's own formats out (only the other files).
[ "${VARIANTS_ON:-1}" = 1 ] || VARIANTS=()
for v in "${VARIANTS[@]}"; do
    out="$WORK/$(echo "$v" | tr -d ' -')"
    [ -d "$out" ] || "$YOMI" quantize -M "$SRC" --out "$out" $v >/dev/null 2>&1
    row "yomi $v" "$out"
done
for g in "$@"; do
    row "$(basename "$g")" "$g"
done
