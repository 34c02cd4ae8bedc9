"""The embedding cache's SQLite store under attack: concurrent processes, threads, fork, damaged or foreign files,
a full disk, the old one-file-per-text layout, exact round trips."""

import contextlib
import hashlib
import multiprocessing
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import joblib
import numpy as np
import pytest

from skflow import BertEmbedder
from skflow.embedding import EmbeddingCache

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["A man is playing a guitar.", "Two dogs run in the snow.", "Stocks fell sharply today.", ""]


def _vectors(n: int, dim: int = 384, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def _sha(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def test_float32_vectors_come_back_bit_for_bit(tmp_path):
    """NaN payloads, infinities, -0.0, subnormals, the largest floats: every bit pattern is stored exactly."""
    bits = np.random.default_rng(0).integers(0, 2**32, size=(500, 16), dtype=np.uint64).astype(np.uint32)
    bits[0, :6] = [0x7FC00001, 0xFF800000, 0x80000000, 0x00000001, 0x7F7FFFFF, 0x7FA00000]  # NaN payload, -inf, ...
    vectors = bits.view(np.float32)
    cache = EmbeddingCache(tmp_path, {"k": 1}, dim=16)
    texts = [f"t{i}" for i in range(len(vectors))]
    cache.put_many(texts, vectors)
    got, found = EmbeddingCache(tmp_path, {"k": 1}, dim=16).get_many(texts)
    assert found.all() and got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), bits)


# ------------------------------------------------------------ concurrency
WORKER = """
import sys
import numpy as np
from skflow.embedding import EmbeddingCache
folder, seed = sys.argv[1], int(sys.argv[2])
vectors = np.random.default_rng(0).standard_normal((2000, 384)).astype(np.float32)
texts = [f"text {i}" for i in range(len(vectors))]
order = np.random.default_rng(seed).permutation(len(texts))
cache = EmbeddingCache(folder, {"k": "shared"}, dim=384)
for start in range(0, len(order), 50):  # like transform: read, then write what was missing
    chunk = order[start:start + 50]
    got, found = cache.get_many([texts[i] for i in chunk])
    assert (got[found] == vectors[chunk][found]).all()
    cache.put_many([texts[i] for i in chunk[~found]], vectors[chunk[~found]])
print(repr(cache.problems()))
"""


