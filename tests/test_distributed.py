"""skflow embed | fit | transform on Ray Data, against the same estimators in process."""

import json
import os
import signal
import sys

import joblib
import numpy as np
import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet as pq
import pytest
import torch

import skflow
from skflow import BertEmbedder, FlowGaussianizer
from skflow.cli import main
from skflow.datasets import load_sts

N_SENTENCES = 300


@pytest.fixture(scope="module")
def sentences(sts_data_home):
    dev = load_sts("stsb", split="dev", data_home=sts_data_home, download_if_missing=False)
    return list(dict.fromkeys(dev.pairs.ravel().tolist()))[:N_SENTENCES]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, sentences):
    """Two Parquet shards with an id column that must ride along, and the texts by id."""
    folder = tmp_path_factory.mktemp("corpus")
    ids = np.arange(1000, 1000 + len(sentences))
    half = len(sentences) // 2
    for part, rows in enumerate([slice(0, half), slice(half, None)]):
        pq.write_table(pa.table({"id": ids[rows], "text": sentences[rows]}), folder / f"part-{part}.parquet")
    return folder, dict(zip(ids.tolist(), sentences))


def _embedder():
    return BertEmbedder(pooling="cls", dtype="float32", show_progress_bar=False)


def _read(folder, column):
    table = pq.read_table(folder)
    vectors = np.stack(table.column(column).to_numpy(zero_copy_only=False)).astype(np.float32)
    return table.column("id").to_pylist(), vectors, table


def test_embed_fit_transform_match_the_estimators_in_process(ray_instance, corpus, tmp_path, capsys):
    folder, texts = corpus
    assert main(["embed", str(folder), "--output", str(tmp_path / "emb"), "--pooling", "cls", "--dtype", "float32",
                 "--quiet"]) == 0
    ids, vectors, table = _read(tmp_path / "emb", "embedding")
    assert sorted(ids) == sorted(texts) and table.column_names == ["id", "text", "embedding"]
    assert pa.types.is_fixed_size_list(table.schema.field("embedding").type) and vectors.shape == (N_SENTENCES, 384)
    expected = _embedder().transform([texts[i] for i in ids])
    np.testing.assert_allclose(vectors, expected, rtol=0, atol=1e-5)

    fit = ["fit", str(tmp_path / "emb"), "--output", str(tmp_path / "flow.skops"), "--epochs", "2", "--quiet"]
    assert main(fit) == 0
    flow = skflow.load(tmp_path / "flow.skops")  # skflow fit writes .skops
    assert isinstance(flow, FlowGaussianizer) and flow.n_samples_seen_ == 2 * N_SENTENCES and flow.n_iter_ == 2

    assert main(["transform", str(tmp_path / "emb"), "--model", str(tmp_path / "flow.skops"),
                 "--output", str(tmp_path / "z"), "--quiet"]) == 0
    z_ids, z, z_table = _read(tmp_path / "z", "z")
    assert z_table.column_names == ["id", "text", "embedding", "z"]
    np.testing.assert_allclose(z, flow.transform(expected[[ids.index(i) for i in z_ids]]), rtol=1e-5, atol=1e-5)


