"""A DFlash drafter (block-diffusion drafter conditioned on the target's hidden states).

Written from the math in ../shared/docs/speculative.md §1. Notation: d = hidden size, the
target's residual stream after layers `target_layer_ids` (HF hidden_states[i + 1]) is
concatenated per token into C (n × L_t·d).

    ctx      = hidden_norm(fc(C))                         one row per committed token
    h        = embed([anchor, MASK, ..., MASK])           the block, B rows, positions a..a+B-1
    per layer (pre-norm, residual):
      x      = input_layernorm(h)
      q      = rope(q_norm(q_proj(x)))                    queries: block rows only
      k      = rope(k_norm(k_proj([ctx ; x])))            keys/values: context rows then block
      v      = v_proj([ctx ; x])                          rows, each at its absolute position
      h      = h + o_proj(attention(q, k, v))             no causal mask: the block sees itself
      h      = h + down(silu(gate(y)) * up(y)),  y = post_attention_layernorm(h)
    out      = norm(h);  logits = target_lm_head(out[1:])

RMSNorm as Qwen3 (weight * x / rms(x), computed in f32), per-head q/k norms, rotate-half RoPE,
grouped-query attention. The same k_proj/v_proj serve context and block rows; the context is
*not* passed through input_layernorm (hidden_norm already normalised it).

Training runs many blocks of one sequence at once (`forward_train`): the context K/V of the
whole sequence is computed once per layer and each block's queries are masked to the context
rows before its anchor plus its own B rows — the same function as one `forward` per block.

Checkpoint format (z-lab's): config.json (a Qwen3 config + architectures ["DFlashDraftModel"],
block_size, num_target_layers, dflash_config {mask_token_id, target_layer_ids}) and
model.safetensors with fc.weight, hidden_norm.weight, norm.weight, layers.{i}.* — no embedding,
no LM head (the target's are used).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


def spread_layer_ids(num_target_layers: int, k: int) -> list:
    """k tap layers spread evenly over [1, N-3] (the rule z-lab's released drafters follow)."""
    if k == 1:
        return [num_target_layers // 2]
    lo, hi = 1, num_target_layers - 3
    return [round(lo + i * (hi - lo) / (k - 1)) for i in range(k)]


@dataclass
class DFlashConfig:
    hidden_size: int = 576
    intermediate_size: int = 1024
    num_hidden_layers: int = 2
    num_attention_heads: int = 9
    num_key_value_heads: int = 3
    head_dim: int = 64
    rms_norm_eps: float = 1e-5
    rope_theta: float = 100000.0
    max_position_embeddings: int = 8192
    vocab_size: int = 49152
    num_target_layers: int = 30
    block_size: int = 16
    mask_token_id: int = 16
    target_layer_ids: list = field(default_factory=lambda: [1, 8, 14, 20, 27])
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2

    def to_hf_json(self, dtype: str = "bfloat16") -> dict:
        """config.json in z-lab's schema (a Qwen3 config plus the DFlash fields)."""
        n = self.num_hidden_layers
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": n,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "rope_scaling": None,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "tie_word_embeddings": True,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": n,
            "layer_types": ["full_attention"] * n,
            "num_target_layers": self.num_target_layers,
            "block_size": self.block_size,
            "dflash_config": {"mask_token_id": self.mask_token_id,
                              "target_layer_ids": list(self.target_layer_ids)},
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "torch_dtype": dtype,
            "dtype": dtype,
            "initializer_range": 0.02,
            "use_cache": True,
        }

    @classmethod
    def from_hf_json(cls, d: dict) -> "DFlashConfig":
        dc = d.get("dflash_config", {})
        theta = d.get("rope_theta") or (d.get("rope_parameters") or {}).get("rope_theta", 1e6)
        return cls(
            hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=d["num_attention_heads"],
            num_key_value_heads=d["num_key_value_heads"],
            head_dim=d.get("head_dim", d["hidden_size"] // d["num_attention_heads"]),
            rms_norm_eps=d["rms_norm_eps"], rope_theta=float(theta),
            max_position_embeddings=d.get("max_position_embeddings", 8192),
            vocab_size=d["vocab_size"], num_target_layers=d["num_target_layers"],
            block_size=d.get("block_size", dc.get("block_size", 16)),
            mask_token_id=dc.get("mask_token_id", d.get("mask_token_id")),
            target_layer_ids=dc.get("target_layer_ids", d.get("target_layer_ids")),
            bos_token_id=d.get("bos_token_id"), eos_token_id=d.get("eos_token_id"),
        )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dt)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float):
    """cos, sin of shape positions.shape + (head_dim,) in f32 (rotate-half layout)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                        dtype=torch.float32) / head_dim))
    ang = positions.float()[..., None] * inv
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def apply_rope(x, cos, sin):
    """x: [b, heads, n, hd]; cos/sin: [b, n, hd] (or [n, hd])."""
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos + rot * sin


class Attention(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.nh, self.nkv, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        d = c.hidden_size
        self.q_proj = nn.Linear(d, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(d, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, d, bias=False)
        self.q_norm = RMSNorm(self.hd, c.rms_norm_eps)
        self.k_norm = RMSNorm(self.hd, c.rms_norm_eps)

    def forward(self, x, ctx, cos_sin_q, cos_sin_k, mask=None):
        """x [b, q, d] block rows (normed); ctx [b, c, d]; mask [b or 1, 1, q, c+q] bool."""
        b, q, _ = x.shape
        c = ctx.shape[1]
        qh = self.q_norm(self.q_proj(x).view(b, q, self.nh, self.hd)).transpose(1, 2)
        kv_in = torch.cat([ctx, x], dim=1)
        kh = self.k_norm(self.k_proj(kv_in).view(b, c + q, self.nkv, self.hd)).transpose(1, 2)
        vh = self.v_proj(kv_in).view(b, c + q, self.nkv, self.hd).transpose(1, 2)
        qh = apply_rope(qh, *cos_sin_q)
        kh = apply_rope(kh, *cos_sin_k)
        rep = self.nh // self.nkv
        kh = kh.repeat_interleave(rep, dim=1)
        vh = vh.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=False,
                                           scale=self.hd ** -0.5)
        return self.o_proj(o.transpose(1, 2).reshape(b, q, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)

    def forward(self, h, ctx, cs_q, cs_k, mask=None):
        h = h + self.self_attn(self.input_layernorm(h), ctx, cs_q, cs_k, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDrafter(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.config = c
        d = c.hidden_size
        self.fc = nn.Linear(len(c.target_layer_ids) * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, c.rms_norm_eps)
        self.layers = nn.ModuleList([Layer(c) for _ in range(c.num_hidden_layers)])
        self.norm = RMSNorm(d, c.rms_norm_eps)
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02):
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=std)
            elif isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)

    def fuse(self, feats):
        """feats [b, n, L_t·d] (tapped target states, concatenated) -> ctx rows [b, n, d]."""
        return self.hidden_norm(self.fc(feats))

    def forward(self, noise_embedding, target_hidden, position_ids):
        """One block per batch row, as z-lab's forward: noise_embedding [b, q, d] (embedded
        [anchor, MASK...]), target_hidden [b, c, L_t·d], position_ids [b, c+q] (context rows
        then block rows). Returns norm(h) [b, q, d]."""
        c = self.config
        ctx = self.fuse(target_hidden)
        q = noise_embedding.shape[1]
        cos, sin = rope_cos_sin(position_ids, c.head_dim, c.rope_theta)
        cs_k = (cos, sin)
        cs_q = (cos[:, -q:], sin[:, -q:])
        h = noise_embedding
        for layer in self.layers:
            h = layer(h, ctx, cs_q, cs_k)
        return self.norm(h)

    def forward_train(self, feats, block_emb, anchors, valid):
        """Many blocks per sequence in one pass.

        feats [b, T, L_t·d]: tapped target states of whole sequences (positions 0..T-1);
        block_emb [b, A, B, d]: embedded blocks ([token@anchor, MASK×(B-1)]);
        anchors [b, A] (long): anchor position of each block; valid [b, A] bool.
        Block (i, j) sees context rows t < anchors[i, j] and its own B rows.
        Returns norm(h) [b, A, B, d].
        """
        c = self.config
        b, T, _ = feats.shape
        _, A, B, d = block_emb.shape
        dev = feats.device
        ctx = self.fuse(feats)
        pos_k_ctx = torch.arange(T, device=dev).expand(b, T)
        pos_blk = (anchors[:, :, None] + torch.arange(B, device=dev)).reshape(b, A * B)
        cos_c, sin_c = rope_cos_sin(pos_k_ctx, c.head_dim, c.rope_theta)
        cos_b, sin_b = rope_cos_sin(pos_blk, c.head_dim, c.rope_theta)
        cs_q = (cos_b, sin_b)
        cs_k = (torch.cat([cos_c, cos_b], 1), torch.cat([sin_c, sin_b], 1))
        # mask [b, 1, A*B, T + A*B]
        see_ctx = torch.arange(T, device=dev)[None, None, :] < anchors[:, :, None]  # [b, A, T]
        see_ctx = see_ctx & valid[:, :, None]
        see_ctx = see_ctx[:, :, None, :].expand(b, A, B, T).reshape(b, A * B, T)
        blk_id = torch.arange(A, device=dev).repeat_interleave(B)
        see_blk = (blk_id[:, None] == blk_id[None, :]).expand(b, A * B, A * B)
        mask = torch.cat([see_ctx, see_blk], dim=-1)[:, None]
        h = block_emb.reshape(b, A * B, d)
        for layer in self.layers:
            h = layer(h, ctx, cs_q, cs_k, mask)
        return self.norm(h).view(b, A, B, d)

    # ---- z-lab format I/O

    def export(self, out_dir: str, dtype=torch.bfloat16):
        from safetensors.torch import save_file

        os.makedirs(out_dir, exist_ok=True)
        name = {torch.bfloat16: "bfloat16", torch.float32: "float32",
                torch.float16: "float16"}[dtype]
        sd = {k: v.detach().to("cpu", dtype).contiguous() for k, v in self.state_dict().items()}
        save_file(sd, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(self.config.to_hf_json(name), f, indent=2)
            f.write("\n")

    @classmethod
    def load(cls, path: str, device="cpu") -> "DFlashDrafter":
        from safetensors.torch import load_file

        with open(os.path.join(path, "config.json")) as f:
            cfg = DFlashConfig.from_hf_json(json.load(f))
        m = cls(cfg)
        sd = load_file(os.path.join(path, "model.safetensors"))
        m.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
        return m.to(device)


def block_loss(logits, labels, gamma: float):
    """Decayed cross-entropy over block positions 1..B-1.

    logits [..., B-1, V], labels [..., B-1] (-100 = ignore). Position k (1-based) weighs
    exp(-(k-1)/gamma). Returns (loss, per-position top-1 correct [..., B-1] bool, mask)."""
    Bm1 = labels.shape[-1]
    w = torch.exp(-torch.arange(Bm1, device=labels.device, dtype=torch.float32) / gamma)
    mask = labels >= 0
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                         labels.clamp_min(0).reshape(-1), reduction="none").view(labels.shape)
    wm = w * mask
    loss = (ce * wm).sum() / wm.sum().clamp_min(1e-6)
    correct = (logits.argmax(-1) == labels) & mask
    return loss, correct, mask


def expected_accept(correct, mask):
    """Greedy acceptance length per block: drafts accepted before the first miss (a miss or
    the end of the sequence stops it). Mean over blocks; tokens per pass = 1 + this."""
    ok = (correct & mask).int()
    return ok.cumprod(-1).sum(-1).float()


def count_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


__all__ = ["DFlashConfig", "DFlashDrafter", "block_loss", "expected_accept", "spread_layer_ids",
           "rope_cos_sin", "count_params"]
