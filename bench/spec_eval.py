#!/usr/bin/env python3
"""Tokens per pass and decode speed of speculative modes against plain decoding, through
`yomi run --json` (greedy: every mode's output must equal plain decoding's token for token).
Called by bench/dflash_eval.sh and bench/mtp_eval.sh, which fix the prompts and the modes.

    python3 bench/spec_eval.py --model M --prompts FILE.jsonl.gz [--n N] [--max-tokens T]
        [--raw] [--device cuda] --mode NAME='FLAGS' [--mode ...]

The first mode is the baseline (plain decoding). The modes take turns on each prompt, so that
a machine whose speed drifts (other jobs on a shared VM) moves every mode alike. Prints one
line per mode: mean tokens per verify pass, decode tok/s (median over prompts), the median
over prompts of the mode's decode speed over the baseline's on the same prompt, and whether
every output equalled the baseline's.
"""
import argparse
import gzip
import json
import shlex
import statistics
import subprocess


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--yomi", default="target/release/yomi")
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--max-tokens", default="128")
    ap.add_argument("--raw", action="store_true", help="prompts are raw text, no chat template")
    ap.add_argument("--device", default="cpu", help="yomi's --device (cpu or cuda)")
    ap.add_argument("--mode", action="append", required=True, metavar="NAME=FLAGS")
    a = ap.parse_args()
    modes = dict(m.split("=", 1) for m in a.mode)
    prompts = [json.loads(line)["prompt"] for line in gzip.open(a.prompts, "rt")][: a.n]
    raw = ["--raw"] if a.raw else []
    runs = {name: [] for name in modes}
    for p in prompts:
        for name, flags in modes.items():
            r = subprocess.run([a.yomi, "run", "-M", a.model, "--device", a.device,
                                "--temperature", "0", "--max-tokens", a.max_tokens, "--json",
                                *raw, *shlex.split(flags), "-m", p],
                               capture_output=True, text=True, check=True)
            runs[name].append(json.loads(r.stdout.strip().splitlines()[-1]))
    base_name = next(iter(modes))
    base = runs[base_name]
    for name, js in runs.items():
        tpp = [j["stats"]["tokens_per_forward_pass"] for j in js]
        speed = [j["stats"]["generation_tokens_per_s"] for j in js]
        ratio = [s / q["stats"]["generation_tokens_per_s"] for s, q in zip(speed, base)]
        same = "-" if name == base_name else str(
            all(j["output_ids"] == q["output_ids"] for j, q in zip(js, base)))
        print(f"{name:16s} tokens/pass {statistics.mean(tpp):5.2f}  decode tok/s "
              f"{statistics.median(speed):7.1f}  vs plain {statistics.median(ratio):5.2f}x  "
              f"same as plain: {same}")


if __name__ == "__main__":
    main()
