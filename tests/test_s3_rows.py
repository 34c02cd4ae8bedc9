"""Rows of Parquet files on object storage are checked where they are read, not downloaded by the driver; an
skflow output on object storage is read as the files its manifest lists, and is written, killed and overwritten
as a local one is. Against moto's S3 server, as test_s3.

Each test has a Ray instance of its own: a failed job's actors are left by Ray Data to reference counting and
can hold their CPU for a while (skflow waits for them, a bounded time), which on 2 CPUs would delay the next test.
"""

import json
import signal
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from skflow import FlowGaussianizer, distributed
from skflow.cli import main
from skflow.ray_jobs import MARKER, OutputFolder, _corpus, input_files, load_model, save_model
from skflow.utils import OutputPathError
from tests import test_s3
from tests.test_output_files import _writers, write_like_ray
from tests.test_s3 import BUCKET, _embed_args, _keys, _objects, _put, _refused, _s3_table, _sorted_vectors

s3 = test_s3.s3  # the same moto server fixture, one per module
no_secret_in_output = test_s3.no_secret_in_output


@pytest.fixture
def driver_reads(monkeypatch):
    """Every file whose rows the driver's checks read (the actors are other processes)."""
    reads, real = [], _corpus.read_table
    monkeypatch.setattr(_corpus, "read_table", lambda path, *a, **k: reads.append(path) or real(path, *a, **k))
    return reads


def _texts(ids, texts) -> pa.Table:
    return pa.table({"id": list(ids), "text": pa.array(texts, pa.string())})


def _vectors(ids, vectors) -> pa.Table:  # a variable-length list column: its length is not in the schema
    return pa.table({"id": list(ids), "embedding": pa.array([list(map(float, v)) for v in vectors])})


def test_the_rows_of_s3_parquet_texts_are_checked_in_the_actors_not_downloaded_by_the_driver(
    ray_instance, s3, capfd, driver_reads
):
    client, _ = s3
    _put(client, "shards/a.parquet", _texts([1, 2], ["a first text", "a second"]))
    _put(client, "shards/b.parquet", _texts([3, 4, 5], ["a third", "a fourth", "a fifth"]))
    assert main(_embed_args(f"s3://{BUCKET}/shards/", "--output", f"s3://{BUCKET}/shards-emb")) == 0
    assert driver_reads == []
    ids, vectors = _sorted_vectors(_s3_table(f"s3://{BUCKET}/shards-emb"), "embedding")
    assert ids == [1, 2, 3, 4, 5] and vectors.shape == (5, 384)
    assert json.loads(client.get_object(Bucket=BUCKET, Key=f"shards-emb/{MARKER}")["Body"].read())["rows"] == 5

    _put(client, "shards/b.parquet", _texts([3, 4, 5], ["a third", None, "a fifth"]))
    err = _refused(capfd, _embed_args(f"s3://{BUCKET}/shards/", "--output", f"s3://{BUCKET}/shards-emb-2"),
                   after_ray=True)
    assert err == (f"error: s3://{BUCKET}/shards/b.parquet: row 2 of column 'text' is empty (null), not a string; "
                   "nothing was written")
    # the driver read no rows: the read checked each file where Ray read it
    assert driver_reads == [] and _objects(client, "shards-emb-2") == {}
    # footers are checked on the driver, before Ray starts
    _put(client, "shards/b.parquet", pa.table({"id": [3], "text": [3]}))
    err = _refused(capfd, _embed_args(f"s3://{BUCKET}/shards/", "--output", f"s3://{BUCKET}/shards-emb-2"))
    assert err == f"error: s3://{BUCKET}/shards/b.parquet: column 'text' holds int64 values, not strings"


