"""An independent LLaMA-3 reference in numpy (float64), written from the
Hugging Face LlamaForCausalLM definition rather than from the server's code,
plus a writer of Hugging Face checkpoint directories (config.json and
safetensors, single file or sharded with model.safetensors.index.json) that
needs neither torch nor the safetensors package.

Used by test_model_oracle.py; tools/hf_compare.py checks the same server
against transformers itself where torch is installed.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np


# ---- checkpoint writing ---------------------------------------------------------

def bf16_round(a: np.ndarray) -> np.ndarray:
    """Rounds float32 values to bfloat16 (nearest even); returns the uint16 bits."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path: Path, tensors: Dict[str, np.ndarray], dtype: str = "F32") -> None:
    """tensors: float arrays, stored as F32, F16 or BF16."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors.items():
        if dtype == "F32":
            raw = np.ascontiguousarray(a, dtype="<f4").tobytes()
        elif dtype == "F16":
            raw = np.ascontiguousarray(a, dtype="<f2").tobytes()
        elif dtype == "BF16":
            raw = bf16_round(a).astype("<u2").tobytes()
        else:
            raise ValueError(dtype)
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def random_llama(config: dict, seed: int, scale: float = 1.0) -> Dict[str, np.ndarray]:
    """Random float32 weights with HF names for a LlamaForCausalLM config."""
    rng = np.random.default_rng(seed)
    D, L = config["hidden_size"], config["num_hidden_layers"]
    Hq, Hkv = config["num_attention_heads"], config["num_key_value_heads"]
    Dh = config.get("head_dim") or D // Hq
    I, V = config["intermediate_size"], config["vocab_size"]

    def lin(n, k):
        return (rng.standard_normal((n, k)) * scale / math.sqrt(k)).astype(np.float32)

    w = {"model.embed_tokens.weight": rng.standard_normal((V, D)).astype(np.float32)}
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
        w[p + "self_attn.q_proj.weight"] = lin(Hq * Dh, D)
        w[p + "self_attn.k_proj.weight"] = lin(Hkv * Dh, D)
        w[p + "self_attn.v_proj.weight"] = lin(Hkv * Dh, D)
        w[p + "self_attn.o_proj.weight"] = lin(D, Hq * Dh)
        w[p + "post_attention_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
        w[p + "mlp.gate_proj.weight"] = lin(I, D)
        w[p + "mlp.up_proj.weight"] = lin(I, D)
        w[p + "mlp.down_proj.weight"] = lin(D, I)
    w["model.norm.weight"] = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    if not config.get("tie_word_embeddings", False):
        w["lm_head.weight"] = lin(V, D)
    return w


def write_checkpoint(directory: Path, config: dict, weights: Dict[str, np.ndarray], dtype: str = "F32",
                     shards: int = 1) -> Dict[str, np.ndarray]:
    """Writes config.json and the safetensors; returns the weights as the
    server will read them (rounded to dtype), in float64."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    names = list(weights)
    if shards == 1:
        write_safetensors(directory / "model.safetensors", weights, dtype)
    else:
        weight_map = {}
        for s in range(shards):
            part = names[s::shards]
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            write_safetensors(directory / fname, {n: weights[n] for n in part}, dtype)
            weight_map.update({n: fname for n in part})
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    if dtype == "BF16":
        return {n: bf16_bits_to_f32(bf16_round(a)).astype(np.float64) for n, a in weights.items()}
    if dtype == "F16":
        return {n: a.astype(np.float16).astype(np.float64) for n, a in weights.items()}
    return {n: a.astype(np.float64) for n, a in weights.items()}


# ---- forward pass -------------------------------------------------------------------

class LlamaReference:
    """LlamaForCausalLM forward in float64 (HF semantics: rotate-half rope,
    GQA by repeating kv heads, RMSNorm with the weight applied after
    normalising, SwiGLU MLP, llama3 rope scaling)."""

    def __init__(self, config: dict, weights: Dict[str, np.ndarray]):
        self.c = config
        self.w = weights
        self.D = config["hidden_size"]
        self.L = config["num_hidden_layers"]
        self.Hq = config["num_attention_heads"]
        self.Hkv = config.get("num_key_value_heads", self.Hq)
        self.Dh = config.get("head_dim") or self.D // self.Hq
        self.eps = config.get("rms_norm_eps", 1e-6)
        self.inv_freq = self._inv_freq()

    def _inv_freq(self) -> np.ndarray:
        theta = self.c.get("rope_theta", 10000.0)
        inv = 1.0 / theta ** (np.arange(0, self.Dh, 2, dtype=np.float64) / self.Dh)
        rs = self.c.get("rope_scaling") or {}
        if rs.get("rope_type", rs.get("type")) != "llama3":
            return inv
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / lo, old / hi
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled)

    def _rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def _rope(self, x, positions):  # x [S, H, Dh]
        freqs = positions[:, None].astype(np.float64) * self.inv_freq[None, :]  # [S, Dh/2]
        emb = np.concatenate([freqs, freqs], axis=-1)
        cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
        half = self.Dh // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rot * sin

    def layer(self, i: int, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """One decoder layer over one sequence. x [S, D]."""
        p, w = f"model.layers.{i}.", self.w
        S = x.shape[0]
        h = self._rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(S, self.Hq, self.Dh)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(S, self.Hkv, self.Dh)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(S, self.Hkv, self.Dh)
        q, k = self._rope(q, positions), self._rope(k, positions)
        rep = self.Hq // self.Hkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        scores = np.einsum("shd,thd->hst", q, k) / math.sqrt(self.Dh)
        scores = scores + np.triu(np.full((S, S), -np.inf), 1)[None]
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        o = np.einsum("hst,thd->shd", probs, v).reshape(S, self.Hq * self.Dh)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = self._rms(x, w[p + "post_attention_layernorm.weight"])
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        return x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T

    def layers(self, hidden: np.ndarray, first: int, n: int, positions: Optional[np.ndarray] = None) -> np.ndarray:
        """hidden [B, S, D] -> [B, S, D] after layers [first, first + n)."""
        B, S, _ = hidden.shape
        out = np.empty_like(hidden, dtype=np.float64)
        for b in range(B):
            x = hidden[b].astype(np.float64)
            pos = np.arange(S) if positions is None else positions[b]
            for i in range(first, first + n):
                x = self.layer(i, x, pos)
            out[b] = x
        return out

    def logits(self, tokens: List[int]) -> np.ndarray:
        """Logits of every position of one sequence, [S, vocab]."""
        x = self.w["model.embed_tokens.weight"][np.asarray(tokens)]
        x = self.layers(x[None], 0, self.L)[0]
        x = self._rms(x, self.w["model.norm.weight"])
        head = self.w["model.embed_tokens.weight"] if self.c.get("tie_word_embeddings") else self.w["lm_head.weight"]
        return x @ head.T

    def greedy(self, prompt: List[int], n: int):
        """n greedy tokens (full recompute each step) and each step's top-2 margin."""
        tokens, out, margins = list(prompt), [], []
        for _ in range(n):
            last = self.logits(tokens)[-1]
            top2 = np.sort(last)[-2:]
            margins.append(float(top2[1] - top2[0]))
            t = int(np.argmax(last))
            out.append(t)
            tokens.append(t)
        return out, margins
