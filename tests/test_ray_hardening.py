"""skflow embed | fit | transform as a careless user or an attacker runs them: they never destroy data and never
report a partial success.

Most checks fail before Ray starts (``distributed.ray_session`` is replaced by a failure there); those that need
Ray share the session's head of 2 CPUs (``tests/conftest.py``); the kill, address and README tests run the real
command in a process of its own, every wait bounded by a timeout.
"""

import gzip
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import types
import warnings
from pathlib import Path

import joblib
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

import skflow
from skflow import BertEmbedder, FlowGaussianizer, distributed
from skflow.cli import main
from skflow.ray_jobs import MARKER, OutputFolder, input_files
from skflow.utils import MANIFEST, OutputPathError, replaced_atomically
from tests.conftest import session_processes as _session
from tests.test_output_files import write_like_ray

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
TOPICS = ["cats", "rain", "trains", "bread"] * 10
SENTENCES = [f"Sentence number {i} is about {topic}." for i, topic in enumerate(TOPICS)]


# ----------------------------------------------------------------------------------------- helpers
def _tree(folder: Path) -> dict:
    """Every file under ``folder`` (hidden ones included) and the sha256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


def _run(argv) -> int:
    try:
        return main([str(a) for a in argv])
    except SystemExit as exc:  # usage errors: argparse exits
        return exc.code


def _refused(capsys, argv, code=2) -> str:
    assert _run(argv) == code
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.fixture
def no_ray(monkeypatch):
    monkeypatch.setattr(distributed, "ray_session", lambda *a, **k: pytest.fail("Ray started before the checks"))


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("\n".join(SENTENCES[:20]) + "\n", encoding="utf-8")
    (folder / "b.txt").write_text("\n".join(SENTENCES[20:]) + "\n", encoding="utf-8")
    return folder


def _embeddings(folder: Path, n=40, d=8, *, shards=2, bad=None) -> Path:
    folder.mkdir()
    X = np.random.RandomState(0).normal(size=(n, d)).astype(np.float32)
    if bad is not None:
        X[bad] = np.nan
    for part, rows in enumerate(np.array_split(np.arange(n), shards)):
        vectors = pa.FixedSizeListArray.from_arrays(pa.array(X[rows].ravel()), d)
        pq.write_table(pa.table({"id": rows, "embedding": vectors}), folder / f"part-{part}.parquet")
    return folder


def _flow_file(path: Path, d=8) -> Path:
    X = np.random.RandomState(1).normal(size=(64, d)).astype(np.float32)
    joblib.dump(FlowGaussianizer(max_epochs=1, random_state=0).fit(X), path)
    return path


def _skflow_output(folder: Path) -> Path:
    """An output folder as skflow leaves it (one shard and the manifest)."""
    write_like_ray(OutputFolder(folder, overwrite=False), pa.table({"id": [1, 2], "text": ["old", "output"]}))
    return folder


# ------------------------------------------------------- outputs that are inputs, folders skflow did not write
def test_an_output_that_is_contains_or_lies_inside_an_input_is_refused(tmp_path, corpus, capsys, monkeypatch, no_ray):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link").symlink_to(corpus)
    emb = _embeddings(tmp_path / "emb")
    (tmp_path / "out").mkdir()
    _flow_file(tmp_path / "out" / "flow.joblib")
    before = _tree(tmp_path)
    cases = [
        (["embed", "corpus", "--output", "corpus", "--overwrite"], "the output folder is the input corpus"),
        (["embed", "corpus", "--output", ".", "--overwrite"], "the output folder contains the input corpus"),
        (["embed", "corpus", "--output", "corpus/emb"], "the output folder lies inside the input corpus"),
        (["embed", "corpus", "--output", "link", "--overwrite"], "the output folder is the input corpus"),
        (["embed", "link/a.txt", "--output", "corpus", "--overwrite"],
         "the output folder contains the input link/a.txt"),
        (["fit", emb, "--output", emb / "flow.skops"], "the output file lies inside the input"),
        (["fit", emb / "part-0.parquet", "--output", emb / "part-0.parquet", "--overwrite"],
         "the output file is the input"),
        (["transform", emb, "--model", "out/flow.joblib", "--output", "out", "--overwrite"],
         "the output folder contains the input out/flow.joblib"),
    ]
    for argv, message in cases:
        assert message in _refused(capsys, argv), argv
    assert _tree(tmp_path) == before


def test_overwrite_replaces_only_a_folder_that_skflow_wrote(tmp_path, corpus, capsys, monkeypatch, no_ray):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    forged = tmp_path / "forged"
    forged.mkdir()
    (forged / MARKER).write_text("not json")
    (forged / "notes.txt").write_text("keep")
    old = _skflow_output(tmp_path / "old")
    (old / "sub").mkdir()
    (old / "sub" / "user.csv").write_text("a,b\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep")
    before = _tree(tmp_path)
    assert "mine: is not a folder skflow wrote (no valid .skflow-output manifest" in _refused(
        capsys, ["embed", corpus, "--output", mine, "--overwrite"])
    assert "is not a folder skflow wrote" in _refused(capsys, ["embed", corpus, "--output", forged, "--overwrite"])
    assert "holds files that skflow did not write (sub/user.csv)" in _refused(
        capsys, ["embed", corpus, "--output", old, "--overwrite"])
    assert "exists and is not empty; pass --overwrite" in _refused(capsys, ["embed", corpus, "--output", old])
    monkeypatch.chdir(elsewhere)
    assert "is not a folder skflow wrote" in _refused(capsys, ["embed", corpus, "--output", ".", "--overwrite"])
    assert _tree(tmp_path) == before


def test_a_command_that_fails_with_overwrite_keeps_the_previous_output(tmp_path, corpus, capsys, no_ray):
    old = _skflow_output(tmp_path / "old")
    (tmp_path / "empty-model").mkdir()
    (tmp_path / "odd-model").mkdir()
    (tmp_path / "odd-model" / "config.json").write_text('{"model_type": "no-such-architecture"}')
    before = _tree(tmp_path)
    for model, message in [(tmp_path / "empty-model", "that folder has no config.json"),
                           (tmp_path / "odd-model", "Could not load the encoder"),
                           (tmp_path / "missing-model", "there is no folder at that path")]:
        assert message in _refused(capsys, ["embed", corpus, "--output", old, "--overwrite", "--model", model])
    assert _tree(tmp_path) == before


# --------------------------------------------------------- options that cannot work: before Ray, before output
@pytest.mark.parametrize("argv, message", [
    (["embed", "{corpus}", "--workers", "0"], "argument --workers: must be an int in the range [1, inf), got '0'"),
    (["embed", "{corpus}", "--workers", "-2"], "argument --workers: must be an int in the range [1, inf), got '-2'"),
    (["embed", "{corpus}", "--threads-per-worker", "-3"],
     "argument --threads-per-worker: must be an int in the range [1, inf)"),
    (["embed", "{corpus}", "--gpus-per-worker", "-1"], "argument --gpus-per-worker: must be a float in the range [0.0"),
    (["embed", "{corpus}", "--gpus-per-worker", "nan"],
     "argument --gpus-per-worker: must be a float in the range [0.0, inf), got 'nan'"),
    (["embed", "{corpus}", "--max-length", "100000"],
     "max_length=100000 exceeds what 'sentence-transformers/all-MiniLM-L6-v2' supports (512 positions)"),
    (["embed", "{emb_with_text}"], "has a column 'embedding' already"),
    (["fit", "{emb}", "--epochs", "0"], "argument --epochs: must be an int in the range [1, 10000], got '0'"),
    (["fit", "{emb}", "--device", "meta"], "device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got 'meta'"),
    (["fit", "{emb}", "--depth", "1000000"], "error: FlowGaussianizer: the flow would have 3000000 steps (depth x "
                                             "levels), more than 1000; lower depth, n_levels or hidden_channels"),
    (["fit", "{emb}", "--hidden-channels", "1000000000"], "error: FlowGaussianizer: the flow would have "
                                                          "9000000078000000126 weights; training them takes about"),
    (["transform", "{emb}", "--model", "{flow}", "--output-column", "embedding"], "has a column 'embedding' already"),
    (["transform", "{emb}", "--model", "{flow}", "--output-column", "id"], "has a column 'id' already"),
    (["transform", "{emb}", "--model", "{skops_as_joblib}"], "is a skops file (a zip archive with schema.json), not"),
    (["transform", "{emb}", "--model", "{joblib_as_skops}"], "is not a skops file (a joblib or pickle file)"),
    (["transform", "{emb}", "--model", "{unfitted}"], "holds an unfitted FlowGaussianizer"),
    (["transform", "{emb}", "--model", "{corpus}"], "is a folder; give the model file"),
])
def test_options_that_cannot_work_fail_in_one_line_before_ray_and_before_any_output(
        tmp_path, corpus, capsys, no_ray, argv, message):
    emb = _embeddings(tmp_path / "emb")
    emb_with_text = tmp_path / "embedded"
    emb_with_text.mkdir()
    pq.write_table(pq.read_table(emb / "part-0.parquet").append_column("text", pa.array(["x"] * 20)),
                   emb_with_text / "part-0.parquet")
    flow = _flow_file(tmp_path / "flow.joblib")
    skflow.dump(joblib.load(flow), tmp_path / "flow.skops")
    os.replace(tmp_path / "flow.skops", tmp_path / "skops.joblib")
    joblib.dump(FlowGaussianizer(), tmp_path / "unfitted.joblib")
    names = {"corpus": corpus, "emb": emb, "emb_with_text": emb_with_text, "flow": flow,
             "skops_as_joblib": tmp_path / "skops.joblib",
             "joblib_as_skops": tmp_path / "j.skops", "unfitted": tmp_path / "unfitted.joblib"}
    (tmp_path / "j.skops").write_bytes(flow.read_bytes())
    out = tmp_path / ("model.skops" if argv[0] == "fit" else "out")
    before = _tree(tmp_path)
    assert message in _refused(capsys, [part.format(**names) for part in argv] + ["--output", out])
    assert not out.exists() and _tree(tmp_path) == before


@pytest.mark.parametrize("params, message", [
    ({"depth": 10**6}, "FlowGaussianizer: the flow would have 3000000 steps (depth x levels), more than 1000"),
    ({"n_levels": 2, "depth": 501}, "FlowGaussianizer: the flow would have 1002 steps (depth x levels)"),
    ({"hidden_channels": 10**9}, "FlowGaussianizer: the flow would have 9000000078000000126 weights; training them"),
])
def test_distributed_fit_refuses_a_flow_too_large_to_train_from_the_footers_before_ray(tmp_path, no_ray, params,
                                                                                       message):
    emb = _embeddings(tmp_path / "emb")
    before = _tree(tmp_path)
    with pytest.raises(ValueError, match=re.escape(message)):
        distributed.fit(emb, tmp_path / "model.skops", flow=FlowGaussianizer(**params))
    assert _tree(tmp_path) == before


def test_a_flow_too_large_for_vectors_no_footer_sizes_is_refused_at_the_first_batch(ray_instance, tmp_path, capsys):
    """A column of variable-length lists (pandas' and pyarrow's default) gives no length in its footer: checked
    when the first vectors arrive, the same one line and exit 2 as from a footer, nothing written."""
    (tmp_path / "emb").mkdir()
    X = np.random.RandomState(0).normal(size=(40, 8))
    pq.write_table(pa.table({"embedding": pa.array([list(map(float, v)) for v in X])}), tmp_path / "emb" / "a.parquet")
    err = _refused(capsys, ["fit", tmp_path / "emb", "--output", tmp_path / "flow.skops", "--depth", "1000000",
                            "--quiet"])
    assert err == ("error: FlowGaussianizer: the flow would have 3000000 steps (depth x levels), more than 1000; "
                   "lower depth, n_levels or hidden_channels; nothing was written"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb"]


_CONTROL = "the file name must not hold a line break or another control character; rename the file"


@pytest.mark.parametrize("name, shown, message", [
    (b"bad\xff.txt", "bad\\xff.txt", "the file name must be valid UTF-8; rename the file"),
    (b"line\nbreak.txt", "line\\nbreak.txt", _CONTROL),
    ("para\u2029graph.txt".encode(), "para\\u2029graph.txt", _CONTROL),
    (b"bell\x07.txt", "bell\\x07.txt", _CONTROL),
])
def test_file_names_that_ray_cannot_carry_are_refused_naming_them(tmp_path, corpus, capsys, no_ray, name, shown,
                                                                  message):
    """Listed in a folder or named directly: one line that names the file (escaped), exit 2, before Ray."""
    path = os.fsdecode(os.path.join(os.fsencode(corpus), name))
    Path(path).write_text("a text\n")
    before = _tree(tmp_path)
    for given in (corpus, path):
        assert _refused(capsys, ["embed", given, "--output", tmp_path / "out"]) == f"error: {corpus}/{shown}: {message}"
    assert _tree(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]


_EMPTY, _BREAK, _NOT_UTF8 = "must not be empty", "must not hold a line break or another control character", \
    "must be valid UTF-8"


@pytest.mark.parametrize("column, problem", [
    ("", f"{_EMPTY}, got ''"), ("  ", f"{_EMPTY}, got '  '"), ("two\nlines", f"{_BREAK}, got 'two\\nlines'"),
    ("z\r", f"{_BREAK}, got 'z\\r'"), ("nul\x00", f"{_BREAK}, got 'nul\\x00'"),
    ("z\u2028", f"{_BREAK}, got 'z\\u2028'"),
    ("z\udcff", f"{_NOT_UTF8}, got 'z\\xff'"),  # what Python makes of the argv bytes b"z\xff": Arrow cannot write it
])
def test_an_output_column_that_is_not_a_name_is_refused_before_ray(tmp_path, capsys, no_ray, column, problem):
    emb, flow = _embeddings(tmp_path / "emb"), _flow_file(tmp_path / "flow.joblib")
    err = _refused(capsys, ["transform", emb, "--model", flow, "--output", tmp_path / "z", "--output-column", column])
    assert err == f"error: --output-column {problem}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb", "flow.joblib"]
    with pytest.raises(distributed.InputError) as info:
        distributed.transform(emb, flow, tmp_path / "z", output_column=column)
    assert str(info.value) == f"--output-column {problem}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb", "flow.joblib"]


@pytest.mark.parametrize("command, value, problem", [
    *((command, value, problem) for command in ("embed", "fit", "transform") for value, problem in [
        ("", f"{_EMPTY}, got ''"), (" ", f"{_EMPTY}, got ' '"), ("out\nx", f"{_BREAK}, got 'out\\nx'"),
        ("out\u2028x", f"{_BREAK}, got 'out\\u2028x'"), ("out\udcff", f"{_NOT_UTF8}, got 'out\\xff'")]),
    ("fit", "sub/", "must name a file, not a folder, got 'sub/'"),
    ("fit", ".", "must name a file, not a folder, got '.'"),
])
def test_an_output_that_is_not_a_name_is_refused_before_ray(tmp_path, corpus, capsys, no_ray, monkeypatch, command,
                                                            value, problem):
    """``--output ''`` wrote into the current folder; a line break passed embed, transform and fit."""
    emb, flow = _embeddings(tmp_path / "emb"), _flow_file(tmp_path / "flow.joblib")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    before = _tree(tmp_path), sorted(os.listdir(tmp_path))
    argv = {"embed": ["embed", corpus], "fit": ["fit", emb], "transform": ["transform", emb, "--model", flow]}[command]
    err = _refused(capsys, [*argv, "--output", value])
    assert err == f"error: --output {problem}"
    run = {"embed": lambda: distributed.embed([corpus], value), "fit": lambda: distributed.fit(emb, value),
           "transform": lambda: distributed.transform(emb, flow, value)}[command]
    with pytest.raises(OutputPathError) as info:
        run()
    assert str(info.value) == f"--output {problem}"
    assert (_tree(tmp_path), sorted(os.listdir(tmp_path))) == before


def test_the_library_checks_its_arguments_too(tmp_path, corpus, no_ray):
    with pytest.raises(ValueError, match=r"'workers' parameter of embed must be an int in the range \[1, inf\)"):
        distributed.embed([corpus], tmp_path / "out", workers=0)
    with pytest.raises(ValueError, match="'threads_per_worker' parameter of transform must be an int in the range"):
        distributed.transform(corpus, tmp_path / "m.joblib", tmp_path / "out", threads_per_worker=-3)
    with pytest.raises(ValueError, match=r"'epochs' parameter of fit must be an int in the range \[1, 10000\]"):
        distributed.fit(_embeddings(tmp_path / "emb"), tmp_path / "flow.skops", epochs=0)
    with pytest.raises(ValueError, match="device must be"):
        distributed.fit(tmp_path / "emb", tmp_path / "flow.skops", flow=FlowGaussianizer(device="meta"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "emb"]


def test_non_finite_or_null_vectors_are_refused_naming_the_shard_and_the_row(ray_instance, tmp_path, capsys):
    """Found by the Ray task that reads the shard (the driver reads Parquet footers only)."""
    bad = _embeddings(tmp_path / "nan", bad=(25, 0))
    assert "part-1.parquet: row 6 of column 'embedding' holds nan (element 1)" in _refused(
        capsys, ["fit", bad, "--output", tmp_path / "flow.skops", "--quiet"])
    emb = _embeddings(tmp_path / "inf")
    table = pq.read_table(emb / "part-1.parquet")
    X = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    X[3, 5] = np.inf
    pq.write_table(table.set_column(1, "embedding", pa.array(list(X), pa.list_(pa.float32()))), emb / "part-1.parquet")
    err = _refused(capsys, ["fit", emb, "--output", tmp_path / "flow.skops", "--quiet"])
    assert f"{emb / 'part-1.parquet'}: row 4 of column 'embedding' holds inf (element 6); 1 non-finite" in err
    null_vector = pa.table({"embedding": pa.array([[1.0, 2.0], None], pa.list_(pa.float32()))})
    pq.write_table(null_vector, emb / "part-1.parquet")
    assert "part-1.parquet: row 2 of column 'embedding' is null, not a vector" in _refused(
        capsys, ["fit", emb, "--output", tmp_path / "flow.skops", "--quiet"])
    assert not (tmp_path / "flow.skops").exists()


def test_fit_overwrites_only_a_model_file(tmp_path, capsys, no_ray):
    emb = _embeddings(tmp_path / "emb")
    (tmp_path / "notes.skops").write_text("my notes")
    assert "notes.skops: exists and is not a model file (skops or joblib)" in _refused(
        capsys, ["fit", emb, "--output", tmp_path / "notes.skops", "--overwrite"])
    assert (tmp_path / "notes.skops").read_text() == "my notes"


# ----------------------------------------------------------------------------- every file read, or refused
def _write_texts(path: Path, lines) -> None:
    data = ("\n".join(lines) + "\n").encode("utf-8")
    path.write_bytes(gzip.compress(data) if path.name.lower().endswith(".gz") else data)


def _json_lines(path: Path, rows) -> None:
    data = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in rows).encode()
    path.write_bytes(gzip.compress(data) if path.name.lower().endswith(".gz") else data)


def test_every_file_in_a_folder_is_read_or_the_listing_is_refused(tmp_path, no_ray):
    from skflow.ray_jobs._corpus import file_format, read_table

    def rows(*inputs):  # read as the Ray tasks read each file
        corpus = input_files(inputs)
        return sum(read_table(file, "text").num_rows for file in corpus.files), corpus

    texts = tmp_path / "texts"
    (texts / "sub").mkdir(parents=True)
    _write_texts(texts / "a.txt", SENTENCES[:10])
    _write_texts(texts / "b.TXT", SENTENCES[10:20])
    _write_texts(texts / "sub" / "c.txt.GZ", SENTENCES[20:30])
    _write_texts(texts / ".hidden.txt", ["never read"])
    (texts / "_SUCCESS").write_text("")
    assert rows(texts)[0] == 30
    jsonl = tmp_path / "jsonl"
    jsonl.mkdir()
    _json_lines(jsonl / "a.jsonl", enumerate(SENTENCES[:10]))
    _json_lines(jsonl / "b.jsonl.gz", enumerate(SENTENCES[10:20]))
    _json_lines(jsonl / "c.JSONL.GZ", enumerate(SENTENCES[20:25]))
    count, corpus = rows(jsonl)
    assert count == 25 and [file_format(f)[1] for f in corpus.files] == [None, "gzip", "gzip"]
    assert rows(texts / "a.txt", texts, texts / "a.txt")[0] == 30  # a file named twice is read once

    (texts / "notes.md").write_text("# notes")
    (texts / "sub" / "data.parquet.gz").write_bytes(b"")
    os.mkfifo(texts / "sub" / "pipe.txt")
    with pytest.raises(distributed.InputError) as info:
        rows(texts)
    message = str(info.value)
    assert message.startswith("3 file(s) in the input folders would not be read: ")
    assert f"{texts / 'notes.md'}" in message and f"{texts / 'sub' / 'data.parquet.gz'}" in message
    assert f"{texts / 'sub' / 'pipe.txt'} (not a regular file)" in message
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    _write_texts(mixed / "a.txt", ["x"])
    _json_lines(mixed / "b.jsonl", [(0, "y")])
    with pytest.raises(distributed.InputError, match=r"the inputs mix formats \(json, text: .*b.jsonl, .*a.txt\)"):
        rows(mixed)


def test_format_errors_name_the_file_and_the_row(ray_instance, tmp_path, capsys):
    """Found by the Ray task that reads the file (the driver reads Parquet footers only): one job proves that its
    error ends the command in one line; every format's message comes from the same reader, called in-process."""
    from skflow.ray_jobs._corpus import InputError, read_checked

    cases = {
        "bad.txt": (b"fine\nalso fine\nbroken \xff here\n", "bad.txt: line 3 is not valid UTF-8 (byte 8 of the line"),
        "bad.jsonl": (b'{"text": "a"}\n{"text": "b"\n{"text": "c"}\n', ("bad.jsonl: cannot be read as JSON lines (one "
                      "object a line) (JSON parse error: Missing a comma or '}' after an object member. in row 2)")),
        "latin1.jsonl": ('{"text": "caf\xe9"}\n'.encode("latin-1"), "latin1.jsonl: line 1 is not valid UTF-8"),
        "bad.csv": (b"id,text\n1,a\n2,b,c\n", ("bad.csv: cannot be read as CSV (CSV parse error: Expected 2 columns, "
                    "got 3: 2,b,c)")),
        "bad.parquet": (b"PAR1 not really", "bad.parquet: cannot be read as Parquet"),
        "bad.jsonl.gz": (b"not gzip", "bad.jsonl.gz: cannot be read as gzip"),
        "number.jsonl": (b'{"text": "a"}\n{"text": 5}\n', "Column(/text) changed from string to number in row 2"),
    }
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(InputError) as refused:
            read_checked(str(tmp_path / name), column="text")
        assert message in str(refused.value) and str(tmp_path / name) in str(refused.value), name
    assert cases["bad.jsonl"][1] in _refused(capsys, ["embed", tmp_path / "bad.jsonl", "--output", tmp_path / "out",
                                                       "--quiet"])
    assert not (tmp_path / "out").exists()


