"""yomi's small Qwen3.5-architecture hybrid model: transformers' `Qwen3_5ForCausalLM` trunk plus
an MTP block written here, its export as a Hugging Face directory, and its evaluation helpers.

The trunk is transformers' own class (so the export loads with `AutoModelForCausalLM`); the
MTP block is not trained by transformers (it drops `mtp.*` on load), so it is written here,
from ../shared/docs/qwen35.md §2.7 and §2.3 (the source followed for the layout and the order of
the concatenation; that document cites vLLM's `qwen3_5_mtp.py` — `torch.cat([inputs_embeds,
hidden_states])` — and llama.cpp's `qwen35.cpp` — `ggml_concat(e_norm, h_norm)`):

    h_t  = the trunk's hidden state after its final norm (what the LM head reads) at position t
    e    = RMSNorm_(1+w)(E[x_{t+1}];  mtp.pre_fc_norm_embedding)
    h'   = RMSNorm_(1+w)(h_t;         mtp.pre_fc_norm_hidden)
    u    = mtp.fc([e ; h'])                       (embedding first; fc is [H, 2H], no bias)
    u    = mtp.layers.0(u)                        (a full-attention Qwen3.5 decoder layer: gated
                                                   attention with q/k norms and partial RoPE at
                                                   position t, causal over the MTP rows; dense MLP)
    logits(x_{t+2}) = E · RMSNorm_(1+w)(u; mtp.norm)   (the shared, tied LM head)

Weight names are those of the published Qwen3.5 checkpoints (`mtp.fc.weight`,
`mtp.pre_fc_norm_embedding.weight`, `mtp.pre_fc_norm_hidden.weight`, `mtp.norm.weight`,
`mtp.layers.0.{input_layernorm,post_attention_layernorm}.weight`,
`mtp.layers.0.self_attn.{q,k,v,o}_proj.weight`, `mtp.layers.0.self_attn.{q,k}_norm.weight`,
`mtp.layers.0.mlp.{gate,up,down}_proj.weight`), and the config carries
`mtp_num_hidden_layers: 1` and `mtp_use_dedicated_embeddings: false` as theirs do.
tests/test_hybrid.py checks the MTP decoder layer against transformers' own full-attention
`Qwen3_5DecoderLayer` with the same weights.
"""

from __future__ import annotations

import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

TRANSPORT_FILE_BYTES = 15 << 20  # files that come back from the GPU machine: <= 16 MiB each
# Kept in float32 in the export, as in the published checkpoints (qwen35.md §4.1).
F32_SUFFIXES = ("linear_attn.A_log", "linear_attn.norm.weight")


# --------------------------------------------------------------------------------------------
# Configuration


def model_config(vocab_size=49152, hidden_size=320, intermediate_size=896, num_layers=8,
                 full_attention_interval=4, num_heads=4, num_kv_heads=2, head_dim=128,
                 linear_key_heads=2, linear_value_heads=4, linear_head_dim=128,
                 rope_theta=100000.0, partial_rotary_factor=0.5, max_position_embeddings=4096,
                 eos_token_id=0, mtp_layers=1):
    """The config as a plain dict (what config.json holds)."""
    layer_types = ["full_attention" if (i + 1) % full_attention_interval == 0
                   else "linear_attention" for i in range(num_layers)]
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "layer_types": layer_types,
        "full_attention_interval": full_attention_interval,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "linear_num_key_heads": linear_key_heads,
        "linear_num_value_heads": linear_value_heads,
        "linear_key_head_dim": linear_head_dim,
        "linear_value_head_dim": linear_head_dim,
        "linear_conv_kernel_dim": 4,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta,
                            "partial_rotary_factor": partial_rotary_factor,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        "partial_rotary_factor": partial_rotary_factor,
        "max_position_embeddings": max_position_embeddings,
        "initializer_range": 0.02,
        "bos_token_id": None,
        "eos_token_id": eos_token_id,
        "pad_token_id": eos_token_id,
        "use_cache": True,
        "mtp_num_hidden_layers": mtp_layers,
        "mtp_use_dedicated_embeddings": False,
        "dtype": "bfloat16",
    }


