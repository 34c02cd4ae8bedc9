"""The texts `BertEmbedder` takes: a 1-D sequence or a 2-D ``(n, k)`` array of valid Unicode strings."""

import numpy as np


def validate_texts(X) -> tuple[np.ndarray, tuple[int, ...]]:
    """Texts as an object array of str, and the shape of the input (1-D or 2-D)."""
    if isinstance(X, (str, bytes)):
        raise TypeError(
            "BertEmbedder expects a sequence of texts, got a single string; wrap it in a list: [text]."
        )
    if hasattr(X, "to_numpy"):  # pandas and polars Series / DataFrames
        X = X.to_numpy()
    elif not hasattr(X, "__array__") and not isinstance(X, (list, tuple)):
        try:
            X = list(X)
        except TypeError:
            raise TypeError(
                f"BertEmbedder expects a sequence of texts or an (n, k) array of texts, "
                f"got {type(X).__name__}."
            ) from None
    texts = np.asarray(X, dtype=object)
    if texts.ndim not in (1, 2):
        raise ValueError(
            "BertEmbedder takes a 1-D sequence of texts or a 2-D (n, k) array of texts "
            f"(e.g. sentence pairs); got a {texts.ndim}-D array of shape {texts.shape}."
        )
    is_text = np.frompyfunc(lambda v: isinstance(v, str), 1, 1)(texts).astype(bool)
    if not is_text.all():
        where = tuple(int(i) for i in np.argwhere(~is_text)[0])
        position = where[0] if texts.ndim == 1 else where
        value = texts[where]
        raise TypeError(
            f"BertEmbedder expects strings, but the element at position {position} is "
            f"{value!r} of type {type(value).__name__}. Drop it or replace it with a string "
            "(empty strings are valid)."
        )
    for flat_index, text in enumerate(texts.flat):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            where = np.unravel_index(flat_index, texts.shape)
            position = int(where[0]) if texts.ndim == 1 else tuple(int(i) for i in where)
            raise TypeError(
                f"BertEmbedder expects valid Unicode text, but the element at position {position} has a lone "
                f"surrogate {text[exc.start]!r} at character {exc.start}; it cannot be encoded as UTF-8. Such "
                "strings come from decoding bytes with errors='surrogateescape' or from broken UTF-16: decode "
                "the source with the right encoding, or clean the text, e.g. "
                "text.encode('utf-8', 'replace').decode('utf-8')."
            ) from None
    return texts, texts.shape