def test_files_are_read_one_a_task_up_to_200_then_in_tasks_of_at_most_100():
    """A read task and its block cost the driver ~5 KB and ~14 ms (benchmarks/many_files.py): 10**6 files read
    one a task would hold some 5 GB on it."""
    from skflow.ray_jobs._corpus import file_groups

    assert [file_groups(n) for n in (1, 7, 200, 201, 20_000, 20_001, 10**6)] == [1, 7, 200, 200, 200, 201, 10_000]


def test_text_lines_end_at_newline_only():
    from skflow.ray_jobs._corpus import text_rows

    data = "one\x0ctwo\nthree\u2028four\r\nfive\x1cfive\u0085\n\n \t\n\ufeffsix\n".encode()
    assert text_rows("\ufeffbom\n".encode()) == ["bom"]
    assert text_rows(data) == ["one\x0ctwo", "three\u2028four", "five\x1cfive\u0085", "\ufeffsix"]


# ------------------------------------------------------------------------------ model files written whole
KILL_SCRIPT = textwrap.dedent('''
    """Fork a writer of the new model, SIGKILL it mid-write, and load the path: the old or the new model."""
    import json, os, random, signal, sys, time
    import numpy as np
    from skflow import FlowGaussianizer
    from skflow.ray_jobs import load_model, save_model
    from skflow.synthetic import make_anisotropic_mixture

    paths, rounds = json.loads(sys.argv[1]), int(sys.argv[2])
    X = make_anisotropic_mixture(300, 96, random_state=0).astype(np.float32)
    old, new = (FlowGaussianizer(max_epochs=1, hidden_channels=256, random_state=s).fit(X) for s in (0, 1))
    expected = {"old": old.transform(X[:4]), "new": new.transform(X[:4])}
    rng, outcomes = random.Random(0), {}
    for path, r in ((path, r) for path in paths for r in range(rounds)):
        folder = os.path.dirname(path)
        save_model(old, path)
        writes = rng.choice([1, 1, 2, 3])  # killed during the first write, or after one or two whole ones
        pid = os.fork()
        if pid == 0:
            while True:
                save_model(new, path)
        seen, end = set(), time.monotonic() + 120
        while len(seen) < writes and time.monotonic() < end:
            seen |= {n for n in os.listdir(folder) if n.startswith(".skflow-tmp-")}
            time.sleep(0.0005)
        time.sleep(rng.uniform(0, 0.005))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        left = [n for n in os.listdir(folder) if n.startswith(".skflow-tmp-")]
        try:
            got = load_model(path).transform(X[:4])
            outcome = next((k for k, v in expected.items() if np.array_equal(got, v)), "another model")
        except Exception as exc:
            outcome = f"unreadable: {exc}"
        outcomes.setdefault(path, []).append([outcome, len(left)])
    for path in paths:  # the next write, by a process that wrote none of them, removes what the killed ones left
        save_model(load_model(path), path)
    print(json.dumps(outcomes))
''')