def test_the_vectors_of_s3_shards_are_checked_where_they_are_read_naming_the_file_and_row(
    ray_instance, s3, capfd, driver_reads, tmp_path
):
    client, _ = s3
    good = np.random.default_rng(0).normal(size=(40, 8))
    _put(client, "vectors/part-0.parquet", _vectors(range(20), good[:20]))
    bad = good[20:].copy()
    bad[4, 2] = np.nan
    _put(client, "vectors/part-1.parquet", _vectors(range(20, 40), bad))
    err = _refused(capfd, ["fit", f"s3://{BUCKET}/vectors", "--output", tmp_path / "flow.joblib", "--quiet"],
                   after_ray=True)
    assert err.startswith(f"error: s3://{BUCKET}/vectors/part-1.parquet: row 5 of column 'embedding' holds nan "
                          "(element 3)")
    assert not (tmp_path / "flow.joblib").exists()
    assert driver_reads == []  # the file was checked where Ray read it, not on the driver

    _put(client, "vectors/part-1.parquet", _vectors(range(20, 40), good[20:]))
    flow = distributed.fit(f"s3://{BUCKET}/vectors", tmp_path / "flow.joblib", quiet=True)
    assert flow.n_samples_seen_ == 40 and driver_reads == []

    save_model(FlowGaussianizer(max_epochs=1, random_state=0).fit(good), str(tmp_path / "flow.joblib"))
    _put(client, "vectors/part-1.parquet", _vectors(range(20, 40), good[20:, :7]))  # one feature short
    err = _refused(capfd, ["transform", f"s3://{BUCKET}/vectors", "--model", tmp_path / "flow.joblib",
                           "--output", f"s3://{BUCKET}/vectors-z", "--quiet"], after_ray=True)
    assert err.startswith(f"error: s3://{BUCKET}/vectors/part-1.parquet: column 'embedding' holds vectors of "
                          "length 7; expected 8")
    assert err.endswith("nothing was written") and driver_reads == [] and _objects(client, "vectors-z") == {}


def test_an_s3_output_is_read_as_the_files_its_manifest_lists(ray_instance, s3, tmp_path):
    client, _ = s3
    vectors = np.random.default_rng(1).normal(size=(30, 8))
    _put(client, "half-done/part-old.parquet", _vectors(range(10), vectors[:10]))
    _put(client, "half-done/part-new.parquet", _vectors(range(10, 30), vectors[10:]))  # a killed overwrite's
    client.put_object(Bucket=BUCKET, Key=f"half-done/{MARKER}", Body=json.dumps({"files": ["part-old.parquet"]}))
    with pytest.warns(UserWarning, match=r"1 other file\(s\) under it are not part of it and are not read: "
                                         r"part-new.parquet"):
        corpus = input_files([f"s3://{BUCKET}/half-done/"])
    assert corpus.files == (f"s3://{BUCKET}/half-done/part-old.parquet",)
    with pytest.warns(UserWarning, match="part-new.parquet"):
        flow = distributed.fit(f"s3://{BUCKET}/half-done", tmp_path / "flow.joblib", quiet=True)
    assert flow.n_samples_seen_ == 10  # the old output alone, not the old and the half-copied new

    client.put_object(Bucket=BUCKET, Key=f"half-done/{MARKER}", Body=json.dumps({"files": ["part-gone.parquet"]}))
    with pytest.raises(distributed.InputError, match="lists part-gone.parquet, which is missing"):
        input_files([f"s3://{BUCKET}/half-done/"])
    # not JSON, not a list, not names; a name skflow never writes (hidden, in a subfolder, empty, a line break in it)
    for damaged in (b"{not json", b'{"files": "part-old.parquet"}', b'{"files": [1]}', b'{"files": [".part.parquet"]}',
                    b'{"files": ["sub/part.parquet"]}', b'{"files": [""]}', b'{"files": ["part\\nold.parquet"]}'):
        client.put_object(Bucket=BUCKET, Key=f"half-done/{MARKER}", Body=damaged)
        with pytest.raises(distributed.InputError, match="manifest is damaged"):
            input_files([f"s3://{BUCKET}/half-done/"])


def test_an_output_in_a_subfolder_of_an_input_prefix_is_refused_naming_it(s3):
    """Only the input's own manifest is read as listed: an output deeper (one left by a killed --overwrite, say)
    is refused naming it, never read with its strays; given as an input of its own, it is read as listed."""
    client, _ = s3
    vectors = np.random.default_rng(2).normal(size=(4, 8))
    for key in ("runs/day1/part-old.parquet", "runs/day1/part-new.parquet", "runs/loose.parquet"):
        _put(client, key, _vectors(range(4), vectors))
    client.put_object(Bucket=BUCKET, Key=f"runs/day1/{MARKER}", Body=json.dumps({"files": ["part-old.parquet"]}))
    with pytest.raises(distributed.InputError, match=rf"^s3://{BUCKET}/runs/day1: is an skflow output inside the "
                                                      rf"input s3://{BUCKET}/runs; give it as an input of its own"):
        input_files([f"s3://{BUCKET}/runs/"])
    with pytest.warns(UserWarning, match=r"1 other file\(s\) under it are not part of it and are not read"):
        corpus = input_files([f"s3://{BUCKET}/runs/day1", f"s3://{BUCKET}/runs/loose.parquet"])
    assert corpus.files == (f"s3://{BUCKET}/runs/day1/part-old.parquet", f"s3://{BUCKET}/runs/loose.parquet")