def test_a_pipeline_from_text_transforms_any_text_format(ray_instance, sentences, tmp_path):
    from sklearn.pipeline import make_pipeline

    pipe = make_pipeline(_embedder(), FlowGaussianizer(random_state=0)).fit(sentences)
    joblib.dump(pipe, tmp_path / "pipe.joblib")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "texts.txt").write_text("\n".join(sentences[:40]) + "\n", encoding="utf-8")
    assert main(["transform", str(tmp_path / "in"), "--model", str(tmp_path / "pipe.joblib"),
                 "--output", str(tmp_path / "out"), "--quiet"]) == 0
    table = pq.read_table(tmp_path / "out")
    got = np.stack(table.column("z").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(got, pipe.transform(table.column("text").to_pylist()), rtol=1e-5, atol=1e-5)
    assert sorted(table.column("text").to_pylist()) == sorted(sentences[:40])


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_csv_and_json_lines_inputs(ray_instance, sentences, tmp_path, fmt):
    rows = [{"id": i, "text": t} for i, t in enumerate(sentences[:30])]
    path = tmp_path / f"in.{fmt}"
    if fmt == "csv":
        pyarrow.csv.write_csv(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    from skflow.distributed import embed

    assert embed([path], tmp_path / "out", embedder=_embedder(), quiet=True) == 30
    ids, vectors, _ = _read(tmp_path / "out", "embedding")
    np.testing.assert_allclose(vectors, _embedder().transform([sentences[i] for i in ids]), atol=1e-5)


class KillOnceEmbedder(BertEmbedder):
    """Kills its own worker process (SIGKILL) in the middle of its first batch, once per marker file."""

    def __init__(self, marker="", **kwargs):
        super().__init__(**kwargs)
        self.marker = marker

    def transform(self, X):
        if len(X) > 1 and self.marker and not os.path.exists(self.marker):
            with open(self.marker, "w") as f:
                f.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().transform(X)


def test_a_killed_worker_is_restarted_and_every_row_written_once(ray_instance, corpus, tmp_path):
    from ray import cloudpickle

    from skflow.distributed import embed

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module
    folder, texts = corpus
    marker = tmp_path / "killed"
    killer = KillOnceEmbedder(marker=str(marker), pooling="cls", dtype="float32", show_progress_bar=False)
    assert embed([folder], tmp_path / "out", embedder=killer, quiet=True) == N_SENTENCES
    killed_pid = int(marker.read_text())
    assert killed_pid != os.getpid()
    with pytest.raises(ProcessLookupError):
        os.kill(killed_pid, 0)  # that worker is gone
    ids, vectors, _ = _read(tmp_path / "out", "embedding")
    assert len(ids) == len(set(ids)) == N_SENTENCES and set(ids) == set(texts)
    np.testing.assert_allclose(vectors, _embedder().transform([texts[i] for i in ids]), atol=1e-5)


def _openmp():
    """The OpenMP runtime torch runs on (its thread count is kept per thread)."""
    import ctypes
    import importlib

    importlib.import_module("torch")  # loads the runtime
    with open("/proc/self/maps") as maps:
        path = next(line.split()[-1] for line in maps if "libgomp" in line and "torch" in line)  # not sklearn's
    return ctypes.CDLL(path)


@pytest.mark.parametrize("per_thread", [True, False], ids=["openmp-per-thread", "no-per-thread-limit"])
def test_each_actor_call_runs_with_its_thread_count_in_whatever_thread_ray_uses(corpus, monkeypatch, per_thread):
    import threading

    import skflow.utils._runtime
    from skflow.distributed import _MapBatches

    if not per_thread:  # no OpenMP runtime threadpoolctl can limit per thread: the count is set all the same
        monkeypatch.setattr(skflow.utils._runtime, "per_thread_limits", lambda: False)
    omp, before = _openmp(), torch.get_num_threads()
    folder, _ = corpus
    table = pq.read_table(folder / "part-0.parquet")
    X = np.random.RandomState(0).normal(size=(200, 4)).astype(np.float32)
    table = table.append_column("embedding", pa.array(X[: table.num_rows].tolist(), pa.list_(pa.float32(), 4)))
    actor = _MapBatches(FlowGaussianizer(max_epochs=1, random_state=0).fit(X), "embedding", "z", threads=2)
    seen = []
    transform = actor.model.transform
    actor.model.transform = lambda X: seen.append(omp.omp_get_max_threads()) or transform(X)

    def ray_call():
        omp.omp_set_num_threads(1)  # a thread Ray starts in a worker that reserves one CPU
        seen.append(actor(table).num_rows)

    thread = threading.Thread(target=ray_call)
    thread.start()
    thread.join(timeout=120)
    torch.set_num_threads(before)  # the call gave its thread's 1 back to torch's process-wide count
    assert seen == [2, table.num_rows]  # the model ran on the actor's count


def test_grid_search_on_the_ray_joblib_backend(ray_instance, sts_data_home, tmp_path):
    from ray.util.joblib import register_ray
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline

    from skflow.metrics import make_sts_scorer

    register_ray()
    dev = load_sts("stsb", split="dev", data_home=sts_data_home, download_if_missing=False)
    pipe = make_pipeline(BertEmbedder(pooling="cls", cache_dir=tmp_path, show_progress_bar=False),
                         FlowGaussianizer(random_state=0))
    grid = {"flowgaussianizer__learning_rate": [1e-3, 1e-4]}
    with joblib.parallel_backend("ray"):
        search = GridSearchCV(pipe, grid, cv=2, scoring=make_sts_scorer(), n_jobs=-1)
        search.fit(dev.pairs[:200], dev.scores[:200])
    serial = GridSearchCV(pipe, grid, cv=2, scoring=make_sts_scorer()).fit(dev.pairs[:200], dev.scores[:200])
    np.testing.assert_allclose(search.cv_results_["mean_test_score"], serial.cv_results_["mean_test_score"], atol=1e-3)
    assert all(0.5 < s < 0.95 for s in search.cv_results_["mean_test_score"])


# ------------------------------------------------- bad input: one line, exit 2, before any work
def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_bad_inputs_fail_fast_with_one_line(corpus, tmp_path, capsys, monkeypatch):
    folder, _ = corpus
    from skflow import distributed

    never = lambda *a, **k: pytest.fail("Ray used before the input was checked")  # noqa: E731
    monkeypatch.setattr(distributed, "ray_session", never)
    embed = ["embed", str(folder), "--text-column", "sentence", "--output", str(tmp_path / "o")]
    assert "no column 'sentence' (columns: id, text)" in _error(capsys, embed)
    bad = tmp_path / "bad"
    bad.mkdir()
    pq.write_table(pa.table({"text": [1, 2]}), bad / "x.parquet")
    embed_bad = ["embed", str(bad), "--output", str(tmp_path / "o")]
    assert f"{bad / 'x.parquet'}: column 'text' holds int64 values, not strings" in _error(capsys, embed_bad)
    empty = tmp_path / "empty"
    empty.mkdir()
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), empty / "x.parquet")
    assert "the input has no rows" in _error(capsys, ["embed", str(empty), "--output", str(tmp_path / "o")])
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "old.parquet").write_bytes(b"x")
    embed_full = ["embed", str(folder), "--output", str(tmp_path / "full")]
    assert "exists and is not empty; pass --overwrite" in _error(capsys, embed_full)
    (tmp_path / "broken.joblib").write_bytes(b"not a model")
    transform = ["transform", str(folder), "--output", str(tmp_path / "o2"), "--model"]
    assert "broken.joblib: cannot read the model" in _error(capsys, [*transform, str(tmp_path / "broken.joblib")])
    joblib.dump({"a": 1}, tmp_path / "dict.joblib")
    expected = "holds a dict; expected a fitted FlowGaussianizer"
    assert expected in _error(capsys, [*transform, str(tmp_path / "dict.joblib")])
    assert "no such file or folder" in _error(
        capsys,
        ["embed", str(tmp_path / "nowhere"), "--output", str(tmp_path / "o")],
    )
    assert not (tmp_path / "o").exists() and not (tmp_path / "o2").exists()