@pytest.mark.slow
def test_four_processes_writing_the_same_texts_at_once_lose_nothing_and_raise_nothing(tmp_path):
    workers = [
        subprocess.Popen([sys.executable, "-W", "error", "-c", WORKER, str(tmp_path), str(seed)], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for seed in range(4)
    ]
    for worker in workers:
        out, err = worker.communicate(timeout=600)
        assert worker.returncode == 0 and out.strip() == "''", err  # no "database is locked", nothing skipped
    cache = EmbeddingCache(tmp_path, {"k": "shared"}, dim=384)
    got, found = cache.get_many([f"text {i}" for i in range(2000)])
    assert found.all() and not cache.skipped
    np.testing.assert_array_equal(got, _vectors(2000))


READER = """
import sys
import numpy as np
from skflow.embedding import EmbeddingCache
vectors = np.random.default_rng(0).standard_normal((20_000, 384)).astype(np.float32)
texts = [f"text {i}" for i in range(len(vectors))]
seen = 0
while True:
    cache = EmbeddingCache(sys.argv[1], {"k": "shared"}, dim=384)
    got, found = cache.get_many(texts)
    assert not cache.skipped, cache.problems()
    assert (got[found] == vectors[found]).all() and found.sum() >= seen
    seen = int(found.sum())
    print(seen, flush=True)
    if seen == len(texts):
        break
"""


@pytest.mark.slow
def test_a_process_reads_whole_entries_while_another_writes(tmp_path):
    reader = subprocess.Popen([sys.executable, "-W", "error", "-c", READER, str(tmp_path)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "0"  # reading (an empty cache) before any write
        cache = EmbeddingCache(tmp_path, {"k": "shared"}, dim=384)
        vectors, texts = _vectors(20_000), [f"text {i}" for i in range(20_000)]
        for start in range(0, len(texts), 200):
            cache.put_many(texts[start : start + 200], vectors[start : start + 200])
        out, err = reader.communicate(timeout=600)
    finally:
        reader.kill()
    assert reader.returncode == 0, err
    counts = [int(line) for line in out.split()]
    assert counts[-1] == 20_000 and not cache.skipped
    assert any(0 < count < 20_000 for count in counts)  # it read while the writer wrote, not waiting for the end


def test_threads_share_one_cache_object(tmp_path):
    cache = EmbeddingCache(tmp_path, {"k": 1}, dim=384)
    vectors, texts = _vectors(2000), [f"text {i}" for i in range(2000)]
    errors = []

    def work(offset: int) -> None:
        try:
            for start in range(offset, len(texts), 400):
                cache.put_many(texts[start : start + 400], vectors[start : start + 400])
                got, found = cache.get_many(texts)
                assert (got[found] == vectors[found]).all()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(offset,)) for offset in (0, 100, 200, 300)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors and not cache.skipped
    got, found = cache.get_many(texts)
    assert found.all()
    np.testing.assert_array_equal(got, vectors)


def test_writers_racing_to_create_the_store_all_use_it(tmp_path):
    # a reader of the header saw the id of an empty file and the table of a just-created store:
    # "another program's database" in a third of these races before both were read in one snapshot
    for trial in range(40):
        cache = EmbeddingCache(tmp_path / str(trial), {"k": 1}, dim=4)
        start = threading.Barrier(4)

        def write(i: int, cache=cache, start=start) -> None:
            start.wait(timeout=60)
            cache.put_many([f"text {i}"], np.full((1, 4), i, dtype=np.float32))

        threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not cache.skipped, (trial, cache.skipped)
        got, found = cache.get_many([f"text {i}" for i in range(4)])
        assert found.all() and (got == np.arange(4, dtype=np.float32)[:, None]).all()


def test_a_journal_deleted_while_it_is_checked_is_not_taken_for_a_hard_link(tmp_path, monkeypatch):
    # SQLite deletes its rollback journal at each commit: lstat can find the name and then report 0 links
    cache = EmbeddingCache(tmp_path, {"k": 1}, dim=4)
    cache.put_many(["a"], np.ones((1, 4), dtype=np.float32))
    journal = cache.path.with_name(cache.path.name + "-journal")
    journal.touch()
    real_lstat = os.lstat

    def lstat_as_unlinked(path, *args, **kwargs):
        info = real_lstat(path, *args, **kwargs)
        if str(path) == str(journal) and journal.exists():
            journal.unlink()  # deleted between the lookup and the stat
            fields = list(info)
            fields[stat.ST_NLINK] = 0
            return os.stat_result(fields)
        return info

    monkeypatch.setattr(os, "lstat", lstat_as_unlinked)
    fresh = EmbeddingCache(tmp_path, {"k": 1}, dim=4)
    got, found = fresh.get_many(["a"])
    assert found.all() and not fresh.skipped
    np.testing.assert_array_equal(got, np.ones((1, 4), dtype=np.float32))
    monkeypatch.setattr(os, "lstat", real_lstat)
    journal.touch()
    os.link(journal, tmp_path / "elsewhere")  # a real second link is still refused
    linked = EmbeddingCache(tmp_path, {"k": 1}, dim=4)
    assert not linked.get_many(["a"])[1].any()
    assert list(linked.skipped) == [
        "unusable store: embeddings.sqlite3-journal is not a regular file of one link; delete it to cache again"
    ]


def test_a_symbolically_linked_store_is_refused_where_the_file_system_counts_no_links(tmp_path, monkeypatch):
    # some FUSE file systems report 0 links for every file: that is no file deleted while it was checked
    outside = tmp_path / "outside.sqlite3"
    outside.touch()
    cache = EmbeddingCache(tmp_path / "cache", {"k": 1}, dim=4)
    cache.folder.mkdir(parents=True)
    cache.path.symlink_to(outside)
    real_lstat = os.lstat

    def lstat_without_links(path, *args, **kwargs):
        fields = list(real_lstat(path, *args, **kwargs))
        fields[stat.ST_NLINK] = 0
        return os.stat_result(fields)

    monkeypatch.setattr(os, "lstat", lstat_without_links)
    cache.put_many(["a"], np.ones((1, 4), dtype=np.float32))
    assert outside.stat().st_size == 0
    assert list(cache.skipped) == [
        "unusable store: embeddings.sqlite3 is a symbolic link; delete it to cache again"
    ]


def _child_writes(folder: str) -> None:
    cache = EmbeddingCache(folder, {"k": 1}, dim=384)
    cache.put_many(["child"], _vectors(1, seed=2))
    os._exit(0 if cache.get_many(["parent", "child"])[1].all() and not cache.skipped else 1)


def test_a_cache_used_before_fork_works_in_the_child(tmp_path):
    cache = EmbeddingCache(tmp_path, {"k": 1}, dim=384)
    cache.put_many(["parent"], _vectors(1, seed=1))
    assert cache.get_many(["parent"])[1].all()
    child = multiprocessing.get_context("fork").Process(target=_child_writes, args=(str(tmp_path),))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 0
    got, found = cache.get_many(["parent", "child"])
    assert found.all() and not cache.skipped
    np.testing.assert_array_equal(got[1], _vectors(1, seed=2)[0])


def _embed(cache_dir, pooling, texts):
    return BertEmbedder(dtype="float32", device="cpu", pooling=pooling, cache_dir=cache_dir).transform(texts)


@pytest.mark.slow
def test_two_pipelines_with_different_encoders_share_a_cache_dir_at_once(tmp_path):
    texts = [f"sentence number {i}" for i in range(60)]
    jobs = [(p, texts[i:] + texts[:i]) for p, i in (("cls", 0), ("mean", 0), ("cls", 30), ("mean", 30))]
    results = joblib.Parallel(n_jobs=4, backend="loky")(joblib.delayed(_embed)(tmp_path, p, t) for p, t in jobs)
    for pooling, first, second in (("cls", results[0], results[2]), ("mean", results[1], results[3])):
        plain = BertEmbedder(dtype="float32", device="cpu", pooling=pooling).transform(texts)
        # workers run other thread counts and batches (padding): float32 sums differ by up to ~1.3e-6
        np.testing.assert_allclose(first, plain, atol=1e-5)
        np.testing.assert_allclose(np.roll(second, 30, axis=0), plain, atol=1e-5)
    assert np.abs(results[0] - results[1]).max() > 0.1  # each encoder kept its own vectors
    assert len(list(tmp_path.glob("*/embeddings.sqlite3"))) == 2


# ------------------------------------------------------------ damaged and foreign files
def _filled(folder: Path, n: int = 3000) -> tuple[EmbeddingCache, list, np.ndarray]:
    cache = EmbeddingCache(folder, {"k": 1}, dim=384)
    texts, vectors = [f"text {i}" for i in range(n)], _vectors(n)
    cache.put_many(texts, vectors)
    assert not (cache.folder / "embeddings.sqlite3-wal").exists()  # checkpointed when the last connection closed
    return cache, texts, vectors


def _foreign_database(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE embeddings (id INTEGER PRIMARY KEY, text_hash BLOB, vector BLOB, checksum BLOB)")
        db.execute("INSERT INTO embeddings VALUES (1, x'00', x'00', x'00')")


def _our_format(path: Path, version: int) -> None:
    EmbeddingCache(path.parent.parent, {"k": 1}, dim=384).put_many(["x"], _vectors(1))
    with contextlib.closing(sqlite3.connect(path)) as db:
        if version == 1:  # the stores before 0.3, bound to no configuration
            db.execute("DROP TABLE configuration")
        db.execute(f"PRAGMA user_version = {version}")


def _copied_from_another_configuration(path: Path) -> None:
    other = EmbeddingCache(path.parent.parent / "elsewhere", {"k": 2}, dim=384)
    other.put_many(["text 0", "text 1"], _vectors(2, seed=1))
    path.unlink()
    shutil.copyfile(other.path, path)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: p.write_bytes(b"not a database, just some text\n" * 100), "embeddings.sqlite3 is not a database"),
        (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "embeddings.sqlite3 is damaged"),
        (lambda p: p.write_bytes(p.read_bytes()[:1000]), "embeddings.sqlite3 is damaged"),
        (lambda p: (p.unlink(), _foreign_database(p)), "embeddings.sqlite3 is another program's database"),
        (lambda p: (p.unlink(), _our_format(p, 3)), "embeddings.sqlite3 has format 3, not 2"),
        (lambda p: (p.unlink(), _our_format(p, 1)), "embeddings.sqlite3 has format 1, not 2"),
        (_copied_from_another_configuration, "embeddings.sqlite3 was made for another configuration"),
    ],
    ids=["text file", "truncated to half", "truncated in its first page", "foreign table", "future format",
         "unbound old format", "copied from another configuration"],
)
def test_a_store_that_is_not_ours_or_damaged_is_left_alone_and_recomputed_with_a_clear_warning(tmp_path, damage,
                                                                                            reason):
    cache, texts, vectors = _filled(tmp_path)
    damage(cache.path)
    before = cache.path.read_bytes()
    for _ in range(2):
        cache = EmbeddingCache(tmp_path, {"k": 1}, dim=384)
        got, found = cache.get_many(texts)
        assert (got[found] == vectors[found]).all()  # never a wrong vector
        cache.put_many(texts[:10], vectors[:10])
        assert reason in cache.problems() and "delete it to cache again" in cache.problems(), cache.problems()
    assert cache.path.read_bytes() == before  # not modified, not deleted: the user decides
    cache.path.unlink()
    cache = EmbeddingCache(tmp_path, {"k": 1}, dim=384)
    cache.put_many(texts[:10], vectors[:10])  # deleted as the warning says: a cache again
    assert cache.get_many(texts[:10])[1].all() and not cache.skipped