def test_hidden_folders_are_never_read_their_manifests_included(s3):
    client, _ = s3
    client.put_object(Bucket=BUCKET, Key="keep/a.txt", Body=b"a text\n")
    client.put_object(Bucket=BUCKET, Key=f"keep/_tmp/{MARKER}", Body=b"{not json")
    client.put_object(Bucket=BUCKET, Key=f"keep/.staging/{MARKER}", Body=json.dumps({"files": ["gone.txt"]}))
    client.put_object(Bucket=BUCKET, Key=f"keep/_bak/{MARKER}", Body=json.dumps({"files": ["a.txt"]}))
    client.put_object(Bucket=BUCKET, Key="keep/_bak/b.txt", Body=b"a stray\n")
    client.put_object(Bucket=BUCKET, Key="keep/.staging/.skflow-pending", Body=b"{}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert input_files([f"s3://{BUCKET}/keep/"]).files == (f"s3://{BUCKET}/keep/a.txt",)


def test_names_from_the_store_stay_on_one_line_and_nothing_unreadable_is_passed_on(s3):
    """Unprintable characters in names are escaped (a tab here: moto stores no key with a line break)."""
    client, _ = s3
    for key in ("odd/run\t1/a.txt", "odd/run\t1/b\tc.txt"):
        client.put_object(Bucket=BUCKET, Key=key, Body=b"a text\n")
    client.put_object(Bucket=BUCKET, Key=f"odd/run\t1/{MARKER}", Body=json.dumps({"files": ["a.txt"]}))
    with pytest.warns(UserWarning) as caught:
        corpus = input_files([f"s3://{BUCKET}/odd/run\t1"])
    assert corpus.files == (f"s3://{BUCKET}/odd/run\t1/a.txt",)
    assert [str(w.message) for w in caught] == [
        f"s3://{BUCKET}/odd/run\\t1: read as the skflow output that its {MARKER} manifest lists (1 file); 1 other "
        "file(s) under it are not part of it and are not read: b\\tc.txt"]
    with pytest.raises(distributed.InputError, match=rf"^s3://{BUCKET}/odd/run\\t1: is an skflow output inside"):
        input_files([f"s3://{BUCKET}/odd/"])
    client.put_object(Bucket=BUCKET, Key=f"odd/run\t1/{MARKER}", Body=b'{"files": ' + b"[" * 100_000 + b"]" * 100_000
                      + b"}")  # deeper than Python's parser goes
    with pytest.raises(distributed.InputError, match=r"^[^\n]*run\\t1: its .skflow-output manifest is damaged"):
        input_files([f"s3://{BUCKET}/odd/run\t1"])


def test_the_command_line_shows_a_warning_on_one_line_like_its_errors(s3, capfd):
    client, _ = s3
    for key in ("shown/out/a.txt", "shown/out/b\tc.txt"):
        client.put_object(Bucket=BUCKET, Key=key, Body=b"a text\n")
    client.put_object(Bucket=BUCKET, Key=f"shown/out/{MARKER}", Body=json.dumps({"files": ["a.txt"]}))
    assert main(["embed", f"s3://{BUCKET}/shown/out", "--output", f"s3://{BUCKET}/shown/out/z"]) == 2  # not --quiet
    assert capfd.readouterr().err.splitlines() == [
        f"warning: s3://{BUCKET}/shown/out: read as the skflow output that its {MARKER} manifest lists (1 file); "
        "1 other file(s) under it are not part of it and are not read: b\\tc.txt",
        f"error: s3://{BUCKET}/shown/out/z: the output folder lies inside the input s3://{BUCKET}/shown/out; "
        "choose another output"]


def test_overwrite_trusts_no_record_that_names_skflow_bookkeeping_and_escapes_foreign_names(s3):
    client, _ = s3
    _put(client, "books/a.parquet", pa.table({"id": [1]}))
    client.put_object(Bucket=BUCKET, Key=f"books/{MARKER}", Body=json.dumps({"files": [MARKER, "a.parquet"]}))
    with pytest.raises(OutputPathError, match="is not a folder skflow wrote"):  # it would delete its own manifest
        OutputFolder(f"s3://{BUCKET}/books", overwrite=True)
    client.put_object(Bucket=BUCKET, Key=f"books/{MARKER}", Body=json.dumps({"files": ["a.parquet"]}))
    client.put_object(Bucket=BUCKET, Key="books/not\tmine.parquet", Body=b"a foreign object")
    with pytest.raises(OutputPathError) as refused:
        OutputFolder(f"s3://{BUCKET}/books", overwrite=True)
    assert "holds files that skflow did not write (not\\tmine.parquet)" in str(refused.value)


def test_an_s3_output_killed_mid_write_or_written_twice_at_once_is_read_whole(s3, tmp_path):
    """Real processes, as in test_output_files: a first write and an --overwrite killed (SIGKILL, by pid) after one
    file, then two --overwrite writers at once; the same code as locally, a manifest upload instead of a rename."""
    client, _ = s3
    out = f"s3://{BUCKET}/killed/out"
    assert _writers(out, "new", ["killed"], tmp_path)["killed"].returncode == -signal.SIGKILL
    for uri in (out, f"s3://{BUCKET}/killed/"):  # the output, and a prefix holding it
        with pytest.raises(distributed.InputError, match=f"^{out}: holds the files of an skflow run without a "
                                                         f"{MARKER} manifest"):
            input_files([uri])
    with pytest.raises(OutputPathError, match="exists and is not empty; pass --overwrite"):
        OutputFolder(out, overwrite=False)
    runs = _writers(out, "overwrite", ["3", "4"], tmp_path)
    assert [run.returncode for run in runs.values()] == [0, 0], {n: r.stderr[-1500:] for n, r in runs.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the first run's files, if its manifest lost: not read
        assert _s3_table(out).column("id").to_pylist() in ([3], [4])
    manifest = client.get_object(Bucket=BUCKET, Key=f"killed/out/{MARKER}")["Body"].read()
    assert _writers(out, "overwrite", ["killed"], tmp_path)["killed"].returncode == -signal.SIGKILL
    assert client.get_object(Bucket=BUCKET, Key=f"killed/out/{MARKER}")["Body"].read() == manifest
    write_like_ray(OutputFolder(out, overwrite=True), pa.table({"id": [5]}))
    files = json.loads(client.get_object(Bucket=BUCKET, Key=f"killed/out/{MARKER}")["Body"].read())["files"]
    objects = [key for key in _keys(client, "killed/") if not key.endswith("/")]  # not folder placeholders
    assert objects == sorted(f"killed/out/{name}" for name in [MARKER, *files])  # every dead run's file gone
    assert input_files([out]).files == tuple(f"{out}/{name}" for name in files)


def _damaged(table: pa.Table, column: str) -> bytes:
    """``table`` as Parquet whose footer is sound but whose first page of ``column`` is overwritten."""
    import io


    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="none")
    data = bytearray(buffer.getvalue())
    offset = pq.ParquetFile(io.BytesIO(bytes(data))).metadata.row_group(0).column(
        table.column_names.index(column)).data_page_offset
    data[offset : offset + 40] = b"\xff" * 40
    return bytes(data)


def test_a_damaged_s3_parquet_page_behind_a_sound_footer_is_named_exit_2(ray_instance, s3, capfd, tmp_path):
    """The footer passes the driver's check; the read fails in Ray, which names the file: not "the Ray job failed"
    (exit 1) nor, in fit, Ray's whole traceback."""
    client, _ = s3
    vectors = np.random.default_rng(2).normal(size=(40, 8))
    _put(client, "damaged/part-0.parquet", _vectors(range(20), vectors[:20]))
    client.put_object(Bucket=BUCKET, Key="damaged/part-1.parquet",
                      Body=_damaged(_vectors(range(20, 40), vectors[20:]), "embedding"))
    expected = f"error: s3://{BUCKET}/damaged/part-1.parquet: cannot be read as Parquet ("
    err = _refused(capfd, ["fit", f"s3://{BUCKET}/damaged", "--output", tmp_path / "flow.joblib", "--quiet"],
                   after_ray=True)
    assert err.startswith(expected) and "ray::" not in err and not (tmp_path / "flow.joblib").exists()
    save_model(FlowGaussianizer(max_epochs=1, random_state=0).fit(vectors), str(tmp_path / "model.joblib"))
    err = _refused(capfd, ["transform", f"s3://{BUCKET}/damaged", "--model", tmp_path / "model.joblib",
                           "--output", f"s3://{BUCKET}/damaged-z", "--quiet"], after_ray=True)
    assert err.startswith(expected) and err.endswith("; nothing was written"), err
    assert _objects(client, "damaged-z") == {}
    # a damaged page of another column: fit reads the vectors' column only (the footer says where its pages are)
    client.put_object(Bucket=BUCKET, Key="other-column/part-0.parquet",
                      Body=_damaged(_vectors(range(20), vectors[:20]), "id"))
    assert main(["fit", f"s3://{BUCKET}/other-column", "--output", str(tmp_path / "flow.joblib"), "--quiet"]) == 0
    assert load_model(str(tmp_path / "flow.joblib")).n_samples_seen_ == 20