@pytest.mark.slow
def test_a_model_writer_killed_mid_write_leaves_the_old_or_the_whole_new_model(tmp_path):
    """Ten kills of a forked writer for each format, in one process; then a write by another process."""
    (tmp_path / "kill.py").write_text(KILL_SCRIPT)
    paths = {name: tmp_path / name.replace(".", "-") / name for name in ("flow.skops", "flow.joblib")}
    for path in paths.values():
        path.parent.mkdir()
    run = subprocess.run([sys.executable, tmp_path / "kill.py", json.dumps([str(p) for p in paths.values()]), "10"],
                         capture_output=True, text=True, env=ENV, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout)
    for name, path in paths.items():
        outcomes = found[str(path)]
        # never a damaged file (a plain write left an unreadable one after 11 of 12 such kills)
        assert {outcome for outcome, _ in outcomes} <= {"old", "new"} and "new" in dict(outcomes), (name, outcomes)
        assert sum(left for _, left in outcomes) >= 3, (name, outcomes)  # kills that landed in the middle of a write
        assert [p.name for p in path.parent.iterdir()] == [name]


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "results.json"
    path.write_text('{"files": ["old"]}')  # a manifest: a file of the kind written, which the write may replace
    with pytest.raises(OSError, match="No space left"), replaced_atomically(path, kind=MANIFEST) as tmp:
        tmp.write_text("half of the new")
        raise OSError(28, "No space left on device")
    assert path.read_text() == '{"files": ["old"]}' and [p.name for p in tmp_path.iterdir()] == ["results.json"]
    skflow.dump(FlowGaussianizer(max_epochs=1, random_state=0).fit(np.random.RandomState(0).normal(size=(64, 3))),
                tmp_path / "flow.skops")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flow.skops", "results.json"]


