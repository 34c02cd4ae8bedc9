"""A sentence-transformers folder from somebody else, checked before anything in it is read as a model.

skflow writes two modules, so the loader does not let the folder choose:
``modules.json`` must list exactly sentence-transformers' ``Transformer``
then skflow's ``FlowPooling``, each at a relative path that stays inside the
folder once links are resolved; every entry of the folder must be a file or
a folder (a FIFO would hang whoever reads it); the pooling configuration
must be one skflow writes. What is *not* checked here, on purpose, is
whether some file names code: the loader never lets transformers run any.
"""

import json
import os
import stat
from numbers import Integral
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import NamedTuple

from skflow._encoding import POOLINGS
from skflow.persistence import InvalidModelError, UntrustedTypeError

TRANSFORMER_TYPES = ("sentence_transformers.base.modules.transformer.Transformer",
                     "sentence_transformers.models.Transformer")
POOLING_TYPE = "skflow.serving.FlowPooling"
REDUCTIONS = tuple(sorted({reduction for reduction, _ in POOLINGS.values()}))
POOLING_KEYS = ("reduction", "layers", "normalize")
MODULE_KEYS = {"idx": int, "name": str, "path": str, "type": str}
JSON_LIMIT = 2**20
_NOT_OURS = "not a folder written by skflow.export_sentence_transformer"


class ExportedFolder(NamedTuple):
    root: Path  # links resolved
    transformer: Path
    pooling: Path
    pooling_config: dict


def check_folder(path: str | os.PathLike) -> ExportedFolder:
    """The two module folders of an exported model, and its pooling configuration, checked."""
    given = Path(path).expanduser()
    if not given.is_dir():
        raise InvalidModelError(f"{given}: not a folder")
    try:
        root = given.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise InvalidModelError(f"{given}: cannot be resolved ({exc})") from None
    _check_entries(root)
    if (root / "adapter_config.json").exists():  # a PEFT adapter loads its base model from wherever it says
        raise InvalidModelError(f"{root}: holds adapter_config.json (a PEFT adapter); {_NOT_OURS}")
    modules = read_json(root / "modules.json")
    if not isinstance(modules, list) or len(modules) != 2:
        raise InvalidModelError(f"{root / 'modules.json'}: must list exactly two modules (Transformer, FlowPooling)")
    for index, (module, types) in enumerate(zip(modules, (TRANSFORMER_TYPES, (POOLING_TYPE,)))):
        _check_module_entry(module, index, root / "modules.json")
        if module["type"] not in types:
            raise UntrustedTypeError(
                f"{root / 'modules.json'}: module {index} is {module['type']!r}, not {' or '.join(types)}; {_NOT_OURS}"
            )
    transformer, pooling = (_module_dir(root, module["path"]) for module in modules)
    config_file = pooling / "config.json"
    return ExportedFolder(root, transformer, pooling, check_pooling_config(read_json(config_file), config_file))


def check_pooling_config(config, where) -> dict:
    """``FlowPooling``'s saved configuration, exactly as skflow writes it (else an `InvalidModelError`)."""
    if not isinstance(config, dict) or set(config) != set(POOLING_KEYS):
        found = sorted(config) if isinstance(config, dict) else type(config).__name__
        raise InvalidModelError(f"{where}: FlowPooling's configuration must have the keys {list(POOLING_KEYS)}, "
                                f"got {found}")
    if config["reduction"] not in REDUCTIONS:
        raise InvalidModelError(f"{where}: unknown reduction {config['reduction']!r}; FlowPooling knows {REDUCTIONS}")
    layers = config["layers"]
    if layers is not None and not (
        isinstance(layers, list) and layers
        and all(isinstance(v, Integral) and not isinstance(v, bool) and v >= 0 for v in layers)
    ):
        raise InvalidModelError(
            f"{where}: layers must be null or a non-empty list of hidden_states indices (ints >= 0), got {layers!r}"
        )
    if not isinstance(config["normalize"], bool):
        raise InvalidModelError(f"{where}: normalize must be true or false, got {config['normalize']!r}")
    return dict(config)


def read_json(path: Path):
    """A small JSON file, refused if missing, not a regular file, too large or not JSON."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
        with os.fdopen(descriptor, "rb") as stream:
            info = os.fstat(descriptor)
            if not stat.S_ISREG(info.st_mode) or info.st_size > JSON_LIMIT:
                raise InvalidModelError(f"{path}: not a regular file of at most {JSON_LIMIT} bytes")
            return json.loads(stream.read(JSON_LIMIT + 1).decode("utf-8"))
    except FileNotFoundError:
        raise InvalidModelError(f"{path}: missing; {_NOT_OURS}") from None
    except (OSError, ValueError) as exc:
        if isinstance(exc, InvalidModelError):
            raise
        raise InvalidModelError(f"{path}: not readable JSON ({type(exc).__name__}: {exc})") from None


def _check_entries(root: Path) -> None:
    for folder, subfolders, files in os.walk(root):
        for name in subfolders + files:
            entry = Path(folder) / name
            try:
                mode = os.stat(entry).st_mode
            except OSError as exc:
                raise InvalidModelError(f"{entry}: cannot be read ({exc.strerror}, a broken link?)") from None
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise InvalidModelError(f"{entry}: neither a file nor a folder (a FIFO, socket or device)")


def _check_module_entry(module, index: int, where: Path) -> None:
    if not isinstance(module, dict) or set(module) != set(MODULE_KEYS):
        raise InvalidModelError(f"{where}: module {index} must have exactly the keys {list(MODULE_KEYS)}")
    for key, kind in MODULE_KEYS.items():
        if not isinstance(module[key], kind) or isinstance(module[key], bool):
            raise InvalidModelError(
                f"{where}: module {index}'s {key} must be of type {kind.__name__}, got {module[key]!r}"
            )
    if module["idx"] != index:
        raise InvalidModelError(f"{where}: module {index} has idx {module['idx']}")


def _module_dir(root: Path, relative: str) -> Path:
    """``root / relative``, refused unless it is a folder inside ``root`` (links resolved)."""
    pure = PurePosixPath(relative)
    if pure.is_absolute() or PureWindowsPath(relative).is_absolute() or PureWindowsPath(relative).drive \
            or ".." in pure.parts or "\\" in relative:
        raise InvalidModelError(f"{root / 'modules.json'}: module path {relative!r} must be relative, without '..'")
    try:
        folder = (root / relative).resolve()
    except (OSError, RuntimeError) as exc:  # a loop of links
        raise InvalidModelError(
            f"{root / 'modules.json'}: module path {relative!r} cannot be resolved ({exc})"
        ) from None
    if not folder.is_relative_to(root) or not folder.is_dir():
        raise InvalidModelError(f"{root / 'modules.json'}: module path {relative!r} leads outside the folder "
                                f"or to no folder ({folder})")
    return folder
