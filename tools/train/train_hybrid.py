"""Train yomi's small Qwen3.5 hybrid model (hybrid_model.py) with its MTP block, on code_corpus.py's
token streams, inside one wall-clock budget (the GPU machine's commands last at most 10 minutes).

Data: the train stream (files joined by <|endoftext|>) cut into windows of --seq-len + 1 tokens
at stride --seq-len, from an offset drawn per epoch, in a shuffled order per epoch (documents are
packed: a window crosses file boundaries; nothing is masked at the separators). The held-out
stream is only evaluated, never trained on.

Loss: main next-token cross-entropy over the window's --seq-len targets + --mtp-weight × the
MTP block's cross-entropy of token t+2 (rows t = 0..seq_len-2, fed the true x_{t+1} and the
trunk's final-normed h_t; gradients flow into the trunk and the shared embeddings, as in joint
MTP training).

Optimiser: AdamW (β 0.9/0.95, weight decay on matrices and the embedding, not on norms, conv
kernels, A_log or dt_bias), gradient clipping 1.0, linear warm-up then cosine decay to
--min-lr-ratio. The number of steps is set by the clock: after --calibrate steps the measured
step time fixes the total so that training ends --reserve seconds before --time-budget (which
counts from the start of the script); --steps fixes it instead (tests). bf16 autocast on CUDA.

At the end: every weight rounded to its export dtype (bf16; A_log and the GDN norm stay f32),
then the held-out evaluation in f32 with those weights (hybrid_model.evaluate_windows: all
non-overlapping windows of --seq-len tokens, `yomi perplexity --score-all`'s convention) — the
number the exported model reproduces; then the export:
  --out/weights/part-NN.safetensors   the export tensors, files <= 15 MiB (tensors cut by rows)
  --out/config.json, --out/train_log.json
and, with --hf-out, the Hugging Face directory itself (hybrid_model.write_hf_dir).

    python3 tools/train/train_hybrid.py --data .device/code --out .device/hybrid --time-budget 500
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hybrid_model as hm  # noqa: E402
from code_corpus import read_stream  # noqa: E402


def epoch_windows(n_tokens, T, epoch, seed):
    """Start offsets of the windows of one epoch, shuffled."""
    rng = np.random.default_rng([seed, epoch])
    off = int(rng.integers(T))
    n = (n_tokens - 1 - (T - 1)) // T  # the same count for every offset < T
    return off + T * rng.permutation(n)


class Batches:
    def __init__(self, stream, T, B, seed):
        self.stream, self.T, self.B, self.seed = stream, T, B, seed
        self.per_epoch = (len(stream) - 1 - (T - 1)) // T
        if self.per_epoch < B:
            raise SystemExit(f"stream of {len(stream)} tokens has fewer than {B} windows of {T}")
        self._epoch, self._starts = None, None

    def starts(self, step):
        out = []
        pos = step * self.B
        while len(out) < self.B:
            e, i = divmod(pos + len(out), self.per_epoch)
            if e != self._epoch:
                self._epoch, self._starts = e, epoch_windows(len(self.stream), self.T, e,
                                                             self.seed)
            take = min(self.B - len(out), self.per_epoch - i)
            out.extend(self._starts[i:i + take].tolist())
        return out

    def batch(self, step):
        idx = np.asarray(self.starts(step))[:, None] + np.arange(self.T + 1)[None]
        return torch.from_numpy(self.stream[idx].astype(np.int64))


def lr_at(step, total, warmup, lr, min_ratio):
    if step < warmup:
        return lr * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def param_groups(model, wd):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if p.dim() >= 2 and "conv1d" not in n:
            decay.append(p)
        else:
            no_decay.append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def main(argv=None):
    t0 = time.time()
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="code_corpus.py output folder")
    ap.add_argument("--out", required=True)
    ap.add_argument("--hf-out", default="", help="also write the HF model directory here")
    # shape (defaults: the shipped model)
    ap.add_argument("--hidden", type=int, default=320)
    ap.add_argument("--intermediate", type=int, default=896)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--linear-key-heads", type=int, default=2)
    ap.add_argument("--linear-value-heads", type=int, default=4)
    ap.add_argument("--linear-head-dim", type=int, default=128)
    ap.add_argument("--rope-theta", type=float, default=100000.0)
    # training
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32, help="windows per micro-batch")
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0, help="fixed number of steps (else by clock)")
    ap.add_argument("--time-budget", type=float, default=500.0)
    ap.add_argument("--reserve", type=float, default=45.0,
                    help="seconds kept for the final evaluation and export")
    ap.add_argument("--calibrate", type=int, default=30)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--eval-every", type=float, default=120.0, help="seconds between quick evals")
    ap.add_argument("--eval-windows", type=int, default=0, help="cap (0: all held-out windows)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--export-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = ap.parse_args(argv)

    device = args.device
    cuda = device.startswith("cuda")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(args.seed)

    train = read_stream(os.path.join(args.data, "train.u16.xz"))
    held = read_stream(os.path.join(args.data, "heldout.u16.xz"))
    with open(os.path.join(args.data, "manifest.json")) as f:
        man = json.load(f)
    for split, arr in (("train", train), ("heldout", held)):
        assert len(arr) == man["splits"][split]["tokens"], split
    cfg = hm.model_config(hidden_size=args.hidden, intermediate_size=args.intermediate,
                          num_layers=args.layers, num_heads=args.heads,
                          num_kv_heads=args.kv_heads, head_dim=args.head_dim,
                          linear_key_heads=args.linear_key_heads,
                          linear_value_heads=args.linear_value_heads,
                          linear_head_dim=args.linear_head_dim, rope_theta=args.rope_theta,
                          eos_token_id=man["eos_id"])
    if args.export_dtype == "float32":
        cfg["dtype"] = "float32"
    model = hm.HybridLM(cfg).to(device)
    model.train()
    n_main, n_mtp = hm.count_params(model)
    opt_kw = {"fused": True} if cuda else {}
    opt = torch.optim.AdamW(param_groups(model, args.weight_decay), lr=args.lr,
                            betas=(0.9, 0.95), eps=1e-8, **opt_kw)
    data = Batches(train, args.seq_len, args.batch * args.accum, args.seed)
    held_w = hm.eval_windows(held, args.seq_len, args.eval_windows or None)
    gpu = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"{gpu}; torch {torch.__version__}; params main {n_main / 1e6:.2f} M (tied head), "
          f"mtp {n_mtp / 1e6:.2f} M; train {len(train):,} tokens ({data.per_epoch} windows of "
          f"{args.seq_len}), held-out {len(held):,} tokens ({len(held_w)} windows); "
          f"setup {time.time() - t0:.1f} s", flush=True)

    log = {"args": vars(args), "config": cfg, "device": gpu, "torch": torch.__version__,
           "params_main": n_main, "params_mtp": n_mtp, "train_tokens_in_corpus": len(train),
           "corpus": {k: man["splits"][k] for k in ("train", "heldout")},
           "steps": [], "evals": []}
    try:
        import transformers

        log["transformers"] = transformers.__version__
    except ImportError:
        pass
    total = args.steps or 0
    train_end = t0 + args.time_budget - args.reserve
    step, t_cal, last_eval = 0, None, time.time()
    acc = {"main": 0.0, "mtp": 0.0, "mc": 0, "mmc": 0, "n": 0, "mn": 0, "k": 0}
    t_log = time.time()
    while True:
        if total and step >= total:
            break
        if not args.steps and time.time() > train_end:
            print(f"clock: stopping at step {step}", flush=True)
            break
        if not args.steps and step == args.calibrate:
            t_cal = time.time()
        if not args.steps and step == 2 * args.calibrate:
            per = (time.time() - t_cal) / args.calibrate
            total = step + int((train_end - time.time()) / per)
            print(f"{per * 1000:.0f} ms/step -> {total} steps in all", flush=True)
        lr = lr_at(step, total or 10**9, args.warmup, args.lr, args.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        wb = data.batch(step).to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        for w in wb.chunk(args.accum):
            with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16,
                                enabled=cuda):
                main, mtp, mc, mmc, n, mn = model.losses(w)
                loss = (main + args.mtp_weight * mtp) / args.accum
            loss.backward()
            acc["main"] += main.detach() / args.accum  # tensors: no GPU sync per step
            acc["mtp"] += mtp.detach() / args.accum
            acc["mc"] += mc
            acc["mmc"] += mmc
            acc["n"] += n
            acc["mn"] += mn
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        acc["k"] += 1
        if step % args.log_every == 0 or step == total:
            k = acc["k"]
            dt = time.time() - t_log
            rec = {"step": step, "main_loss": float(acc["main"]) / k,
                   "mtp_loss": float(acc["mtp"]) / k, "main_top1": float(acc["mc"]) / acc["n"],
                   "mtp_top1": float(acc["mmc"]) / acc["mn"],
                   "lr": lr, "grad_norm": float(gnorm), "tok_per_s": acc["n"] / dt,
                   "tokens_seen": step * args.batch * args.accum * args.seq_len,
                   "elapsed_s": time.time() - t0}
            log["steps"].append(rec)
            print(f"step {step}/{total} loss {rec['main_loss']:.4f} mtp {rec['mtp_loss']:.4f} "
                  f"top1 {rec['main_top1']:.3f}/{rec['mtp_top1']:.3f} lr {lr:.2e} "
                  f"|g| {rec['grad_norm']:.2f} {rec['tok_per_s'] / 1e3:.0f}k tok/s "
                  f"t {rec['elapsed_s']:.0f}s", flush=True)
            acc = {k2: 0 for k2 in acc}
            t_log = time.time()
        if time.time() - last_eval > args.eval_every and (not total or step < total - 20):
            te = time.time()
            model.eval()
            ev = hm.evaluate_windows(model, held_w[:64], batch=16, autocast=cuda,
                                     device=device)
            model.train()
            ev["step"] = step
            log["evals"].append(ev)
            print(f"  held-out (64 windows, bf16): ppl {ev['main_ppl']:.3f} mtp top1 "
                  f"{ev['mtp_top1']:.3f} agree {ev['mtp_agree_greedy']:.3f}", flush=True)
            last_eval = time.time()
            t_log += last_eval - te  # keep the eval out of the training throughput

    log["steps_done"] = step
    log["tokens_seen"] = step * args.batch * args.accum * args.seq_len
    log["train_seconds"] = time.time() - t0
    # Round to the export dtype, then evaluate in f32: what the exported files compute.
    tensors = hm.export_tensors(model, getattr(torch, args.export_dtype))
    with torch.no_grad():
        for k, v in model.lm.state_dict().items():
            src = tensors.get(k, tensors.get("model.embed_tokens.weight")
                              if k == "lm_head.weight" else None)
            v.copy_(src.to(v.dtype))
        for k, v in model.mtp.state_dict().items():
            v.copy_(tensors["mtp." + k].to(v.dtype))
    model.eval()
    te = time.time()
    final = hm.evaluate_windows(model, held_w, batch=16, autocast=False, device=device)
    final_first64 = hm.evaluate_windows(model, held_w[:64], batch=16, autocast=False,
                                        device=device)
    final["eval_seconds"] = time.time() - te
    log["final_heldout"] = final
    log["final_heldout_first64"] = final_first64
    print(f"held-out, {final['windows']} windows of {final['window']} ({final['targets']:,} "
          f"targets), f32 on the {args.export_dtype} weights: ppl {final['main_ppl']:.3f} "
          f"(second half {final['main_ppl_second_half']:.3f}) top1 {final['main_top1']:.3f}; "
          f"mtp loss {final['mtp_loss']:.3f} top1 {final['mtp_top1']:.3f} agree-with-greedy "
          f"{final['mtp_agree_greedy']:.3f}; first 64 windows ppl "
          f"{final_first64['main_ppl']:.4f}", flush=True)

    os.makedirs(args.out, exist_ok=True)
    files = hm.save_transport(tensors, os.path.join(args.out, "weights"))
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    log["transport_files"] = files
    log["wall_seconds"] = time.time() - t0
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump(log, f, indent=1)
    if args.hf_out:
        hm.write_hf_dir(tensors, cfg, args.hf_out,
                        tokenizer_json=os.path.join(args.data, "tokenizer.json"))
    print(f"wrote {args.out} ({len(files)} weight files); steps {step}, tokens seen "
          f"{log['tokens_seen']:,}; wall {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
