"""A random-weight checkpoint with Qwen3.5-9B's shapes, in bf16, for timing (not for quality).

Runs on the GPU machine with its transformers (5.17): `python3 bench/make_qwen35_9b.py DIR`.
Shapes as Qwen3.5-9B: hidden 4096, 32 layers (Gated DeltaNet ×3, then gated attention, repeated),
FFN 12288, attention 16 query / 4 KV heads of 256 (partial rotary 0.25), GDN 16 key / 32 value
heads of 128, conv 4, vocabulary 248320, untied LM head. Weights are transformers' own random
init (bf16); the recurrence is stable with the default A_log/dt_bias init. No tokenizer: the
benchmark drives token ids directly.
"""
import sys
import time

import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

out = sys.argv[1]
layers = 32
cfg = Qwen3_5TextConfig(
    vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=layers,
    num_attention_heads=16, num_key_value_heads=4, head_dim=256,
    linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
    linear_value_head_dim=128, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
    rope_parameters={"rope_theta": 10000000.0, "partial_rotary_factor": 0.25, "rope_type": "default"},
    max_position_embeddings=32768, eos_token_id=248044, bos_token_id=None, pad_token_id=None,
)
t = time.time()
torch.manual_seed(0)
with torch.device("cuda"):
    model = Qwen3_5ForCausalLM(cfg).to(torch.bfloat16)
n = sum(p.numel() for p in model.parameters())
model.save_pretrained(out, max_shard_size="4GB")
print(f"made {out}: {n / 1e9:.2f} B parameters in {time.time() - t:.0f} s")
