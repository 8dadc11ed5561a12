#!/usr/bin/env bash
# Tokens per pass and decode speed of DFlash drafting against plain decoding and the suffix
# drafter, on the held-out eval prompts of tools/train (never used for training or tuning),
# through `yomi run` (greedy; the output must be the same token for token in every mode).
#
#   bash bench/dflash_eval.sh MODEL DRAFTER_DIR [N_PROMPTS] [MAX_TOKENS]
#
# Prints one line per mode: mean tokens per verify pass, decode tok/s (median over prompts),
# and whether every output equalled plain decoding's.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: bench/dflash_eval.sh MODEL DRAFTER_DIR [N] [MAX_TOKENS]}
drafter=${2:?drafter directory}
n=${3:-20}
max=${4:-128}
yomi=${YOMI_BIN:-target/release/yomi}
python3 - "$yomi" "$model" "$drafter" "$n" "$max" <<'PY'
import gzip, json, statistics, subprocess, sys
yomi, model, drafter, n, max_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
prompts = [json.loads(l)["prompt"] for l in gzip.open("tools/train/data/eval.jsonl.gz", "rt")][:n]
modes = {
    "none": ["--draft", "none"],
    "suffix": ["--draft", "suffix"],
    "dflash chain": ["--draft", "dflash", "--draft-model", drafter, "--draft-tree", "chain"],
    "dflash tree": ["--draft", "dflash", "--draft-model", drafter, "--draft-tree", "tree"],
}
plain = None
for name, flags in modes.items():
    tpp, speed, outs = [], [], []
    for p in prompts:
        r = subprocess.run([yomi, "run", "-M", model, "--device", "cpu", "--temperature", "0",
                            "--max-tokens", max_tokens, "--json", *flags, "-m", p],
                           capture_output=True, text=True, check=True)
        j = json.loads(r.stdout.strip().splitlines()[-1])
        outs.append(j["output_ids"])
        tpp.append(j["stats"]["tokens_per_forward_pass"])
        speed.append(j["stats"]["generation_tokens_per_s"])
    same = "-" if plain is None else str(outs == plain)
    plain = plain or outs
    print(f"{name:13s} tokens/pass {statistics.mean(tpp):5.2f}  decode tok/s {statistics.median(speed):7.1f}  same as plain: {same}")
PY
