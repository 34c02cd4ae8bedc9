"""The embedding cache: keys that follow the weights, entries that are not trusted, permissions, a killed writer."""

import contextlib
import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from skflow import BertEmbedder
from skflow.embedding._cache import EmbeddingCache
from skflow.embedding._model_source import DEFAULT_MODEL, EncoderChangedError, folder_fingerprint, resolve_model_source

TEXTS = ["A man is playing a guitar.", "Two dogs run in the snow.", "Stocks fell sharply today.", ""]
ROOT = Path(__file__).resolve().parents[1]


def _f32(model=DEFAULT_MODEL, **kwargs):
    return BertEmbedder(model, dtype="float32", device="cpu", **kwargs)


def _save_model(folder: Path, scale_noise: float = 0.0, seed: int = 0) -> None:
    """The default encoder saved to ``folder``; with noise added to every weight if asked."""
    source = resolve_model_source(DEFAULT_MODEL, None).path_or_id
    model = AutoModel.from_pretrained(source)
    if scale_noise:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(scale_noise * p.std() * torch.randn(p.shape, generator=generator))
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)


@pytest.mark.slow
def test_weights_resaved_into_the_same_folder_give_new_vectors(tmp_path):
    folder = tmp_path / "model"
    _save_model(folder)
    cached, plain = _f32(folder, cache_dir=tmp_path / "cache"), _f32(folder)
    before = cached.transform(TEXTS)
    np.testing.assert_allclose(plain.transform(TEXTS), before, atol=1e-6)
    time.sleep(0.01)
    _save_model(folder, scale_noise=0.5)
    shutil.copytree(folder, tmp_path / "copy")  # the same new weights elsewhere: nothing cached for them
    expected = _f32(tmp_path / "copy").transform(TEXTS)
    assert np.abs(expected - before).max() > 0.05
    np.testing.assert_allclose(cached.transform(TEXTS), expected, atol=1e-6)  # the cache key changed
    np.testing.assert_allclose(plain.transform(TEXTS), expected, atol=1e-6)  # so did the model registry's
    assert len(list((tmp_path / "cache").glob("*/key.json"))) == 2


def test_the_fingerprint_follows_the_content_of_model_files_only(tmp_path):
    (tmp_path / "config.json").write_text('{"a": 1}')
    (tmp_path / "vocab.txt").write_text("hello\nworld\n")
    weights = tmp_path / "model.safetensors"
    with open(weights, "wb") as f:
        f.write(b"\x10" + b"\0" * 7 + b"{'header': 1234}")
        f.truncate(40 << 20)
    (tmp_path / "README.md").write_text("notes")
    first = folder_fingerprint(tmp_path)
    assert folder_fingerprint(tmp_path) == first

    def changed(path: Path, offset: int, byte: bytes) -> str:
        info = path.stat()
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(byte)
        os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))  # same size, same mtime
        return folder_fingerprint(tmp_path)

    assert changed(tmp_path / "vocab.txt", 0, b"j") != first
    second = folder_fingerprint(tmp_path)
    assert changed(weights, 9, b"X") not in {first, second}  # the safetensors header
    third = folder_fingerprint(tmp_path)
    # a byte outside the first MiB and away from any sampled block: hashed whole, so seen too
    assert changed(weights, (20 << 20) + 12345, b"Y") not in {first, second, third}
    fourth = folder_fingerprint(tmp_path)
    os.utime(weights, ns=(1, 1))  # touched: content unchanged
    assert folder_fingerprint(tmp_path) == fourth
    (tmp_path / "README.md").write_text("other notes")  # documentation does not change the vectors
    (tmp_path / "notes.txt").write_text("unrelated")
    (tmp_path / ".gitattributes").write_text("*.bin lfs")
    assert folder_fingerprint(tmp_path) == fourth
    copy = tmp_path / "copy"
    copy.mkdir()
    for file in tmp_path.iterdir():
        if file.is_file():
            shutil.copyfile(file, copy / file.name)  # new inode, new mtime, same bytes
    assert folder_fingerprint(copy) == fourth


