"""A persistent on-disk cache of sentence embeddings: one SQLite file per configuration, safe for concurrent writers.

Under ``cache_dir``, each configuration (everything that changes the vectors)
has a folder named by the hash of its settings, holding ``key.json`` (the
settings, for people) and ``embeddings.sqlite3``: one row per text, keyed by
the text's SHA-256, in SQLite's write-ahead-log mode. Several processes read
and write it at once: writers queue on SQLite's lock with a busy timeout,
readers never wait. Rows are written in transactions: a writer killed at any
instant leaves each one whole or absent. Each row carries its text's full hash
and a checksum of hash and vector: a damaged row is detected, recomputed and
rewritten. Vectors come back bit for bit (little-endian float32).

Each store is bound to its configuration: it holds the SHA-256 of the key
(table ``configuration``), checked at every opening, so a store copied or moved
into another configuration's folder is never served there.

Not trusted, and recomputed with a warning: a store (or its ``-wal``, ``-shm``
or ``-journal`` file) that is a symbolic or hard link, not a regular file, not
a database, damaged, another program's database, of another format (stores of
format 1 were not bound), or made for another configuration; such a file is never
modified or deleted: the warning says to delete it. A store owned by another
user (who could have planted any vector) is never read: this user keeps its
own beside it. Nothing goes through a symbolically linked configuration folder.
The store has the user's umask, and SQLite gives its ``-wal`` and ``-shm``
files the store's mode. Failed writes (a full disk) are counted, not raised.
Folders of the old one-file-per-text layout are not read: a one-line
``UserWarning`` per folder and process says so and how to free their space.
"""

import contextlib
import hashlib
import json
import os
import sqlite3
import stat
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np

from skflow.embedding._cache_legacy import notice_legacy_layout
from skflow.utils import write_text_atomically

STORE_NAME = "embeddings.sqlite3"
_SIDE_FILES = ("-wal", "-shm", "-journal")
_APPLICATION_ID = 0x534B4645  # "SKFE" in the database header: this file is an skflow embedding store
_FORMAT = 2  # PRAGMA user_version; 2: the store holds the hash of its configuration's key
_PAGE_SIZE = 32768  # 21 rows of 384 float32 per page, 97% full (4 KiB pages: 2 rows, 75%); see benchmarks
_BUSY_TIMEOUT_S = 300.0  # in all, for one statement: SQLite waits 30 s at a time, _retry tries again
_READ_BATCH = 500  # under SQLite's 999 bound variables of old versions
_WRITE_BATCH = 2048  # rows per transaction: other writers get their turn between them
_COLUMNS = [("prefix", "INTEGER"), ("text_hash", "BLOB"), ("vector", "BLOB"), ("checksum", "BLOB")]
_FIELDS = "prefix, text_hash, vector, checksum"
# rows are appended in write order, found by the index of prefixes (keyed by hash: 7x slower writes at 100,000)
_SCHEMA = (
    "CREATE TABLE embeddings (prefix INTEGER NOT NULL UNIQUE, text_hash BLOB NOT NULL, "
    "vector BLOB NOT NULL, checksum BLOB NOT NULL)"
)
_BINDING = "CREATE TABLE configuration (key_sha256 TEXT NOT NULL)"  # one row: the key this store was made for
_T = TypeVar("_T")


class _StoreError(Exception):
    """The store cannot be used at all (not a file of ours, a link, another user's): its reason, for the warning."""


def _text_hash(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def _row_id(text_hash: bytes) -> int:
    """The key of a text's row: the first 8 bytes of its hash, as a 64-bit integer."""
    return int.from_bytes(text_hash[:8], "little", signed=True)


def _digest(text_hash: bytes, vector: bytes) -> bytes:
    return hashlib.blake2b(text_hash + vector, digest_size=16).digest()


def _is_busy(exc: sqlite3.Error) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))


def _retry(operation: Callable[[], _T]) -> _T:
    """Run ``operation``, again while SQLite says the store is busy (past its own busy timeout), for a while."""
    deadline = time.monotonic() + _BUSY_TIMEOUT_S
    delay = 0.01
    while True:
        try:
            return operation()
        except sqlite3.Error as exc:
            if not _is_busy(exc) or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(2 * delay, 0.5)


