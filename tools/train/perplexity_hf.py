"""`yomi perplexity`'s computation, done by Hugging Face transformers (float32, CPU, eager), to
check yomi's number on the same text (issue 41).

Same steps as crates/yomi-engine/src/perplexity.rs: the whole file is tokenized once (the
model's tokenizer, no special tokens added: yomi-code-hybrid has no BOS; `<|endoftext|>` in the
text is its special token, as in yomi), the stream is cut into non-overlapping windows of
--window tokens (the tail shorter than a window is dropped), each window is one fresh forward
pass, and token j of a window is scored from row j-1 for j from max(score_from, 1) on, where
score_from is window/2 (yomi's default) or 0 (--score-all). NLL in float64 from float32 logits.
Both scorings come from one pass, so the script prints both.

    python3 tools/train/perplexity_hf.py models/yomi-code-hybrid --file .device/code/heldout.txt \
        --window 1024 --max-windows 32
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--file", required=True)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--max-windows", type=int, default=0, help="0: the whole file")
    args = ap.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_grad_enabled(False)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    with open(args.file, encoding="utf-8") as f:
        ids = tok(f.read(), add_special_tokens=False)["input_ids"]
    W = args.window
    n = len(ids) // W
    if args.max_windows:
        n = min(n, args.max_windows)
    sums = {"all": [0.0, 0.0, 0], "second_half": [0.0, 0.0, 0]}
    starts = {"all": 1, "second_half": max(W // 2, 1)}
    t0 = time.time()
    for w in range(n):
        win = torch.tensor([ids[w * W:(w + 1) * W]])
        logits = model(win, use_cache=False).logits[0].float()
        # NLL of token j from row j-1, in float64 like perplexity.rs's token_logprob.
        lp = torch.log_softmax(logits[:-1].double(), dim=-1)
        nll = -lp.gather(1, win[0, 1:, None]).squeeze(1)  # nll[j-1] scores token j
        for k, s in starts.items():
            part = nll[s - 1:]
            sums[k][0] += part.sum().item()
            sums[k][1] += (part * part).sum().item()
            sums[k][2] += part.numel()
        print(f"window {w + 1}/{n}: ppl(all) {math.exp(sums['all'][0] / sums['all'][2]):.4f} "
              f"({time.time() - t0:.0f} s)", flush=True)
    out = {"file": args.file, "tokens": len(ids), "window": W, "windows": n}
    for k, (s, sq, c) in sums.items():
        mean = s / c
        var = max(sq / c - mean * mean, 0.0)
        out[k] = {"scored_tokens": c, "mean_nll": mean, "perplexity": math.exp(mean),
                  "nll_stderr": math.sqrt(var / c)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