def hf_config(cfg: dict):
    from transformers import Qwen3_5TextConfig

    kw = {k: v for k, v in cfg.items()
          if k not in ("architectures", "model_type", "full_attention_interval", "dtype")}
    c = Qwen3_5TextConfig(**kw)
    c.architectures = ["Qwen3_5ForCausalLM"]
    return c


# --------------------------------------------------------------------------------------------
# The MTP block


class ZeroRMSNorm(nn.Module):
    """Qwen3.5's RMSNorm: x / sqrt(mean(x²) + eps) · (1 + w), in float32, w initialised to 0."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


def rope_tables(positions, rot_dim, theta, device, dtype=torch.float32):
    """cos, sin [T, rot_dim] for NeoX-style (rotate-half) RoPE on the first rot_dim dims."""
    inv = 1.0 / (theta ** (torch.arange(0, rot_dim, 2, device=device, dtype=torch.float32)
                           / rot_dim))
    ang = positions.to(device=device, dtype=torch.float32)[:, None] * inv[None]
    ang = torch.cat([ang, ang], -1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x, cos, sin):
    """x [B, heads, T, hd]; rotates dims [0, rot) as (a, b) -> (a cos - b sin, b cos + a sin)."""
    rot = cos.shape[-1]
    xr, xp = x[..., :rot], x[..., rot:]
    a, b = xr[..., : rot // 2], xr[..., rot // 2:]
    rotated = torch.cat([-b, a], -1)
    return torch.cat([xr * cos + rotated * sin, xp], -1)


class GatedAttention(nn.Module):
    """Qwen3.5 full attention (qwen35.md §2.3): q_proj rows are [query | gate] per head."""

    def __init__(self, cfg):
        super().__init__()
        H, self.nh, self.nkv = cfg["hidden_size"], cfg["num_attention_heads"], \
            cfg["num_key_value_heads"]
        self.hd = cfg["head_dim"]
        rp = cfg["rope_parameters"]
        self.rot = int(self.hd * rp.get("partial_rotary_factor", 0.25))
        self.theta = rp["rope_theta"]
        self.q_proj = nn.Linear(H, self.nh * self.hd * 2, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
        self.q_norm = ZeroRMSNorm(self.hd, cfg["rms_norm_eps"])
        self.k_norm = ZeroRMSNorm(self.hd, cfg["rms_norm_eps"])

    def forward(self, x, positions):
        B, T, _ = x.shape
        qg = self.q_proj(x).view(B, T, self.nh, 2 * self.hd)
        q, gate = qg[..., : self.hd], qg[..., self.hd:]
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        cos, sin = rope_tables(positions, self.rot, self.theta, x.device)
        q = apply_rope(q.float(), cos, sin).to(v.dtype)
        k = apply_rope(k.float(), cos, sin).to(v.dtype)
        if self.nkv != self.nh:  # query head h reads kv head h // (nh / nkv)
            rep = self.nh // self.nkv
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.hd ** -0.5)
        o = o.transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return self.o_proj(o * torch.sigmoid(gate.reshape(B, T, -1)))


class MLP(nn.Module):
    def __init__(self, H, inter):
        super().__init__()
        self.gate_proj = nn.Linear(H, inter, bias=False)
        self.up_proj = nn.Linear(H, inter, bias=False)
        self.down_proj = nn.Linear(inter, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class AttentionLayer(nn.Module):
    """A pre-norm Qwen3.5 full-attention decoder layer."""

    def __init__(self, cfg):
        super().__init__()
        H = cfg["hidden_size"]
        self.input_layernorm = ZeroRMSNorm(H, cfg["rms_norm_eps"])
        self.self_attn = GatedAttention(cfg)
        self.post_attention_layernorm = ZeroRMSNorm(H, cfg["rms_norm_eps"])
        self.mlp = MLP(H, cfg["intermediate_size"])

    def forward(self, x, positions):
        x = x + self.self_attn(self.input_layernorm(x), positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class MTPBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.pre_fc_norm_embedding = ZeroRMSNorm(H, eps)
        self.pre_fc_norm_hidden = ZeroRMSNorm(H, eps)
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.layers = nn.ModuleList([AttentionLayer(cfg)
                                     for _ in range(cfg.get("mtp_num_hidden_layers", 1))])
        self.norm = ZeroRMSNorm(H, eps)

    def forward(self, next_emb, hidden, positions):
        """next_emb = E[x_{t+1}], hidden = h_t (post final norm), both [B, T, H]; positions [T].
        Returns the normed MTP state [B, T, H] (logits of x_{t+2} = state · Eᵀ)."""
        u = self.fc(torch.cat([self.pre_fc_norm_embedding(next_emb),
                               self.pre_fc_norm_hidden(hidden)], -1))
        for layer in self.layers:
            u = layer(u, positions)
        return self.norm(u)


def init_mtp(mtp: MTPBlock, std=0.02):
    for p in mtp.parameters():
        if p.dim() == 1:  # the (1+w) norms
            nn.init.zeros_(p)
        else:
            nn.init.normal_(p, 0.0, std)


# --------------------------------------------------------------------------------------------
# Trunk + MTP


class HybridLM(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        from transformers import Qwen3_5ForCausalLM

        self.cfg = cfg
        self.lm = Qwen3_5ForCausalLM(hf_config(cfg))
        self.mtp = MTPBlock(cfg)
        init_mtp(self.mtp, cfg.get("initializer_range", 0.02))

    @property
    def embed(self):
        return self.lm.model.embed_tokens.weight

    def hidden(self, ids):
        """The trunk's final-normed hidden states [B, T, H]."""
        return self.lm.model(input_ids=ids, use_cache=False).last_hidden_state

    def mtp_state(self, ids, h):
        """MTP rows t = 0..T-2 (x_{t+1} = ids[:, t+1], h_t = h[:, t]) at positions t."""
        T = ids.shape[1]
        pos = torch.arange(T - 1, device=ids.device)
        return self.mtp(F.embedding(ids[:, 1:], self.embed), h[:, :-1], pos)

    def losses(self, window):
        """window [B, T+1]: main CE over T next tokens, MTP CE over T-1 tokens at t+2.
        Returns (main, mtp, main_correct, mtp_correct, n_main, n_mtp)."""
        ids, tgt = window[:, :-1], window[:, 1:]
        h = self.hidden(ids)
        logits = F.linear(h, self.embed)
        main = F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten())
        s = self.mtp_state(ids, h)  # rows 0..T-2 predict window[:, t+2]
        mlogits = F.linear(s, self.embed)
        mtgt = window[:, 2:]
        mtp = F.cross_entropy(mlogits.flatten(0, 1).float(), mtgt.flatten())
        with torch.no_grad():
            mc = (logits.argmax(-1) == tgt).sum()
            mmc = (mlogits.argmax(-1) == mtgt).sum()
        return main, mtp, mc, mmc, tgt.numel(), mtgt.numel()


