#!/usr/bin/env bash
# Tokens per pass and decode speed of DFlash drafting against plain decoding and the suffix
# drafter, on the held-out eval prompts of tools/train (never used for training or tuning),
# through `yomi run` (greedy; the output must be the same token for token in every mode).
#
#   bash bench/dflash_eval.sh MODEL DRAFTER_DIR [N_PROMPTS] [MAX_TOKENS]
#
# The modes take turns on each prompt (plain first), so that a machine whose speed drifts
# (other jobs on a shared VM) moves every mode alike. Prints one line per mode: mean tokens
# per verify pass, decode tok/s (median over prompts), the median over prompts of the mode's
# decode speed over plain decoding's on the same prompt, and whether every output equalled
# plain decoding's.
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
dflash = ["--draft", "dflash", "--draft-model", drafter, "--draft-tree"]
modes = {
    "none": ["--draft", "none"],
    "suffix": ["--draft", "suffix"],
    "dflash chain": dflash + ["chain"],
    "dflash tree": dflash + ["tree"],
    "dflash mixed": dflash + ["mixed"],
}
runs = {name: [] for name in modes}
for p in prompts:
    for name, flags in modes.items():
        r = subprocess.run([yomi, "run", "-M", model, "--device", "cpu", "--temperature", "0",
                            "--max-tokens", max_tokens, "--json", *flags, "-m", p],
                           capture_output=True, text=True, check=True)
        runs[name].append(json.loads(r.stdout.strip().splitlines()[-1]))
plain = runs["none"]
for name, js in runs.items():
    tpp = [j["stats"]["tokens_per_forward_pass"] for j in js]
    speed = [j["stats"]["generation_tokens_per_s"] for j in js]
    ratio = [s / q["stats"]["generation_tokens_per_s"] for s, q in zip(speed, plain)]
    same = "-" if name == "none" else str(all(j["output_ids"] == q["output_ids"] for j, q in zip(js, plain)))
    print(f"{name:13s} tokens/pass {statistics.mean(tpp):5.2f}  decode tok/s {statistics.median(speed):7.1f}"
          f"  vs plain {statistics.median(ratio):5.2f}x  same as plain: {same}")
PY