def test_a_store_copied_from_the_mean_folder_into_the_cls_folder_is_not_served(tmp_path):
    texts = TEXTS[:3]
    mean = BertEmbedder(dtype="float32", device="cpu", pooling="mean", cache_dir=tmp_path / "mean")
    cls = BertEmbedder(dtype="float32", device="cpu", pooling="cls", cache_dir=tmp_path / "cls")
    mean_vectors, cls_vectors = mean.transform(texts), cls.transform(texts)
    assert np.abs(mean_vectors - cls_vectors).max() > 0.1
    ((mean_store,), (cls_store,)) = ((tmp_path / p).glob("*/embeddings.sqlite3") for p in ("mean", "cls"))
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            (cls_store.parent / (cls_store.name + suffix)).unlink()
    shutil.copyfile(mean_store, cls_store)  # what `cp -r` of the mean folder onto the cls one does
    with pytest.warns(RuntimeWarning, match="made for another configuration than " + cls_store.parent.name):
        np.testing.assert_array_equal(cls.transform(texts), cls_vectors)  # the cls vectors, recomputed
    assert cls_store.read_bytes() == mean_store.read_bytes()  # left alone: the warning says to delete it


def test_a_damaged_file_warns_through_the_embedder_and_the_vectors_are_right(tmp_path):
    embedder = BertEmbedder(dtype="float32", device="cpu", cache_dir=tmp_path)
    expected = embedder.transform(TEXTS)
    (store,) = tmp_path.glob("*/embeddings.sqlite3")
    store.write_bytes(b"\0" * 100_000)
    with pytest.warns(RuntimeWarning, match=r"\(4 unusable store: embeddings.sqlite3 is not a database; delete it"):
        np.testing.assert_array_equal(embedder.transform(TEXTS), expected)


