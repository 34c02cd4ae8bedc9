"""Names skflow is given (paths, folders, columns): one check for all, before any work, and how one-line messages
show them. Arrow, Ray and JSON carry names as UTF-8 text, and a message naming one must stay one line. Numbers
written as text (an option, a score in a file, a port) are read in ASCII only."""

import os
import unicodedata

__all__ = ["EXTRAS", "ascii_number", "check_given_name", "check_name", "install_hint", "name_problem", "printable",
           "some_names"]

# The packages of each optional extra, as pyproject.toml declares them (tests/test_newcomer.py compares). A hint
# names the packages themselves: "skflow" on PyPI is another project's name.
EXTRAS = {
    "ray": ("ray[data]>=2.60", "fsspec[http]"),
    "serve": ("sentence-transformers>=6.2", "onnx>=1.16", "onnxscript>=0.5", "onnxruntime>=1.18"),
    "mteb": ("mteb>=2.26",),
    "engines": ("faiss-cpu>=1.15", "usearch>=2.26"),
}


def install_hint(extra: str) -> str:
    """What to run for an optional extra: ``pip install "faiss-cpu>=1.15" "usearch>=2.26" (skflow's engines extra)``."""
    return "pip install " + " ".join(f'"{package}"' for package in EXTRAS[extra]) + f" (skflow's {extra} extra)"


def printable(text: str) -> str:
    """``text`` with unprintable characters (a line break, a tab, a byte that was not UTF-8) escaped."""
    return "".join(c if c.isprintable() else f"\\x{ord(c) - 0xDC00:02x}" if "\udc80" <= c <= "\udcff" else
                   c.encode("unicode_escape").decode("ascii") for c in text)


def _problem(text: str) -> str | None:
    if any("\ud800" <= c <= "\udfff" for c in text):  # a surrogate: no UTF-8 form
        return "must be valid UTF-8"
    if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") and c != "\t" for c in text):  # a tab is carried
        return "must not hold a line break or another control character"


def check_name(shown: str, error: type[Exception] = ValueError) -> None:
    """Refuse a file name that is not UTF-8, or holds a line break or another control character."""
    if problem := _problem(shown):
        raise error(f"{printable(shown)}: the file name {problem}; rename the file")


def name_problem(value, *, file: bool = False) -> str | None:
    """What is wrong with a name skflow is given (a path, a folder, a column), as ``must ..., got 'NAME'`` (escaped),
    or None: empty, not UTF-8, a control character; with ``file``, also a folder's name (``.``, ``..``, ``a/``)."""
    if not isinstance(value, (str, os.PathLike)):
        return f"must be a path or a name, got {type(value).__name__}"
    text = os.fsdecode(os.fspath(value))
    problem = "must not be empty" if not text.strip() else _problem(text)
    if not problem and file and (os.path.basename(text) in ("", ".", "..") or text.endswith(("/", os.sep))):
        problem = "must name a file, not a folder"
    return problem and f"{problem}, got '{printable(text)}'"


def check_given_name(option: str, value, error: type[Exception] = ValueError, *, file: bool = False) -> None:
    """Refuse, as ``error`` in one line naming ``option`` and the value, a name :func:`name_problem` finds wrong."""
    if problem := name_problem(value, file=file):
        raise error(f"{option} {problem}")


def some_names(names: list[str], limit: int = 5) -> str:
    """The first ``limit`` of ``names``, then how many more: a list in a one-line message."""
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def ascii_number(text: str, kind: type[int] | type[float] = int, *, digits: bool = False) -> int | float | None:
    """``kind(text)`` where ``text`` is ASCII that ``kind`` reads, else None: ``int()`` and ``float()`` also read the
    digits of other scripts ('٣', '３'), which no number skflow is given may be written in. What they read in ASCII
    stays theirs ('+1', ' 1', '1_000'; '1e3', 'nan' for a float); ``digits``: 0-9 only, no sign, space or '_' (a
    count, a port). ``int`` refuses more than 4300 digits; ``float`` reads any length."""
    if not text.isascii() or (digits and not text.isdigit()):  # isdigit of ASCII text: 0-9 only, at least one
        return None
    try:
        return kind(text)
    except ValueError:
        return None