def test_touch_copy_and_unrelated_files_keep_the_encoder_identity_and_content_changes_do_not(tmp_path):
    source = Path(resolve_model_source(DEFAULT_MODEL, None).path_or_id)
    folder = tmp_path / "model"
    shutil.copytree(source, folder)
    embedder = _f32(folder).fit([])
    identity = embedder.encoder_identity_
    assert identity == "local:" + resolve_model_source(DEFAULT_MODEL, None).identity.rpartition(":")[2]
    os.utime(folder / "model.safetensors")  # touch (a reinstall of the package: new mtimes)
    assert embedder.check_encoder_identity() == identity
    for file in folder.iterdir():
        if file.is_file():
            file.unlink()
            shutil.copyfile(source / file.name, file)  # byte-identical copy, new inode and mtime
    assert embedder.check_encoder_identity() == identity
    (folder / "notes.txt").write_text("my notes")
    assert embedder.check_encoder_identity() == identity
    with open(folder / "model.safetensors", "r+b") as f:
        f.seek(os.path.getsize(folder / "model.safetensors") // 3 + 7)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(EncoderChangedError):
        embedder.check_encoder_identity()


@pytest.mark.slow
def test_a_hub_model_is_keyed_by_the_commit_its_branch_points_to(tmp_path, hub_cache):
    """Offline hub cache with two commits; moving refs/main changes the vectors, cached or not."""
    source = Path(resolve_model_source(DEFAULT_MODEL, None).path_or_id)
    repo = hub_cache / "models--someorg--moving-cached"
    old, new = "1" * 40, "2" * 40
    (repo / "snapshots" / old).mkdir(parents=True)
    for file in source.iterdir():
        if file.is_file():
            (repo / "snapshots" / old / file.name).symlink_to(file)
    _save_model(repo / "snapshots" / new, scale_noise=0.5)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(old)
    cached = BertEmbedder("someorg/moving-cached", dtype="float32", cache_dir=tmp_path / "cache")
    before = cached.transform(TEXTS)
    (repo / "refs" / "main").write_text(new)
    after = cached.transform(TEXTS)
    pinned = BertEmbedder("someorg/moving-cached", revision=new, dtype="float32").transform(TEXTS)
    assert np.abs(after - before).max() > 0.05 and np.abs(after - pinned).max() < 1e-6
    keys = sorted(p.read_text() for p in (tmp_path / "cache").glob("*/key.json"))
    assert len(keys) == 2 and any(f"someorg/moving-cached@{old}" in k for k in keys) and any(new in k for k in keys)


# ------------------------------------------------------------ untrusted stores
def _rows(cache: EmbeddingCache) -> int:
    """Rows in the store; 0 where a writer was killed before it made the table."""
    with contextlib.closing(sqlite3.connect(cache.path)) as db:
        if not db.execute("SELECT name FROM sqlite_master WHERE name = 'embeddings'").fetchall():
            return 0
        return db.execute("SELECT count(*) FROM embeddings").fetchone()[0]


def _integrity(cache: EmbeddingCache) -> str:
    with contextlib.closing(sqlite3.connect(cache.path)) as db:
        return db.execute("PRAGMA integrity_check").fetchone()[0]


@pytest.mark.parametrize("params,folder", [
    ({}, "2961ce0f933c56e6e6dd96c7"),
    ({"pooling": "last2avg", "layers": [0, -1], "max_length": 64, "normalize": True, "prompt": "query: ",
      "model_kwargs": {"attn_implementation": "eager", "low_cpu_mem_usage": True}}, "299fccb3711bc71993cd2a9d"),
], ids=["default", "every-keyed-setting"])
def test_an_existing_cache_keeps_its_folder(tmp_path, params, folder):
    """The configuration folders that 88eb914 (before the resolved settings object) made for these settings:
    a user's cache keeps hitting."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # last2avg
        _f32(cache_dir=tmp_path, **params).transform(TEXTS[:1])
    assert [p.name for p in tmp_path.iterdir()] == [folder]


@pytest.mark.parametrize("kind", ["folder", "fifo", "symbolic link", "hard link", "-wal link"])
def test_a_store_that_is_a_folder_fifo_or_link_is_recomputed_with_a_warning(tmp_path, kind):
    """Each is left as it is, never read, never written through; the vectors are computed afresh."""
    embedder = _f32(cache_dir=tmp_path / "cache")
    expected = embedder.transform(TEXTS)
    cache = EmbeddingCache(tmp_path / "cache", embedder._settings().cache_key, expected.shape[1])
    planted = EmbeddingCache(tmp_path / "planted", cache.key, cache.dim)
    planted.put_many(TEXTS, expected + 1)  # valid entries with other vectors
    outside = tmp_path / "outside.sqlite3"
    shutil.copyfile(planted.path, outside)
    before = outside.read_bytes()
    if kind != "-wal link":
        cache.path.unlink()
    if kind == "folder":
        cache.path.mkdir()
    elif kind == "fifo":
        os.mkfifo(cache.path)  # must not block the reader
    elif kind == "symbolic link":
        cache.path.symlink_to(outside)
    elif kind == "hard link":
        os.link(outside, cache.path)
    else:
        (cache.folder / "embeddings.sqlite3-wal").symlink_to(tmp_path / "outside.sqlite3-wal")
    reason = {
        "folder": "embeddings.sqlite3 is not a regular file of one link",
        "fifo": "embeddings.sqlite3 is not a regular file of one link",
        "symbolic link": "embeddings.sqlite3 is a symbolic link",
        "hard link": "embeddings.sqlite3 is not a regular file of one link",
        "-wal link": "embeddings.sqlite3-wal is a symbolic link",
    }[kind]
    for _ in range(2):  # not repaired behind the user's back: the same warning each time
        with pytest.warns(RuntimeWarning, match=rf"\(4 unusable store: {reason}; delete it to cache again\)"):
            np.testing.assert_array_equal(embedder.transform(TEXTS), expected)
    assert outside.read_bytes() == before and not (tmp_path / "outside.sqlite3-wal").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "outside.sqlite3", "planted"]


def test_another_users_store_is_never_read_and_this_user_keeps_its_own_beside_it(tmp_path):
    """A team sharing a cache_dir: no warning, no vector of another user's (who could have planted any)."""
    embedder = _f32(cache_dir=tmp_path)
    expected = embedder.transform(TEXTS)
    cache = EmbeddingCache(tmp_path, embedder._settings().cache_key, expected.shape[1])
    cache.path.unlink()
    EmbeddingCache(tmp_path, cache.key, cache.dim).put_many(TEXTS, expected + 1)  # planted, valid entries
    os.chown(cache.path, 65534, 65534) if os.getuid() == 0 else pytest.fail("run as root")
    before = cache.path.read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(embedder.transform(TEXTS), expected)
    assert cache.path.read_bytes() == before and cache.path.stat().st_uid == 65534
    own = EmbeddingCache(tmp_path, cache.key, cache.dim)
    got, found = own.get_many(TEXTS)
    assert found.all() and own.path.name == f"embeddings-uid{os.getuid()}.sqlite3" and not own.skipped
    np.testing.assert_array_equal(got, expected)
    os.chown(own.path, 65533, 65533)  # and another user's file in place of this user's own: recomputed, with a warning
    with pytest.warns(RuntimeWarning, match=rf"4 unusable store: embeddings-uid{os.getuid()}.sqlite3 is owned by"):
        np.testing.assert_array_equal(embedder.transform(TEXTS), expected)


@pytest.mark.slow
def test_an_unreadable_or_read_only_store():
    """Without the power to override file permissions (root has it): mode 000 is recomputed, 0444 is read."""
    folder = Path(tempfile.mkdtemp(prefix="skflow-cache-"))
    try:
        cache = EmbeddingCache(folder, {"k": 1}, dim=4)
        code = (
            "import numpy as np, sys\n"
            "from skflow.embedding._cache import EmbeddingCache\n"
            f"cache = EmbeddingCache({str(folder)!r}, {{'k': 1}}, dim=4)\n"
            "if sys.argv[1] == 'write':\n"
            "    cache.put_many(['a', 'b'], np.arange(8, dtype=np.float32).reshape(2, 4))\n"
            "else:\n"
            "    vectors, found = cache.get_many(['a', 'b'])\n"
            "    cache.put_many(['c'], np.ones((1, 4), np.float32))\n"
            "    print(found.tolist(), vectors[found].sum(), cache.problems())\n"
        )
        subprocess.run([sys.executable, "-c", code, "write"], check=True, cwd=ROOT, timeout=60)
        drop = ["-dac_override,-dac_read_search"] * 2
        unprivileged = ["setpriv", "--bounding-set", drop[0], "--inh-caps", drop[1]] if os.getuid() == 0 else []
        outputs = []
        for mode in (0, 0o444):
            os.chmod(cache.path, mode)
            run = subprocess.run([*unprivileged, sys.executable, "-c", code, "read"], capture_output=True, text=True,
                                 cwd=ROOT, timeout=60)
            assert run.returncode == 0, run.stderr
            outputs.append(run.stdout.strip())
        assert outputs == [
            "[False, False] 0.0 2 not read: unable to open database file, 1 not written: unable to open database file",
            "[True, True] 28.0 1 not written: attempt to write a readonly database",
        ]
    finally:
        shutil.rmtree(folder)


@pytest.mark.parametrize("umask", [0o002, 0o022])
def test_the_store_its_wal_and_shm_files_and_folders_are_created_with_the_users_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        cache = EmbeddingCache(tmp_path / "c", {"k": 1}, dim=4)
        cache.put_many(["a"], np.ones((1, 4), np.float32))
    finally:
        os.umask(old)
    old = os.umask(0o077)  # a later writer with a stricter umask: SQLite gives -wal and -shm the store's mode
    try:
        with contextlib.closing(sqlite3.connect(cache.path)) as reader:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM embeddings").fetchone()  # holds the WAL open
            cache.put_many(["b"], np.ones((1, 4), np.float32))
            files = {p.name: stat.S_IMODE(p.stat().st_mode) for p in cache.folder.iterdir()}
    finally:
        os.umask(old)
    assert files == {name: 0o666 & ~umask for name in
                     ["embeddings.sqlite3", "embeddings.sqlite3-shm", "embeddings.sqlite3-wal", "key.json"]}
    assert stat.S_IMODE(cache.folder.stat().st_mode) == 0o777 & ~umask
    assert cache.get_many(["a", "b"])[1].all() and not cache.skipped


def test_nothing_is_read_or_written_through_a_symlinked_configuration_folder(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    cache = EmbeddingCache(tmp_path / "c", {"k": 1}, dim=4)
    (tmp_path / "c").mkdir()
    cache.folder.symlink_to(outside, target_is_directory=True)
    cache.put_many(["a", "b"], np.ones((2, 4), np.float32))
    assert list(outside.iterdir()) == []
    assert cache.skipped == {"in a symbolically linked folder": 2}
    valid = EmbeddingCache(tmp_path / "d", {"k": 1}, dim=4)
    valid.put_many(["a"], np.ones((1, 4), np.float32))
    shutil.copytree(valid.folder, outside, dirs_exist_ok=True)  # a valid store out there is not read
    assert not cache.get_many(["a"])[1][0]
    assert sorted(p.name for p in outside.iterdir()) == ["embeddings.sqlite3", "key.json"]  # nor written


def test_a_cache_dir_that_cannot_be_used_is_an_error_before_any_encoding(tmp_path, monkeypatch):
    from skflow.embedding import _encoding as _encoding

    monkeypatch.setattr(_encoding, "encode_ids", lambda *a, **k: pytest.fail("encoded before checking the cache"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="cache_dir .*file' is a file, not a folder"):
        _f32(cache_dir=tmp_path / "file").transform(TEXTS)
    with pytest.raises(NotADirectoryError, match="cannot be used: Not a directory"):
        _f32(cache_dir=tmp_path / "file" / "sub").transform(TEXTS)
    with pytest.raises(OSError, match="cache_dir '/proc/skflow-cache' cannot be used"):
        _f32(cache_dir="/proc/skflow-cache").transform(TEXTS)


# ------------------------------------------------------------------ kill tests
WRITER = """
import sys
import numpy as np
from skflow.embedding._cache import EmbeddingCache
cache = EmbeddingCache(sys.argv[1], {"k": "kill"}, dim=384)
vectors = np.random.default_rng(0).standard_normal((100_000, 384)).astype(np.float32)
texts = [f"text {i}" for i in range(len(vectors))]
step = int(sys.argv[2])
print(0, flush=True)
for start in range(0, len(texts), step):
    cache.put_many(texts[start:start + step], vectors[start:start + step])
    print(start + step, flush=True)
"""


def _killed_writer(folder: Path, step: int, kill_after_rows: int = 0, kill_at_stored: int | None = None) -> None:
    """Start a writer of ``step`` texts per call and SIGKILL it, by its pid, in the middle of its writes: once it
    printed ``kill_after_rows`` (rows of its finished calls), or once the store holds ``kill_at_stored`` rows (its
    committed transactions, read as another process reads them: inside a call, however fast the machine)."""
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(folder), str(step)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    store = EmbeddingCache(folder, {"k": "kill"}, dim=384).path
    try:
        for line in writer.stdout:
            if int(line) >= kill_after_rows:
                break
        while kill_at_stored and _stored(store) < kill_at_stored:
            assert writer.poll() is None, "the writer ended before it was killed"
            time.sleep(0.02)
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(timeout=30)
    finally:
        writer.kill()
        writer.stdout.close()
    assert writer.returncode == -signal.SIGKILL


def _stored(store: Path) -> int:
    """Rows committed in a store (its last rowid: rows are only added, and a count would scan them all while the
    writer writes), read only, never creating it; 0 until its table is there."""
    if not store.exists():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
            return db.execute("SELECT coalesce(max(rowid), 0) FROM embeddings").fetchone()[0]
    except sqlite3.OperationalError:  # no table yet, or the store being set up
        return 0


@pytest.mark.slow
def test_a_writer_killed_mid_write_leaves_only_whole_entries(tmp_path):
    _killed_writer(tmp_path, step=100, kill_after_rows=2000)
    cache = EmbeddingCache(tmp_path, {"k": "kill"}, dim=384)
    vectors = np.random.default_rng(0).standard_normal((100_000, 384)).astype(np.float32)
    texts = [f"text {i}" for i in range(len(vectors))]
    got, found = cache.get_many(texts)
    n_rows = _rows(cache)
    assert 2000 <= found.sum() == n_rows < len(texts) and found[:n_rows].all()  # every entry there is whole
    assert n_rows % 100 == 0  # and each call's transaction all there or not at all
    assert not cache.skipped and _integrity(cache) == "ok"
    np.testing.assert_array_equal(got[found], vectors[found])  # and right, bit for bit
    cache.put_many([t for t, f in zip(texts, found) if not f][:500], vectors[~found][:500])
    assert cache.get_many(texts)[1].sum() == n_rows + 500 and not cache.skipped


@pytest.mark.parametrize("kill_at_stored", [None, 30_000, 70_000])
@pytest.mark.slow
def test_a_writer_killed_inside_its_transactions_leaves_whole_transactions(tmp_path, kill_at_stored):
    """One call of 100,000 texts: 2,048 rows per transaction, killed inside that call: as it begins, and once 30,000
    and 70,000 rows are committed (was: 0.05, 0.4 and 1.0 s after it began, which a quiet machine's call outran)."""
    _killed_writer(tmp_path, step=100_000, kill_at_stored=kill_at_stored)
    cache = EmbeddingCache(tmp_path, {"k": "kill"}, dim=384)
    vectors = np.random.default_rng(0).standard_normal((100_000, 384)).astype(np.float32)
    texts = [f"text {i}" for i in range(len(vectors))]
    got, found = cache.get_many(texts)
    n_rows = _rows(cache) if cache.path.exists() else 0
    assert found.sum() == n_rows < len(texts) and n_rows % 2048 == 0 and found[:n_rows].all()
    assert not cache.skipped and (n_rows == 0 or _integrity(cache) == "ok")
    np.testing.assert_array_equal(got[found], vectors[found])
    cache.put_many(texts[:5000], vectors[:5000])  # the next writer carries on
    assert cache.get_many(texts)[1].sum() == max(n_rows, 5000) and not cache.skipped
