"""Generate through the Python client: a clear UNIMPLEMENTED error until the
model lands, then tokens, stats and reproducibility."""

import grpc
import pytest

from fusedserve_client import FusedServeError


def _generate_or_none(client, **kw):
    """Tokens and stats, or None when this build does not implement Generate."""
    stream = client.generate(**kw)
    try:
        tokens = stream.collect()
    except FusedServeError as e:
        if e.code == grpc.StatusCode.UNIMPLEMENTED:
            return None
        raise
    return tokens, stream.stats


def test_generate_answers_or_says_unimplemented_clearly(client):
    stream = client.generate([1, 2, 3], max_new_tokens=4, timeout=120)
    try:
        tokens = stream.collect()
    except FusedServeError as e:
        assert e.code == grpc.StatusCode.UNIMPLEMENTED, e
        assert len(e.details) > 10, f"unhelpful message: {e.details!r}"
        assert "Generate" in str(e)
        return
    assert 1 <= len(tokens) <= 4
    assert stream.stats is not None


def test_generate_tokens_and_stats(client):
    got = _generate_or_none(client, prompt_token_ids=[1, 2, 3], max_new_tokens=5, timeout=120)
    if got is None:
        pytest.skip("Generate is UNIMPLEMENTED in this build")
    tokens, stats = got
    vocab = client.server_info().model.vocab_size
    assert 1 <= len(tokens) <= 5
    assert all(0 <= t < vocab for t in tokens)
    assert stats is not None
    assert stats.prompt_tokens == 3
    assert stats.generated_tokens == len(tokens)
    assert stats.finish_reason in ("length", "stop")
    if stats.finish_reason == "length":
        assert len(tokens) == 5
    assert stats.time_to_first_token_seconds > 0


def test_generate_is_reproducible(client):
    kw = dict(prompt_token_ids=[5, 6, 7, 8], max_new_tokens=6, temperature=0.8, top_k=20, seed=42, timeout=120)
    first = _generate_or_none(client, **kw)
    if first is None:
        pytest.skip("Generate is UNIMPLEMENTED in this build")
    assert _generate_or_none(client, **kw)[0] == first[0]
    greedy = dict(prompt_token_ids=[5, 6, 7, 8], max_new_tokens=6, timeout=120)
    assert _generate_or_none(client, **greedy)[0] == _generate_or_none(client, **greedy)[0]


def test_generate_rejects_empty_prompt(client):
    stream = client.generate([], max_new_tokens=2, timeout=60)
    with pytest.raises(FusedServeError) as e:
        stream.collect()
    if e.value.code == grpc.StatusCode.UNIMPLEMENTED:
        pytest.skip("Generate is UNIMPLEMENTED in this build")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt" in e.value.details


# -- Text API (issue 17): the default preset's built-in byte tokenizer -------------------


def test_server_info_names_the_tokenizer(client):
    t = client.server_info().tokenizer
    assert t.name == "builtin bytes"
    assert t.vocab_size == client.server_info().model.vocab_size
    assert t.bos_token_id == 256
    assert list(t.eos_token_ids) == [257, 260]
    assert t.chat_supported and t.chat_format == "llama-3"


def test_generate_text_streams_text_pieces(client):
    stream = client.generate("Héllo, wörld! 你好", max_new_tokens=16, ignore_eos=True, timeout=120)
    pieces = list(stream)
    assert all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == stream.text
    assert len(stream.tokens) == 16
    assert stream.stats.finish_reason == "length"
    assert stream.stats.prompt_tokens == 1 + len("Héllo, wörld! 你好".encode())
    # The stream's text is the detokenized ids; the ids are those of the same prompt as ids.
    assert client.detokenize(stream.tokens) == stream.text
    ids = client.tokenize("Héllo, wörld! 你好").token_ids
    assert client.generate(ids, max_new_tokens=16, timeout=120).collect() == stream.tokens


def test_chat_uses_the_llama3_format(client):
    msgs = [{"role": "system", "content": "Be brief."}, ("user", "Hi")]
    ids = client.tokenize(messages=msgs).token_ids
    assert ids[:2] == [256, 258]  # <|begin_of_text|><|start_header_id|>
    assert client.detokenize(ids, skip_special_tokens=False) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    stream = client.chat(msgs, max_new_tokens=6, ignore_eos=True, timeout=120)
    reply = stream.collect()
    assert isinstance(reply, str)
    assert stream.stats.prompt_tokens == len(ids)
    assert len(stream.tokens) == 6


def test_stop_string_ends_the_text(client):
    full = client.generate("abc", max_new_tokens=32, ignore_eos=True, timeout=120)
    text = full.collect()
    chars = [c for c in text if c != "\ufffd"]
    if len(chars) < 3:
        pytest.skip(f"the random model produced too little text: {text!r}")
    stop = text[text.index(chars[1]):][:2]
    cut = client.generate("abc", max_new_tokens=32, ignore_eos=True, stop=[stop], timeout=120)
    assert cut.collect() == text[:text.index(stop)]
    assert cut.stats.finish_reason == "stop"
    assert cut.tokens == full.tokens[:len(cut.tokens)]


def test_logprobs(client):
    stream = client.generate("x", max_new_tokens=5, logprobs=True, top_logprobs=3, ignore_eos=True, timeout=120)
    stream.collect()
    assert len(stream.logprobs) == len(stream.tokens) == 5
    for tok, lp in zip(stream.tokens, stream.logprobs):
        assert lp.chosen.token_id == tok
        assert lp.chosen.logprob <= 0
        assert [t.logprob for t in lp.top] == sorted((t.logprob for t in lp.top), reverse=True)
        assert lp.top[0].token_id == tok  # greedy


def test_text_and_ids_together_are_rejected(client):
    with pytest.raises(FusedServeError) as e:
        client.generate("hi", prompt_token_ids=[1, 2], max_new_tokens=2, timeout=60).collect()
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "exactly one of" in e.value.details
    with pytest.raises(FusedServeError) as e:
        client.detokenize([10**7])
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_tokenize_round_trip(client):
    text = "Grüße 世界 🙂 tabs\t\tspaces  <|eot_id|> 123"
    t = client.tokenize(text, add_special_tokens=False)
    assert len(t.tokens) == len(t.token_ids)
    assert t.token_ids.count(260) == 1
    assert client.detokenize(t.token_ids, skip_special_tokens=False) == text
    assert client.detokenize(t.token_ids) == text.replace("<|eot_id|>", "")
