"""Small tokenizers trained offline with Hugging Face `tokenizers`, in the
layouts of the checkpoint families fusedserve's C++ tokenizer supports, and
the stress corpus they are compared on (tests/python/test_tokenizer.py,
bench/tokenizer_bench.py).

Families (each written as tokenizer.json + tokenizer_config.json):
  llama3      byte-level BPE, Llama-3's split pattern, ignore_merges, Llama-3
              special tokens, TemplateProcessing adding <|begin_of_text|>
  qwen2       the same vocabulary with Qwen2's pattern and NFC normalizer
  gpt2        byte-level BPE with the ByteLevel(use_regex) GPT-2 pattern
  llama2      SentencePiece-style BPE: Prepend/Replace normalizer, byte
              fallback (<0xNN> ids 3..258), <unk>/<s>/</s>, Strip decoder
  mistral     the llama2 vocabulary with a Metaspace(prepend_scheme first)
              pre-tokenizer instead of the normalizer
  metaspace   Metaspace(always, split) pre-tokenizer and Metaspace decoder
and VARIANTS of these with other options (prefix space, Removed splits,
NFKC, lstrip/rstrip and normalized added tokens, Metaspace never/split).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

# Text the tokenizers are trained on: enough variety that merges cover words,
# accents, CJK, digits and whitespace runs, while rare characters (most
# emoji, Hindi, Arabic) stay outside the SentencePiece alphabet and go
# through byte fallback.
TRAIN_TEXT = """The quick brown fox jumps over the lazy dog. It's what we've said: they'll say you'd go, I'm here.
Hello world! Hello, world. HELLO WORLD. hello   world\tTabs\t\tand  spaces    here.
Numbers: 1234567890, 3.14159, 2024-06-01, 1,000,000 and 42 and 007.
Café, naïve, résumé, façade, jalapeño, Ångström, Über, straße.
中文文本测试，这是一个句子。日本語のテキストです。한국어 텍스트입니다.
def main():\n    return {"key": [1, 2, 3]}  # comment\n\nif x == y:\n\tprint(x)
Пример русского текста. Ελληνικά κείμενα. עברית. العربية نص. हिन्दी पाठ।
""" * 3

STRESS = [
    "",
    " ",
    "  ",
    "\n",
    "\n\n\n",
    "\t",
    "Hello world",
    " Hello world",
    "Hello  world   with    spaces",
    "   leading and trailing   ",
    "tabs\tand\t\ttabs\t",
    "line1\nline2\r\nline3\n\n\nline4\r\r",
    "trailing newline\n",
    "It's I'm you're we've they'll he'd IT'S I'M YOU'RE WE'VE THEY'LL HE'D 'S 'LL 'Re",
    "don't won't can't shan't o'clock rock'n'roll 'quoted'",
    "Digits 1 12 123 1234 12345 123456 3.14159 1,000,000 0x1F 2024-06-01",
    "ÀÉÎÕÜ àéîõü ñ ç ß æ ø å Œ",
    "e\u0301 cafe\u0301 A\u030a n\u0303",  # combining marks (NFC changes them)
    "中文文本测试，这是一个句子。",
    "日本語のテキストです。カタカナ ひらがな 漢字",
    "한국어 텍스트입니다",
    "العربية نص مع أرقام ١٢٣ وعلامات؟",
    "हिन्दी पाठ। नमस्ते दुनिया",
    "Ελληνικά κείμενα και Кириллица",
    "emoji 😀😃😄 👍🏽 ❤️ 🇫🇷 🏳️‍🌈",
    "ZWJ family 👨‍👩‍👧‍👦 and 👩‍💻 and 🧑🏿‍🚀",
    "math ∑∫∂√∞ ≤≥≠ → ⇒ ∀∃",
    "symbols !@#$%^&*()_+-=[]{}|;':\",./<>?`~",
    "code:\n    def f(x):\n        return x**2  # square\n\tif a != b:\n",
    "mixed中文and English混合text 123数字",
    "<|begin_of_text|>Hello<|eot_id|>",
    "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "text <|eot_id|> more <|end_of_text|>",
    "<|begin_of_text|><|begin_of_text|>",
    "not special <|eot_id| <|eot_id|x",
    "<s>Hello</s> world <unk> <s> after",
    "<0x41> literal byte token text",
    "<|endoftext|>GPT-2 end<|endoftext|>",
    "\u00a0nbsp\u00a0\u2003em space\u3000ideographic space\u2028line sep",
    "zero\u200bwidth\u200cnon\u200djoiner\ufeffbom",
    "\u180emongolian vowel separator",
    "replacement char \ufffd and private use \ue000 and astral \U0001d400 \U00010348",
    "a" * 300,
    "ab " * 200,
    "😀" * 50,
    " " * 40 + "x",
    "\n" * 30,
    "x\n \n \n y",
    "end with spaces     ",
    "end with tabs\t\t",
    # case folding inside (?i:...), Unicode line/paragraph separators,
    # format characters, digits of other scripts, tags, plane ends
    "it'ſ we'LL x'ﬀ İstanbul'S \u212a'd ǅ'M",
    "\u0085x\u0085 \u0085 a\u2029b\u000bc\u000c",
    "\u00ad\u200e\u061c\u2066x",
    "١٢٣٤٥ ۱۲۳ ߀߁ ௧௨௩ 𝟘𝟙𝟚 ⅠⅡⅢ ½¾ ①②",
    "ǅǈ ᾈ ﬁ Ⅸ \U000e0041\U000e0042 tags \ud7ff\ue000\U0010ffff",
]


def _write(dirpath: Path, tok_json: dict, config: dict) -> Path:
    dirpath.mkdir(parents=True, exist_ok=True)
    (dirpath / "tokenizer.json").write_text(json.dumps(tok_json, ensure_ascii=False), encoding="utf-8")
    (dirpath / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return dirpath


def _byte_level_base(vocab_size: int = 3000) -> dict:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=LLAMA3_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TRAIN_TEXT.splitlines(keepends=True), trainer)
    return json.loads(tok.to_str())


def _llama3_post(j: dict) -> dict:
    bos = next(t["id"] for t in j["added_tokens"] if t["content"] == "<|begin_of_text|>")
    return {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                  {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                  {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos],
                                                  "tokens": ["<|begin_of_text|>"]}}}]}


def _sp_base(vocab_size: int = 1200) -> dict:
    """SentencePiece-style BPE in Llama-2's layout: <unk> <s> </s>, then the
    256 <0xNN> byte tokens, then the trained pieces."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  limit_alphabet=120, show_progress=False)
    tok.train_from_iterator(TRAIN_TEXT.splitlines(keepends=True), trainer)
    j = json.loads(tok.to_str())
    trained = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab: Dict[str, int] = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in trained:
        if piece not in vocab:
            vocab[piece] = len(vocab)
    j["model"]["vocab"] = vocab
    for t in j["added_tokens"]:
        t["id"] = vocab[t["content"]]
        t["normalized"] = False
    j["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    return j


def build_all(root: Path) -> Dict[str, Path]:
    """Writes every family under root/<name>/; returns name -> directory."""
    out: Dict[str, Path] = {}
    bl = _byte_level_base()

    llama3 = json.loads(json.dumps(bl))
    llama3["post_processor"] = _llama3_post(llama3)
    out["llama3"] = _write(root / "llama3", llama3, {
        "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
        "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"})

    qwen2 = json.loads(json.dumps(bl))
    qwen2["normalizer"] = {"type": "NFC"}
    qwen2["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN2_PATTERN
    qwen2["model"]["ignore_merges"] = False
    qwen2["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                               "use_regex": False}
    out["qwen2"] = _write(root / "qwen2", qwen2, {"eos_token": "<|end_of_text|>"})

    gpt2 = json.loads(json.dumps(bl))
    gpt2["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                             "use_regex": True}
    gpt2["model"]["ignore_merges"] = False
    # GPT-2's merges file spells merges as "a b" strings.
    gpt2["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in gpt2["model"]["merges"]]
    gpt2["added_tokens"] = [dict(t, content="<|endoftext|>") if t["content"] == "<|end_of_text|>" else t
                            for t in gpt2["added_tokens"]]
    gpt2["model"]["vocab"]["<|endoftext|>"] = gpt2["model"]["vocab"].pop("<|end_of_text|>")
    gpt2["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                              "use_regex": True}
    out["gpt2"] = _write(root / "gpt2", gpt2, {"eos_token": "<|endoftext|>"})

    sp = _sp_base()
    out["llama2"] = _write(root / "llama2", sp, {"bos_token": "<s>", "eos_token": "</s>"})

    mistral = json.loads(json.dumps(sp))
    mistral["normalizer"] = None
    mistral["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                                "split": False}
    out["mistral"] = _write(root / "mistral", mistral, {"bos_token": "<s>", "eos_token": "</s>"})

    meta = json.loads(json.dumps(sp))
    meta["normalizer"] = None
    meta["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    meta["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    out["metaspace"] = _write(root / "metaspace", meta, {"bos_token": "<s>", "eos_token": "</s>"})

    # Options the real checkpoints use less often, each on one of the above.
    for name, (base, edit) in VARIANTS.items():
        j = json.loads((out[base] / "tokenizer.json").read_text(encoding="utf-8"))
        edit(j)
        out[name] = _write(root / name, j, json.loads((out[base] / "tokenizer_config.json").read_text()))
    return out


def _edit_added(j: dict, content: str, **fields) -> None:
    next(t for t in j["added_tokens"] if t["content"] == content).update(fields)


VARIANTS = {
    "gpt2-prefix-space": ("gpt2", lambda j: j["pre_tokenizer"].update(add_prefix_space=True)),
    "llama3-split-removed": ("llama3", lambda j: j["pre_tokenizer"]["pretokenizers"][0].update(behavior="Removed")),
    "llama3-nfkc": ("llama3", lambda j: j.update(normalizer={"type": "NFKC"})),
    "llama3-added-strip": ("llama3", lambda j: (
        _edit_added(j, "<|eot_id|>", lstrip=True, rstrip=True),
        _edit_added(j, "<|begin_of_text|>", special=False, normalized=True))),
    "llama2-added-strip": ("llama2", lambda j: (_edit_added(j, "</s>", lstrip=True), _edit_added(j, "<s>", rstrip=True))),
    "mistral-never": ("mistral", lambda j: j["pre_tokenizer"].update(prepend_scheme="never")),
    "mistral-split": ("mistral", lambda j: j["pre_tokenizer"].update(split=True)),
    "mistral-nfc": ("mistral", lambda j: j.update(normalizer={"type": "NFC"})),
    "llama2-bos-eos": ("llama2", lambda j: (
        j["post_processor"]["single"].append({"SpecialToken": {"id": "</s>", "type_id": 0}}),
        j["post_processor"]["special_tokens"].update({"</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}))),
}


def tiktoken_encoding(path: Path, pattern: str = LLAMA3_PATTERN):
    """A tiktoken Encoding over a byte-level tokenizer.json's vocabulary
    (rank = id; merges follow the ids' order in a trained BPE) and its
    split pattern, built locally (tiktoken downloads its own files)."""
    import tiktoken

    j = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
    byte_of = {}
    n = 0
    for b in range(256):
        printable = ord("!") <= b <= ord("~") or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF
        byte_of[chr(b) if printable else chr(256 + n)] = b
        n += 0 if printable else 1
    special = {t["content"]: t["id"] for t in j["added_tokens"]}
    ranks = {}
    for tok, i in j["model"]["vocab"].items():
        if tok in special or not all(c in byte_of for c in tok):
            continue
        ranks[bytes(byte_of[c] for c in tok)] = i
    return tiktoken.Encoding(name=f"local-{path.name}", pat_str=pattern, mergeable_ranks=ranks,
                             special_tokens=special)


def hf_tokenizer(path: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path / "tokenizer.json"))


if __name__ == "__main__":  # python tokenizer_fixtures.py OUT_DIR
    import sys

    for name, p in build_all(Path(sys.argv[1])).items():
        print(name, p)
