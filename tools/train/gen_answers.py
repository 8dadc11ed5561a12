"""Answer the prompt set with SmolLM2 itself: the drafter's training targets.

Every prompt goes through SmolLM2's chat template (gguf_llama.chat_prompt, the GGUF's own
template), then SmolLM2 (gguf_llama.load_llama, f32) answers it with Hugging Face `generate`,
batched with left padding and a KV cache, up to --max-new tokens, stopping at <|im_end|>:
  - once greedily (`greedy`), and
  - once sampled (`--temperatures`, one picked per batch from a seeded RNG, top-p 1).
Prompts are sorted by length within a shard so batches carry little padding.

Output: shards of --shard-size prompts, `{out}/{split}-{shard:03d}.npz`, each a few MB (well
under the 16 MiB a file may have coming back from the GPU machine):
    tokens      uint16 [sum of lengths]  prompt + answer ids of every sequence, concatenated
                                          (vocab 49152 < 2^16); the answer ends with <|im_end|>
                                          unless it hit --max-new
    offsets     int64  [n + 1]           sequence i is tokens[offsets[i]:offsets[i+1]]
    prompt_len  int32  [n]               the first prompt_len[i] ids are the templated prompt
    prompt_idx  int32  [n]               row of the prompt in the split's jsonl.gz
    temperature float32 [n]              0 = greedy
A shard already on disk is skipped, so a run cut off by the 10-minute limit resumes with the
same command; --time-budget stops starting new shards after that many seconds.

    python3 tools/train/gen_answers.py --split train --batch 1024 --time-budget 500
(default --out: .device/train/answers, ignored by git)
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_llama  # noqa: E402
from prompts import read_jsonl_gz  # noqa: E402

IM_END = 2  # <|im_end|>: SmolLM2's end of turn (tokenizer.ggml.eos_token_id)


def encode_prompts(tok, rows):
    return [gguf_llama.encode_chat(tok, r["prompt"]) for r in rows]


@torch.no_grad()
def generate_batch(model, prompts, max_new, temperature, pad_id, device, eos=IM_END):
    """prompts: list of id lists -> list of answer id lists (ending at `eos` included)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    kw = dict(do_sample=False) if temperature == 0 else dict(
        do_sample=True, temperature=temperature, top_p=1.0, top_k=0)
    out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                         max_new_tokens=max_new, eos_token_id=eos, pad_token_id=pad_id,
                         use_cache=True, **kw)
    out = out[:, width:].cpu().tolist()
    answers = []
    for a in out:
        if eos in a:
            a = a[: a.index(eos) + 1]
        answers.append(a)
    return answers


