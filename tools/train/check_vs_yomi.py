"""Check the PyTorch SmolLM2 of gguf_llama.py against yomi itself (run here, on the CPU).

For each prompt: the token ids of our tokenizer + chat template against `yomi run --json`'s
prompt_ids; then one forward pass on prompt + yomi's greedy answer, our f32 logits against
`yomi logits` (Q4_1 weights with 8-bit quantized activations on yomi's side, so the logits
differ a little), and the residual stream at the target layers the drafter taps
(`--hidden-out`). Prints max |diff| of the logits, their max |diff| relative to each row's
logit spread, top-1 agreement over all rows, and whether our greedy continuation reproduces
yomi's greedy answer token for token.

    python3 tools/train/check_vs_yomi.py [--yomi target/release/yomi] [--n 6]
    python3 tools/train/check_vs_yomi.py --tokenizer-split eval     (token ids only, all prompts)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_llama  # noqa: E402

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "Explain photosynthesis to a ten-year-old in three sentences.",
    "Give me three tips for a job interview.",
    "Translate 'good morning, my friend' into Spanish.",
    "What does the Unix command `grep -r` do?",
    "Summarize the plot of Romeo and Juliet.",
    "If I have 3 apples and buy 5 more, then eat 2, how many do I have?",
]

# Taps checked: the residual stream after these decoder layers (HF hidden_states[i + 1]).
TAPS = [1, 8, 15, 22, 27]


def run_yomi(yomi, gguf, prompt, max_tokens):
    r = subprocess.run([yomi, "run", "--model", gguf, "--device", "cpu", "--temperature", "0",
                        "--draft", "none", "--max-tokens", str(max_tokens), "--json",
                        "-m", prompt], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def yomi_logits(yomi, gguf, ids, tmp):
    from safetensors.numpy import load_file

    lo, hi = os.path.join(tmp, "l.safetensors"), os.path.join(tmp, "h.safetensors")
    subprocess.run([yomi, "logits", "--model", gguf, "--device", "cpu", "--kv-cache", "f32",
                    "--tokens", ",".join(map(str, ids)), "--out", lo, "--hidden-out", hi],
                   capture_output=True, check=True)
    return load_file(lo)["logits"], load_file(hi)


def check_tokenizer(args):
    from prompts import read_jsonl_gz

    gguf = args.gguf or gguf_llama.default_gguf_path()
    tok = gguf_llama.build_tokenizer(gguf_llama.read_gguf(gguf))
    rows = read_jsonl_gz(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                                      f"{args.tokenizer_split}.jsonl.gz"))
    bad = [r["id"] for r in rows
           if gguf_llama.encode_chat(tok, r["prompt"]) != run_yomi(
               args.yomi, gguf, r["prompt"], 1)["prompt_ids"]]
    print(f"token ids equal to yomi's on {len(rows) - len(bad)}/{len(rows)} prompts of "
          f"{args.tokenizer_split}" + (f"; differ: {bad[:20]}" if bad else ""))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--yomi", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                    "target", "release", "yomi"))
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--n", type=int, default=len(PROMPTS))
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--tokenizer-split", default="",
                    help="only compare token ids with yomi's on every prompt of this split")
    args = ap.parse_args()
    if args.tokenizer_split:
        return check_tokenizer(args)
    gguf = args.gguf or gguf_llama.default_gguf_path()
    torch.set_num_threads(2)
    model, hp, g = gguf_llama.load_llama(gguf)
    tok = gguf_llama.build_tokenizer(g)

    worst_abs, worst_rel, agree, rows, gen_same = 0.0, 0.0, 0, 0, 0
    hid_rel = {t: 0.0 for t in TAPS}
    with tempfile.TemporaryDirectory() as tmp:
        for prompt in PROMPTS[: args.n]:
            ours = gguf_llama.encode_chat(tok, prompt)
            y = run_yomi(args.yomi, gguf, prompt, args.max_tokens)
            assert ours == y["prompt_ids"], f"tokenizer mismatch on {prompt!r}"
            ids = y["prompt_ids"] + y["output_ids"]
            yl, yh = yomi_logits(args.yomi, gguf, ids, tmp)
            with torch.no_grad():
                out = model(torch.tensor([ids]), output_hidden_states=True)
            tl = out.logits[0].float().numpy()
            d = np.abs(tl - yl)
            spread = yl.max(-1) - yl.min(-1)
            worst_abs = max(worst_abs, float(d.max()))
            worst_rel = max(worst_rel, float((d.max(-1) / spread).max()))
            a = int((tl.argmax(-1) == yl.argmax(-1)).sum())
            agree += a
            rows += len(ids)
            for t in TAPS:
                th = out.hidden_states[t + 1][0].numpy()
                yt = yh[f"hidden_states.{t + 1}"]
                rel = float(np.linalg.norm(th - yt) / np.linalg.norm(yt))
                hid_rel[t] = max(hid_rel[t], rel)
            # Our greedy continuation from the same prompt.
            with torch.no_grad():
                gen = model.generate(torch.tensor([ours]), max_new_tokens=len(y["output_ids"]),
                                     do_sample=False, pad_token_id=hp.pad_token_id)
            g_ids = gen[0, len(ours):].tolist()
            n_same = 0
            for u, v in zip(g_ids, y["output_ids"]):
                if u != v:
                    break
                n_same += 1
            gen_same += n_same == len(y["output_ids"])
            print(f"{prompt[:40]!r:44s} rows {len(ids):3d}  max|dl| {d.max():.3f}  "
                  f"top1 {a}/{len(ids)}  greedy same {n_same}/{len(y['output_ids'])}")
    print(f"max |logit diff| {worst_abs:.4f}; max |diff| / row logit spread {worst_rel:.4f}; "
          f"top-1 agreement {agree}/{rows} = {agree / rows:.4f}; greedy answers identical "
          f"{gen_same}/{args.n}")
    print("hidden-state relative L2 diff at taps: " +
          ", ".join(f"{t}: {v:.4f}" for t, v in hid_rel.items()))
    return worst_rel, agree / rows


if __name__ == "__main__":
    main()
