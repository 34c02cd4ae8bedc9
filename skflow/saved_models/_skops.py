"""A ``.skops`` file checked before skops reads an array from it: declared sizes, shapes and memory.

skops reads every array member of the zip into memory while it builds its
tree, ``get_untrusted_types`` included, and numpy allocates what each
``.npy`` header declares; so a 2.5 MB file whose zip declares 1.6 GB of zeros
used to take 3.5 GB before skflow saw the flow it held. Here only the zip's
directory, ``schema.json`` and the first bytes of each member are read:

- ``schema.json`` may declare at most ``max(16 MiB, 4 x the file's size)``, and
  its nodes may nest at most ``MAX_DEPTH`` deep;
- every member that skops would read must exist, its ``.npy`` header must
  declare exactly the member's size, and all of them together with the
  schema may declare at most ``max(64 MiB, 32 x the file's size)``;
- each FlowGaussianizer's configuration is checked, then its number of
  weight arrays and sizes against the file (`skflow.flow_estimator._state.check_sizes`,
  arithmetic only), then every array's header against the shape and dtype the
  configuration gives it, the standardisation and optimiser state included.
  skops builds the first node of an ``__id__`` wherever that id appears, so
  every other node sharing an id with a node of the flow must be the same
  up to ids and array values (a genuine file serialises an object held twice
  twice, with fresh ids for its temporaries); otherwise content that was not
  checked here could stand in for the flow.
"""

import io
import json
import zipfile
from math import prod

import numpy as np

from skflow.flow_estimator import (
    array_label,
    check_config,
    check_fitted_keys,
    check_n_features_in,
    check_saved_array,
    check_sizes,
    fitted_arrays,
    state_arrays,
)
from skflow.utils import InvalidModelError

