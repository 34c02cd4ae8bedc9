"""A ``.skops`` file's memory bounded before skops reads an array from it: declared sizes against the file's.

skops reads every array member whole, and numpy allocates what a ``.npy`` header declares (a 2.5 MB file took
3.5 GB). Only the zip's directory, ``schema.json`` and members' first bytes are read here (``docs/serving.md``).
"""

import io
import json
import os
import stat
import zipfile
from math import prod

import numpy as np

from skflow.utils import InvalidModelError

MIB = 2**20
SCHEMA_FLOOR, SCHEMA_RATIO = 16 * MIB, 4
TOTAL_FLOOR, TOTAL_RATIO = 64 * MIB, 32
MAX_DEPTH = 200
_HEADER_VERSIONS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def read_skops_file(path: str | os.PathLike) -> bytes:
    """The bytes of a ``.skops`` file, read once (what is checked is what is loaded), its declared sizes bounded:
    an `InvalidModelError` naming no path (zipfile's, json's and numpy's own errors where it cannot be read)."""
    data = read_regular_file(path)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:  # not a zip, damaged: zipfile's own errors
        members = {info.filename: info for info in archive.infolist()}  # the last of equal names, as zipfile reads
        schema = _read_schema(archive, members, len(data))
        _check_members(archive, members, _nodes(schema), len(data))
    return data


def read_regular_file(path: str | os.PathLike, limit: int | None = None) -> bytes:
    """The bytes of a regular file (of at most ``limit``), read once; else an `InvalidModelError` naming no path.
    A FIFO or device is refused unread (opening a FIFO would block until a writer came)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(descriptor, "rb") as stream:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or (limit is not None and info.st_size > limit):
            raise InvalidModelError("not a regular file" + ("" if limit is None else f" of at most {limit} bytes"))
        return stream.read(-1 if limit is None else limit + 1)


def _read_schema(archive: zipfile.ZipFile, members: dict, size: int):
    info = members["schema.json"]
    limit = max(SCHEMA_FLOOR, SCHEMA_RATIO * size)
    if info.file_size > limit:
        raise InvalidModelError(f"schema.json declares {info.file_size} bytes, more than {limit} for a file of {size}")
    return json.loads(archive.read(info))


def _nodes(schema) -> list[dict]:
    """Every node of the schema (a dict with a ``__loader__``), nesting bounded."""
    nodes, stack = [], [(schema, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidModelError(f"schema.json nests deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            if "__loader__" in value:
                nodes.append(value)
            stack.extend((child, depth + 1) for child in value.values())
        elif isinstance(value, list):
            stack.extend((child, depth + 1) for child in value)
    return nodes


def _check_members(archive: zipfile.ZipFile, members: dict, nodes: list[dict], size: int) -> None:
    """Declared sizes of every member skops would read, bounded; the arrays' headers checked against them."""
    read = {}
    for node in nodes:
        name = node.get("file")
        if name is None:
            continue
        if not isinstance(name, str) or name not in members:
            raise InvalidModelError(f"schema.json names a member {name!r} that the archive does not hold")
        saved_id = node.get("__id__")  # skops builds one object per id: nodes without an int id count each
        read[(saved_id if isinstance(saved_id, int) else id(node), name)] = node["__loader__"]
    total = members["schema.json"].file_size + sum(members[name].file_size for _, name in read)
    limit = max(TOTAL_FLOOR, TOTAL_RATIO * size)
    _check_total(total, limit, size)  # every member's declared size, before any is read
    for (_, name), loader in read.items():
        if loader in ("NdArrayNode", "SparseMatrixNode"):
            total += _check_headers(archive, members[name], name, sparse=loader == "SparseMatrixNode")
            _check_total(total, limit, size)


def _check_total(total: int, limit: int, size: int) -> None:
    if total > limit:
        raise InvalidModelError(f"the archive declares {total} bytes, more than {limit} for a file of {size}")


def _check_headers(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, sparse: bool) -> int:
    """A ``.npy`` member's header, or those of a sparse matrix's ``.npz`` (a zip in the zip, streamed, never read
    whole); returns what the ``.npz``'s arrays declare besides the member (0 for a ``.npy``)."""
    with archive.open(info) as member:
        if not sparse:
            _read_npy_header(member, info.file_size, name)
            return 0
        with zipfile.ZipFile(member) as inner:
            for part in inner.infolist():
                with inner.open(part) as stream:
                    _read_npy_header(stream, part.file_size, f"{name}/{part.filename}")
            return sum(part.file_size for part in inner.infolist())


def _read_npy_header(stream, size: int, name: str) -> None:
    version = np.lib.format.read_magic(stream)
    if version not in _HEADER_VERSIONS:
        raise InvalidModelError(f"array {name}: .npy format version {version} is not one skops writes")
    shape, _, dtype = _HEADER_VERSIONS[version](stream)
    if dtype.hasobject:
        raise InvalidModelError(f"array {name}: holds Python objects")
    declared = stream.tell() + prod(shape) * dtype.itemsize
    if declared != size:
        raise InvalidModelError(f"array {name}: its header declares {declared} bytes, the member {size}")
