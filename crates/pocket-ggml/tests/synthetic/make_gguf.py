#!/usr/bin/env python3
"""Write a tiny random-weight GGUF of one llama.cpp architecture.

Used by pocket-ggml's parity tests: the same file is run through our own
ggml graph and through llama.cpp, and the logits are compared.  Every file
must load in the llama.cpp we link against (llama-cpp-sys-2 0.1.161), so the
metadata keys, tensor names and shapes below follow that version's
src/llama-arch.cpp, src/llama-model.cpp (llama_model_base::load_hparams,
create_tensor_qkv) and src/models/<arch>.cpp (load_arch_hparams,
load_arch_tensors).  See README.md next to this file.

Shapes are written here in ggml order (ne0 first, as llama.cpp's
create_tensor() spells them); numpy arrays handed to gguf.GGUFWriter are
row-major, i.e. the reverse: a ggml {ne0, ne1} matrix is a numpy (ne1, ne0)
array.

Requires the `gguf` (>= 0.17, tested with 0.19.0) and `numpy` packages.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import zlib
from dataclasses import dataclass, field

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType, GGUFValueType
    from gguf.quants import quantize
except ImportError as e:  # pragma: no cover - environment problem
    sys.exit(f"make_gguf.py: cannot import gguf/numpy ({e}); "
             f"install with: pip install gguf numpy")

ARCHS = ("llama", "llama3", "qwen2", "qwen3", "gemma3", "phi3", "smollm3", "olmo2")

# GGUF general.architecture for each CLI arch name.
GGUF_ARCH = {a: a for a in ARCHS}
GGUF_ARCH["llama3"] = "llama"

# Default rope.freq_base per arch (the released models' rope_theta).
DEFAULT_FREQ_BASE = {
    "llama": 10000.0,      # SmolLM2-style
    "llama3": 500000.0,    # Llama 3.1 / 3.2
    "qwen2": 1000000.0,    # Qwen2.5
    "qwen3": 1000000.0,    # Qwen3
    "gemma3": 1000000.0,   # Gemma 3 global layers (rope.freq_base_swa = 10000 below)
    "phi3": 10000.0,       # Phi-3-mini-4k
    "smollm3": 5000000.0,  # SmolLM3-3B
    "olmo2": 500000.0,     # OLMo-2
}

# Archs whose output projection is tied to token_embd (no output.weight).
TIED = {"llama", "llama3", "gemma3"}

# Archs whose loader sizes q/o as {n_embd, n_embd} (qwen2, phi3) or uses
# n_embd/n_head as the head size (olmo2): head_dim must be n_embd/n_head.
HEAD_DIM_FIXED = {"qwen2", "phi3", "olmo2"}

# Archs whose converter writes rope.dimension_count (LlamaModel and its
# subclasses, Phi3MiniModel).  For the others llama.cpp defaults n_rot to
# key_length (load_hparams).
WRITES_ROPE_DIM = {"llama", "llama3", "smollm3", "phi3"}

# Archs whose converter always writes attention.key_length/value_length
# (qwen3, gemma3: head_dim in config; Llama 3.2's config.json also has head_dim).
WRITES_KV_LENGTH = {"qwen3", "gemma3", "llama3"}

# Llama 3.1/3.2 rope scaling (config.json rope_scaling of Llama-3.2-1B/3B).
LLAMA3_ROPE = dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=8192)

LLAMA_MAX_LAYERS = 512  # src/llama-hparams.h
RMS_EPS = 1e-6


class Refused(Exception):
    pass


@dataclass
class TensorSpec:
    name: str
    ne: tuple[int, ...]  # ggml order, ne0 first
    kind: str            # embd | mat | norm | bias | rope_freqs


@dataclass
class Model:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    tensors: list[TensorSpec] = field(default_factory=list)

    def add(self, name: str, ne: tuple[int, ...], kind: str) -> None:
        self.tensors.append(TensorSpec(name, tuple(int(x) for x in ne), kind))


# --------------------------------------------------------------------------
# tensor lists, one per arch (mirrors src/models/<arch>.cpp load_arch_tensors)
# --------------------------------------------------------------------------

def build_tensors(m: Model) -> None:
    E, F, V = m.n_embd, m.n_ff, m.n_vocab
    D, H, HKV = m.head_dim, m.n_head, m.n_head_kv
    Q, KV = H * D, HKV * D  # n_embd_head_k*n_head, n_embd_k_gqa (== n_embd_v_gqa)
    a = m.arch

    m.add("token_embd.weight", (E, V), "embd")
    m.add("output_norm.weight", (E,), "norm")
    if a not in TIED:
        m.add("output.weight", (E, V), "mat")
    if a == "llama3":
        # llama.cpp: rope_freqs {n_rot/2}, TENSOR_NOT_REQUIRED, shared by all layers
        m.add("rope_freqs.weight", (D // 2,), "rope_freqs")

    for i in range(m.n_layer):
        b = f"blk.{i}."
        if a == "phi3":
            # create_tensor_qkv(..., n_embd, n_embd, n_embd_gqa, n_embd_gqa): fused
            # attn_qkv {n_embd, n_embd + 2*n_embd_gqa} is tried first.
            m.add(b + "attn_norm.weight", (E,), "norm")
            m.add(b + "attn_qkv.weight", (E, E + 2 * KV), "mat")
            m.add(b + "attn_output.weight", (E, E), "mat")
            m.add(b + "ffn_norm.weight", (E,), "norm")
            m.add(b + "ffn_down.weight", (F, E), "mat")
            m.add(b + "ffn_up.weight", (E, 2 * F), "mat")
            continue
        if a == "olmo2":
            # no attn_norm / ffn_norm: post-norms only; q/k norms over the whole row
            m.add(b + "attn_q.weight", (E, E), "mat")
            m.add(b + "attn_k.weight", (E, KV), "mat")
            m.add(b + "attn_v.weight", (E, KV), "mat")
            m.add(b + "attn_output.weight", (E, E), "mat")
            m.add(b + "attn_q_norm.weight", (E,), "norm")
            m.add(b + "attn_k_norm.weight", (KV,), "norm")
            m.add(b + "post_attention_norm.weight", (E,), "norm")
            m.add(b + "ffn_gate.weight", (E, F), "mat")
            m.add(b + "ffn_up.weight", (E, F), "mat")
            m.add(b + "ffn_down.weight", (F, E), "mat")
            m.add(b + "post_ffw_norm.weight", (E,), "norm")
            continue

        # llama, llama3, qwen2, qwen3, gemma3, smollm3: separate q/k/v
        m.add(b + "attn_norm.weight", (E,), "norm")
        m.add(b + "attn_q.weight", (E, Q), "mat")
        m.add(b + "attn_k.weight", (E, KV), "mat")
        m.add(b + "attn_v.weight", (E, KV), "mat")
        if a == "qwen2":
            m.add(b + "attn_q.bias", (Q,), "bias")
            m.add(b + "attn_k.bias", (KV,), "bias")
            m.add(b + "attn_v.bias", (KV,), "bias")
        m.add(b + "attn_output.weight", (Q, E), "mat")
        if a in ("qwen3", "gemma3"):
            m.add(b + "attn_q_norm.weight", (D,), "norm")
            m.add(b + "attn_k_norm.weight", (D,), "norm")
        if a == "gemma3":
            m.add(b + "post_attention_norm.weight", (E,), "norm")
        m.add(b + "ffn_norm.weight", (E,), "norm")
        m.add(b + "ffn_gate.weight", (E, F), "mat")
        m.add(b + "ffn_up.weight", (E, F), "mat")
        m.add(b + "ffn_down.weight", (F, E), "mat")
        if a == "gemma3":
            m.add(b + "post_ffw_norm.weight", (E,), "norm")


# --------------------------------------------------------------------------
# weights
# --------------------------------------------------------------------------

def llama3_rope_freqs(head_dim: int, base: float) -> np.ndarray:
    """rope_freqs as conversion/llama.py LlamaModel.generate_extra_tensors
    computes it for rope_type == "llama3" (float32 arithmetic, like torch)."""
    p = LLAMA3_ROPE
    f32 = np.float32
    factor, lo, hi = f32(p["factor"]), f32(p["low_freq_factor"]), f32(p["high_freq_factor"])
    old_ctx = f32(p["original_max_position_embeddings"])
    freqs = (f32(1.0) / (f32(base) ** (np.arange(0, head_dim, 2, dtype=f32) / f32(head_dim)))).astype(f32)
    low_freq_wavelen = float(p["original_max_position_embeddings"]) / p["low_freq_factor"]
    high_freq_wavelen = float(p["original_max_position_embeddings"]) / p["high_freq_factor"]
    out = []
    for freq in freqs:
        wavelen = f32(2 * math.pi) / freq
        if wavelen < high_freq_wavelen:
            out.append(f32(1.0))
        elif wavelen > low_freq_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - lo) / (hi - lo)
            out.append(f32(1.0) / ((f32(1.0) - smooth) / factor + smooth))
    return np.array(out, dtype=f32)


def tensor_rng(seed: int, name: str) -> np.random.Generator:
    # one stream per tensor name: deterministic and independent of write order
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def make_values(m: Model, t: TensorSpec, seed: int, freq_base: float) -> np.ndarray:
    shape = tuple(reversed(t.ne))  # numpy row-major
    if t.kind == "rope_freqs":
        return llama3_rope_freqs(m.head_dim, freq_base)
    rng = tensor_rng(seed, t.name)
    z = rng.standard_normal(shape, dtype=np.float32)
    if t.kind == "norm":
        # Gemma GGUFs store norm weights with the +1 already applied by the
        # converter, so values near 1 are right for every arch.
        return np.float32(1.0) + np.float32(0.1) * z
    if t.kind == "bias":
        return np.float32(0.1) * z
    if t.kind == "embd":
        # gemma3 multiplies the embedding by sqrt(n_embd) in the graph
        std = 1.0 / math.sqrt(m.n_embd) if m.arch == "gemma3" else 1.0
        return (np.float32(std) * z).astype(np.float32)
    assert t.kind == "mat"
    return (np.float32(1.0 / math.sqrt(t.ne[0])) * z).astype(np.float32)


def encode(values: np.ndarray, t: TensorSpec, weights: str) -> tuple[np.ndarray, GGMLQuantizationType]:
    if t.kind not in ("mat", "embd"):
        return values.astype(np.float32), GGMLQuantizationType.F32
    if weights == "q8_0" and t.ne[0] % 32 == 0:
        return quantize(values, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0
    return values.astype(np.float16), GGMLQuantizationType.F16


# --------------------------------------------------------------------------
# tokenizer copy
# --------------------------------------------------------------------------

def read_tokenizer(path: str) -> tuple[list[tuple[str, object, GGUFValueType, GGUFValueType | None]], int]:
    """All tokenizer.* key/values of `path`, with their exact GGUF types.
    Strings are kept as raw bytes so they are copied byte for byte."""
    reader = gguf.GGUFReader(path, "r")
    kvs = []
    n_vocab = None
    for key, f in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = GGUFValueType(f.types[0])
        if vtype == GGUFValueType.ARRAY:
            if len(f.types) != 2:
                raise Refused(f"{path}: {key} is a nested array; not supported")
            sub = GGUFValueType(f.types[1])
            if sub == GGUFValueType.STRING:
                val = [bytes(f.parts[i]) for i in f.data]
            else:
                val = [v for i in f.data for v in f.parts[i].tolist()]
            if len(val) == 0:
                raise Refused(f"{path}: {key} is an empty array; gguf cannot write it")
            kvs.append((key, val, vtype, sub))
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(val)
        elif vtype == GGUFValueType.STRING:
            kvs.append((key, bytes(f.parts[f.data[0]]), vtype, None))
        else:
            kvs.append((key, f.parts[f.data[0]].tolist()[0], vtype, None))
    if n_vocab is None:
        raise Refused(f"{path}: no tokenizer.ggml.tokens array")
    return kvs, n_vocab


def adapt_tokenizer(kvs, n_vocab: int, chat_template: str | None, user_tokens: list[str]):
    """The borrowed tokenizer with another chat template and some tokens renamed as
    user-defined ones (token type 4, which llama.cpp matches in any text)."""
    kvs = [list(kv) for kv in kvs]
    by_key = {kv[0]: kv for kv in kvs}
    if chat_template is not None:
        text = open(chat_template, "rb").read()
        if "tokenizer.chat_template" in by_key:
            by_key["tokenizer.chat_template"][1] = text
        else:
            kvs.append(["tokenizer.chat_template", text, GGUFValueType.STRING, None])
    for spec in user_tokens:
        tid, _, text = spec.partition("=")
        if not tid.isdigit() or not text or int(tid) >= n_vocab:
            raise Refused(f"--user-token {spec!r}: ID=TEXT with ID below {n_vocab}")
        by_key["tokenizer.ggml.tokens"][1][int(tid)] = text.encode()
        if "tokenizer.ggml.token_type" in by_key:
            by_key["tokenizer.ggml.token_type"][1][int(tid)] = 4
    return [tuple(kv) for kv in kvs]


# --------------------------------------------------------------------------
# checks (what llama.cpp would reject or mis-run)
# --------------------------------------------------------------------------

def check(args: argparse.Namespace, m: Model) -> None:
    a = m.arch
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise Refused(msg)

    need(1 <= m.n_layer <= LLAMA_MAX_LAYERS, f"--n-layer must be in 1..{LLAMA_MAX_LAYERS}")
    for k in ("n_embd", "n_head", "n_head_kv", "head_dim", "n_ff", "n_ctx_train"):
        v = getattr(m, k, None) if k != "n_ctx_train" else args.n_ctx_train
        need(v >= 1, f"--{k.replace('_', '-')} must be >= 1 (got {v})")
    need(m.n_head % m.n_head_kv == 0,
         f"n_head ({m.n_head}) must be a multiple of n_head_kv ({m.n_head_kv}) for grouped-query attention")
    need(m.head_dim % 2 == 0, f"head_dim ({m.head_dim}) must be even (RoPE rotates pairs)")
    if a in HEAD_DIM_FIXED:
        why = ("its loader takes the head size as n_embd/n_head" if a == "olmo2"
               else "its loader sizes attn_q/attn_output as {n_embd, n_embd}")
        need(m.n_embd % m.n_head == 0 and m.head_dim == m.n_embd // m.n_head,
             f"{a}: head_dim must equal n_embd/n_head ({why} in llama.cpp); "
             f"got n_embd={m.n_embd} n_head={m.n_head} head_dim={m.head_dim}")
    if a == "gemma3":
        need(args.sliding_window >= 1, "--sliding-window must be >= 1 (0 turns SWA off in llama.cpp)")
        need(args.swa_pattern is None or args.swa_pattern >= 0, "--swa-pattern must be >= 0")
        need(args.final_logit_softcapping is None or args.final_logit_softcapping > 0,
             "--final-logit-softcapping must be > 0")
    else:
        need(args.sliding_window is None and args.swa_pattern is None,
             "--sliding-window/--swa-pattern are only for --arch gemma3")
        need(args.final_logit_softcapping is None, "--final-logit-softcapping is only for --arch gemma3")
    need(m.n_vocab >= 1, "tokenizer has no tokens")


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------

def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", required=True, choices=ARCHS)
    p.add_argument("--out", required=True, help="output .gguf path (written atomically)")
    p.add_argument("--tokenizer-from", required=True,
                   help="GGUF whose tokenizer.* keys are copied verbatim; vocab size = its token count")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-head-kv", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=None, help="default n_embd/n_head (32 with the defaults)")
    p.add_argument("--n-ff", type=int, default=256)
    p.add_argument("--weights", choices=("f16", "q8_0"), default="f16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-ctx-train", type=int, default=4096)
    p.add_argument("--rope-freq-base", type=float, default=None, help="override the arch default")
    p.add_argument("--sliding-window", type=int, default=None, help="gemma3 only; default 64")
    p.add_argument("--swa-pattern", type=int, default=None,
                   help="gemma3 only; writes gemma3.attention.sliding_window_pattern (u32): layer il "
                        "is SWA iff il %% N < N-1 (0: every layer). Omitted by default, as in real "
                        "Gemma 3 GGUFs: llama.cpp then uses 6")
    p.add_argument("--final-logit-softcapping", type=float, default=None, help="gemma3 only; default off")
    p.add_argument("--chat-template", default=None,
                   help="a file whose text replaces the borrowed tokenizer's chat template")
    p.add_argument("--user-token", action="append", default=[], metavar="ID=TEXT",
                   help="token ID becomes the user-defined token TEXT (as Qwen3's <think>, which a "
                        "borrowed Qwen2.5 vocabulary holds as padding); may be repeated")
    args = p.parse_args(argv)
    if args.arch == "gemma3" and args.sliding_window is None:
        args.sliding_window = 64
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    a = args.arch
    try:
        if args.head_dim is None:
            if args.n_head < 1 or args.n_embd % args.n_head != 0:
                raise Refused(f"n_embd ({args.n_embd}) is not a multiple of n_head ({args.n_head}); pass --head-dim")
            args.head_dim = args.n_embd // args.n_head
        tok_kvs, n_vocab = read_tokenizer(args.tokenizer_from)
        tok_kvs = adapt_tokenizer(tok_kvs, n_vocab, args.chat_template, args.user_token)
        m = Model(a, args.n_layer, args.n_embd, args.n_head, args.n_head_kv, args.head_dim, args.n_ff, n_vocab)
        check(args, m)
    except Refused as e:
        print(f"make_gguf.py: refused: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"make_gguf.py: cannot read --tokenizer-from {args.tokenizer_from}: {e}", file=sys.stderr)
        return 2

    build_tensors(m)
    freq_base = args.rope_freq_base if args.rope_freq_base is not None else DEFAULT_FREQ_BASE[a]
    ga = GGUF_ARCH[a]
    D = m.head_dim

    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".make_gguf.", suffix=".gguf", dir=out_dir)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual file mode
    try:
        w = gguf.GGUFWriter(tmp, ga)  # writes general.architecture
        # llama.cpp's vocab loader gives models whose name contains "phi3" or "phi-3" special
        # attributes for Phi's own tokens ("</s>", ...), which a borrowed tokenizer lacks: the
        # name must not say phi3.
        w.add_string("general.name", "synthetic-phi" if a == "phi3" else f"synthetic-{a}")
        w.add_uint32("general.file_type", 7 if args.weights == "q8_0" else 1)  # MOSTLY_Q8_0 / MOSTLY_F16
        w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)

        w.add_uint32(f"{ga}.block_count", m.n_layer)
        w.add_uint32(f"{ga}.context_length", args.n_ctx_train)
        w.add_uint32(f"{ga}.embedding_length", m.n_embd)
        w.add_uint32(f"{ga}.feed_forward_length", m.n_ff)
        w.add_uint32(f"{ga}.attention.head_count", m.n_head)
        w.add_uint32(f"{ga}.attention.head_count_kv", m.n_head_kv)
        w.add_float32(f"{ga}.attention.layer_norm_rms_epsilon", RMS_EPS)
        w.add_float32(f"{ga}.rope.freq_base", freq_base)
        if a in WRITES_ROPE_DIM:
            w.add_uint32(f"{ga}.rope.dimension_count", D)
        if a in WRITES_KV_LENGTH or m.n_embd % m.n_head != 0 or D != m.n_embd // m.n_head:
            w.add_uint32(f"{ga}.attention.key_length", D)
            w.add_uint32(f"{ga}.attention.value_length", D)
        if a == "gemma3":
            w.add_uint32(f"{ga}.attention.sliding_window", args.sliding_window)
            if args.swa_pattern is not None:
                w.add_uint32(f"{ga}.attention.sliding_window_pattern", args.swa_pattern)
            w.add_float32(f"{ga}.rope.freq_base_swa", 10000.0)
            if args.final_logit_softcapping is not None:
                w.add_float32(f"{ga}.final_logit_softcapping", args.final_logit_softcapping)
        w.add_uint32(f"{ga}.vocab_size", n_vocab)

        for key, val, vtype, sub in tok_kvs:
            w.add_key_value(key, val, vtype, sub_type=sub)

        for t in m.tensors:
            data, qtype = encode(make_values(m, t, args.seed, freq_base), t, args.weights)
            w.add_tensor(t.name, data, raw_dtype=qtype if qtype == GGMLQuantizationType.Q8_0 else None)

        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, args.out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
