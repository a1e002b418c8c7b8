"""The hosted model against an independent numpy LLaMA (_llama_reference.py):
a random checkpoint is written here in the Hugging Face layout (config.json +
safetensors, sharded with an index, llama3 rope scaling, GQA, head_dim !=
hidden/heads), the server loads it with --model, and TransformerBlock outputs
and greedy Generate tokens must match the reference. A broken checkpoint must
stop the server at start-up with a message naming the tensor."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from _llama_reference import LlamaReference, random_llama, write_checkpoint
from conftest import ServerProcess
from fusedserve_client import FusedServeClient

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 80,
    "vocab_size": 200,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "torch_dtype": "float32",
}


def _start(server_bin, tmp_path, dtype, shards, tied):
    config = dict(CONFIG, tie_word_embeddings=tied,
                  torch_dtype={"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[dtype])
    weights = random_llama(config, seed=3, scale=1.5)
    model_dir = tmp_path / "ckpt"
    ref_weights = write_checkpoint(model_dir, config, weights, dtype=dtype, shards=shards)
    proc = ServerProcess(server_bin, tmp_path, [f"--model={model_dir}"]).start()
    return proc, LlamaReference(config, ref_weights)


@pytest.fixture(scope="module", params=[("F32", 1, False), ("BF16", 2, True)],
                ids=["f32-single-file", "bf16-sharded-tied"])
def model(request, server_bin, tmp_path_factory):
    dtype, shards, tied = request.param
    proc, ref = _start(server_bin, tmp_path_factory.mktemp("oracle"), dtype, shards, tied)
    with FusedServeClient(proc.target, timeout=120.0) as client:
        yield client, ref, dtype
    proc.stop()


def test_server_info_matches_config(model):
    client, ref, dtype = model
    info = client.server_info().model
    assert (info.hidden_size, info.num_layers, info.num_q_heads, info.num_kv_heads, info.head_dim,
            info.intermediate_size, info.vocab_size) == (48, 3, 4, 2, 16, 80, 200)
    assert info.name.endswith("ckpt")


def test_transformer_block_matches_reference(model):
    client, ref, _ = model
    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((2, 7, 48)).astype(np.float32)
    for first, n in [(0, 0), (0, 1), (1, 2), (2, 1)]:
        got = client.transformer_block(hidden, first_layer=first, num_layers=n)
        want = ref.layers(hidden.astype(np.float64), first, n or 3 - first)
        assert got.shape == (2, 7, 48)
        err = np.abs(got - want).max() / (np.abs(want).max() + 1e-12)
        assert err < 2e-5, f"layers [{first}, {first + (n or 3 - first)}): rel err {err:.2e}"
    # Explicit positions (a continuation at offset 40: rope scaling in play).
    positions = np.stack([np.arange(40, 47), np.arange(7)]).astype(np.int64)
    got = client.transformer_block(hidden, positions=positions)
    want = ref.layers(hidden.astype(np.float64), 0, 3, positions)
    assert np.abs(got - want).max() / np.abs(want).max() < 2e-5


def test_greedy_generate_matches_reference(model):
    client, ref, _ = model
    for prompt in ([1, 2, 3], [150, 7, 99, 42, 0, 13, 8]):
        stream = client.generate(prompt, max_new_tokens=24, timeout=120)
        got = stream.collect()
        want, margins = ref.greedy(prompt, 24)
        assert len(got) == 24 and stream.stats.generated_tokens == 24
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                # Only a near-tie may flip between fp32 and fp64.
                assert margins[i] < 1e-3, f"token {i}: got {g}, reference {w} (margin {margins[i]:.3g})"
                break


def test_broken_checkpoint_fails_at_startup(server_bin, tmp_path):
    config = dict(CONFIG)
    weights = random_llama(config, seed=1)
    weights["model.layers.1.self_attn.k_proj.weight"] = weights["model.layers.1.self_attn.k_proj.weight"][:16]
    model_dir = tmp_path / "broken"
    write_checkpoint(model_dir, config, weights)
    out = subprocess.run([server_bin, "serve", "--listen=127.0.0.1:0", "--metrics_listen=", "--device=cpu",
                          "--tuning_cache=", f"--model={model_dir}"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "model.layers.1.self_attn.k_proj.weight" in out.stderr, out.stderr
    assert "shape" in out.stderr