@torch.no_grad()
def evaluate_windows(model: HybridLM, windows, batch=8, autocast=False, device="cpu"):
    """Over [N, W] windows, each one fresh forward of its first W-1 tokens (the convention of
    `yomi perplexity --score-all`: targets are tokens 1..W-1 of each window):
      main   NLL, perplexity and top-1 over all W-1 targets, and over the second half only
             (targets W/2..W-1, `yomi perplexity`'s default scoring);
      mtp    NLL and top-1 of x_{t+2} (rows t = 0..W-3, given the true x_{t+1}), and the MTP
             top-1's agreement with the trunk's own greedy token at t+2 — what one greedy
             `--draft mtp` step would have accepted there."""
    tot = {"nll": 0.0, "n": 0, "top1": 0, "nll2": 0.0, "n2": 0, "mtp_nll": 0.0, "mtp_n": 0,
           "mtp_top1": 0, "mtp_agree": 0}
    dev_type = device.split(":")[0]
    W = windows.shape[1]
    half = W // 2 - 1  # column of target W/2
    for i in range(0, len(windows), batch):
        w = torch.as_tensor(windows[i:i + batch], dtype=torch.long, device=device)
        with torch.autocast(device_type=dev_type, dtype=torch.bfloat16, enabled=autocast):
            ids, tgt = w[:, :-1], w[:, 1:]
            h = model.hidden(ids)
            logits = F.linear(h, model.embed).float()
            s = model.mtp_state(ids, h)
            mlogits = F.linear(s, model.embed).float()
        nll = F.cross_entropy(logits.transpose(1, 2), tgt, reduction="none")  # [B, W-1]
        tot["nll"] += nll.sum().item()
        tot["n"] += nll.numel()
        tot["nll2"] += nll[:, half:].sum().item()
        tot["n2"] += nll[:, half:].numel()
        tot["top1"] += (logits.argmax(-1) == tgt).sum().item()
        mtgt = w[:, 2:]  # row t predicts token t+2
        tot["mtp_nll"] += F.cross_entropy(mlogits.transpose(1, 2), mtgt, reduction="sum").item()
        tot["mtp_n"] += mtgt.numel()
        mp = mlogits.argmax(-1)
        tot["mtp_top1"] += (mp == mtgt).sum().item()
        # the trunk's greedy token at t+2 is the argmax of its logits at row t+1
        tot["mtp_agree"] += (mp == logits[:, 1:].argmax(-1)).sum().item()
    n, n2, m = max(1, tot["n"]), max(1, tot["n2"]), max(1, tot["mtp_n"])
    return {"windows": int(len(windows)), "window": int(W), "targets": tot["n"],
            "main_loss": tot["nll"] / n, "main_ppl": math.exp(tot["nll"] / n),
            "main_top1": tot["top1"] / n, "main_ppl_second_half": math.exp(tot["nll2"] / n2),
            "mtp_loss": tot["mtp_nll"] / m, "mtp_top1": tot["mtp_top1"] / m,
            "mtp_agree_greedy": tot["mtp_agree"] / m}


