"""Evaluate an exported hybrid model directory with transformers on the CPU.

  - loads it with `AutoModelForCausalLM.from_pretrained` (the trunk) and the `mtp.*` tensors into
    hybrid_model.MTPBlock, in float32;
  - held-out perplexity, MTP top-1 of token t+2 and its agreement with the trunk's greedy token
    (hybrid_model.evaluate_windows: non-overlapping windows of --window tokens of code_corpus.py's
    held-out stream, `yomi perplexity --score-all`'s convention), on the first --windows windows;
  - with --tokenizer-check: the directory's tokenizer (AutoTokenizer) on heldout.txt gives the
    held-out token stream exactly;
  - greedy completions (HF `generate`, no sampling) of the first --prompts held-out prompts of
    data/code_eval.jsonl.gz.

    python3 tools/train/eval_hybrid.py models/yomi-code-hybrid --data .device/code --windows 64
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hybrid_model as hm  # noqa: E402
from code_corpus import read_stream  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def load_prompts(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--data", default=os.path.join(HERE, "..", "..", ".device", "code"))
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=64, help="first N held-out windows (0: all)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokenizer-check", action="store_true")
    ap.add_argument("--prompts", type=int, default=0)
    ap.add_argument("--prompt-file", default=os.path.join(HERE, "data", "code_eval.jsonl.gz"))
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--json-out", default="")
    args = ap.parse_args(argv)

    t0 = time.time()
    lm, mtp, cfg = hm.load_hf_dir(args.model, torch.float32)
    model = hm.LoadedHybrid(lm, mtp, cfg)
    out = {"model": args.model}
    held = read_stream(os.path.join(args.data, "heldout.u16.xz"))
    if args.tokenizer_check:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.model)
        with open(os.path.join(args.data, "heldout.txt"), encoding="utf-8") as f:
            ids = tok(f.read(), add_special_tokens=False)["input_ids"]
        same = ids == held.tolist()
        out["tokenizer_check"] = same
        print(f"tokenizer on heldout.txt == held-out stream: {same} ({len(ids):,} tokens)")
    if args.windows >= 0:
        w = hm.eval_windows(held, args.window, args.windows or None)
        ev = hm.evaluate_windows(model, w, batch=args.batch)
        out["heldout"] = ev
        print(f"held-out, first {ev['windows']} windows of {ev['window']} ({ev['targets']:,} "
              f"targets), transformers f32 on CPU: ppl {ev['main_ppl']:.4f} (second half "
              f"{ev['main_ppl_second_half']:.4f}) top1 {ev['main_top1']:.4f}; mtp loss "
              f"{ev['mtp_loss']:.4f} top1 {ev['mtp_top1']:.4f} agree-with-greedy "
              f"{ev['mtp_agree_greedy']:.4f} ({time.time() - t0:.0f} s)", flush=True)
    if args.prompts:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.model)
        rows = load_prompts(args.prompt_file)[: args.prompts]
        out["completions"] = []
        for r in rows:
            ids = tok(r["prompt"], add_special_tokens=False, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                g = lm.generate(ids, max_new_tokens=args.max_new, do_sample=False,
                                eos_token_id=cfg["eos_token_id"],
                                pad_token_id=cfg["pad_token_id"])
            text = tok.decode(g[0, ids.shape[1]:], skip_special_tokens=False)
            out["completions"].append({"id": r["id"], "completion": text,
                                       "reference": r["reference"]})
            tail = "\n".join(r["prompt"].rstrip("\n").split("\n")[-3:])
            print(f"=== {r['id']} ({r['prompt_tokens']} prompt tokens)\n--- prompt (last lines)"
                  f"\n{tail}\n--- greedy\n{text}\n--- reference\n"
                  f"{''.join(r['reference'].splitlines(True)[:6])}", flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
