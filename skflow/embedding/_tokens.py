"""Texts to token ids, truncated to ``max_length``, reading of a long text only what its kept tokens need.

Tokenizing a text whole costs about 60 bytes a character in Hugging Face's tokenizers (a 10 MiB text: 1.5 GB and
12 s) before truncation keeps its first ``max_length`` tokens. A long text is tokenized from a head instead: its
first ``HEAD_CHARS_PER_TOKEN * max_length + HEAD_MARGIN`` characters, four times more while the head cannot settle
what the whole text's first tokens are, up to the whole text.

A head settles them when it holds more tokens than are kept and, after the word of the first token dropped, one
more word whole (a token of a later word in the head). A fast tokenizer tokenizes each word of its pre-tokenizer
apart from the others (BPE, WordPiece and Unigram models alike), and its normalizers and pre-tokenizers look at
most a few characters ahead, so the words before that one tokenize as in the whole text: the kept tokens, and the
count of tokens beyond them, are the same. A slow (Python) tokenizer, which says nothing of its words, and one that
truncates on the left tokenize each text whole.
"""

from collections.abc import Sequence

from skflow.embedding._encoding import quiet_transformers

HEAD_CHARS_PER_TOKEN = 16  # English takes about 5 characters a token, CJK 1; indented code more
HEAD_MARGIN = 1024
HEAD_GROWTH = 4
CHECKED_AT_ONCE = 64  # heads tokenized in one call of the check: their encodings are held together


def tokenize(tokenizer, texts: Sequence[str], max_length: int) -> tuple[list[list[int]], list[int]]:
    """Token ids of each text, truncated to ``max_length``; also the indices of those truncated.

    The ids are those of the whole text tokenized then truncated, and a text is counted as truncated when its
    whole has more than ``max_length`` tokens; a long text is tokenized from a head (see the module's docstring).
    """
    with quiet_transformers():  # no "sequence longer than the maximum" warning: we count those
        heads = settled_heads(tokenizer, texts, max_length)
        full = tokenizer(heads, truncation=False, verbose=False, return_token_type_ids=False,
                         return_attention_mask=False)["input_ids"]
        long = [i for i, ids in enumerate(full) if len(ids) > max_length]
        if long:
            cut = tokenizer([heads[i] for i in long], truncation=True, max_length=max_length)["input_ids"]
            for i, ids in zip(long, cut):
                full[i] = ids
    empty = [i for i, ids in enumerate(full) if not ids]
    if empty:
        first = texts[empty[0]]  # a text of characters the tokenizer drops may be megabytes: show its head only
        shown = repr(first[:40]) + (f" and {len(first) - 40:,} more characters" if len(first) > 40 else "")
        raise ValueError(
            f"{len(empty)} of {len(full)} texts have no tokens with this tokenizer (the first: {shown}); "
            "it adds no special tokens, so an empty text leaves nothing to pool. Drop empty texts, or set a prompt."
        )
    return full, long


def settled_heads(tokenizer, texts: Sequence[str], max_length: int, first: int | None = None) -> list[str]:
    """Each text, or a head of it whose tokens, truncated to ``max_length``, are those of the whole text truncated,
    and whose count of tokens is above ``max_length`` as the whole text's is. ``first``: the first head's
    length in characters (the default: ``HEAD_CHARS_PER_TOKEN * max_length + HEAD_MARGIN``)."""
    heads = list(texts)
    if not getattr(tokenizer, "is_fast", False) or getattr(tokenizer, "truncation_side", "right") != "right":
        return heads
    n_kept = max(max_length - tokenizer.num_special_tokens_to_add(pair=False), 0)
    size = first or HEAD_CHARS_PER_TOKEN * max_length + HEAD_MARGIN
    todo = [i for i, text in enumerate(texts) if len(text) > size]
    while todo:
        unsettled = []
        for start in range(0, len(todo), CHECKED_AT_ONCE):
            group = todo[start : start + CHECKED_AT_ONCE]
            encoded = tokenizer([texts[i][:size] for i in group], add_special_tokens=False, verbose=False,
                                return_token_type_ids=False, return_attention_mask=False)
            for row, i in enumerate(group):
                if _settles(encoded.word_ids(row), n_kept):
                    heads[i] = texts[i][:size]
                else:
                    unsettled.append(i)
        size *= HEAD_GROWTH
        todo = [i for i in unsettled if len(texts[i]) > size]
    return heads


def _settles(words: list[int | None], n_kept: int) -> bool:
    """Whether a head whose tokens belong to ``words`` (their pre-tokenizer word indices) settles the whole text's
    first ``n_kept`` tokens and that it has more: a token beyond them, and a word whole after that token's."""
    if len(words) <= n_kept or words[n_kept] is None:
        return False
    return max((w for w in words[n_kept:] if w is not None), default=-1) >= words[n_kept] + 2