def eval_windows(stream, W, max_windows=None):
    """Non-overlapping [N, W] windows of a token stream (as `yomi perplexity` cuts them)."""
    import numpy as np

    n = len(stream) // W
    if max_windows:
        n = min(n, max_windows)
    return np.asarray(stream[: n * W]).astype(np.int64).reshape(n, W)


# --------------------------------------------------------------------------------------------
# Export


def export_tensors(model: HybridLM, dtype=torch.bfloat16):
    """Checkpoint names -> tensors (tied LM head left out; A_log and the GDN norm in f32)."""
    out = {}
    for k, v in model.lm.state_dict().items():
        if k == "lm_head.weight" and model.cfg["tie_word_embeddings"]:
            continue
        out[k] = v
    for k, v in model.mtp.state_dict().items():
        out["mtp." + k] = v
    return {k: v.detach().to("cpu", torch.float32 if k.endswith(F32_SUFFIXES) else dtype)
            .contiguous() for k, v in out.items()}


def save_transport(tensors, path, max_bytes=TRANSPORT_FILE_BYTES):
    """Tensors in safetensors files of <= max_bytes each; a tensor larger than that is cut
    along dim 0 into `name@row` pieces. Returns the file names."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    files, cur, cur_bytes = [], {}, 0
    for k in sorted(tensors):
        t = tensors[k]
        nb = t.numel() * t.element_size()
        if nb > max_bytes:
            rows = max(1, max_bytes // (nb // t.shape[0]))
            for j in range(0, t.shape[0], rows):
                files.append({f"{k}@{j}": t[j:j + rows].contiguous()})
            continue
        if cur and cur_bytes + nb > max_bytes:
            files.append(cur)
            cur, cur_bytes = {}, 0
        cur[k] = t
        cur_bytes += nb
    if cur:
        files.append(cur)
    names = []
    for i, f in enumerate(files):
        name = f"part-{i:02d}.safetensors"
        save_file(f, os.path.join(path, name))
        names.append(name)
    return names


def load_transport(path):
    from safetensors.torch import load_file

    tensors, pieces = {}, {}
    for name in sorted(os.listdir(path)):
        if not (name.startswith("part-") and name.endswith(".safetensors")):
            continue
        for k, v in load_file(os.path.join(path, name)).items():
            if "@" in k:
                base, j = k.rsplit("@", 1)
                pieces.setdefault(base, []).append((int(j), v))
            else:
                tensors[k] = v
    for base, ps in pieces.items():
        tensors[base] = torch.cat([v for _, v in sorted(ps, key=lambda p: p[0])], 0)
    return tensors


def write_hf_dir(tensors, cfg: dict, out, tokenizer_json=None, shard_bytes=15 << 20):
    """An HF model directory: config.json, generation_config.json, sharded safetensors
    (model-0000i-of-0000n.safetensors, greedy in name order, a new shard when the next tensor
    would pass shard_bytes; a bigger tensor gets a shard of its own) with
    model.safetensors.index.json, and the tokenizer files."""
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.startswith("model") and (f.endswith(".safetensors") or f.endswith(".json")):
            os.remove(os.path.join(out, f))
    shards, cur, cur_bytes = [], {}, 0
    for k in sorted(tensors):
        nb = tensors[k].numel() * tensors[k].element_size()
        if cur and cur_bytes + nb > shard_bytes:
            shards.append(cur)
            cur, cur_bytes = {}, 0
        cur[k] = tensors[k]
        cur_bytes += nb
    if cur:
        shards.append(cur)
    weight_map, total = {}, 0
    for i, sh in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sh, os.path.join(out, name), metadata={"format": "pt"})
        for k, t in sh.items():
            weight_map[k] = name
            total += t.numel() * t.element_size()
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total},
                   "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": None, "eos_token_id": cfg["eos_token_id"],
                   "pad_token_id": cfg["pad_token_id"], "do_sample": False}, f, indent=2)
        f.write("\n")
    if tokenizer_json:
        import shutil

        shutil.copyfile(tokenizer_json, os.path.join(out, "tokenizer.json"))
        # A base (completion) model: no chat template. <|endoftext|> separates documents.
        with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
                       "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                       "unk_token": "<|endoftext|>", "add_bos_token": False,
                       "model_max_length": cfg["max_position_embeddings"],
                       "clean_up_tokenization_spaces": False}, f, indent=2)
            f.write("\n")
    return [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]


def load_hf_dir(path, dtype=torch.float32):
    """(transformers model from AutoModelForCausalLM, MTPBlock with the mtp.* weights, cfg)."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    with open(os.path.join(path, "model.safetensors.index.json")) as f:
        wm = json.load(f)["weight_map"]
    sd = {}
    for k, fname in wm.items():
        if k.startswith("mtp."):
            with safe_open(os.path.join(path, fname), "pt") as f:
                sd[k[4:]] = f.get_tensor(k).to(dtype)
    mtp = MTPBlock(cfg)
    mtp.load_state_dict(sd)
    return lm, mtp.to(dtype).eval(), cfg


