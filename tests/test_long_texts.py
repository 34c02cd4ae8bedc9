"""A long text is tokenized from a head (`skflow.embedding._tokens`): its ids, whether it counts as truncated, and
its vector are those of the whole text tokenized then truncated, for WordPiece (the bundled BERT tokenizer),
byte-level BPE and Unigram (sentencepiece's Metaspace) tokenizers built here offline; a 10 MiB text costs what
its head costs."""

import math
import warnings

import numpy as np
import pytest
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from skflow import BertEmbedder
from skflow.datasets import load_sts
from skflow.embedding import _tokens
from skflow.embedding._model_source import DEFAULT_MODEL, resolve_model_source
from skflow.embedding._tokens import settled_heads, tokenize

LENGTHS = (2, 3, 16, 128, 512)


def _bert():
    return AutoTokenizer.from_pretrained(resolve_model_source(DEFAULT_MODEL, None).path_or_id)


def _vocabulary() -> list[str]:
    return [w for w in _bert().get_vocab() if not w.startswith("[")]


def _byte_level_bpe():
    """GPT-2's layout (byte-level pre-tokenizer and BPE), with Qwen2's NFC normalizer and an EOS appended."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.train_from_iterator(sorted(_vocabulary())[:5000], trainers.BpeTrainer(
        vocab_size=1000, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", tokenizer.token_to_id("<|endoftext|>"))])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")


def _unigram(split: bool = True):
    """sentencepiece's layout (NFKC, runs of spaces collapsed, Metaspace, a Unigram model) from the BERT vocabulary;
    ``split=False``: the whole text one word, as Llama's legacy tokenizers."""
    pieces = list(dict.fromkeys(["<unk>", "<s>", "</s>"] + [w[2:] if w.startswith("##") else "▁" + w
                                                             for w in sorted(_vocabulary())]))
    tokenizer = Tokenizer(models.Unigram([(p, -math.log(i + 2)) for i, p in enumerate(pieces)], unk_id=0))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(split=split)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A </s>",
                                                             special_tokens=[("<s>", 1), ("</s>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def tokenizers() -> dict:
    left = _bert()
    left.truncation_side = "left"  # keeps the last tokens: tokenized whole
    return {"wordpiece": _bert(), "byte-level-bpe": _byte_level_bpe(), "unigram": _unigram(),
            "unigram-one-word": _unigram(split=False), "wordpiece-left": left}


@pytest.fixture(scope="module")
def long_texts(sts_data_home) -> dict:
    """Real long texts (STS-B sentences run together) and what breaks a guess of characters per token."""
    sentences = load_sts("stsb", split="test", data_home=sts_data_home).pairs.ravel().tolist()
    real = " ".join(sentences[:150])  # 4,700 characters
    return {
        "real": real,
        "real, one line a sentence": "\n".join(sentences[150:300]),
        "one huge word first": "a" * 8_000 + " " + real,
        "one huge word at the cut": real[:1000] + "x" * 8_000 + " " + real,
        "many spaces first": " " * 8_000 + real,
        "many spaces between": real[:700] + " " * 8_000 + real[700:],
        "only spaces": " " * 8_000,
        "whitespace and control characters": "\n\t \r\n\x00\x01" * 1_000 + real,
        "CJK": "".join(chr(0x4E00 + (i * 7919) % 20_000) for i in range(6_000)),
        "CJK and words": "".join(chr(0x4E00 + i % 500) + (" word" if i % 7 == 0 else "") for i in range(4_000)),
        "emoji": "😀👍🏽👨‍👩‍👧" * 600,
        "emoji and words": " ".join(["😀", "👍🏽 ok", "naïve", "e\u0301t\u00e9", "漢字"][i % 5] for i in range(3_000)),
        "a combining mark run": "e" + "\u0301\u0323" * 3_000 + " " + real,
        "punctuation": "!?.,;" * 1_000,
        "digits": "1234567890" * 600,
    }


@pytest.mark.slow
@pytest.mark.parametrize("head", ["default", "7 characters"])
def test_a_long_text_has_the_ids_and_the_truncation_of_the_whole_text(tokenizers, long_texts, head, monkeypatch):
    """Every text, for max_length 2 to 512: first heads of the default length (3,072 characters at max_length=128),
    or of 7 characters, which grow to settle (a head too short to settle anything: the worst guess); at 128 each
    text alone too."""
    if head != "default":
        monkeypatch.setattr(_tokens, "HEAD_CHARS_PER_TOKEN", 0)
        monkeypatch.setattr(_tokens, "HEAD_MARGIN", int(head.split()[0]))
    names, texts = list(long_texts), list(long_texts.values())
    for name, tokenizer in tokenizers.items():
        whole = tokenizer(texts)["input_ids"]
        for max_length in LENGTHS:
            expected = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
            ids, truncated = tokenize(tokenizer, texts, max_length)
            for i, text_name in enumerate(names):
                assert ids[i] == expected[i], (name, max_length, text_name)
                assert (i in truncated) == (len(whole[i]) > max_length), (name, max_length, text_name)
                if max_length == 128:
                    assert tokenize(tokenizer, [texts[i]], 128)[0] == [expected[i]], (name, text_name)


def test_heads_are_cut_where_the_tokenizer_allows_and_not_where_it_does_not(tokenizers, long_texts):
    """The cases above exercise the cut: a real text is read 2,048 + 1,024 characters far at max_length=128, one that
    starts with 8,000 spaces as far as its words; a text with less than max_length tokens, or tokenized without
    words or on the left, is read whole."""
    real = long_texts["real"]
    for name in ("wordpiece", "byte-level-bpe", "unigram"):
        assert len(settled_heads(tokenizers[name], [real], 128)[0]) == 16 * 128 + 1024, name
        # 8,000 spaces first (runs of spaces are no token: WordPiece drops them, BPE makes one word of them and
        # sentencepiece one space): a head of 3,072 characters is unsettled, one of 12,288 settles (the text has 12,700)
        assert len(settled_heads(tokenizers[name], [long_texts["many spaces first"]], 128)[0]) == 12_288, name
    for name in ("unigram-one-word", "wordpiece-left"):
        assert settled_heads(tokenizers[name], [real], 128) == [real], name
    assert settled_heads(tokenizers["wordpiece"], [long_texts["only spaces"]], 128) == [long_texts["only spaces"]]


def test_the_bundled_tokenizers_ids_of_long_texts_are_those_of_the_whole_texts(long_texts):
    """The fast loop's share of the test above: the bundled tokenizer, max_length=128, every text at once."""
    tokenizer, texts = _bert(), list(long_texts.values())
    ids, truncated = tokenize(tokenizer, texts, 128)
    assert ids == tokenizer(texts, truncation=True, max_length=128)["input_ids"]
    assert truncated == [i for i, whole in enumerate(tokenizer(texts)["input_ids"]) if len(whole) > 128]
    # not truncated: only spaces ([CLS] [SEP]), and the emoji and digits, one word each of over 100 characters: [UNK]
    assert [name for i, name in enumerate(long_texts) if i not in truncated] == ["only spaces", "emoji", "digits"]


def test_the_vectors_and_the_warning_of_long_texts_are_those_of_the_whole_texts(long_texts, monkeypatch):
    texts = [long_texts[name] for name in ("real", "one huge word at the cut", "many spaces first", "only spaces",
                                           "CJK and words", "emoji and words")]
    texts.append("A short text.")
    embedder = BertEmbedder(pooling="mean", dtype="float32", device="cpu", max_length=128)
    with pytest.warns(UserWarning, match=r"^BertEmbedder: 5 of 7 texts \(5 distinct\) are longer than max_length=128"):
        cut = embedder.transform(texts)
    monkeypatch.setattr(_tokens, "settled_heads", lambda tokenizer, texts, max_length: list(texts))
    with pytest.warns(UserWarning, match=r"^BertEmbedder: 5 of 7 texts \(5 distinct\) are longer than max_length=128"):
        whole = embedder.transform(texts)
    np.testing.assert_array_equal(cut, whole)


def _resident_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return int(next(line.split()[1] for line in status if line.startswith(field + ":")))


def test_a_10_mib_text_costs_its_head_not_its_length(long_texts):
    """10 MiB of real sentences at max_length=128: at most 100 MB above the memory before the call (peak resident
    memory, its high-water mark reset first). Tokenized whole it cost 1.5 GB and 12 s here."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:  # resets VmHWM, the peak resident memory
            clear.write("5")
    except OSError as exc:
        pytest.skip(f"the peak resident memory cannot be reset here: {exc}")
    real = long_texts["real"]
    text = (real + " ") * (10 * 2**20 // (len(real) + 1) + 1)
    embedder = BertEmbedder(pooling="mean", dtype="float32", device="cpu", max_length=128)
    expected = embedder.transform([text[:100_000]])  # the encoder loaded; the same first tokens
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    before = _resident_kib("VmRSS")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        vector = embedder.transform([text])
    peak_mb = (_resident_kib("VmHWM") - before) / 1024
    assert peak_mb <= 100, f"a 10 MiB text took {peak_mb:.0f} MB"
    assert [str(w.message) for w in seen] == [
        "BertEmbedder: 1 of 1 texts (1 distinct) are longer than max_length=128 tokens and were truncated. Raise "
        "max_length to keep more of each (this encoder reads up to 512 tokens), or split long texts into passages."]
    np.testing.assert_array_equal(vector, expected)