def test_an_empty_store_left_by_a_writer_killed_before_its_first_commit_is_made_a_store(tmp_path):
    cache = EmbeddingCache(tmp_path, {"k": 1}, dim=384)
    cache.folder.mkdir(parents=True)
    cache.path.touch()
    assert not cache.get_many(["a"])[1].any() and not cache.skipped
    cache.put_many(["a"], _vectors(1))
    assert cache.get_many(["a"])[1].all() and not cache.skipped


def test_bytes_flipped_on_disk_inside_a_vector_are_detected_recomputed_and_rewritten(tmp_path):
    cache, texts, vectors = _filled(tmp_path, n=200)
    data = bytearray(cache.path.read_bytes())
    offset = bytes(data).index(vectors[77].tobytes())  # the vector's bytes, as stored in the file
    data[offset + 100] ^= 0x01
    cache.path.write_bytes(bytes(data))
    got, found = cache.get_many(texts)
    assert found.sum() == 199 and not found[77] and cache.problems() == "1 corrupt or truncated"
    assert (got[found] == vectors[found]).all()
    cache.put_many([texts[77]], vectors[77:78])
    again = EmbeddingCache(tmp_path, {"k": 1}, dim=384)
    assert again.get_many(texts)[1].all() and not again.skipped


FULL_DISK = """
import resource, signal, sys
import numpy as np
from skflow.embedding import EmbeddingCache
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit, writes fail with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
cache = EmbeddingCache(sys.argv[1], {"k": 1}, dim=384)
vectors = np.random.default_rng(5).standard_normal((3000, 384)).astype(np.float32)
cache.put_many([f"new {i}" for i in range(3000)], vectors)
print(cache.problems())
"""


