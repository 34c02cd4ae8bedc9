"""Names skflow is given (paths, folders, columns): one check for all, and how one-line messages show them.

A name is refused when it is empty, is not UTF-8 (a byte ``os.fsdecode``
could not decode reaches Python as a lone surrogate) or holds a line break or
another control character: Arrow, Ray and JSON carry names as UTF-8 text, and
a message naming it must stay one line. The check runs before any work.
"""

import os
import unicodedata


def printable(text: str) -> str:
    """``text`` with unprintable characters (a line break, a tab, a byte that was not UTF-8) escaped: a name in a
    one-line message."""
    return "".join(c if c.isprintable() else f"\\x{ord(c) - 0xDC00:02x}" if _undecoded(c) else
                   c.encode("unicode_escape").decode("ascii") for c in text)


def _undecoded(c: str) -> bool:
    return "\udc80" <= c <= "\udcff"  # a byte that os.fsdecode could not decode


def _not_utf8(text: str) -> bool:
    return any("\ud800" <= c <= "\udfff" for c in text)  # a surrogate: no UTF-8 form


def has_control_characters(text: str) -> bool:
    """Whether ``text`` holds a line break (``\\n``, ``\\r``, U+2028, ...) or another control character but a tab
    (a tab is carried as it is, and shown escaped)."""
    return any(unicodedata.category(c) in ("Cc", "Zl", "Zp") and c != "\t" for c in text)


def check_name(shown: str, error: type[Exception] = ValueError) -> None:
    """Refuse a file name that is not UTF-8, or holds a line break or another control character.

    Arrow and Ray carry paths as UTF-8 text: such a name would fail inside the
    job, or reach its messages mangled.
    """
    if _not_utf8(shown):
        raise error(f"{printable(shown)}: the file name is not valid UTF-8; rename the file")
    if has_control_characters(shown):
        raise error(f"{printable(shown)}: the file name holds a line break or another control character; rename "
                    "the file")


def name_problem(value, *, file: bool = False) -> str | None:
    """What is wrong with a name skflow is given (a path, a folder, a column), as ``must ...``; None if nothing.

    Empty (or blank), not UTF-8, or holding a line break or another control
    character; with ``file``, also ``.``, ``..`` or a name ending in a
    separator (a folder's name). The value is shown escaped (:func:`printable`).
    """
    if not isinstance(value, (str, os.PathLike)):
        return f"must be a path or a name, got {type(value).__name__}"
    text = os.fspath(value)
    text = os.fsdecode(text) if isinstance(text, bytes) else text
    shown = f"'{printable(text)}'"
    if not text.strip():
        return f"must not be empty, got {shown}"
    if _not_utf8(text):
        return f"must be valid UTF-8, got {shown}"
    if has_control_characters(text):
        return f"must not hold a line break or another control character, got {shown}"
    if file and (os.path.basename(text) in ("", ".", "..") or text.endswith(("/", os.sep))):
        return f"must name a file, not a folder, got {shown}"
    return None


def check_given_name(option: str, value, error: type[Exception] = ValueError, *, file: bool = False) -> None:
    """Refuse, as ``error`` in one line naming ``option`` and the value, a name that :func:`name_problem` finds
    wrong: checked before any work, so that nothing is written."""
    problem = name_problem(value, file=file)
    if problem is not None:
        raise error(f"{option} {problem}")