def test_bad_rows_are_found_where_ray_reads_them_in_one_line_naming_file_and_row(ray_instance, tmp_path, capsys):
    """The driver reads listings and Parquet footers only: the task that reads a file checks its rows, and a bad
    one ends the command in one line, exit 2, with nothing written (a text corpus of blank lines too)."""
    bad = tmp_path / "bad"
    bad.mkdir()
    pq.write_table(pa.table({"text": ["a", None, "c"]}), bad / "x.parquet")
    embed_bad = ["embed", str(bad), "--output", str(tmp_path / "o"), "--quiet"]
    assert f"{bad / 'x.parquet'}: row 2 of column 'text' is empty" in _error(capsys, embed_bad)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    pq.write_table(pa.table({"embedding": pa.array([[1.0, 2.0], [1.0, 2.0, 3.0]])}), mixed / "x.parquet")
    assert "vectors of several lengths" in _error(capsys, ["fit", str(mixed), "--output", str(tmp_path / "m.joblib"),
                                                           "--quiet"])
    blank = tmp_path / "blank"
    blank.mkdir()
    (blank / "a.txt").write_text("\n  \n\n")
    assert "the input has no rows" in _error(capsys, ["embed", str(blank), "--output", str(tmp_path / "o"), "--quiet"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "blank", "mixed"]