def code_prompts(stream_path, n, seed, lo=48, hi=320, eos=0):
    """`n` code-completion prompts from a code_corpus.py token stream (its train split): windows
    of lo..hi tokens at seeded random offsets, wherever they end (the model completes mid-line
    too); a window never spans two documents (it holds no end-of-text id)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from code_corpus import read_stream

    stream = read_stream(stream_path)
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        length = int(rng.integers(lo, hi + 1))
        start = int(rng.integers(0, len(stream) - length))
        w = stream[start:start + length]
        if (w == eos).any():
            continue
        out.append(w.astype(np.int64).tolist())
    return out


def run_shard(model, enc, idxs, args, shard, device, pad_id):
    rng = random.Random(f"{args.seed}:{args.split}:{shard}")
    torch.manual_seed(args.seed * 1000 + shard)
    order = sorted(idxs, key=lambda i: len(enc[i]))
    seqs, plen, pidx, temps = [], [], [], []
    n_tok, t0 = 0, time.time()
    for mode in ("greedy", "sampled"):
        for b in range(0, len(order), args.batch):
            chunk = order[b : b + args.batch]
            temp = 0.0 if mode == "greedy" else rng.choice(args.temperatures)
            answers = generate_batch(model, [enc[i] for i in chunk], args.max_new, temp,
                                     pad_id, device, args.eos)
            for i, a in zip(chunk, answers):
                seqs.append(enc[i] + a)
                plen.append(len(enc[i]))
                pidx.append(i)
                temps.append(temp)
                n_tok += len(a)
    dt = time.time() - t0
    lens = [len(s) for s in seqs]
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lens)
    path = os.path.join(args.out, f"{args.split}-{shard:03d}.npz")
    tmp = path + ".tmp.npz"
    np.savez(tmp, tokens=np.concatenate([np.asarray(s, dtype=np.uint16) for s in seqs]),
             offsets=offsets, prompt_len=np.asarray(plen, dtype=np.int32),
             prompt_idx=np.asarray(pidx, dtype=np.int32),
             temperature=np.asarray(temps, dtype=np.float32))
    os.replace(tmp, path)
    print(f"{path}: {len(seqs)} sequences, {n_tok} answer tokens in {dt:.1f} s "
          f"({n_tok / dt:.0f} tok/s), {os.path.getsize(path) / 2**20:.1f} MiB", flush=True)
    if args.copy_to:
        shutil.copy(path, args.copy_to)
    return dt


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--target-hf", default="",
                    help="a Hugging Face model directory instead of SmolLM2's GGUF (with "
                         "--code-stream: e.g. models/yomi-code-hybrid)")
    ap.add_argument("--code-stream", default="",
                    help="prompts are windows of this code_corpus.py stream (its train split), "
                         "--prompts of them, instead of the chat prompt split")
    ap.add_argument("--prompts", type=int, default=24000, help="with --code-stream")
    ap.add_argument("--data", default=os.path.join(here, "data"))
    ap.add_argument("--split", default="train")
    ap.add_argument("--out", default=os.path.join(here, "..", "..", ".device", "train",
                                                  "answers"))
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts (smoke)")
    ap.add_argument("--shard-size", type=int, default=4000)
    ap.add_argument("--shards", default="", help="comma-separated shard numbers (default: all)")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--temperatures", default="0.7,0.8,0.9")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--layers", type=int, default=None, help="truncate the target (smoke only)")
    ap.add_argument("--time-budget", type=float, default=0,
                    help="seconds; 0 = no limit. A shard is not started unless the last one's "
                         "time still fits")
    ap.add_argument("--copy-to", default="", help="also copy each finished shard here ($OUT)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    args.temperatures = [float(t) for t in args.temperatures.split(",")]
    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)

    if args.target_hf:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.target_hf, dtype=torch.float32)
        model = model.to(args.device).eval()
        pad = model.config.pad_token_id
        pad_id = pad if pad is not None else 0
        args.eos = model.config.eos_token_id
    else:
        model, hp, g = gguf_llama.load_llama(args.gguf, num_layers=args.layers,
                                             device=args.device)
        pad_id, args.eos = hp.pad_token_id, IM_END
    if args.code_stream:
        rows = code_prompts(args.code_stream, args.prompts, args.seed)
        if args.limit:
            rows = rows[: args.limit]
        enc = rows
    else:
        tok = gguf_llama.build_tokenizer(g)
        rows = read_jsonl_gz(os.path.join(args.data, f"{args.split}.jsonl.gz"))
        if args.limit:
            rows = rows[: args.limit]
        enc = encode_prompts(tok, rows)
    n_shards = (len(rows) + args.shard_size - 1) // args.shard_size
    shards = [int(s) for s in args.shards.split(",")] if args.shards else range(n_shards)
    print(f"{len(rows)} prompts, {n_shards} shards, device {args.device}, "
          f"load {time.time() - t_start:.1f} s", flush=True)
    last = 0.0
    for shard in shards:
        path = os.path.join(args.out, f"{args.split}-{shard:03d}.npz")
        if os.path.exists(path):
            continue
        if args.time_budget and time.time() - t_start + 1.15 * last > args.time_budget:
            print(f"time budget: shard {shard} and later not started; rerun to continue")
            break
        idxs = list(range(shard * args.shard_size, min(len(rows), (shard + 1) * args.shard_size)))
        last = run_shard(model, enc, idxs, args, shard, args.device, pad_id)


def load_answers(paths):
    """All sequences of some shards: list of (ids int64 array, prompt_len)."""
    out = []
    for p in paths:
        z = np.load(p)
        tok, off, pl = z["tokens"].astype(np.int64), z["offsets"], z["prompt_len"]
        for i in range(len(pl)):
            out.append((tok[off[i]:off[i + 1]], int(pl[i])))
    return out


if __name__ == "__main__":
    main()
