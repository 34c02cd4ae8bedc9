"""Which objects under an input prefix are read: skflow's outputs as their markers say, the rest as listed.

An object store has no rename, so skflow marks a finished output with one
object written last, ``.skflow-output``, that lists its files
(:mod:`skflow.ray_jobs._remote_outputs`). A reader that lists the prefix
instead would see, after a run killed mid-write, the old output and the
new shards copied beside it, or a first output's partial shards. So every
folder under an input prefix, at any depth, that holds a marker is read as
the files the marker lists; a folder that holds only the ``.skflow-pending``
record of a write in progress (or killed) is refused. A folder inside such
an output is the output's business (its own markers are not read), and
hidden folders (a part starting with ``.`` or ``_``) are never read, so
their markers do not count either.

Names come from the store and may hold anything: messages show them with
unprintable characters escaped, so each stays one line.
"""

import json
import warnings
from concurrent.futures import ThreadPoolExecutor

from skflow.ray_jobs._uris import read_bytes
from skflow.utils import MARKER, some_names

PENDING = ".skflow-pending"


def is_hidden(name: str) -> bool:
    return name.startswith((".", "_"))


def printable(text: str) -> str:
    """``text`` with unprintable characters (a line break, a tab) escaped: a name in a one-line message."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def read_as_marked(remote, listed: list[str], error: type[Exception] = ValueError) -> list[str]:
    """The visible names of ``listed`` (relative to ``remote``) that are read, each output as its marker says.

    Refusals raise ``error``; other objects under an output are named in one warning.
    """
    visible, outputs = [], {}
    for name in listed:
        *folders, base = name.split("/")
        if any(map(is_hidden, folders)):
            continue
        if base in (MARKER, PENDING) and "" not in folders:
            outputs.setdefault(name[: -len(base)], set()).add(base)
        elif not is_hidden(base):
            visible.append(name)
    kept = _readable(remote, visible, outputs, error) if outputs else visible
    unreadable = next((name for name in kept if "" in name.split("/")), None)
    if unreadable is not None:
        raise error(f"{printable(remote.uri)}: the object '{printable(unreadable)}' has an empty part in its name "
                    "('//'), which cannot be read; rename it or name the files to read")
    return kept


def _readable(remote, visible: list[str], outputs: dict[str, set[str]], error: type[Exception]) -> list[str]:
    """``visible`` less the objects of marked folders that their markers do not list (named in one warning)."""
    # the outermost marked folders: an output inside another is the outer one's business
    owned: dict[str, list[str]] = {folder: [] for folder in outputs if not outputs.keys() & _folders_holding(folder)}
    read = set()
    for name in visible:
        owner = next((folder for folder in _folders_holding(name) if folder in owned), None)
        if owner is None:
            read.add(name)
        else:
            owned[owner].append(name)
    with ThreadPoolExecutor(max_workers=min(16, len(owned))) as pool:
        reads = {folder: pool.submit(_marker_files, remote, folder, MARKER in outputs[folder], error)
                 for folder in owned}
    strays = []
    for folder, names in owned.items():
        listed_files = reads[folder].result()
        inside = {name[len(folder):] for name in names}
        absent = sorted(listed_files - inside)
        if absent:
            raise error(f"{_uri(remote, folder)}: its {MARKER} marker lists {printable(absent[0])}, which is "
                        f"missing ({len(absent)} missing in all): the output is incomplete, or was replaced while "
                        "being read; read it again, or write it again")
        read.update(name for name in names if name[len(folder):] in listed_files)
        others = sorted(name for name in inside if name not in listed_files)
        if others:
            strays.append((folder, len(listed_files), others))
    if strays:
        warnings.warn(_strays_message(remote, strays), UserWarning, stacklevel=4)
    return [name for name in visible if name in read]


def _folders_holding(path: str) -> set[str]:
    """The folders above a name or a folder (``"a/b/c.txt"`` or ``"a/b/c/"``: ``""``, ``"a/"``, ``"a/b/"``)."""
    if not path:
        return set()
    parts = path.rstrip("/").split("/")[:-1]
    return {"".join(part + "/" for part in parts[:depth]) for depth in range(len(parts) + 1)}


def _uri(remote, folder: str) -> str:
    return printable(remote.child(folder[:-1]).uri if folder else remote.uri)


def _marker_files(remote, folder: str, marked: bool, error: type[Exception]) -> set[str]:
    """The files that the marker of ``folder`` lists; refused when it is damaged or absent (a write under way)."""
    where = _uri(remote, folder)
    if not marked:
        raise error(f"{where}: an skflow output whose writing is under way or was interrupted (it holds "
                    f"{PENDING} but no {MARKER} marker); write it again with --overwrite, or wait for it")
    try:
        return recorded_files(remote.child(folder + MARKER))
    except (OSError, ValueError):
        raise error(f"{where}: its {MARKER} marker is damaged, so which of its objects form the output is "
                    "unknown; write the output again (or delete the marker to read every object)") from None


def recorded_files(record) -> set[str]:
    """The files that a marker or pending record (a :class:`Remote`) lists; OSError or ValueError if it cannot say.

    Only names that skflow could have written count: no hidden or empty
    part (so never a marker itself), nothing unprintable.
    """
    try:
        files = json.loads(read_bytes(record).decode("utf-8"))["files"]
    except (KeyError, TypeError, RecursionError):
        raise ValueError(f"{record.uri}: not a record of files") from None
    if not isinstance(files, list) or not all(map(_written_name, files)):
        raise ValueError(f"{record.uri}: not a record of files")
    return set(files)


def _written_name(name) -> bool:
    return isinstance(name, str) and name.isprintable() and all(part and not is_hidden(part)
                                                                for part in name.split("/"))


def _strays_message(remote, strays: list[tuple[str, int, list[str]]]) -> str:
    if len(strays) == 1:
        folder, count, others = strays[0]
        files = f"{count} file" + "s" * (count != 1)
        return (f"{_uri(remote, folder)}: read as the skflow output that its {MARKER} marker lists ({files}); "
                f"{len(others)} other object(s) under it are not part of it and are not read: "
                f"{printable(some_names(others))}")
    folders = [f"{folder[:-1] or '.'} ({some_names(others, 3)})" for folder, _, others in strays]
    return (f"{printable(remote.uri)}: {len(strays)} skflow outputs under it hold objects their {MARKER} markers do "
            f"not list, which are not read: {printable(some_names(folders))}")