# ------------------------------------------------------------ on Ray: the session's head of 2 CPUs (conftest.py)
def _embedder():
    return BertEmbedder(pooling="cls", dtype="float32", show_progress_bar=False)


@pytest.fixture(scope="module")
def agents_ending():
    """Sessions of killed drivers whose last Ray processes, the dashboard and runtime-env agents, end on their own
    60 s after the kill (Ray 2.60's ``publish_error`` to the dead GCS server, a timeout fixed in its code): the rest
    of this module runs meanwhile, and at its end every such session must be empty."""
    sessions = []
    yield sessions
    for sid, killed in sessions:
        while _session(sid) and time.monotonic() - killed < 180:
            time.sleep(0.5)
        left = _session(sid)
        for line in left:  # never leave anything behind, even if the check fails
            os.kill(int(line.split()[0]), signal.SIGKILL)
        assert left == [], f"Ray processes left 180 s after the driver's SIGKILL: {left}"


@pytest.mark.ray
def test_a_driver_killed_with_sigkill_leaves_no_ray_process_and_the_old_output(tmp_path, corpus, agents_ending):
    """Ray ends its instance without help (measured, Ray 2.60: the head at once, the workers within 3 s, the
    dashboard and runtime-env agents after 62 to 64 s, checked at the end of this module, which runs
    for more than those 64 s after this test: its end does not wait)."""
    old = _skflow_output(tmp_path / "old")
    before = _tree(old)
    driver = subprocess.Popen([sys.executable, "-m", "skflow", "embed", corpus, "--output", old, "--overwrite",
                               "--quiet"], env=ENV, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    agents = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")
    try:
        end = time.monotonic() + 180
        while "ray::MapWorker" not in " ".join(_session(driver.pid)):  # the job runs
            assert driver.poll() is None and time.monotonic() < end, "the job did not start"
            time.sleep(0.2)
        time.sleep(1)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=10)
        killed = time.monotonic()
        while [p for p in _session(driver.pid) if not any(a in p for a in agents)] and time.monotonic() - killed < 30:
            time.sleep(0.5)
        left = [p for p in _session(driver.pid) if not any(a in p for a in agents)]
        print(f"Ray's head and workers gone {time.monotonic() - killed:.1f} s after the driver's SIGKILL")
    finally:
        if driver.poll() is None:
            driver.kill()
        agents_ending.append((driver.pid, time.monotonic()))
    assert left == []
    # the old output is whole and read as before: its manifest and files (a killed run's files may lie beside them)
    assert {name: digest for name, digest in _tree(old).items() if name in before} == before
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a killed run's files beside it are named in a warning
        read = input_files([old]).files
    assert sorted(Path(f).name for f in read) == json.loads((old / MARKER).read_text())["files"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "old"]


