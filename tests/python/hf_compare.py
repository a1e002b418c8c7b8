#!/usr/bin/env python3
"""The server against Hugging Face transformers itself (issue 6, "Correctness").

Two steps, which may run on different hosts (transformers + torch are on the
GPU host; the server and its Python client wherever it is built):

  make  --out DIR [--head-dim N]
                      builds a LlamaForCausalLM with random weights (GQA,
                      llama3 rope scaling, head_dim != hidden/heads; 48 by
                      default, 64 for the CUDA runner's head dims), saves it
                      with save_pretrained (safetensors) as DIR/f32 and, cast
                      to bfloat16, as DIR/bf16, and records transformers'
                      prefill logits and 32 greedy tokens (full forward per
                      step) in DIR/expected.npz.
  check --dir DIR --bin FUSEDSERVE [--device cpu|cuda] [--tensor-parallel N]
                      starts the server with --model=DIR/f32 (then DIR/bf16)
                      and compares: logits of the prefill (embeddings ->
                      TransformerBlock over all layers -> final norm and
                      lm_head from the checkpoint, in numpy), relative error
                      <= 1e-4 in fp32 and <= 2e-2 in bf16; and Generate's
                      greedy tokens, identical to transformers' in fp32.
                      --tensor-parallel N runs the server with the model
                      split over N GPUs (N ranks of the CPU runner on cpu).
  all   --out DIR --bin FUSEDSERVE     both on one host.

Needs: make: torch, transformers, numpy. check: numpy, grpcio and the
fusedserve_client package (clients/python) on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PROMPT = [3, 141, 59, 26, 535, 89, 79, 32, 384, 626, 433, 83]
STEPS = 32


def make(out: Path, head_dim: int = 48) -> None:
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}
    kw = dict(vocab_size=1000, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=2, head_dim=head_dim, rms_norm_eps=1e-5,
              max_position_embeddings=2048, tie_word_embeddings=False, bos_token_id=None,
              eos_token_id=None, pad_token_id=None)
    try:  # transformers 5: rope_parameters carries theta and scaling
        config = LlamaConfig(**kw, rope_parameters=dict(rope, rope_theta=500000.0))
    except TypeError:
        config = LlamaConfig(**kw, rope_theta=500000.0, rope_scaling=rope)
    model = LlamaForCausalLM(config).float().eval()
    # HF's init (std 0.02) gives near-uniform logits; re-initialise so greedy
    # tokens have clear margins.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                std = 1.0 if "embed_tokens" in name else 1.0 / math.sqrt(p.shape[1])
                p.normal_(0.0, std)
            else:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    assert getattr(model.model.rotary_emb, "rope_type", "llama3") == "llama3", "rope scaling not applied"

    out.mkdir(parents=True, exist_ok=True)
    expected = {}
    for tag, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        m = model.to(dtype)
        m.save_pretrained(out / tag, safe_serialization=True)
        (out / tag / "generation_config.json").unlink(missing_ok=True)  # not needed by the server
        with torch.no_grad():
            ids = torch.tensor([PROMPT])
            expected[f"{tag}_logits"] = m(ids).logits[0].float().numpy()
            tokens, margins = list(PROMPT), []
            for _ in range(STEPS):
                last = m(torch.tensor([tokens])).logits[0, -1].float()
                top2 = torch.topk(last, 2).values
                margins.append(float(top2[0] - top2[1]))
                tokens.append(int(torch.argmax(last)))
            expected[f"{tag}_greedy"] = np.array(tokens[len(PROMPT):])
            expected[f"{tag}_margins"] = np.array(margins)
    np.savez(out / "expected.npz", prompt=np.array(PROMPT), **expected)
    (out / "versions.json").write_text(json.dumps({"torch": torch.__version__,
                                                   "transformers": transformers.__version__}))
    print(f"make: wrote {out} (torch {torch.__version__}, transformers {transformers.__version__})")
    print("config.json:", (out / "f32" / "config.json").read_text())


def _load_weights(ckpt: Path) -> dict:
    sys.path.insert(0, str(HERE))
    import struct

    from _llama_reference import bf16_bits_to_f32

    files = sorted(ckpt.glob("*.safetensors"))
    out = {}
    for f in files:
        raw = f.read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        data = raw[8 + n:]
        for name, e in header.items():
            if name == "__metadata__":
                continue
            b, end = e["data_offsets"]
            buf = data[b:end]
            if e["dtype"] == "F32":
                a = np.frombuffer(buf, "<f4")
            elif e["dtype"] == "BF16":
                a = bf16_bits_to_f32(np.frombuffer(buf, "<u2"))
            elif e["dtype"] == "F16":
                a = np.frombuffer(buf, "<f2").astype(np.float32)
            else:
                continue
            out[name] = a.reshape(e["shape"]).astype(np.float64)
    return out


def check(directory: Path, binary: str, device: str = "cpu", tensor_parallel: int = 1) -> bool:
    sys.path.insert(0, str(HERE))
    import tempfile

    from conftest import ServerProcess
    from fusedserve_client import FusedServeClient

    exp = np.load(directory / "expected.npz")
    prompt = [int(t) for t in exp["prompt"]]
    ok = True
    for tag, tol in (("f32", 1e-4), ("bf16", 2e-2)):
        ckpt = directory / tag
        config = json.loads((ckpt / "config.json").read_text())
        w = _load_weights(ckpt)
        with tempfile.TemporaryDirectory() as tmp:
            proc = ServerProcess(binary, Path(tmp), [f"--model={ckpt}", f"--device={device}", f"--tensor_parallel={tensor_parallel}"]).start()
            try:
                with FusedServeClient(proc.target, timeout=300.0) as c:
                    info = c.server_info()
                    print(f"{tag}: server model runner on {info.device} ({info.device_name}), "
                          f"tensor parallel {tensor_parallel}")
                    emb = w["model.embed_tokens.weight"][prompt].astype(np.float32)[None]
                    hidden = c.transformer_block(emb).astype(np.float64)[0]
                    eps = config.get("rms_norm_eps", 1e-6)
                    x = hidden / np.sqrt(np.mean(hidden * hidden, -1, keepdims=True) + eps) * w["model.norm.weight"]
                    logits = x @ w["lm_head.weight"].T
                    want = exp[f"{tag}_logits"].astype(np.float64)
                    err = np.abs(logits - want).max() / np.abs(want).max()
                    good = err <= tol
                    print(f"{tag}: prefill logits rel. error {err:.2e} (limit {tol:.0e}) {'OK' if good else 'FAIL'}")
                    ok &= bool(good)
                    got = c.generate(prompt, max_new_tokens=STEPS, timeout=300).collect()
                    ref = [int(t) for t in exp[f"{tag}_greedy"]]
                    first_diff = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), None)
                    if tag == "f32":
                        good = got == ref
                        print(f"{tag}: greedy {STEPS} tokens {'identical' if good else f'differ at {first_diff}'} "
                              f"(min margin {exp[f'{tag}_margins'].min():.3g})")
                        ok &= good
                    else:
                        print(f"{tag}: greedy tokens agree up to step "
                              f"{STEPS if first_diff is None else first_diff} (bf16 rounding differs between "
                              f"transformers and the server; informative only)")
            finally:
                proc.stop()
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["make", "check", "all"])
    ap.add_argument("--out", "--dir", dest="dir", type=Path, required=True)
    ap.add_argument("--bin", default=None, help="fusedserve binary (check, all)")
    ap.add_argument("--head-dim", type=int, default=48, help="make: attention head dim")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="check: the server's --device")
    ap.add_argument("--tensor-parallel", type=int, default=1, help="check: the server's --tensor_parallel")
    a = ap.parse_args()
    if a.mode in ("make", "all"):
        make(a.dir, a.head_dim)
    if a.mode in ("check", "all"):
        if not a.bin:
            ap.error("--bin is required for check")
        return 0 if check(a.dir, a.bin, a.device, a.tensor_parallel) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