class EmbeddingCache:
    """Embeddings of one configuration (model, pooling, dtype, ...) under ``root``.

    Parameters
    ----------
    root : path-like
        The user's ``cache_dir``; several configurations share it.
    key : dict
        Everything that changes the vectors. Its hash names the
        configuration's folder; it is stored there as ``key.json`` so a folder
        can be traced back to its settings.
    dim : int
        Length of each vector.

    Attributes
    ----------
    folder : pathlib.Path
        The configuration's folder.
    path : pathlib.Path
        The store, ``folder / "embeddings.sqlite3"`` (``embeddings-uid<uid>.sqlite3`` if that is another's).
    skipped : collections.Counter
        Texts whose entry was ignored on reading or not written, by reason;
        see `problems`.

    Notes
    -----
    No connection is held between calls (each `get_many` and `put_many` opens
    the store and closes it): threads may share an instance, and so may both
    sides of a ``fork``.
    """

    def __init__(self, root: str | os.PathLike, key: dict, dim: int):
        self.key_sha256 = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
        self.root = Path(root).expanduser()
        self.folder = self.root / self.key_sha256[:24]
        self.path = self.folder / STORE_NAME
        self.key = key
        self.dim = dim
        self.skipped: Counter = Counter()

    @property
    def n_corrupt(self) -> int:
        """Entries found damaged (a wrong checksum, length or text hash) and ignored."""
        return self.skipped["corrupt or truncated"]

    def problems(self) -> str:
        """What was ignored, for a warning: '2 corrupt or truncated, 4 not written: ...'; '' if nothing."""
        return ", ".join(f"{n} {reason}" for reason, n in sorted(self.skipped.items()))

    def check_writable(self) -> None:
        """Create the cache folder and prove it takes files, before any work: OSError naming it if not."""
        if self.root.exists() and not self.root.is_dir():
            raise NotADirectoryError(f"cache_dir {str(self.root)!r} is a file, not a folder")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=self.root).close()
        except OSError as exc:
            raise type(exc)(f"cache_dir {str(self.root)!r} cannot be used: {exc.strerror or exc}") from None

    # ------------------------------------------------------------------ reading
    def get_many(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Cached vectors of ``texts`` and a mask of which were found intact and trusted.

        Parameters
        ----------
        texts : sequence of str

        Returns
        -------
        vectors : ndarray of shape (len(texts), dim), float32
            Zero where not found.
        found : ndarray of shape (len(texts),), bool
        """
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        found = np.zeros(len(texts), dtype=bool)
        if not len(texts):
            return vectors, found
        notice_legacy_layout(self.folder, STORE_NAME)
        hashes = [_text_hash(text) for text in texts]
        try:
            with self._connect(create=False) as db:
                if db is None:
                    return vectors, found
                for start in range(0, len(hashes), _READ_BATCH):
                    self._read_batch(db, hashes, start, vectors, found)
        except _StoreError as exc:
            self._count_store_problem(str(exc), len(texts))
        except (sqlite3.Error, OSError) as exc:
            self._count_store_problem(self._failure(exc, "not read"), len(texts) - int(found.sum()))
        return vectors, found

    def _read_batch(self, db: sqlite3.Connection, hashes: list, start: int, vectors, found) -> None:
        chunk = hashes[start : start + _READ_BATCH]
        ids = [_row_id(h) for h in chunk]
        query = f"SELECT {_FIELDS} FROM embeddings WHERE prefix IN ({','.join('?' * len(ids))})"
        rows = {row[0]: row[1:] for row in _retry(lambda: db.execute(query, ids).fetchall())}
        for i, (row_id, text_hash) in enumerate(zip(ids, chunk), start):
            row = rows.get(row_id)
            if row is None:
                continue
            stored_hash, vector, checksum = row
            if not _intact(row_id, stored_hash, vector, checksum, 4 * self.dim):
                self.skipped["corrupt or truncated"] += 1
            elif stored_hash == text_hash:  # else another text whose hash starts alike: a miss
                vectors[i] = np.frombuffer(vector, dtype="<f4")
                found[i] = True

    # ------------------------------------------------------------------ writing
    def put_many(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        """Store the vectors of ``texts``, replacing existing entries; texts that cannot be stored are counted.

        Parameters
        ----------
        texts : sequence of str
        vectors : array-like of shape (len(texts), dim)
            Stored as little-endian float32, returned bit for bit.
        """
        vectors = np.ascontiguousarray(vectors, dtype="<f4").reshape(len(texts), self.dim)
        if not len(texts):
            return
        notice_legacy_layout(self.folder, STORE_NAME)
        rows = []
        for text, vector in zip(texts, vectors):
            text_hash, data = _text_hash(text), vector.tobytes()
            rows.append((_row_id(text_hash), text_hash, data, _digest(text_hash, data)))
        written = 0
        try:
            with self._connect(create=True) as db:
                for start in range(0, len(rows), _WRITE_BATCH):
                    batch = rows[start : start + _WRITE_BATCH]
                    _retry(lambda batch=batch: _write(db, batch))
                    written += len(batch)
        except _StoreError as exc:
            self._count_store_problem(str(exc), len(rows))
        except (sqlite3.Error, OSError) as exc:
            reason = self._failure(exc, "not written")
            if reason.startswith("unusable store"):
                self._count_store_problem(reason, len(rows))
            else:
                self.skipped[reason] += len(rows) - written

    def _count_store_problem(self, reason: str, n: int) -> None:
        self.skipped[reason] = max(self.skipped[reason], n)  # each text once, met reading, writing or both

    # ------------------------------------------------------------------ the store
    @contextlib.contextmanager
    def _connect(self, create: bool) -> Iterator[sqlite3.Connection | None]:
        """A connection to the checked store; None when reading a store that does not exist yet."""
        if not self._folder_ready(create):
            yield None
            return
        if not self._check_files():
            if not create:
                yield None
                return
            with contextlib.suppress(FileExistsError):  # created here so that the umask applies, not SQLite's 0644
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666))
            self._check_files()
        db = sqlite3.connect(self.path, timeout=min(30.0, _BUSY_TIMEOUT_S), isolation_level=None)
        try:
            try:
                ready = self._prepare(db, create)
            except sqlite3.DatabaseError as exc:
                if not self._failure(exc, "").startswith("unusable store"):
                    raise
                raise _StoreError(self._failure(exc, "")) from None
            yield db if ready else None
        finally:
            db.close()

    def _failure(self, exc: Exception, doing: str) -> str:
        """The reason to count for an error of SQLite or the system while ``doing`` ('not read', 'not written')."""
        message = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if "not a database" in message:
            return _unusable(f"{self.path.name} is not a database")
        if "malformed" in message:
            return _unusable(f"{self.path.name} is damaged ({message})")
        return f"{doing}: {message}"

    def _folder_ready(self, create: bool) -> bool:
        """Whether the configuration's folder exists (made if ``create``); _StoreError if it is a link or a file."""
        try:
            mode = os.lstat(self.folder).st_mode
        except FileNotFoundError:
            if not create:
                return False
            self.folder.mkdir(parents=True, exist_ok=True)
            mode = os.lstat(self.folder).st_mode
        if stat.S_ISLNK(mode):
            raise _StoreError("in a symbolically linked folder")
        if not stat.S_ISDIR(mode):
            raise _StoreError(_unusable(f"{self.folder.name} is not a folder"))
        if create:
            self._write_key()
        return True

    def _check_files(self) -> bool:
        """Whether the store exists; _StoreError if it or a file SQLite opens beside it is not to be trusted."""
        exists = False
        for suffix in ("", *_SIDE_FILES):
            name = self.path.name + suffix
            try:
                info = os.lstat(self.folder / name)
            except FileNotFoundError:
                continue
            if info.st_nlink == 0:  # unlinked between the lookup and the stat: SQLite deletes its journal per commit;
                try:  # or a file system that counts no links (some FUSE ones): found again, it is checked as it is
                    info = os.lstat(self.folder / name)
                except FileNotFoundError:
                    continue
            exists = exists or not suffix
            if stat.S_ISLNK(info.st_mode):
                raise _StoreError(_unusable(f"{name} is a symbolic link"))
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:  # a hard link could lead outside cache_dir
                raise _StoreError(_unusable(f"{name} is not a regular file of one link"))
            if hasattr(os, "getuid") and info.st_uid != os.getuid():
                if not suffix and self.path.name == STORE_NAME:  # another user's: never read; this user has its own
                    self.path = self.folder / f"embeddings-uid{os.getuid()}.sqlite3"
                    return self._check_files()
                raise _StoreError(_unusable(f"{name} is owned by another user"))
        return exists

    def _prepare(self, db: sqlite3.Connection, create: bool) -> bool:
        """Check (and, for a writer, create) the table; False for a reader of a store not yet made."""
        if not self._is_ours(db):
            if not create:
                return False
            db.execute(f"PRAGMA page_size = {_PAGE_SIZE}")  # only takes effect before the first table
            _retry(lambda: db.execute("PRAGMA journal_mode = WAL").fetchone())
            _retry(lambda: _create(db, self._is_ours, self.key_sha256))
        db.execute("PRAGMA synchronous = NORMAL")  # whole transactions survive a killed process; see docs
        db.execute("PRAGMA cache_size = -65536")  # 64 MiB: pages of a batch are read once
        return True

    def _is_ours(self, db: sqlite3.Connection) -> bool:
        """True for an skflow store of this format, False for an empty database; _StoreError for anything else."""
        application_id, tables = _retry(lambda: _header_and_tables(db))
        if application_id == 0 and not tables:
            return False
        if application_id != _APPLICATION_ID:
            raise _StoreError(_unusable(f"{self.path.name} is another program's database"))
        version = db.execute("PRAGMA user_version").fetchone()[0]
        columns = [(row[1], row[2]) for row in db.execute("PRAGMA table_info(embeddings)")]
        if version != _FORMAT or columns != _COLUMNS:
            raise _StoreError(_unusable(f"{self.path.name} has format {version}, not {_FORMAT}"))
        try:
            bound = [row[0] for row in _retry(lambda: db.execute("SELECT key_sha256 FROM configuration").fetchall())]
        except sqlite3.OperationalError as exc:  # no such table: a crafted store
            if _is_busy(exc):
                raise
            bound = []
        if bound != [self.key_sha256]:  # copied or moved from another configuration's folder: its vectors differ
            raise _StoreError(_unusable(f"{self.path.name} was made for another configuration than {self.folder.name}"))
        return True

    def _write_key(self) -> None:
        path = self.folder / "key.json"
        if not os.path.lexists(path):
            with contextlib.suppress(OSError, ValueError):  # only a label for people browsing the cache
                write_text_atomically(path, json.dumps(self.key, indent=1, sort_keys=True))


def _header_and_tables(db: sqlite3.Connection) -> tuple[int, list]:
    """The application id and the table names, read in one snapshot: a store another writer is creating is
    seen either empty or whole, never with its table but not yet its id."""
    snapshot = not db.in_transaction  # inside _create's transaction it is one already
    if snapshot:
        db.execute("BEGIN")
    try:
        tables = db.execute("SELECT name FROM sqlite_master").fetchall()  # the read lock is taken here
        return db.execute("PRAGMA application_id").fetchone()[0], tables
    finally:
        if snapshot:
            db.execute("COMMIT")


def _intact(row_id: int, text_hash, vector, checksum, size: int) -> bool:
    if not all(isinstance(blob, bytes) for blob in (text_hash, vector, checksum)) or len(vector) != size:
        return False
    return len(text_hash) == 32 and _row_id(text_hash) == row_id and _digest(text_hash, vector) == checksum


def _unusable(what: str) -> str:
    return f"unusable store: {what}; delete it to cache again"


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """All of the block's statements or none; BEGIN IMMEDIATE takes the write lock first (no deadlock)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise


def _write(db: sqlite3.Connection, rows: list) -> None:  # a row of the same prefix is deleted, the new appended
    with _transaction(db):
        db.executemany(f"INSERT OR REPLACE INTO embeddings ({_FIELDS}) VALUES (?, ?, ?, ?)", rows)


def _create(db: sqlite3.Connection, is_ours: Callable[[sqlite3.Connection], bool], key_sha256: str) -> None:
    """Create the tables, bind the store to its configuration and mark the file as ours, unless another process
    just did."""
    with _transaction(db):
        if not is_ours(db):
            db.execute(_SCHEMA)
            db.execute(_BINDING)
            db.execute("INSERT INTO configuration (key_sha256) VALUES (?)", (key_sha256,))
            db.execute(f"PRAGMA application_id = {_APPLICATION_ID}")
            db.execute(f"PRAGMA user_version = {_FORMAT}")
