"""A persistent on-disk cache of sentence embeddings, safe for concurrent writers.

One file per text, under a folder named by the hash of everything that changes
the vectors. Each file is written to a temporary name and renamed into place
(atomic on POSIX and Windows), so readers never see half a file and concurrent
writers of the same text simply replace one valid file with another. Each
file carries a checksum, its text's hash and its length, so an entry that was
truncated or corrupted afterwards is detected, recomputed and rewritten.
"""

import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

_MAGIC = b"SKFLEMB1"
_HEADER = struct.Struct("<8sI32s")  # magic, dimension, sha256 of the text
_DIGEST_SIZE = 16


def _text_hash(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=_DIGEST_SIZE).digest()


class EmbeddingCache:
    """Embeddings of one configuration (model, pooling, dtype, ...) under ``root``.

    Parameters
    ----------
    root : path-like
        The user's ``cache_dir``; several configurations share it.
    key : dict
        Everything that changes the vectors. Stored beside the entries as
        ``key.json`` so a folder can be traced back to its settings.
    dim : int
        Length of each vector.
    """

    def __init__(self, root: str | os.PathLike, key: dict, dim: int):
        blob = json.dumps(key, sort_keys=True).encode()
        self.folder = Path(root).expanduser() / hashlib.sha256(blob).hexdigest()[:24]
        self.key = key
        self.dim = dim
        self.n_corrupt = 0

    def _path(self, digest: bytes) -> Path:
        name = digest.hex()
        return self.folder / name[:2] / f"{name}.emb"

    def get_many(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Cached vectors of ``texts`` and a mask of which were found intact."""
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        found = np.zeros(len(texts), dtype=bool)
        for i, text in enumerate(texts):
            vector = self._read(_text_hash(text))
            if vector is not None:
                vectors[i] = vector
                found[i] = True
        return vectors, found

    def _read(self, text_digest: bytes) -> np.ndarray | None:
        try:
            data = self._path(text_digest).read_bytes()
        except FileNotFoundError:
            return None
        except OSError:
            self.n_corrupt += 1
            return None
        expected = _HEADER.size + 4 * self.dim + _DIGEST_SIZE
        body, digest = data[:-_DIGEST_SIZE], data[-_DIGEST_SIZE:]
        if len(data) != expected or _digest(body) != digest:
            self.n_corrupt += 1
            return None
        magic, dim, stored_text_digest = _HEADER.unpack_from(body)
        if magic != _MAGIC or dim != self.dim or stored_text_digest != text_digest:
            self.n_corrupt += 1
            return None
        return np.frombuffer(body, dtype="<f4", offset=_HEADER.size).copy()

    def put_many(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        """Store vectors atomically; an existing entry is replaced."""
        self._write_key()
        for text, vector in zip(texts, np.asarray(vectors, dtype="<f4")):
            text_digest = _text_hash(text)
            body = _HEADER.pack(_MAGIC, self.dim, text_digest) + vector.tobytes()
            _atomic_write(self._path(text_digest), body + _digest(body))

    def _write_key(self) -> None:
        path = self.folder / "key.json"
        if not path.exists():
            _atomic_write(path, json.dumps(self.key, indent=1, sort_keys=True).encode())


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