class LoadedHybrid(HybridLM):
    """A HybridLM around a loaded (transformers) trunk and MTP block, for evaluate_windows."""

    def __init__(self, lm, mtp, cfg):
        nn.Module.__init__(self)
        self.cfg, self.lm, self.mtp = cfg, lm, mtp


def count_params(model: HybridLM):
    main = sum(p.numel() for p in model.lm.parameters())  # tied head counted once
    mtp = sum(p.numel() for p in model.mtp.parameters())
    return main, mtp


def main(argv=None):
    """Assemble the HF directory from what train_hybrid.py wrote (--out): weights/part-*,
    config.json; the tokenizer from code_corpus.py's folder."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("trained", help="train_hybrid.py's --out folder (as returned)")
    ap.add_argument("out", help="the model directory to write")
    ap.add_argument("--tokenizer", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", ".device", "code",
        "tokenizer.json"))
    args = ap.parse_args(argv)
    with open(os.path.join(args.trained, "config.json")) as f:
        cfg = json.load(f)
    tensors = load_transport(os.path.join(args.trained, "weights"))
    shards = write_hf_dir(tensors, cfg, args.out, tokenizer_json=args.tokenizer)
    n = sum(t.numel() for t in tensors.values())
    print(f"{args.out}: {len(tensors)} tensors, {n:,} parameters, shards {shards}")


if __name__ == "__main__":
    main()
