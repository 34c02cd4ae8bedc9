"""A persistent on-disk cache of sentence embeddings, safe for concurrent writers.

One file per text, under a folder named by the hash of everything that changes
the vectors. Each file is written to a temporary name and renamed into place
(atomic on POSIX and Windows), so readers never see half a file and concurrent
writers of the same text simply replace one valid file with another; a writer
killed mid-write leaves only a ``.tmp-*`` file that readers never look at.
Each file carries a checksum, its text's hash and its length, so an entry that
was truncated or corrupted afterwards is detected, recomputed and rewritten.

What is not trusted, and recomputed with a warning: an entry that is not a
regular file (a folder, a symbolic link), that cannot be read, or that another
user owns (they could have planted any vector). Entries and folders are
created with the user's umask, so a team can share a cache through group
permissions; nothing is read or written through a symbolically linked
subfolder, so the cache never writes outside ``cache_dir``.
"""

import hashlib
import json
import os
import secrets
import stat
import struct
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from skflow.utils import prove_writable

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

    Attributes
    ----------
    skipped : collections.Counter
        Entries ignored on reading and writing, by reason; see `problems`.
    """

    def __init__(self, root: str | os.PathLike, key: dict, dim: int):
        blob = json.dumps(key, sort_keys=True).encode()
        self.root = Path(root).expanduser()
        self.folder = self.root / hashlib.sha256(blob).hexdigest()[:24]
        self.key = key
        self.dim = dim
        self.skipped: Counter = Counter()
        self._safe_folders: dict[Path, bool] = {}

    @property
    def n_corrupt(self) -> int:
        return self.skipped["corrupt or truncated"]

    def problems(self) -> str:
        """What was ignored, for a warning: '2 corrupt or truncated, 1 owned by another user'; '' if nothing."""
        return ", ".join(f"{n} {reason}" for reason, n in sorted(self.skipped.items()))

    def check_writable(self) -> None:
        """Create the cache folder and prove it takes files, before any work: OSError naming it if not."""
        if self.root.exists() and not self.root.is_dir():
            raise NotADirectoryError(f"cache_dir {str(self.root)!r} is a file, not a folder")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            prove_writable(self.root)
        except OSError as exc:
            raise type(exc)(f"cache_dir {str(self.root)!r} cannot be used: {exc.strerror or exc}") from None

    def _path(self, digest: bytes) -> Path:
        name = digest.hex()
        return self.folder / name[:2] / f"{name}.emb"

    def _in_cache(self, folder: Path) -> bool:
        """Whether ``folder`` and the configuration folder above it are real folders (or absent), not links."""
        if folder not in self._safe_folders:
            safe = True
            for part in (self.folder, folder):
                try:
                    safe = safe and not stat.S_ISLNK(os.lstat(part).st_mode)
                except FileNotFoundError:
                    pass
            self._safe_folders[folder] = safe
        return self._safe_folders[folder]

    def get_many(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Cached vectors of ``texts`` and a mask of which were found intact and trusted."""
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        found = np.zeros(len(texts), dtype=bool)
        for i, text in enumerate(texts):
            vector = self._read(_text_hash(text))
            if vector is not None:
                vectors[i] = vector
                found[i] = True
        return vectors, found

    def _read(self, text_digest: bytes) -> np.ndarray | None:
        path = self._path(text_digest)
        if not self._in_cache(path.parent):
            self.skipped["in a symbolically linked folder"] += 1
            return None
        data = self._read_trusted(path)
        if data is None:
            return None
        expected = _HEADER.size + 4 * self.dim + _DIGEST_SIZE
        body, digest = data[:-_DIGEST_SIZE], data[-_DIGEST_SIZE:]
        if len(data) != expected or _digest(body) != digest:
            self.skipped["corrupt or truncated"] += 1
            return None
        magic, dim, stored_text_digest = _HEADER.unpack_from(body)
        if magic != _MAGIC or dim != self.dim or stored_text_digest != text_digest:
            self.skipped["corrupt or truncated"] += 1
            return None
        return np.frombuffer(body, dtype="<f4", offset=_HEADER.size).copy()

    def _read_trusted(self, path: Path) -> bytes | None:
        """The bytes of a regular file that this user owns; None (and a reason counted) otherwise."""
        try:
            # O_NONBLOCK: a FIFO planted as an entry must not hang the reader
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.skipped["symbolic links" if stat.S_ISLNK(_lstat_mode(path)) else _unreadable(exc)] += 1
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                self.skipped["not regular files"] += 1
                return None
            if hasattr(os, "getuid") and info.st_uid != os.getuid():
                self.skipped["owned by another user"] += 1
                return None
            return os.read(fd, _HEADER.size + 4 * self.dim + _DIGEST_SIZE + 1)
        except OSError as exc:
            self.skipped[_unreadable(exc)] += 1
            return None
        finally:
            os.close(fd)

    def put_many(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        """Store vectors atomically; an existing entry is replaced. Entries that cannot be written are counted."""
        self._write_key()
        for text, vector in zip(texts, np.asarray(vectors, dtype="<f4")):
            text_digest = _text_hash(text)
            path = self._path(text_digest)
            if not self._in_cache(path.parent):
                self.skipped["not written: in a symbolically linked folder"] += 1
                continue
            body = _HEADER.pack(_MAGIC, self.dim, text_digest) + vector.tobytes()
            try:
                _atomic_write(path, body + _digest(body))
            except OSError as exc:
                self.skipped[f"not written: {exc.strerror or type(exc).__name__}"] += 1

    def _write_key(self) -> None:
        path = self.folder / "key.json"
        if self._in_cache(self.folder) and not path.exists():
            try:
                _atomic_write(path, json.dumps(self.key, indent=1, sort_keys=True).encode())
            except OSError:
                pass  # only a label for people browsing the cache


def _lstat_mode(path: Path) -> int:
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


def _unreadable(exc: OSError) -> str:
    return "not regular files" if isinstance(exc, IsADirectoryError) else "unreadable"


def _atomic_write(path: Path, data: bytes) -> None:
    """Write to a fresh temporary file (mode 0o666 less the umask) and rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{secrets.token_hex(8)}{path.suffix}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
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
