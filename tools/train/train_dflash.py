"""Train a DFlash drafter for SmolLM2-135M-Instruct on its own answers (gen_answers.py shards).

Each step (z-lab's objective, ../shared/docs/speculative.md §1.3):
  1. a batch of sequences (templated prompt + SmolLM2's answer), right-padded;
  2. the frozen target (gguf_llama.load_llama, only the layers up to the deepest tap) runs on
     them once, no grad; the residual stream after each tap layer is concatenated per token;
  3. --anchors random anchor positions per sequence among the answer tokens (the anchor is a
     token the target has committed; at inference the first anchor is the first answer token);
  4. one block per anchor: [token@anchor, MASK × (B-1)] at positions anchor..anchor+B-1, embedded
     with the target's (frozen) embeddings; the drafter sees the fused context rows < anchor and
     its whole block (no causal mask in the block) — all blocks of a batch in one masked pass;
  5. logits of block positions 1..B-1 through the target's (frozen, tied) LM head; cross-entropy
     against the sequence's next B-1 tokens, position k weighted exp(-(k-1)/gamma).
AdamW, linear warm-up then cosine decay, bf16 autocast on CUDA (f32 on the CPU).

Runs in slices that fit the GPU machine's 10-minute commands: --time-budget seconds of wall time,
then a checkpoint (and one every --ckpt-every seconds). The checkpoint is a folder of
safetensors files of at most 15 MiB each (weights f32; Adam moments bf16) plus state.json; the
next call with the same --ckpt resumes exactly (data order and anchors come from the step
number and --seed). Every call ends by exporting the drafter in z-lab's format to --export
(config.json + model.safetensors, bf16, ~13 MiB for the default shape).

    python3 tools/train/train_dflash.py --answers '.device/train/answers/train-*.npz' \
        --ckpt .device/train/ckpt --export .device/train/drafter --epochs 6 --time-budget 510
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_llama  # noqa: E402
from dflash_model import (DFlashConfig, DFlashDrafter, block_loss, count_params,  # noqa: E402
                          expected_accept, spread_layer_ids)
from gen_answers import load_answers  # noqa: E402

CKPT_FILE_BYTES = 15 << 20


# --------------------------------------------------------------------------------------------
# Data


class Sequences:
    def __init__(self, items, max_len):
        # Keep sequences with at least one answer token after the anchor.
        self.items = [(ids[:max_len], pl) for ids, pl in items if min(len(ids), max_len) - pl >= 2]

    def __len__(self):
        return len(self.items)

    def batch(self, idx, pad_id):
        seqs = [self.items[i] for i in idx]
        T = max(len(s) for s, _ in seqs)
        ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
        att = torch.zeros((len(seqs), T), dtype=torch.long)
        lens = torch.zeros(len(seqs), dtype=torch.long)
        plen = torch.zeros(len(seqs), dtype=torch.long)
        for i, (s, pl) in enumerate(seqs):
            ids[i, : len(s)] = torch.from_numpy(np.asarray(s, dtype=np.int64))
            att[i, : len(s)] = 1
            lens[i], plen[i] = len(s), pl
        return ids, att, lens, plen


def epoch_order(n, epoch, seed):
    return np.random.default_rng([seed, epoch]).permutation(n)


def batch_indices(step, n, bs, seed):
    """Indices of step `step` (epochs concatenated, each a fresh permutation)."""
    start = step * bs
    out = []
    while len(out) < bs:
        e, off = divmod(start + len(out), n)
        order = epoch_order(n, e, seed)
        take = min(bs - len(out), n - off)
        out.extend(order[off : off + take].tolist())
    return out


def sample_anchors(lens, plen, T, A, gen):
    """A anchors per row in [plen, len-2] (distinct); valid=False where a row has fewer."""
    b = lens.shape[0]
    pos = torch.arange(T)[None].expand(b, T)
    ok = (pos >= plen[:, None]) & (pos <= lens[:, None] - 2)
    scores = torch.rand(b, T, generator=gen)
    scores = torch.where(ok, scores, torch.full_like(scores, -1.0))
    k = min(A, T)
    top, anchors = scores.topk(k, dim=1)
    return anchors, top >= 0


def make_blocks(ids, lens, anchors, valid, B, mask_id):
    """Block inputs [b, A, B] and labels [b, A, B-1] (-100 past the end / invalid blocks)."""
    b, A = anchors.shape
    off = torch.arange(B)
    pos = anchors[:, :, None] + off  # [b, A, B]
    gathered = torch.gather(ids, 1, pos.clamp_max(ids.shape[1] - 1).reshape(b, -1)).view(b, A, B)
    inputs = torch.full_like(gathered, mask_id)
    inputs[:, :, 0] = gathered[:, :, 0]
    labels = gathered[:, :, 1:].clone()
    in_seq = pos[:, :, 1:] < lens[:, None, None]
    labels[~(in_seq & valid[:, :, None])] = -100
    return inputs, labels


# --------------------------------------------------------------------------------------------
# Target features


class Target:
    """The frozen SmolLM2 trunk up to the deepest tap, its embeddings and its LM head."""

    def __init__(self, gguf, taps, device, layers=None):
        n = max(taps) + 1 if layers is None else layers
        self.model, self.hp, self.gguf = gguf_llama.load_llama(gguf, num_layers=n, device=device)
        self.taps = taps
        self.embed = self.model.model.embed_tokens.weight  # [V, d], tied LM head
        self.head = self.model.lm_head.weight

    @torch.no_grad()
    def features(self, ids, att):
        with gguf_llama.LayerTaps(self.model, self.taps) as taps:
            self.model.model(input_ids=ids, attention_mask=att, use_cache=False)
        return taps.features()


class HFTarget(Target):
    """A frozen Hugging Face causal LM directory (e.g. models/yomi-code-hybrid, a Qwen3.5 hybrid
    with GDN layers), whole, in f32: its taps, tied or own LM head, and the sizes the drafter
    copies (`hp`, as gguf_llama gives them for SmolLM2)."""

    def __init__(self, path, taps, device):
        from types import SimpleNamespace

        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
        self.model.eval().requires_grad_(False)
        c = self.model.config
        rope = getattr(c, "rope_parameters", None) or {}
        self.hp = SimpleNamespace(
            hidden_size=c.hidden_size, vocab_size=c.vocab_size,
            num_attention_heads=c.num_attention_heads,
            num_key_value_heads=c.num_key_value_heads, rms_norm_eps=c.rms_norm_eps,
            rope_theta=rope.get("rope_theta", getattr(c, "rope_theta", 100000.0)),
            num_hidden_layers=c.num_hidden_layers, bos_token_id=c.bos_token_id,
            eos_token_id=c.eos_token_id,
            pad_token_id=c.pad_token_id if c.pad_token_id is not None else 0)
        self.taps = taps
        self.embed = self.model.get_input_embeddings().weight
        self.head = self.model.get_output_embeddings().weight


def hf_num_layers(path):
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)["num_hidden_layers"]


# --------------------------------------------------------------------------------------------
# Checkpoints (≤ 15 MiB per file)


def save_checkpoint(path, drafter, opt, state):
    from safetensors.torch import save_file

    tensors = {f"model.{k}": v.detach().float().cpu().contiguous()
               for k, v in drafter.state_dict().items()}
    names = {id(p): n for n, p in drafter.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p)
            if not st:
                continue
            n = names[id(p)]
            tensors[f"exp_avg.{n}"] = st["exp_avg"].detach().to("cpu", torch.bfloat16).contiguous()
            tensors[f"exp_avg_sq.{n}"] = st["exp_avg_sq"].detach().to(
                "cpu", torch.bfloat16).contiguous()
            state.setdefault("adam_step", {})[n] = float(st["step"])
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    files, cur, cur_bytes = [], {}, 0
    for k in sorted(tensors):
        nb = tensors[k].numel() * tensors[k].element_size()
        if cur and cur_bytes + nb > CKPT_FILE_BYTES:
            files.append(cur)
            cur, cur_bytes = {}, 0
        if nb > CKPT_FILE_BYTES:  # split one big tensor along dim 0
            t = tensors[k]
            rows = max(1, CKPT_FILE_BYTES // (nb // t.shape[0]))
            for j in range(0, t.shape[0], rows):
                files.append({f"{k}@{j}": t[j : j + rows].contiguous()})
            continue
        cur[k] = tensors[k]
        cur_bytes += nb
    if cur:
        files.append(cur)
    state["files"] = []
    for i, f in enumerate(files):
        name = f"part-{i:02d}.safetensors"
        save_file(f, os.path.join(tmp, name))
        state["files"].append(name)
    with open(os.path.join(tmp, "state.json"), "w") as f:
        json.dump(state, f, indent=1)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def load_checkpoint(path, drafter, opt, device):
    from safetensors.torch import load_file

    with open(os.path.join(path, "state.json")) as f:
        state = json.load(f)
    tensors, pieces = {}, {}
    for name in state["files"]:
        for k, v in load_file(os.path.join(path, name)).items():
            if "@" in k:
                base, j = k.rsplit("@", 1)
                pieces.setdefault(base, []).append((int(j), v))
            else:
                tensors[k] = v
    for base, ps in pieces.items():
        tensors[base] = torch.cat([v for _, v in sorted(ps)], 0)
    drafter.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    params = dict(drafter.named_parameters())
    for n, p in params.items():
        if f"exp_avg.{n}" in tensors:
            opt.state[p] = {
                "step": torch.tensor(state["adam_step"][n]),
                "exp_avg": tensors[f"exp_avg.{n}"].to(device, torch.float32),
                "exp_avg_sq": tensors[f"exp_avg_sq.{n}"].to(device, torch.float32),
            }
    return state


# --------------------------------------------------------------------------------------------


def lr_at(step, total, lr, warmup_frac, min_ratio=0.05):
    warm = max(1, int(total * warmup_frac))
    if step < warm:
        return lr * (step + 1) / warm
    t = min(1.0, (step - warm) / max(1, total - warm))
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def run_batch(drafter, target, ids, att, lens, plen, args, gen, device, autocast):
    ids, att = ids.to(device), att.to(device)
    anchors, valid = sample_anchors(lens, plen, ids.shape[1], args.anchors, gen)
    inputs, labels = make_blocks(ids.cpu(), lens, anchors, valid, args.block, args.mask_id)
    anchors, valid = anchors.to(device), valid.to(device)
    inputs, labels = inputs.to(device), labels.to(device)
    with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16,
                        enabled=autocast):
        feats = target.features(ids, att)
        emb = torch.nn.functional.embedding(inputs, target.embed)
        h = drafter.forward_train(feats, emb, anchors, valid)
        hb = h[:, :, 1:]
        # 2-D matmul: a 4-D one against the [V, d] head takes a slow batched path on the CPU.
        logits = torch.nn.functional.linear(hb.reshape(-1, hb.shape[-1]), target.head)
        logits = logits.view(*hb.shape[:-1], -1)
    loss, correct, mask = block_loss(logits, labels, args.gamma)
    acc = expected_accept(correct, mask)[valid]
    return loss, correct, mask, acc


@torch.no_grad()
def evaluate(drafter, target, data, args, device, autocast, max_seqs=256):
    drafter.eval()
    gen = torch.Generator().manual_seed(12345)
    tot, n, accs, pos_ok, pos_n = 0.0, 0, [], 0, 0
    for b in range(0, min(len(data), max_seqs), args.batch):
        idx = list(range(b, min(b + args.batch, len(data), max_seqs)))
        ids, att, lens, plen = data.batch(idx, target.hp.pad_token_id)
        loss, correct, mask, acc = run_batch(drafter, target, ids, att, lens, plen, args, gen,
                                             device, autocast)
        tot += loss.item() * len(idx)
        n += len(idx)
        accs.append(acc.cpu())
        pos_ok = pos_ok + (correct & mask).sum((0, 1)).cpu()
        pos_n = pos_n + mask.sum((0, 1)).cpu()
    drafter.train()
    acc = torch.cat(accs)
    return tot / max(1, n), acc.mean().item(), (pos_ok / pos_n.clamp_min(1)).tolist()


def main():
    ap = argparse.ArgumentParser()
    dev = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".device", "train")
    ap.add_argument("--answers", default=os.path.join(dev, "answers", "train-*.npz"),
                    help="glob of gen_answers.py shards")
    ap.add_argument("--eval-answers", default="", help="glob of held-out shards (tune split)")
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--target-hf", default="",
                    help="a Hugging Face model directory as the target instead of SmolLM2's "
                         "GGUF (e.g. models/yomi-code-hybrid)")
    ap.add_argument("--ckpt", default=os.path.join(dev, "ckpt"))
    ap.add_argument("--export", default=os.path.join(dev, "drafter"))
    ap.add_argument("--layers", type=int, default=2, help="draft layers")
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--taps", default="",
                    help="target layer ids (default: 5 spread over SmolLM2's 30; 3 for a "
                         "target of fewer than 16 layers)")
    ap.add_argument("--target-layers", type=int, default=None,
                    help="run only this many target layers (smoke tests)")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--mask-id", type=int, default=16, help="<empty_output>, never in a chat")
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--epochs", type=float, default=6.0)
    ap.add_argument("--steps", type=int, default=0, help="total steps (overrides --epochs)")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--warmup", type=float, default=0.04)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--gamma", type=float, default=7.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-budget", type=float, default=510.0)
    ap.add_argument("--stop-at", type=int, default=0, help="end this call after step N (tests)")
    ap.add_argument("--ckpt-every", type=float, default=180.0)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--export-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = ap.parse_args()
    t0 = time.time()
    device = args.device
    autocast = device.startswith("cuda")
    if autocast:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    resume = os.path.exists(os.path.join(args.ckpt, "state.json"))
    if resume:
        with open(os.path.join(args.ckpt, "state.json")) as f:
            saved = json.load(f)
        cfg = DFlashConfig(**saved["config"])
    else:
        n_target = hf_num_layers(args.target_hf) if args.target_hf else 30
        taps = [int(t) for t in args.taps.split(",")] if args.taps else \
            spread_layer_ids(n_target, 3 if n_target < 16 else 5)
        cfg = DFlashConfig(num_hidden_layers=args.layers, intermediate_size=args.intermediate,
                           block_size=args.block, mask_token_id=args.mask_id,
                           target_layer_ids=taps)
    args.block, args.mask_id = cfg.block_size, cfg.mask_token_id

    if args.target_hf:
        target = HFTarget(args.target_hf, cfg.target_layer_ids, device)
    else:
        target = Target(args.gguf, cfg.target_layer_ids, device, args.target_layers)
    hp = target.hp
    cfg.hidden_size, cfg.vocab_size = hp.hidden_size, hp.vocab_size
    cfg.num_attention_heads, cfg.num_key_value_heads = hp.num_attention_heads, hp.num_key_value_heads
    cfg.head_dim = hp.hidden_size // hp.num_attention_heads
    cfg.rms_norm_eps, cfg.rope_theta = hp.rms_norm_eps, hp.rope_theta
    cfg.num_target_layers = hp.num_hidden_layers
    cfg.bos_token_id, cfg.eos_token_id = hp.bos_token_id, hp.eos_token_id

    torch.manual_seed(args.seed)
    drafter = DFlashDrafter(cfg).to(device)
    decay = [p for n, p in drafter.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in drafter.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    data = Sequences(load_answers(sorted(glob.glob(args.answers))), args.max_len)
    eval_data = Sequences(load_answers(sorted(glob.glob(args.eval_answers))), args.max_len) \
        if args.eval_answers else None
    if len(data) == 0:
        sys.exit(f"no sequences in {args.answers}")
    if resume:
        state = load_checkpoint(args.ckpt, drafter, opt, device)
        step, total = state["step"], state["total_steps"]
        if state["n_sequences"] != len(data):
            print(f"warning: checkpoint saw {state['n_sequences']} sequences, now {len(data)}")
    else:
        step = 0
        total = args.steps or math.ceil(args.epochs * len(data) / args.batch)
        state = {"config": cfg.__dict__, "total_steps": total, "n_sequences": len(data),
                 "args": vars(args)}
    print(f"drafter {count_params(drafter) / 1e6:.2f} M params, taps {cfg.target_layer_ids}, "
          f"{len(data)} sequences, step {step}/{total}, {'resumed' if resume else 'new'}, "
          f"setup {time.time() - t0:.1f} s", flush=True)

    drafter.train()
    last_ckpt, t_steps, n_steps = time.time(), 0.0, 0
    run_loss, run_acc = 0.0, 0.0
    while step < total:
        ts = time.time()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, args.lr, args.warmup)
        idx = batch_indices(step, len(data), args.batch, args.seed)
        ids, att, lens, plen = data.batch(idx, hp.pad_token_id)
        gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        loss, correct, mask, acc = run_batch(drafter, target, ids, att, lens, plen, args, gen,
                                             device, autocast)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        run_loss += loss.item()
        run_acc += acc.mean().item()
        n_steps += 1
        t_steps += time.time() - ts
        if step % args.log_every == 0 or step == total:
            print(f"step {step}/{total} loss {run_loss / n_steps:.4f} accept/block "
                  f"{run_acc / n_steps:.2f} lr {opt.param_groups[0]['lr']:.2e} "
                  f"{t_steps / n_steps * 1000:.0f} ms/step", flush=True)
            run_loss, run_acc, n_steps, t_steps = 0.0, 0.0, 0, 0.0
        now = time.time()
        step_time = (now - t0) / max(1, step)  # pessimistic
        if now - last_ckpt > args.ckpt_every:
            state["step"] = step
            save_checkpoint(args.ckpt, drafter, opt, state)
            last_ckpt = time.time()
        if args.stop_at and step >= args.stop_at:
            break
        if args.time_budget and now - t0 + min(step_time, 30) + 20 > args.time_budget:
            print(f"time budget: stopping at step {step}/{total}", flush=True)
            break
    state["step"] = step
    save_checkpoint(args.ckpt, drafter, opt, state)
    drafter.export(args.export, dtype=getattr(torch, args.export_dtype))
    if eval_data is not None and len(eval_data):
        el, ea, pos = evaluate(drafter, target, eval_data, args, device, autocast)
        print(f"held-out: loss {el:.4f} accepted drafts/block {ea:.2f} (tokens/pass ≈ "
              f"{1 + ea:.2f}); top-1 by position " + " ".join(f"{p:.2f}" for p in pos))
    size = os.path.getsize(os.path.join(args.export, "model.safetensors"))
    print(f"exported {args.export} ({size / 2**20:.1f} MiB); checkpoint {args.ckpt} "
          f"(step {step}/{total}); wall {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
