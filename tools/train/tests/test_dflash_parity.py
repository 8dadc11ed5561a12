"""Our DFlash drafter against z-lab's reference (`pip install --no-deps dflash`), random weights.

1. Export ours in z-lab's format, load it with `dflash.model.DFlashDraftModel.from_pretrained`,
   run both on the same random block embeddings / target features / positions: f32 tolerance.
2. forward_train (many anchors at once, masked) equals one reference forward per anchor.
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dflash_model import DFlashConfig, DFlashDrafter  # noqa: E402

dflash_model = pytest.importorskip("dflash.model")

TOL = 2e-5  # f32: both sides compute the same ops in a slightly different order


def small_config(**kw):
    # SmolLM2's attention shape (9 heads / 3 KV heads, head_dim 64), smaller elsewhere.
    base = dict(hidden_size=576, intermediate_size=256, num_hidden_layers=2,
                num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=64,
                num_target_layers=8, target_layer_ids=[1, 3, 5], block_size=16,
                mask_token_id=5, rope_theta=100000.0)
    base.update(kw)
    return DFlashConfig(**base)


def random_drafter(cfg, seed=0):
    torch.manual_seed(seed)
    m = DFlashDrafter(cfg)
    with torch.no_grad():  # non-trivial norms too
        for n, p in m.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0, 0.05)
    return m.eval()


def load_reference(tmp_path, ours):
    ours.export(str(tmp_path), dtype=torch.float32)
    ref = dflash_model.DFlashDraftModel.from_pretrained(str(tmp_path), torch_dtype=torch.float32)
    return ref.float().eval()


@pytest.mark.parametrize("ctx_len,q_len,start", [(7, 16, 0), (40, 16, 100), (1, 4, 3000)])
def test_forward_matches_reference(tmp_path, ctx_len, q_len, start):
    cfg = small_config()
    ours = random_drafter(cfg)
    ref = load_reference(tmp_path, ours)
    assert ref.block_size == 16 and ref.mask_token_id == 5 and ref.target_layer_ids == [1, 3, 5]
    torch.manual_seed(1)
    b, d = 2, cfg.hidden_size
    noise = torch.randn(b, q_len, d)
    feats = torch.randn(b, ctx_len, 3 * d)
    pos = torch.arange(start, start + ctx_len + q_len)[None].expand(b, -1)
    with torch.no_grad():
        a = ours(noise, feats, pos)
        r = ref(position_ids=pos, noise_embedding=noise, target_hidden=feats)
    diff = (a - r).abs().max().item()
    print(f"max |ours - dflash| = {diff:.3g}")
    assert diff < TOL


def test_forward_train_matches_per_block_reference(tmp_path):
    cfg = small_config(block_size=8)
    ours = random_drafter(cfg, seed=3)
    ref = load_reference(tmp_path, ours)
    torch.manual_seed(2)
    b, T, A, B, d = 2, 30, 4, 8, cfg.hidden_size
    feats = torch.randn(b, T, 3 * d)
    emb = torch.randn(b, A, B, d)
    anchors = torch.tensor([[3, 10, 11, 25], [1, 7, 20, 29]])
    valid = torch.tensor([[True, True, True, True], [True, True, False, True]])
    with torch.no_grad():
        out = ours.forward_train(feats, emb, anchors, valid)
    worst = 0.0
    for i in range(b):
        for j in range(A):
            if not valid[i, j]:
                continue
            a = int(anchors[i, j])
            pos = torch.arange(0, a + B)[None]
            with torch.no_grad():
                r = ref(position_ids=pos, noise_embedding=emb[i:i + 1, j],
                        target_hidden=feats[i:i + 1, :a])
            worst = max(worst, (out[i, j] - r[0]).abs().max().item())
    print(f"max |forward_train - per-block dflash| = {worst:.3g}")
    assert worst < TOL


def test_config_roundtrip(tmp_path):
    cfg = small_config()
    m = random_drafter(cfg)
    m.export(str(tmp_path), dtype=torch.bfloat16)
    m2 = DFlashDrafter.load(str(tmp_path))
    assert m2.config == cfg
    import json

    j = json.load(open(tmp_path / "config.json"))
    assert j["architectures"] == ["DFlashDraftModel"]
    assert j["dflash_config"] == {"mask_token_id": 5, "target_layer_ids": [1, 3, 5]}
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert {"fc.weight", "hidden_norm.weight", "norm.weight",
            "layers.0.self_attn.q_norm.weight", "layers.1.mlp.down_proj.weight"} <= keys
    assert not any("embed" in k or "lm_head" in k for k in keys)
    # The bf16 export (what training writes) loads with z-lab's class too, same values.
    ref = dflash_model.DFlashDraftModel.from_pretrained(str(tmp_path))
    assert next(ref.parameters()).dtype == torch.bfloat16
    ours_sd = {k: v.to(torch.bfloat16) for k, v in m.state_dict().items()}
    ref_sd = ref.state_dict()
    assert all(torch.equal(ref_sd[k], v) for k, v in ours_sd.items())
