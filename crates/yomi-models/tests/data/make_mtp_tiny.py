#!/usr/bin/env python3
"""Write the mtp-tiny fixture: a random Qwen3.5 MTP block (`mtp.*`, the layout of the published
Qwen3.5 checkpoints) for the qwen35-tiny target, with reference outputs from the torch MTP
implementation in tools/train/hybrid_model.py (`MTPBlock`, written from vLLM's
`qwen3_5_mtp.py` as described in ../shared/docs/qwen35.md §2.7; its decoder layer is tested
against transformers' own Qwen3.5 attention layer in tools/train/tests/test_hybrid.py).

Run by hand (not in CI), from anywhere:

    python3 crates/yomi-models/tests/data/make_mtp_tiny.py [--target DIR] [--out DIR]

The target defaults to ../shared/fixtures/qwen35-tiny next to the repository root; its
reference.safetensors gives the prompt and the trunk's final-normed hidden states
(`hidden_states.4`, from transformers), so only the MTP block runs here. Everything is float32
on CPU, single-threaded, seeded: two runs give byte-identical files.

What the reference holds (T = prompt length, H = 128, V = 512):
- `chain_s` [T-1, H], `chain_logits` [T-1, V]: MTP rows t = 0 .. T-2 (x_{t+1} = prompt[t+1],
  h = hidden_states.4[t], position t), one causal pass.
- `step_tokens` [3]: the tokens of three drafting steps after the prompt, and `step_s` [3, H],
  `step_logits` [3, V]: step 1 is the row at position T-1 (x = step_tokens[0], h =
  hidden_states.4[T-1]); step k > 1 the row at position T-2+k (x = step_tokens[k-1], h = the
  block's own output s of step k-1), each over all rows before it.
Logits are s · lm_headᵀ with the target's LM head (qwen35-tiny's is untied).
"""

import argparse
import json
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

from safetensors.torch import load_file, save_file  # noqa: E402

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "tools" / "train"))
import hybrid_model as hm  # noqa: E402

SEED = 20261207
STEP_TOKENS = [7, 300, 42]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default=str(REPO.parent / "shared" / "fixtures" / "qwen35-tiny"))
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "mtp-tiny"))
    a = ap.parse_args()
    target, out = Path(a.target), Path(a.out)
    cfg = json.loads((target / "config.json").read_text())
    cfg["mtp_num_hidden_layers"] = 1
    cfg["mtp_use_dedicated_embeddings"] = False
    ref = load_file(str(target / "reference.safetensors"))
    weights = load_file(str(target / "model.safetensors"))
    ids = ref["prompt_ids"].long()
    L = cfg["num_hidden_layers"]
    hid = ref[f"hidden_states.{L}"].float()  # [T, H] after the final norm
    head = weights["lm_head.weight"].float()
    embed = weights["model.embed_tokens.weight"].float()
    T, H = hid.shape

    torch.manual_seed(SEED)
    mtp = hm.MTPBlock(cfg).float().eval()
    with torch.no_grad():
        for name, p in mtp.named_parameters():
            if p.dim() == 1:
                p.normal_(0.0, 0.3)  # (1 + w): a zero w would hide a wrong norm form
            else:
                p.normal_(0.0, 1.0 / p.shape[1] ** 0.5)

    def run(tokens, hidden):
        """The block over rows 0 .. n-1 at positions 0 .. n-1 (causal): s [n, H]."""
        e = embed[torch.tensor(tokens)][None]
        pos = torch.arange(len(tokens))
        with torch.no_grad():
            return mtp(e, hidden[None], pos)[0]

    chain_tokens = ids[1:].tolist()
    chain_s = run(chain_tokens, hid[:-1])
    tokens, hidden = list(chain_tokens), hid[:-1]
    prev = hid[T - 1]
    step_s = []
    for tok in STEP_TOKENS:
        tokens.append(tok)
        hidden = torch.cat([hidden, prev[None]])
        s = run(tokens, hidden)
        # Causal: the rows before are unchanged by the new one.
        assert torch.equal(s[: len(chain_tokens)], chain_s)
        prev = s[-1]
        step_s.append(prev)
    step_s = torch.stack(step_s)

    out.mkdir(parents=True, exist_ok=True)
    state = {"mtp." + k: v.contiguous() for k, v in mtp.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file(
        {
            "chain_s": chain_s.contiguous(),
            "chain_logits": (chain_s @ head.T).contiguous(),
            "step_tokens": torch.tensor(STEP_TOKENS, dtype=torch.int64),
            "step_s": step_s.contiguous(),
            "step_logits": (step_s @ head.T).contiguous(),
        },
        str(out / "reference.safetensors"),
        metadata={"format": "pt"},
    )
    (out / "reference.json").write_text(json.dumps({
        "about": "Random Qwen3.5 MTP block for ../shared/fixtures/qwen35-tiny, outputs from "
                 "tools/train/hybrid_model.py's MTPBlock (float32, CPU); see make_mtp_tiny.py.",
        "seed": SEED,
        "prompt_rows": T,
        "torch": torch.__version__,
    }, indent=2) + "\n")
    print(f"wrote {out}: {T - 1} chain rows, {len(STEP_TOKENS)} steps")


if __name__ == "__main__":
    main()