def test_ray_reads_and_writes_exactly_the_rows_of_each_file(ray_instance, tmp_path, monkeypatch):
    from skflow.ray_jobs import _corpus, check_rows, job_failure, read_dataset

    texts = tmp_path / "texts"
    (texts / "sub").mkdir(parents=True)
    odd = ["a form\x0cfeed inside", "a line\u2028separator inside", "a windows line", "  padded  ", "group\x1dsep"]
    (texts / "a.txt").write_bytes(("\n".join(odd[:2]) + "\n\n   \n" + odd[2] + "\r\n" + odd[3] + "\n").encode())
    _write_texts(texts / "B.TXT", [odd[4], *SENTENCES[:5]])
    _write_texts(texts / "sub" / "c.txt.gz", SENTENCES[5:15])
    _write_texts(texts / ".hidden.txt", ["never read"])
    jsonl = tmp_path / "jsonl"
    (jsonl / "sub").mkdir(parents=True)
    _json_lines(jsonl / "a.jsonl", enumerate(SENTENCES[:10]))
    _json_lines(jsonl / "sub" / "b.JSONL.GZ", enumerate(SENTENCES[10:20], start=10))
    dictionary = tmp_path / "dictionary"
    dictionary.mkdir()
    pq.write_table(pa.table({"text": pa.array(SENTENCES[:6] * 2).dictionary_encode()}), dictionary / "d.PARQUET")
    csv = tmp_path / "csv"
    csv.mkdir()
    (csv / "a.csv").write_text("id,text\n1,1990\n2,\"two, quoted\"\n")
    (csv / "b.csv.bz2").write_bytes(__import__("bz2").compress(b"id,text\n3,three\n"))
    expected = {texts: sorted(odd + SENTENCES[:15]), jsonl: sorted(SENTENCES[:20]),
                dictionary: sorted(SENTENCES[:6] * 2), csv: ["1990", "three", "two, quoted"]}
    for files_per_task in (100, 2):  # one file a read task; then two (one read task of many small files)
        monkeypatch.setattr(_corpus, "MIN_READ_TASKS", 200 if files_per_task == 100 else 1)
        monkeypatch.setattr(_corpus, "FILES_PER_READ_TASK", files_per_task)
        for folder, rows in expected.items():
            corpus = input_files([folder])
            dataset = read_dataset(corpus, *check_rows(corpus, "text")[1:]).materialize()
            assert sorted(str(row["text"]) for row in dataset.take_all()) == rows, folder
            n = len(corpus.files)
            assert dataset.num_blocks() == (n if files_per_task == 100 else -(-n // 2)), folder  # one a task
    # files of one read task whose columns cannot join in one block: one line naming the file, not Ray's
    # "Failed to unify schemas" naming none (a dictionary-encoded Parquet column in one file only, the same)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.csv").write_text("id,text\n,blank id\n")  # null: joins the next file's numbers
    (mixed / "b.csv").write_text("id,text\n1,one\n")
    (mixed / "c.csv").write_text("id,text\nc3,three\n")  # words: joins neither
    monkeypatch.setattr(_corpus, "FILES_PER_READ_TASK", 3)
    corpus = input_files([mixed])
    with pytest.raises(Exception) as failed:
        read_dataset(corpus, *check_rows(corpus, "text")[1:]).materialize()
    assert str(job_failure(failed.value)) == (
        f"{mixed / 'c.csv'}: its columns do not match those of the files before it (from {mixed / 'a.csv'}: Unable "
        "to merge: Field id has incompatible types: int64 vs string); give files whose columns hold the same types; "
        "nothing was written")
    monkeypatch.undo()
    assert distributed.embed([texts], tmp_path / "out", embedder=_embedder(), quiet=True) == 20
    table = pq.read_table(tmp_path / "out")
    assert sorted(table.column("text").to_pylist()) == expected[texts] and table.num_rows == 20
    np.testing.assert_allclose(np.stack(table.column("embedding").to_numpy(zero_copy_only=False)),
                               _embedder().transform(table.column("text").to_pylist()), atol=1e-5)
    assert json.loads((tmp_path / "out" / MARKER).read_text())["rows"] == 20


def test_gpus_that_no_node_has_are_refused_at_once(ray_instance, corpus, tmp_path, capsys):
    start = time.monotonic()
    err = _refused(capsys, ["embed", corpus, "--output", tmp_path / "out", "--gpus-per-worker", "1", "--quiet"])
    assert "--gpus-per-worker 1 with --workers 1 needs 1 GPUs, 1 on one node; the Ray cluster has 0" in err
    assert time.monotonic() - start < 30 and not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["corpus"]  # no output folder either


class FailingEmbedder(BertEmbedder):
    """Loads like any embedder (its warm-up passes), then fails on the first real batch."""

    def transform(self, X):
        if len(X) > 1:
            raise RuntimeError("the encoder broke on batch 1")
        return super().transform(X)


def test_a_job_that_fails_keeps_the_previous_output_and_says_so(ray_instance, corpus, tmp_path, capsys):
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module
    old = _skflow_output(tmp_path / "old")
    before = _tree(tmp_path)
    with pytest.raises(distributed.JobFailedError) as info:
        distributed.embed([corpus], old, embedder=FailingEmbedder(pooling="cls", show_progress_bar=False),
                          overwrite=True, quiet=True)
    assert str(info.value) == "the Ray job failed, nothing was written: RuntimeError: the encoder broke on batch 1"
    assert _tree(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "old"]
    end = time.monotonic() + 60  # the failed job's actors go: the next job on this instance finds its CPUs
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < end:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 2


def test_fewer_rows_written_than_read_is_a_failure_not_a_partial_success(ray_instance, tmp_path, capsys, monkeypatch):
    emb = _embeddings(tmp_path / "emb")
    flow = _flow_file(tmp_path / "flow.joblib")
    from skflow.ray_jobs._checkpoint import parts_sink

    on_write_complete = parts_sink().on_write_complete

    def a_file_lost(sink, result):  # what Ray reports, less the last file written
        written = [file for returned in result.write_returns for file in returned][:-1]
        on_write_complete(sink, types.SimpleNamespace(num_rows=result.num_rows, write_returns=[written]))

    monkeypatch.setattr(parts_sink(), "on_write_complete", a_file_lost)
    err = _refused(capsys, ["transform", emb, "--model", flow, "--output", tmp_path / "z", "--quiet"], code=1)
    assert re.fullmatch(r"error: the Ray job wrote \d+ rows of 40; nothing was written", err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb", "flow.joblib"]
    monkeypatch.undo()
    for _ in range(2):  # a new output, then a replaced one: the old files go, nothing is left beside it
        assert _run(["transform", emb, "--model", flow, "--output", tmp_path / "z", "--overwrite", "--quiet"]) == 0
        files = json.loads((tmp_path / "z" / MARKER).read_text())["files"]
        assert sorted(p.name for p in (tmp_path / "z").iterdir()) == sorted([*files, MARKER])
        assert pq.read_table(tmp_path / "z").num_rows == 40
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb", "flow.joblib", "z"]


def test_a_shard_that_changes_during_the_run_is_refused_naming_it(ray_instance, tmp_path, capsys, monkeypatch):
    """Rewritten by a producer after the driver read its footer, before Ray reads it: the read finds other rows
    than the footer gave (the partial output used to be committed: the writes counted only what reached them)."""
    emb, flow = _embeddings(tmp_path / "emb"), _flow_file(tmp_path / "flow.joblib")
    checked = OutputFolder.__init__

    def checked_then_rewritten(self, *args, **kwargs):
        checked(self, *args, **kwargs)
        pq.write_table(pq.read_table(emb / "part-1.parquet").slice(0, 5), emb / "part-1.parquet")

    monkeypatch.setattr(OutputFolder, "__init__", checked_then_rewritten)
    err = _refused(capsys, ["transform", emb, "--model", flow, "--output", tmp_path / "z", "--quiet"])
    assert err == (f"error: {emb / 'part-1.parquet'}: holds 5 rows, 20 when the job began: it changed during the "
                   "run; nothing was written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb", "flow.joblib"]


def test_a_ctrl_c_after_the_commit_leaves_the_new_output_whole(ray_instance, tmp_path, monkeypatch, capsys):
    """Ctrl-C while --overwrite deletes the old files, after the new manifest is written: the run's files stay,
    whole and listed (they were deleted as a failed run's, and the manifest listed missing files); one line says
    that the output is complete (exit 130)."""
    import contextlib

    from skflow.ray_jobs import _outputs

    emb, flow = _embeddings(tmp_path / "emb"), _flow_file(tmp_path / "flow.joblib")
    assert _run(["transform", emb, "--model", flow, "--output", tmp_path / "z", "--quiet"]) == 0
    old = set(json.loads((tmp_path / "z" / MARKER).read_text())["files"])

    class Interrupted:  # the module's contextlib, whose first suppress() after the manifest guards an old file's delete
        contextmanager, interrupted = staticmethod(contextlib.contextmanager), []

        @staticmethod
        def suppress(*exceptions):
            if (tmp_path / "z" / MARKER).read_text() != manifest and not Interrupted.interrupted:
                Interrupted.interrupted.append(True)
                raise KeyboardInterrupt
            return contextlib.suppress(*exceptions)

    manifest = (tmp_path / "z" / MARKER).read_text()
    monkeypatch.setattr(_outputs, "contextlib", Interrupted)
    assert _run(["transform", emb, "--model", flow, "--output", tmp_path / "z", "--overwrite", "--quiet"]) == 130
    monkeypatch.undo()
    assert capsys.readouterr().err == (f"interrupted: after the commit: {tmp_path / 'z'} holds all 40 rows; nothing "
                                       "is left to do\n")
    files = json.loads((tmp_path / "z" / MARKER).read_text())["files"]
    assert Interrupted.interrupted and not set(files) & old
    assert {p.name for p in (tmp_path / "z").iterdir()} >= {*files, MARKER}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the old file the interrupted delete left beside them is named
        assert _run(["fit", tmp_path / "z", "--output", tmp_path / "again.joblib", "--quiet"]) == 0


class _AnotherFitMeanwhile(FlowGaussianizer):
    """Before its first training step, another ``skflow fit`` (the command, on the same Ray instance) writes the same
    output file."""

    def partial_fit(self, X, y=None):
        if not hasattr(self, "n_samples_seen_"):
            assert _run(["fit", *type(self).other, "--quiet"]) == 0
        return super().partial_fit(X, y)


@pytest.mark.parametrize("name", ["flow.skops", "flow.joblib"])
def test_a_model_file_that_appears_during_a_fit_is_not_replaced_without_overwrite(ray_instance, tmp_path, name):
    """Two fits to one path: the one that ends last is refused (one line, exit 2 on the command line); the file
    holds the first model, whole. With --overwrite the last one wins."""
    emb, out = _embeddings(tmp_path / "emb"), tmp_path / name
    _AnotherFitMeanwhile.other = (emb, "--output", out, "--epochs", "2")
    with pytest.raises(OutputPathError) as refused:
        distributed.fit(emb, out, flow=_AnotherFitMeanwhile(max_epochs=1, random_state=0), quiet=True)
    assert str(refused.value).startswith(f"{out}: ") and "\n" not in str(refused.value)
    first = out.read_bytes()
    assert distributed.load_model(out).n_samples_seen_ == 80 and sorted(p.name for p in tmp_path.iterdir()) == [
        "emb", name]  # the other fit's model (2 epochs), and no temporary file
    _AnotherFitMeanwhile.other = (*_AnotherFitMeanwhile.other, "--overwrite")
    flow = distributed.fit(emb, out, flow=_AnotherFitMeanwhile(max_epochs=1, random_state=0), overwrite=True,
                           quiet=True)
    assert out.read_bytes() != first and flow.n_samples_seen_ == 40  # this fit's model, written last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb", name]


# ---------------------------------------------------------------- the real command, in a process of its own
def _command(*argv, **kwargs):
    return subprocess.run([sys.executable, "-m", "skflow", *map(str, argv)], capture_output=True, text=True,
                          env=ENV, check=False, **kwargs)


@pytest.mark.ray
def test_an_address_where_nothing_listens_fails_within_30_s(corpus, tmp_path):
    """ray.init retries such an address for minutes (measured: still retrying after 10); a TCP probe comes first."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
    start = time.monotonic()
    run = _command("embed", corpus, "--output", tmp_path / "out", "--address", address, timeout=60)
    took = time.monotonic() - start
    assert run.returncode == 2 and took < 30, (took, run.stderr[-2000:])
    assert run.stderr.strip() == f"error: no Ray cluster answers at {address} (Connection refused)"
    assert not (tmp_path / "out").exists()


def _readme_ray_commands() -> list[list[str]]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Large corpora"):]
    section = section[:section.index("\n## ", 1)]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)[1]
    return [line.split() for line in block.splitlines() if line.startswith("skflow ")]


@pytest.mark.ray
def test_the_readme_ray_commands_run_as_written_on_this_machine_and_print_nothing_with_quiet(ray_head, tmp_path):
    """One process per command, as a user runs them. With --quiet a successful command writes nothing to stdout or
    stderr: Ray's own lines went to the console whatever the logging level (core_worker's from C++, "Progress bars
    disabled"). Without it, skflow's line only (a progress bar on a terminal): about 40 lines of Ray's logging came
    with it, an error-level line of Ray's C++ core among them, and a "will hang" warning after the job succeeded.
    `embed` starts a local instance, as on a laptop; `fit` and `transform` join a running one through RAY_ADDRESS,
    as on a cluster (and without starting another instance each)."""
    commands = _readme_ray_commands()
    assert [c[:2] for c in commands] == [["skflow", "embed"], ["skflow", "fit"], ["skflow", "transform"]]
    (tmp_path / "corpus").mkdir()
    pq.write_table(pa.table({"id": list(range(40)), "text": SENTENCES}), tmp_path / "corpus" / "part-0.parquet")
    said = ["embedded 40 rows into emb/", None, "transformed 40 rows into latent/"]
    for argv, env, line in zip(commands, [ENV, dict(ENV, RAY_ADDRESS=ray_head), dict(ENV, RAY_ADDRESS=ray_head)],
                               said):
        run = subprocess.run([sys.executable, "-m", "skflow", *argv[1:], *([] if line else ["--quiet"])],
                             cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600, check=False)
        assert (run.returncode, run.stdout, run.stderr) == (0, "", f"{line}\n" if line else ""), (argv,
                                                                                                run.stderr[-3000:])
    assert pq.read_table(tmp_path / "emb").num_rows == 40
    flow = skflow.load(tmp_path / "flow.skops")
    assert flow.n_samples_seen_ == 40
    latent = pq.read_table(tmp_path / "latent")
    assert latent.num_rows == 40 and sorted(latent.column("id").to_pylist()) == list(range(40))


def test_fit_with_a_seed_gives_the_same_model_every_run(ray_instance, tmp_path):
    """Two runs of `skflow fit emb --seed 7` gave latents 1.3 to 3.4 apart: Ray read the shards' blocks in any
    order and shuffled them unseeded. Now the block order, the shuffle buffer and the flow follow the seed."""
    emb = _embeddings(tmp_path / "emb", n=400, shards=4)
    X = np.random.RandomState(0).normal(size=(400, 8)).astype(np.float32)
    latents = []
    for seed in ("7", "7", "8"):
        assert _run(["fit", emb, "--output", tmp_path / "flow.skops", "--seed", seed, "--overwrite",
                     "--batch-size", "32", "--quiet"]) == 0
        latents.append(skflow.load(tmp_path / "flow.skops").transform(X))
    assert latents[0].tobytes() == latents[1].tobytes()
    assert np.abs(latents[0] - latents[2]).max() > 1e-3


def test_vectors_go_to_parquet_and_back_exactly():
    """The Parquet column the Ray commands write holds the float32 vectors exactly (no Ray needed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from skflow.ray_jobs import vectors_array, vectors_column

    vectors = np.random.default_rng(0).normal(size=(7, 5)).astype(np.float32)
    vectors[0, 0], vectors[1, 1] = -0.0, np.float32(1e-40)  # a signed zero and a subnormal
    buffer = pa.BufferOutputStream()
    pq.write_table(pa.table({"embedding": vectors_column(vectors)}), buffer)
    back = vectors_array(pq.read_table(pa.BufferReader(buffer.getvalue()))["embedding"])
    assert back.dtype == np.float32 and back.shape == (7, 5)
    assert back.tobytes() == vectors.tobytes()


def test_parquet_footers_are_read_concurrently_and_the_first_bad_file_in_order_is_named(tmp_path, monkeypatch):
    """Each footer is a round trip to object storage: 10**6 shards read one after another took hours before Ray
    started. 64 footers of 20 ms each: many in flight at once (FOOTER_READS, 32, at most), counted, not timed."""
    import threading

    from skflow.ray_jobs import _corpus
    from skflow.ray_jobs._corpus import InputError, check_rows

    for i in range(64):
        pq.write_table(pa.table({"text": ["a"] * (i + 1)}), tmp_path / f"p{i:02d}.parquet")
    read, lock, flight = _corpus.parquet_metadata, threading.Lock(), {"now": 0, "most": 0}

    def slow_read(where):
        with lock:
            flight["now"] += 1
            flight["most"] = max(flight["most"], flight["now"])
        try:
            time.sleep(0.02)  # a round trip
            return read(where)
        finally:
            with lock:
                flight["now"] -= 1

    monkeypatch.setattr(_corpus, "parquet_metadata", slow_read)
    corpus = input_files([tmp_path])
    assert list(check_rows(corpus, "text")[2].values()) == list(range(1, 65))  # each file's rows, in its order
    assert 8 <= flight["most"] <= _corpus.FOOTER_READS  # one at a time before
    (tmp_path / "p40.parquet").write_bytes(b"PAR1 not really")
    (tmp_path / "p50.parquet").write_bytes(b"PAR1 nor this")
    with pytest.raises(InputError, match=r"p40\.parquet: cannot be read as Parquet"):
        check_rows(corpus, "text")


# ------------------------------------------------------------- Ctrl-C and SIGTERM before the job (#46 item 14)
@pytest.mark.slow  # three processes loading skflow: 10 s
@pytest.mark.parametrize("entry", ["python -m skflow", "the skflow script"])
def test_ctrl_c_while_the_command_loads_its_libraries_is_one_line_and_exit_130(tmp_path, corpus, entry):
    """Ctrl-C in the seconds that torch and the rest take to load (before skflow's code runs) printed a traceback
    of 25 lines through runpy and torch; the skflow script (the console entry point, which calls skflow.cli.main),
    Ctrl-C at any time of `evaluate` too."""
    script = tmp_path / "skflow"  # what pip writes for the console script
    script.write_text("import sys\nfrom skflow.cli import main\nsys.exit(main())\n")
    argv = [sys.executable, *(["-m", "skflow"] if entry == "python -m skflow" else [str(script)]), "embed",
            str(corpus), "--output", str(tmp_path / "emb"), "--max-length", "16"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONPROFILEIMPORTTIME": "1"}  # stderr: a line per import done
    driver = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while b" torch." not in (line := driver.stderr.readline()):  # a module of torch loaded: skflow's loading
            assert line, "the command ended before loading torch"
        driver.send_signal(signal.SIGINT)
        err = driver.stderr.read().decode()
        assert driver.wait(timeout=60) == 130
    finally:
        if driver.poll() is None:
            driver.kill()
    said = [line for line in err.splitlines() if not line.startswith("import time:")]
    assert said == ["interrupted"], err[-3000:]
    assert not (tmp_path / "emb").exists()


def test_sigterm_while_ray_starts_is_the_commands_terminated_and_exit_143(tmp_path, corpus, capsys, monkeypatch):
    """ray.init sets a SIGTERM handler, sys.exit(15), and then its core worker's crash handler, before it returns
    (seconds, starting a local instance): a SIGTERM then ended the command with exit 15 and not a word, or with a
    stack dump. It is the command's 'terminated', and the driver's core worker gets no crash handler."""
    shut, crash_handler = [], []

    def init_like_ray(*args, **kwargs):
        crash_handler.append(not ray._private.ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER)
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))  # Ray's own handler, then the signal
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs at once
        pytest.fail("no SIGTERM")

    monkeypatch.setattr(ray, "init", init_like_ray)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: shut.append(True))
    previous = signal.getsignal(signal.SIGTERM)
    assert main(["embed", str(corpus), "--output", str(tmp_path / "emb"), "--max-length", "16"]) == 143
    assert capsys.readouterr().err.splitlines() == ["terminated: nothing was written"]
    assert signal.getsignal(signal.SIGTERM) is previous and not (tmp_path / "emb").exists() and shut
    assert crash_handler == [False] and not ray._private.ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER
