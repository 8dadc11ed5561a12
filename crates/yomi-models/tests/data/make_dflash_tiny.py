#!/usr/bin/env python3
"""Write the dflash-tiny fixture: a tiny random DFlash drafter (z-lab's
block-diffusion speculative drafter) for the qwen35-tiny target, with reference
outputs computed by z-lab's own implementation (PyPI `dflash`).

Run by hand (not in CI), from anywhere:

    pip install --no-deps dflash==0.1.0   # needs torch + transformers 5.x
    python3 crates/yomi-models/tests/data/make_dflash_tiny.py [--target DIR] [--out DIR]
    python3 crates/yomi-models/tests/data/make_dflash_tiny.py --variant swa

`--variant swa` writes dflash-tiny-swa: the same drafter with its first layer a
sliding-window layer (window 12, causal inside the block, as z-lab's attention
makes a `sliding_attention` layer) and the second full.

The target defaults to ../shared/fixtures/qwen35-tiny next to the repository
root. Everything is float32 on CPU, single-threaded, seeded: two runs give
byte-identical files.
"""

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

import safetensors
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, Qwen3Config

import dflash
from dflash.model import (
    DFlashDraftModel,
    _crop_to,
    _make_cache,
    _output_head,
    _raw_input_embeddings,
    build_target_layer_ids,
    extract_context_feature,
)

SEED = 20261207
L = 40  # context rows before the first block
L2 = 6  # context rows appended before the second block
BLOCK = 8
MASK = 5
TARGET_LAYER_IDS = [0, 2]

CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "block_size": BLOCK,
    "dflash_config": {"mask_token_id": MASK, "target_layer_ids": TARGET_LAYER_IDS},
    "num_target_layers": 4,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "rope_scaling": None,
    "vocab_size": 512,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "layer_types": ["full_attention", "full_attention"],
    "max_position_embeddings": 4096,
    "use_sliding_window": False,
    "sliding_window": None,
    "dtype": "float32",
}

# The sliding-window variant: layer 0 slides (causal, window 12: a block row sees the last
# 11 - i context rows and block rows 0..i), layer 1 stays full and bidirectional.
SWA = {
    "layer_types": ["sliding_attention", "full_attention"],
    "use_sliding_window": True,
    "sliding_window": 12,
    "max_window_layers": 0,
}

NORM_STD = 0.1  # norm weights: 1 + NORM_STD * N(0, 1)
MAT_STD = 0.16  # matrices: N(0, MAT_STD^2); 0.05 left every block row with the same argmax


def stats(t):
    t = t.double()
    return {
        "mean": round(t.mean().item(), 6),
        "std": round(t.std().item(), 6),
        "min": round(t.min().item(), 6),
        "max": round(t.max().item(), 6),
    }


def max_abs(a, b):
    return (a.double() - b.double()).abs().max().item()


def main():
    here = Path(__file__).resolve().parent
    repo = here.parents[3] if len(here.parents) > 3 else here
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default=str(repo.parent / "shared" / "fixtures" / "qwen35-tiny"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--variant", choices=["full", "swa"], default="full")
    args = ap.parse_args()
    swa = args.variant == "swa"
    if swa:
        CONFIG.update(SWA)
    if args.out is None:
        args.out = str(here / ("dflash-tiny-swa" if swa else "dflash-tiny"))
    target_dir = Path(args.target)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # ---- target -----------------------------------------------------------
    target = AutoModelForCausalLM.from_pretrained(
        target_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tref = load_file(target_dir / "reference.safetensors")
    prompt = tref["prompt_ids"].to(torch.int64)
    assert prompt.numel() > L + L2, prompt.numel()
    n_tl = target.config.num_hidden_layers
    assert n_tl == CONFIG["num_target_layers"]

    # ---- drafter: config.json + random weights ----------------------------
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    cfg = Qwen3Config.from_pretrained(out)
    assert cfg.rope_parameters["rope_theta"] == CONFIG["rope_theta"], cfg.rope_parameters
    model = DFlashDraftModel(cfg).eval()
    gen = torch.Generator().manual_seed(SEED)
    weights = {}
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if p.dim() == 1:
                assert name.endswith("norm.weight"), name
                p.copy_(1.0 + NORM_STD * noise)
            else:
                p.copy_(MAT_STD * noise)
            weights[name] = p.detach().clone().contiguous()
    expected = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    for i in range(CONFIG["num_hidden_layers"]):
        pre = f"layers.{i}."
        expected |= {pre + "input_layernorm.weight", pre + "post_attention_layernorm.weight"}
        expected |= {f"{pre}self_attn.{x}_proj.weight" for x in "qkvo"}
        expected |= {f"{pre}self_attn.{x}_norm.weight" for x in "qk"}
        expected |= {f"{pre}mlp.{x}_proj.weight" for x in ("gate", "up", "down")}
    assert set(weights) == expected, sorted(set(weights) ^ expected)
    assert set(model.state_dict()) == expected  # no persistent buffers
    assert tuple(weights["fc.weight"].shape) == (128, 256)
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})

    # Reload from the written directory so the reference is computed from the files.
    model = DFlashDraftModel.from_pretrained(out, dtype=torch.float32).eval()
    for k, v in load_file(out / "model.safetensors").items():
        assert torch.equal(model.state_dict()[k], v), k
    assert model.target_layer_ids == TARGET_LAYER_IDS
    assert model.mask_token_id == MASK and model.block_size == BLOCK
    inv_freq = model.rotary_emb.inv_freq
    want_inv = 1.0 / (CONFIG["rope_theta"] ** (torch.arange(0, 32, 2, dtype=torch.float32) / 32))
    assert torch.allclose(inv_freq, want_inv), (inv_freq, want_inv)
    head = _output_head(target)
    emb_scale = 1.0  # _draft_value(config, "input_embedding_scale", 1.0); not in this config

    # ---- target features ---------------------------------------------------
    # The target against its own fixture: 0.0 with torch's CPU wheel, 3.1e-5 (layer 3) with
    # the CUDA wheel's CPU kernels (both 2.15.0).
    tol_hidden = 1e-4
    checks = {}

    def target_hidden(ids):
        with torch.inference_mode():
            o = target(ids[None], output_hidden_states=True, use_cache=False)
        return o.hidden_states

    hs_full = target_hidden(prompt)
    for j, hs in enumerate(hs_full):
        if f"hidden_states.{j}" in tref:
            d = max_abs(hs[0], tref[f"hidden_states.{j}"])
            checks[f"target_hidden_states.{j}_vs_qwen35_tiny_reference"] = d
            if j in (1, 3):
                assert d <= tol_hidden, (j, d)

    hs_ctx = target_hidden(prompt[:L])
    features = extract_context_feature(hs_ctx, TARGET_LAYER_IDS)[0].contiguous()  # [L, 256]
    assert torch.equal(
        features, torch.cat([hs_ctx[1][0], hs_ctx[3][0]], dim=-1)
    ), "target_layer_ids index hidden_states with +1"
    hs_ctx2 = target_hidden(prompt[: L + L2])
    features2 = extract_context_feature(hs_ctx2, TARGET_LAYER_IDS)[0, L:].contiguous()  # [6, 256]
    ref_feat = torch.cat([tref["hidden_states.1"], tref["hidden_states.3"]], dim=-1)
    checks["features_vs_qwen35_tiny_reference"] = max_abs(features, ref_feat[:L])
    checks["features2_vs_qwen35_tiny_reference"] = max_abs(features2, ref_feat[L : L + L2])
    assert checks["features_vs_qwen35_tiny_reference"] <= tol_hidden
    assert checks["features2_vs_qwen35_tiny_reference"] <= tol_hidden

    context_ids = prompt[:L].clone()
    anchor = prompt[L : L + 1].clone()
    anchor2 = prompt[L + L2 : L + L2 + 1].clone()

    # ---- the drafter, step by step as dflash_generate's loop does ----------
    total = L + L2 + BLOCK + 1
    position_ids = torch.arange(total)[None]
    cache = _make_cache(model.config)

    def draft_block(start, anchor_tok, ctx_hidden, cache):
        block_ids = torch.full((1, BLOCK), MASK, dtype=torch.long)
        block_ids[0, 0] = anchor_tok
        noise = _raw_input_embeddings(target, block_ids, emb_scale)
        with torch.inference_mode():
            h = model(
                target_hidden=ctx_hidden,
                noise_embedding=noise,
                position_ids=position_ids[:, start - ctx_hidden.shape[1] : start + BLOCK],
                past_key_values=cache,
                use_cache=cache is not None,
            )[:, 1 - BLOCK :, :]
            if cache is not None:
                _crop_to(cache, start)
            logits = model.compute_logits(h, head)
        return h[0].clone(), logits[0].clone(), noise[0].clone()

    # block 1: whole context at positions 0..L-1, block at L..L+7
    h1, logits1, noise1 = draft_block(L, anchor.item(), features[None], cache)
    assert cache.get_seq_length() == L
    # block 2: 6 new context rows at positions L..L+5 through the cache, block at L+6
    h2, logits2, noise2 = draft_block(L + L2, anchor2.item(), features2[None], cache)
    assert cache.get_seq_length() == L + L2

    if swa:
        layer0 = model.layers[0].self_attn
        assert layer0.is_causal and layer0.sliding_window == 12, vars(layer0)
        assert not model.layers[1].self_attn.is_causal
        assert model.layers[1].self_attn.sliding_window is None
    # No-cache recomputation of block 2 from the whole context (a full layer has no
    # mask, and a sliding layer's keys are contiguous up to the block: the cache is
    # plain K/V concatenation either way).
    full_ctx = torch.cat([features, features2], dim=0)[None]
    _, logits2_nocache, _ = draft_block(L + L2, anchor2.item(), full_ctx, None)
    checks["draft_logits2_cache_vs_nocache"] = max_abs(logits2, logits2_nocache)
    assert checks["draft_logits2_cache_vs_nocache"] <= 1e-4

    # Sensitivity: the context must matter (else the test checks little).
    _, logits1_zero_ctx, _ = draft_block(L, anchor.item(), torch.zeros_like(features[None]) + 1e-3, None)
    checks["draft_logits_sensitivity_to_context_max_abs"] = max_abs(logits1, logits1_zero_ctx)
    _, logits1_other_anchor, _ = draft_block(L, (anchor.item() + 1) % 512, features[None], None)
    checks["draft_logits_sensitivity_to_anchor_max_abs"] = max_abs(logits1, logits1_other_anchor)
    if swa:
        # The mask must matter: the same weights with every layer full draft otherwise.
        full_cfg = Qwen3Config.from_pretrained(out)
        full_cfg.layer_types = ["full_attention"] * CONFIG["num_hidden_layers"]
        full_cfg.sliding_window = None
        full = DFlashDraftModel(full_cfg).eval()
        full.load_state_dict(model.state_dict())
        with torch.inference_mode():
            noise = _raw_input_embeddings(
                target, torch.tensor([[anchor.item()] + [MASK] * (BLOCK - 1)]), emb_scale
            )
            hf = full(
                target_hidden=features[None],
                noise_embedding=noise,
                position_ids=torch.arange(L + BLOCK)[None],
                past_key_values=None,
                use_cache=False,
            )[:, 1 - BLOCK :, :]
            lf = full.compute_logits(hf, head)[0]
        checks["draft_logits_sensitivity_to_the_window_max_abs"] = max_abs(logits1, lf)
        assert checks["draft_logits_sensitivity_to_the_window_max_abs"] > 0.1

    # Target-head logits of block 1 also reproducible from the hidden output.
    assert torch.allclose(logits1, h1 @ head.weight.T, atol=1e-5)

    # Independent plain-torch forward written from the conventions in README.md
    # (what a port has to do), checked against the package's output.
    w = load_file(out / "model.safetensors")
    lm = head.weight.detach()
    emb = target.get_input_embeddings().weight.detach()
    for ctx, start, anc, want in (
        (features, L, anchor.item(), logits1),
        (full_ctx[0], L + L2, anchor2.item(), logits2),
    ):
        got = manual_draft(w, CONFIG, ctx, start, anc, emb, lm)
        d = max_abs(got, want)
        checks[f"manual_forward_vs_dflash_block_at_{start}"] = d
        assert d <= 1e-4, d

    tensors = {
        "context_ids": context_ids,
        "features": features,
        "anchor": anchor,
        "noise_embedding": noise1,
        "draft_hidden": h1,
        "draft_logits": logits1,
        "features2": features2,
        "anchor2": anchor2,
        "noise_embedding2": noise2,
        "draft_hidden2": h2,
        "draft_logits2": logits2,
    }
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    save_file(tensors, out / "reference.safetensors", metadata={"format": "pt"})

    argmax1 = logits1.argmax(-1).tolist()
    argmax2 = logits2.argmax(-1).tolist()

    def margin(lg):
        top = lg.topk(2, dim=-1).values
        return round((top[:, 0] - top[:, 1]).min().item(), 6)
    ref = {
        "about": "Tiny random DFlash drafter (z-lab block-diffusion speculative drafter, "
        "DFlashDraftModel) for the qwen35-tiny target, with reference outputs from "
        "z-lab's dflash package in float32 on CPU.",
        "made_by": "crates/yomi-models/tests/data/make_dflash_tiny.py"
        + (" --variant swa" if swa else ""),
        "seed": SEED,
        "weight_init": f"every parameter random: norm weights 1 + {NORM_STD}*N(0,1), "
        f"matrices {MAT_STD}*N(0,1), drawn in sorted parameter-name order from one torch.Generator",
        "target": "../shared/fixtures/qwen35-tiny (Qwen3_5ForCausalLM, float32, eager attention)",
        "prompt": "prompt_ids of the target fixture's reference.safetensors",
        **({"layers": "layer 0 sliding_attention (causal, window 12), layer 1 full_attention"} if swa else {}),
        "L": L,
        "block_size": BLOCK,
        "mask_token_id": MASK,
        "target_layer_ids": TARGET_LAYER_IDS,
        "build_target_layer_ids_default(4, 2)": build_target_layer_ids(4, 2),
        "tensors": {
            "context_ids": f"int64 [{L}]: prompt_ids[0:{L}]",
            "features": f"f32 [{L}, 256]: extract_context_feature(target(context_ids).hidden_states, [0, 2]) "
            "= cat(hidden_states[1], hidden_states[3]) = cat(qwen35-tiny hidden_states.1, hidden_states.3) rows 0..40",
            "anchor": f"int64 [1]: prompt_ids[{L}]",
            "noise_embedding": "f32 [8, 128]: target embed_tokens of [anchor, 5 x 7] (input_embedding_scale 1)",
            "draft_hidden": "f32 [7, 128]: model(target_hidden=features[None], noise_embedding, "
            f"position_ids=arange(0, {L + BLOCK}), fresh DynamicCache, use_cache=True)[0, -7:] "
            "(after the drafter's final norm)",
            "draft_logits": "f32 [7, 512]: model.compute_logits(draft_hidden, target.lm_head)",
            "features2": f"f32 [{L2}, 256]: same features for prompt rows {L}..{L + L2} "
            f"(target forward over prompt_ids[0:{L + L2}], no cache)",
            "anchor2": f"int64 [1]: prompt_ids[{L + L2}]",
            "noise_embedding2": "f32 [8, 128]: target embed_tokens of [anchor2, 5 x 7]",
            "draft_hidden2": f"f32 [7, 128]: after _crop_to(draft_cache, {L}): model(target_hidden=features2[None], "
            f"noise_embedding2, position_ids=arange({L}, {L + L2 + BLOCK}), same cache)[0, -7:]",
            "draft_logits2": "f32 [7, 512]: model.compute_logits(draft_hidden2, target.lm_head)",
        },
        "draft_argmax": argmax1,
        "draft_argmax2": argmax2,
        "logit_stats": {"draft_logits": stats(logits1), "draft_logits2": stats(logits2)},
        "min_top1_top2_margin": {"draft_logits": margin(logits1), "draft_logits2": margin(logits2)},
        "hidden_stats": {"draft_hidden": stats(h1), "features": stats(features)},
        "checks_max_abs": {k: float(f"{v:.3e}") for k, v in checks.items()},
        "versions": {
            "dflash": getattr(dflash, "__version__", None) or _dist_version("dflash"),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "safetensors": safetensors.__version__,
            "python": platform.python_version(),
        },
    }
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")

    print("draft_logits ", stats(logits1), "argmax", argmax1)
    print("draft_logits2", stats(logits2), "argmax", argmax2)
    print("min top1-top2 margin", margin(logits1), margin(logits2))
    for k, v in checks.items():
        print(f"{k}: {v:.3e}")
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {out} ({size} bytes)")
    assert size < 2 * 1024 * 1024


def manual_draft(w, c, ctx, start, anchor_tok, emb, lm):
    """DFlash drafter forward for one block, no cache, from the weight dict.

    ctx: [n, 256] target features of positions start-n .. start-1.
    Returns [block-1, vocab] logits of block positions start+1 .. start+block-1.
    """
    eps, hd = c["rms_norm_eps"], c["head_dim"]
    nh, nkv, bs = c["num_attention_heads"], c["num_key_value_heads"], c["block_size"]
    n = ctx.shape[0]

    def rms(x, wt):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * wt

    def rope(x, pos):  # x [T, heads, hd]; rotate-half (NeoX) layout, full head_dim
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        ang = pos.float()[:, None] * inv[None, :]
        cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
        sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    ids = torch.tensor([anchor_tok] + [c["dflash_config"]["mask_token_id"]] * (bs - 1))
    x = emb[ids]  # [bs, hidden]
    kctx = rms(ctx @ w["fc.weight"].T, w["hidden_norm.weight"])  # shared by every layer
    pos_ctx = torch.arange(start - n, start)
    pos_blk = torch.arange(start, start + bs)
    for i in range(c["num_hidden_layers"]):
        p = f"layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(bs, nh, hd)
        q = rope(rms(q, w[p + "self_attn.q_norm.weight"]), pos_blk)
        kv_in = torch.cat([kctx, h], 0)  # context rows first, no input_layernorm on them
        k = (kv_in @ w[p + "self_attn.k_proj.weight"].T).view(n + bs, nkv, hd)
        k = rope(rms(k, w[p + "self_attn.k_norm.weight"]), torch.cat([pos_ctx, pos_blk]))
        v = (kv_in @ w[p + "self_attn.v_proj.weight"].T).view(n + bs, nkv, hd)
        k = k.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) / hd**0.5  # full layers: no mask
        if c["layer_types"][i] == "sliding_attention":
            # Causal inside the block, keys less than the window back (by position).
            qp, kp = pos_blk[:, None], torch.cat([pos_ctx, pos_blk])[None, :]
            seen = (kp <= qp) & (qp - kp < c["sliding_window"])
            s = s.masked_fill(~seen[None], float("-inf"))
        a = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(bs, nh * hd)
        x = x + a @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T)
        x = x + (g * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["norm.weight"])[1:] @ lm.T


def _dist_version(name):
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    sys.exit(main())