@pytest.mark.slow
def test_a_disk_that_fills_up_mid_write_loses_no_stored_entry_and_raises_nothing(tmp_path):
    cache, texts, vectors = _filled(tmp_path)
    limit = 1_000_000  # bytes a file may reach: the write-ahead log cannot take one transaction (3 MB)
    run = subprocess.run([sys.executable, "-W", "error", "-c", FULL_DISK, str(tmp_path), str(limit)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "3000 not written: disk I/O error"  # counted, not raised: transform goes on
    cache = EmbeddingCache(tmp_path, {"k": 1}, dim=384)
    got, found = cache.get_many(texts)
    assert found.all() and not cache.skipped
    np.testing.assert_array_equal(got, vectors)
    with contextlib.closing(sqlite3.connect(cache.path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    cache.put_many(["after"], _vectors(1))  # space again: writes again
    assert cache.get_many(["after"])[1].all() and not cache.skipped


# ------------------------------------------------------------ the old layout
def test_folders_of_the_old_one_file_per_text_layout_are_ignored_with_one_notice(tmp_path):
    embedder = BertEmbedder(dtype="float32", device="cpu", cache_dir=tmp_path)
    expected = embedder.transform(TEXTS[:1])
    (folder,) = tmp_path.glob("*/")
    for store in folder.glob("embeddings.sqlite3*"):
        store.unlink()
    old = folder / _sha(TEXTS[0]).hex()[:2] / f"{_sha(TEXTS[0]).hex()}.emb"
    old.parent.mkdir()
    old.write_bytes(b"SKFLEMB1" + b"\0" * 1580)  # what the old cache wrote there
    fresh = BertEmbedder(dtype="float32", device="cpu", cache_dir=tmp_path)
    with pytest.warns(UserWarning, match=r"holds 1 folders of the old one-file-per-text embedding cache, which is no "
                      r"longer read .*; delete .*\?\? to free their space") as record:
        np.testing.assert_allclose(fresh.transform(TEXTS)[:1], expected, atol=1e-6)  # encoded again, in a batch
    assert len([w for w in record if "old one-file-per-text" in str(w.message)]) == 1  # one line, once
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh.transform(TEXTS[:1])  # once per process and folder
    assert old.exists()  # not deleted for the user


@pytest.mark.slow
def test_a_writer_stuck_in_a_transaction_delays_other_writers_a_bounded_time_and_never_readers(tmp_path, monkeypatch):
    from skflow.embedding import _cache

    monkeypatch.setattr(_cache, "_BUSY_TIMEOUT_S", 3.0)  # 5 minutes in use
    cache, texts, vectors = _filled(tmp_path, n=100)
    with contextlib.closing(sqlite3.connect(cache.path, isolation_level=None)) as stuck:
        stuck.execute("BEGIN IMMEDIATE")  # holds the write lock, as a writer stopped (SIGSTOP) mid-transaction
        stuck.execute("DELETE FROM embeddings")  # not committed: never seen
        start = time.monotonic()
        got, found = cache.get_many(texts)
        assert found.all() and time.monotonic() - start < 2.0  # the reader did not wait
        np.testing.assert_array_equal(got, vectors)
        start = time.monotonic()
        cache.put_many(["new"], _vectors(1))
        assert 3.0 <= time.monotonic() - start < 30.0  # the writer waited its timeout, then gave up on caching
        assert cache.problems() == "1 not written: database is locked"
        stuck.execute("ROLLBACK")
    cache.put_many(["new"], _vectors(1))
    assert cache.get_many(["new"])[1].all()