MIB = 2**20
SCHEMA_FLOOR, SCHEMA_RATIO = 16 * MIB, 4
TOTAL_FLOOR, TOTAL_RATIO = 64 * MIB, 32
MAX_DEPTH = 200
_FLOW_TYPE = ("skflow.gaussianizer", "FlowGaussianizer")
_HEADER_VERSIONS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def check_skops_archive(data: bytes) -> None:
    """Refuse, with an `InvalidModelError`, a skops file whose arrays are not what its content needs."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise InvalidModelError(f"cannot be read as a skops file (not a zip archive: {exc})") from None
    with archive:
        members = {info.filename: info for info in archive.infolist()}  # the last of equal names, as zipfile reads
        schema = _read_schema(archive, members, len(data))
        nodes = _nodes(schema)
        headers = _check_members(archive, members, nodes, len(data))
        flows = [node for node in nodes if (node.get("__module__"), node.get("__class__")) == _FLOW_TYPE]
        for node in flows:
            _check_flow(node, archive, members, headers)
        _check_aliases(flows, nodes, headers)


def _read_schema(archive: zipfile.ZipFile, members: dict, size: int):
    info = members.get("schema.json")
    if info is None:
        raise InvalidModelError("cannot be read as a skops file (no schema.json)")
    limit = max(SCHEMA_FLOOR, SCHEMA_RATIO * size)
    if info.file_size > limit:
        raise InvalidModelError(f"schema.json declares {info.file_size} bytes, more than {limit} for a file of {size}")
    try:
        return json.loads(archive.read(info))
    except (ValueError, RecursionError, zipfile.BadZipFile, OSError) as exc:
        raise InvalidModelError(f"schema.json is not valid JSON ({type(exc).__name__}: {exc})") from None


def _nodes(schema) -> list[dict]:
    """Every node of the schema (a dict with a ``__loader__``), nesting bounded."""
    nodes, stack = [], [(schema, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidModelError(f"schema.json nests deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            if "__loader__" in value:
                saved_id = value.get("__id__")
                if saved_id is not None and (not isinstance(saved_id, int) or isinstance(saved_id, bool)):
                    raise InvalidModelError(f"schema.json has an __id__ that is not an int: {saved_id!r}")
                nodes.append(value)
            stack.extend((child, depth + 1) for child in value.values())
        elif isinstance(value, list):
            stack.extend((child, depth + 1) for child in value)
    return nodes


def _check_aliases(flows: list[dict], nodes: list[dict], headers: dict) -> None:
    """Every node that shares an ``__id__`` with a node of a flow is the same, ids and array values aside."""
    flow_ids = {node["__id__"] for flow in flows for node in _nodes(flow) if "__id__" in node}
    aliases: dict[int, list[dict]] = {}
    for node in nodes:
        if node.get("__id__") in flow_ids:
            aliases.setdefault(node["__id__"], []).append(node)
    memo: dict[int, object] = {}
    for saved_id, group in aliases.items():
        first = _canonical(group[0], headers, memo)
        if any(_canonical(other, headers, memo) != first for other in group[1:]):
            raise InvalidModelError(
                f"schema.json gives another object the __id__ {saved_id} of a node of a FlowGaussianizer"
            )


def _canonical(value, headers: dict, memo: dict):
    if id(value) not in memo:
        if isinstance(value, dict):
            memo[id(value)] = tuple(sorted(
                (key, headers.get(child, child) if key == "file" else _canonical(child, headers, memo))
                for key, child in value.items() if key != "__id__"
            ))
        elif isinstance(value, list):
            memo[id(value)] = tuple(_canonical(child, headers, memo) for child in value)
        else:
            return value
    return memo[id(value)]


def _check_members(archive: zipfile.ZipFile, members: dict, nodes: list[dict], size: int) -> dict:
    """Declared sizes of every member skops would read, bounded; returns ``file -> (shape, dtype)`` of the arrays."""
    read = {}
    for node in nodes:
        name = node.get("file")
        if name is None:
            continue
        if not isinstance(name, str) or name not in members:
            raise InvalidModelError(f"schema.json names a member {name!r} that the archive does not hold")
        read[(node.get("__id__", id(node)), name)] = node
    total = members["schema.json"].file_size + sum(members[name].file_size for _, name in read)
    limit = max(TOTAL_FLOOR, TOTAL_RATIO * size)
    _check_total(total, limit, size)  # every member's declared size, before any is read
    headers = {}
    for (_, name), node in read.items():
        if node.get("__loader__") == "NdArrayNode":
            headers[name] = _npy_header(archive, members[name], name)
        elif node.get("__loader__") == "SparseMatrixNode":
            total += _npz_size(archive, members[name], name)
            _check_total(total, limit, size)
    return headers


def _check_total(total: int, limit: int, size: int) -> None:
    if total > limit:
        raise InvalidModelError(
            f"the archive declares {total} bytes of content, more than {limit} for a file of {size} bytes"
        )


def _npy_header(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> tuple[tuple, np.dtype]:
    """Shape and dtype from a ``.npy`` member's header, which must account for the member's size exactly."""
    try:
        with archive.open(info) as stream:
            return _read_npy_header(stream, info.file_size, name)
    except (ValueError, EOFError, OSError, zipfile.BadZipFile) as exc:
        raise InvalidModelError(f"array {name}: not a readable .npy header ({exc})") from None


def _read_npy_header(stream, size: int, name: str) -> tuple[tuple, np.dtype]:
    version = np.lib.format.read_magic(stream)
    if version not in _HEADER_VERSIONS:
        raise InvalidModelError(f"array {name}: .npy format version {version} is not one skops writes")
    shape, _, dtype = _HEADER_VERSIONS[version](stream)
    if dtype.hasobject:
        raise InvalidModelError(f"array {name}: holds Python objects")
    declared = stream.tell() + prod(shape) * dtype.itemsize
    if declared != size:
        raise InvalidModelError(f"array {name}: its header declares {declared} bytes, the member {size}")
    return tuple(shape), dtype


def _npz_size(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> int:
    """What a sparse matrix's ``.npz`` member (a zip inside the zip) declares, its arrays' headers checked."""
    try:
        with archive.open(info) as member, zipfile.ZipFile(member) as inner:  # streamed (seekable), never read whole
            for part in inner.infolist():
                with inner.open(part) as stream:
                    _read_npy_header(stream, part.file_size, f"{name}/{part.filename}")
            return sum(part.file_size for part in inner.infolist())
    except (ValueError, EOFError, OSError, zipfile.BadZipFile) as exc:
        raise InvalidModelError(f"sparse matrix {name}: not a readable .npz ({exc})") from None


def _check_flow(node: dict, archive: zipfile.ZipFile, members: dict, headers: dict) -> None:
    attributes = _dict_content(node.get("content"), "a FlowGaussianizer's state")
    if "flow_" not in attributes:
        return  # unfitted, or fitted attributes without weights: refused when the state is restored
    check_fitted_keys(attributes)
    config = {
        key: _plain_value(value, archive, members, f"the flow's {key}")
        for key, value in _dict_content(attributes.get("_flow_config"), "the flow's configuration").items()
    }
    check_config(config)
    weights = _dict_content(attributes["flow_"], "the flow's weights")
    shapes = {name: _array_header(value, headers, f"weight {name!r}") for name, value in weights.items()}
    check_sizes(config, sum(prod(shape) for shape, _ in shapes.values()), len(shapes))
    specs = state_arrays(config)  # enumerated only now that their number is the file's
    if set(specs) != set(shapes):
        missing, extra = sorted(set(specs) - set(shapes)), sorted(set(shapes) - set(specs))
        raise InvalidModelError(f"the weights do not fit the configuration (missing {missing[:3]}, extra {extra[:3]})")
    for name, spec in specs.items():
        check_saved_array(("flow_", name), *shapes[name], spec)
    n_features = _plain_value(attributes.get("n_features_in_"), archive, members, "n_features_in_")
    check_n_features_in(n_features, config["n_features"])
    trainer = _dict_content(attributes.get("_trainer_state"), "the optimiser state")
    for key, spec in fitted_arrays(config, n_features).items():
        value = attributes.get(key[0]) if len(key) == 1 else trainer.get(key[1])
        if value is not None:  # a missing one is refused when the state is restored; it costs no memory
            check_saved_array(key, *_array_header(value, headers, array_label(key)), spec)


def _dict_content(node, what: str) -> dict:
    if not (isinstance(node, dict) and node.get("__loader__") == "DictNode" and isinstance(node.get("content"), dict)):
        raise InvalidModelError(f"{what} is not the dict skflow writes")
    return node["content"]


def _array_header(node, headers: dict, what: str) -> tuple[tuple, np.dtype]:
    if not (isinstance(node, dict) and node.get("__loader__") == "NdArrayNode" and node.get("file") in headers):
        raise InvalidModelError(f"{what} is not a numpy array")
    return headers[node["file"]]


def _plain_value(node, archive: zipfile.ZipFile, members: dict, what: str):
    """A JSON value, or a numpy scalar (a parameter given as ``np.int64(3)``), from its node."""
    if isinstance(node, dict) and node.get("__loader__") == "JsonNode" and isinstance(node.get("content"), str):
        try:
            return json.loads(node["content"])
        except ValueError:
            raise InvalidModelError(f"{what} is not valid JSON") from None
    info = members.get(node.get("file")) if isinstance(node, dict) and node.get("__loader__") == "NdArrayNode" else None
    if info is not None and info.file_size <= 1024:
        value = np.load(io.BytesIO(archive.read(info)), allow_pickle=False)
        if value.shape == ():
            return value[()]
    raise InvalidModelError(f"{what} is not a plain value")
