"""A ``.skops`` file's memory bounded before skops reads it: skops reads every array member whole, and numpy
allocates what a ``.npy`` header declares (a 2.5 MB file took 3.5 GB). See ``docs/serving.md``."""

import io
import json
import os
import zipfile
from math import prod

import numpy as np

from skflow.utils import MODEL_FILE_LIMIT, InvalidModelError, UnreadableFileError, read_regular_file

MIB = 2**20
SCHEMA_FLOOR, SCHEMA_RATIO = 16 * MIB, 4
TOTAL_FLOOR, TOTAL_RATIO = 64 * MIB, 32
MAX_DEPTH = 200
_HEADER_VERSIONS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def read_skops_file(path: str | os.PathLike) -> bytes:
    """The bytes of a ``.skops`` file, read once (what is checked is what is loaded), its declared sizes bounded."""
    try:
        data = read_regular_file(path, MODEL_FILE_LIMIT)
    except UnreadableFileError as exc:
        raise InvalidModelError(str(exc)) from None
    with zipfile.ZipFile(io.BytesIO(data)) as archive:  # not a zip, a missing member: zipfile's own errors
        members = {info.filename: info for info in archive.infolist()}  # the last of equal names, as zipfile reads
        schema_limit = max(SCHEMA_FLOOR, SCHEMA_RATIO * len(data))
        if members["schema.json"].file_size > schema_limit:
            raise InvalidModelError(f"schema.json declares {members['schema.json'].file_size} bytes, more than "
                                    f"{schema_limit} for a file of {len(data)}")
        # skops builds one object per __id__; a node without an int id counts on its own
        read = {(node["__id__"] if isinstance(node.get("__id__"), int) else id(node), node["file"]): node["__loader__"]
                for node in _nodes(json.loads(archive.read("schema.json")))}
        total = members["schema.json"].file_size + sum(members[name].file_size for _, name in read)
        limit = max(TOTAL_FLOOR, TOTAL_RATIO * len(data))
        for (_, name), loader in read.items():
            if total > limit:  # every declared size bounded before the next header is read
                break
            if loader in ("NdArrayNode", "SparseMatrixNode"):
                total += _check_headers(archive, members[name], sparse=loader == "SparseMatrixNode")
        if total > limit:
            raise InvalidModelError(f"the archive declares {total} bytes, more than {limit} for a file of {len(data)}")
    return data


def _nodes(schema) -> list[dict]:
    nodes, stack = [], [(schema, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidModelError(f"schema.json nests deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict) and "__loader__" in value and "file" in value:
            nodes.append(value)
        if isinstance(value, (dict, list)):
            stack.extend((child, depth + 1) for child in (value.values() if isinstance(value, dict) else value))
    return nodes


def _check_headers(archive: zipfile.ZipFile, info: zipfile.ZipInfo, sparse: bool) -> int:
    """The headers of a ``.npy`` member or a sparse ``.npz`` (streamed); returns what the ``.npz``'s arrays declare."""
    with archive.open(info) as member:
        if not sparse:
            _read_npy_header(member, info.file_size, info.filename)
            return 0
        with zipfile.ZipFile(member) as inner:
            for part in inner.infolist():
                with inner.open(part) as stream:
                    _read_npy_header(stream, part.file_size, f"{info.filename}/{part.filename}")
            return sum(part.file_size for part in inner.infolist())


def _read_npy_header(stream, size: int, name: str) -> None:
    version = np.lib.format.read_magic(stream)
    if version not in _HEADER_VERSIONS:
        raise InvalidModelError(f"array {name}: .npy format version {version} is not one skops writes")
    shape, _, dtype = _HEADER_VERSIONS[version](stream)
    declared = stream.tell() + prod(shape) * dtype.itemsize  # object arrays: numpy's allow_pickle=False refuses
    if declared != size:
        raise InvalidModelError(f"array {name}: its header declares {declared} bytes, the member {size}")
