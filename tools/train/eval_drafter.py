"""Tokens per target pass of a DFlash drafter on held-out prompts (greedy), in PyTorch.

A reference loop, written for clarity rather than speed (the target is re-run on the whole
sequence every pass, no caches): prefill -> first token; then per pass the drafter proposes
B-1 tokens after the anchor from the target features of the committed tokens, the target
verifies [anchor, drafts], the longest agreeing prefix plus the target's own next token is
committed. The output must equal plain greedy decoding token for token (checked with
--check-lossless against HF generate). Reports tokens per pass (τ, counting the bonus token)
per prompt kind and overall.

    python3 tools/train/eval_drafter.py --drafter DIR [--split eval] [--limit 40]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_llama  # noqa: E402
from dflash_model import DFlashDrafter  # noqa: E402
from prompts import read_jsonl_gz  # noqa: E402

IM_END = 2


@torch.no_grad()
def spec_greedy(target, drafter, prompt_ids, max_new, device):
    cfg = drafter.config
    B, taps = cfg.block_size, cfg.target_layer_ids
    E = target.model.embed_tokens.weight
    ids = torch.tensor([prompt_ids], device=device)
    with gguf_llama.LayerTaps(target, taps) as tp:
        out = target(ids)
    feats = tp.features()  # [1, L, Lt*d]
    seq = list(prompt_ids) + [int(out.logits[0, -1].argmax())]
    L = len(prompt_ids)  # position of the anchor (committed, its features not yet known)
    passes, accepted = 1, []  # the prefill pass gave the first token
    while len(seq) - len(prompt_ids) < max_new and seq[-1] != IM_END:
        block = torch.tensor([[seq[L]] + [cfg.mask_token_id] * (B - 1)], device=device)
        pos = torch.arange(L + B, device=device)[None]
        h = drafter(torch.nn.functional.embedding(block, E), feats[:, :L], pos)
        drafts = torch.nn.functional.linear(h[0, 1:], target.lm_head.weight).argmax(-1).tolist()
        full = torch.tensor([seq[: L + 1] + drafts], device=device)
        with gguf_llama.LayerTaps(target, taps) as tp:
            out = target(full)
        post = out.logits[0, L:].argmax(-1).tolist()  # target's token after each block row
        n = 0
        while n < len(drafts) and drafts[n] == post[n]:
            n += 1
        new = drafts[:n] + [post[n]]
        if IM_END in new:
            new = new[: new.index(IM_END) + 1]
        room = max_new - (len(seq) - len(prompt_ids))
        new = new[:room]
        seq += new
        feats = tp.features()[:, : L + 1 + n]
        L += len(new)
        passes += 1
        accepted.append(len(new))
    return seq[len(prompt_ids):], passes, accepted


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--data", default=os.path.join(here, "data"))
    ap.add_argument("--split", default="eval")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--check-lossless", action="store_true")
    ap.add_argument("--json-out", default="")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    target, hp, g = gguf_llama.load_llama(args.gguf, device=args.device)
    tok = gguf_llama.build_tokenizer(g)
    drafter = DFlashDrafter.load(args.drafter, device=args.device).eval()
    rows = read_jsonl_gz(os.path.join(args.data, f"{args.split}.jsonl.gz"))
    if args.limit:
        rows = rows[: args.limit]
    per_kind, results, t0 = {}, [], time.time()
    tot_tokens = tot_passes = 0
    for r in rows:
        p = gguf_llama.encode_chat(tok, r["prompt"])
        ans, passes, acc = spec_greedy(target, drafter, p, args.max_new, args.device)
        if args.check_lossless:
            ref = target.generate(torch.tensor([p], device=args.device), do_sample=False,
                                  max_new_tokens=args.max_new, eos_token_id=IM_END,
                                  pad_token_id=hp.pad_token_id)[0, len(p):].tolist()
            if IM_END in ref:
                ref = ref[: ref.index(IM_END) + 1]
            assert ans == ref, f"speculative != plain on {r['id']}"
        # τ over the decode passes (the prefill's token is not a drafting pass).
        k = per_kind.setdefault(r["kind"], [0, 0])
        k[0] += len(ans) - 1
        k[1] += passes - 1
        tot_tokens += len(ans) - 1
        tot_passes += passes - 1
        results.append({"id": r["id"], "kind": r["kind"], "tokens": len(ans),
                        "passes": passes, "accepted": acc})
    for kind, (t, n) in sorted(per_kind.items()):
        print(f"{kind:9s} tokens/pass {t / max(1, n):.2f} ({t} tokens, {n} passes)")
    print(f"all       tokens/pass {tot_tokens / max(1, tot_passes):.2f} over {len(rows)} prompts"
          f"{' (lossless: checked)' if args.check_lossless else ''}; {time.time() - t0:.0f} s")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
