"""Sizes that cannot work are refused in one line before any embedding or training (they used to fail after
about 70 s of embedding, or were accepted and ran for days)."""

import functools
import os
import re
import subprocess
import sys
from numbers import Integral
from pathlib import Path

import numpy as np
import pytest

from skflow import FlowGaussianizer, distributed
from skflow.cli import main
from skflow.evaluation import evaluate
from skflow.gaussianizer import MAX_EPOCHS


@pytest.fixture
def nothing_is_embedded(monkeypatch):
    from skflow.embedding import _encoding

    monkeypatch.setattr(_encoding, "encode_ids", lambda *a, **k: pytest.fail("encoded before the check"))
    monkeypatch.setattr("skflow.evaluation.load_sts", lambda *a, **k: pytest.fail("data loaded before the check"))


@pytest.mark.parametrize(("method", "needed"), [("whiten-100000", 100000), ("whiten-385", 385), ("abtt-384", 385)])
def test_a_method_wider_than_the_encoder_is_refused_from_its_configuration(tmp_path, capsys, nothing_is_embedded,
                                                                          method, needed):
    args = ["evaluate", "--method", "none", method, "--sets", "stsb", "--output", str(tmp_path / "r"), "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: method {method!r} needs {needed} dimensions, but "
                   "'sentence-transformers/all-MiniLM-L6-v2' embeds 384."), err
    assert list(tmp_path.iterdir()) == []


def test_the_widest_methods_that_fit_pass_the_check(monkeypatch):
    monkeypatch.setattr("skflow.evaluation.load_sts", lambda *a, **k: (_ for _ in ()).throw(FileNotFoundError("x")))
    from skflow import BertEmbedder

    results = evaluate(BertEmbedder(), methods=["whiten-384", "abtt-383"], sets=["stsb"], skip_missing=True)
    assert results["sets"] == {} and "stsb" in results["skipped"]  # got past the check, to the data


@pytest.mark.parametrize("epochs", [MAX_EPOCHS + 1, 100_000_000_000])
def test_epochs_beyond_the_bound_are_refused(tmp_path, capsys, nothing_is_embedded, epochs):
    with pytest.raises(ValueError, match=rf"'max_epochs' parameter of FlowGaussianizer must be an int in the range "
                                         rf"\[1, {MAX_EPOCHS}\]"):
        FlowGaussianizer(max_epochs=epochs).fit([[0.0, 1.0], [1.0, 0.0]])
    for argv in (["evaluate", "--method", "flow", "--sets", "stsb", "--output", str(tmp_path / "r"), "--quiet"],
                 ["fit", str(tmp_path), "--output", str(tmp_path / "m.skops")]):
        with pytest.raises(SystemExit) as exit_:  # the parser, as the help says: "an integer from 1 to 10000"
            main([*argv, "--epochs", str(epochs)])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and f"must be an int in the range [1, {MAX_EPOCHS}], got '{epochs}'" in err
    FlowGaussianizer(max_epochs=MAX_EPOCHS)._validate_params()  # the bound itself is accepted


# ------------------------------------------- counts of the Ray commands: what this machine or the cluster holds
CPUS = os.cpu_count()


class _RayReachedError(Exception):
    pass


@pytest.fixture
def ray_inputs(tmp_path, monkeypatch):
    """A corpus, embeddings and a fitted flow; Ray is never started (reaching it raises _RayReachedError)."""
    import joblib
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    def reached(*args, **kwargs):
        raise _RayReachedError

    monkeypatch.setattr(distributed, "ray_session", reached)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("a first text\nanother one\n")
    X = np.random.RandomState(0).normal(size=(40, 8)).astype(np.float32)
    (tmp_path / "emb").mkdir()
    pq.write_table(pa.table({"embedding": pa.FixedSizeListArray.from_arrays(pa.array(X.ravel()), 8)}),
                   tmp_path / "emb" / "part-0.parquet")
    joblib.dump(FlowGaussianizer(max_epochs=1, random_state=0).fit(X), tmp_path / "flow.joblib")
    return {"corpus": tmp_path / "corpus", "emb": tmp_path / "emb", "flow": tmp_path / "flow.joblib"}


@pytest.mark.parametrize(("argv", "message"), [
    (["embed", "{corpus}", "--workers", "1000000"],
     f"--workers 1000000: more than 4 per CPU, and this machine has {CPUS} CPUs (at most {4 * CPUS} workers)"),
    (["embed", "{corpus}", "--workers", str(4 * CPUS + 1)], f"--workers {4 * CPUS + 1}: more than 4 per CPU"),
    (["embed", "{corpus}", "--threads-per-worker", "100000"],
     f"--threads-per-worker 100000: more than the {CPUS} CPUs of this machine"),
    (["transform", "{emb}", "--model", "{flow}", "--threads-per-worker", str(CPUS + 1)],
     f"--threads-per-worker {CPUS + 1}: more than the {CPUS} CPUs of this machine"),
    (["transform", "{emb}", "--model", "{flow}", "--gpus-per-worker", "100000"],
     "--gpus-per-worker 100000 with --workers 1 needs 100000 GPUs, 100000 on one node; this machine has"),
])
def test_counts_beyond_what_this_machine_holds_are_refused_before_ray(tmp_path, capsys, ray_inputs, argv, message):
    """``--threads-per-worker 100000`` made the worker create threads until the machine ran out (a SIGSEGV that Ray
    restarted without end), ``--workers 1000000`` ended in Ray's traceback: one line, exit 2, before Ray starts."""
    out = tmp_path / "out"
    assert main([part.format(**ray_inputs) for part in argv] + ["--output", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert not out.exists()


def test_counts_within_the_bounds_reach_ray_the_readmes_four_workers_on_two_cores_included(capsys, ray_inputs,
                                                                                           tmp_path):
    for argv in (["embed", "{corpus}", "--workers", str(4 * CPUS), "--threads-per-worker", str(CPUS)],
                 ["embed", "{corpus}", "--workers", "4"], ["transform", "{emb}", "--model", "{flow}"]):
        with pytest.raises(_RayReachedError):
            main([part.format(**ray_inputs) for part in argv] + ["--output", str(tmp_path / "out"), "--quiet"])
    with pytest.raises(distributed.RayClusterError, match="--workers 1000000: more than 4 per CPU"):
        distributed.embed([ray_inputs["corpus"]], tmp_path / "out", workers=10**6)  # the library checks the same


def test_on_a_cluster_the_bounds_come_from_its_nodes_once_joined(monkeypatch):
    """With ``--address`` (or RAY_ADDRESS), this machine says nothing of the cluster: nothing is checked before Ray
    joins it; then the workers are bounded by the CPUs of all nodes, the threads by the CPUs of the largest."""
    import ray

    from skflow import ray_jobs

    ray_jobs.check_actors_before_ray("10.0.0.1:6379", 10**6, 0, 10**5)  # a cluster: checked once joined
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    ray_jobs.check_actors_before_ray(None, 10**6, 0, 10**5)
    nodes = [{"Alive": True, "NodeID": f"n{i}", "Resources": {"CPU": cpus}} for i, cpus in enumerate((64.0, 16.0))]
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    assert ray_jobs.actor_resources(320, 0, 64)["num_cpus"] == 0.2  # 320 on the 64 CPUs beside the smaller node
    with pytest.raises(distributed.RayClusterError, match=r"^--workers 321: more than 4 per CPU, and the Ray cluster "
                                                          r"has 80 CPUs \(at most 320 workers\)$"):
        ray_jobs.actor_resources(321)
    with pytest.raises(distributed.RayClusterError, match=r"^--threads-per-worker 65: more than the 64 CPUs of the "
                                                          r"largest node of the Ray cluster$"):
        ray_jobs.actor_resources(2, 0, 65)


@pytest.mark.slow
def test_the_command_line_refuses_100000_threads_per_worker_in_one_line(tmp_path):
    (tmp_path / "corpus.txt").write_text("a text\n")
    env = {**os.environ, "RAY_ADDRESS": ""}
    run = subprocess.run([sys.executable, "-m", "skflow", "embed", str(tmp_path / "corpus.txt"), "--output",
                          str(tmp_path / "out"), "--threads-per-worker", "100000"], capture_output=True, text=True,
                         timeout=180, env=env, cwd=Path(__file__).parent.parent)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == f"error: --threads-per-worker 100000: more than the {CPUS} CPUs of this machine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]


def test_an_encoder_batch_beyond_this_machines_memory_is_refused_before_any_encoding(tmp_path, capsys, ray_inputs,
                                                                                     nothing_is_embedded):
    """``--batch-size`` of ``embed`` and ``evaluate`` (``BertEmbedder(batch_size=...)``) is bounded by the memory of
    one forward pass (hidden, feed-forward and attention activations of a layer, float32) against this machine's."""
    from sklearn.pipeline import make_pipeline

    from skflow import BertEmbedder, MeanDirectionRemover, export_sentence_transformer
    from skflow.utils import physical_memory

    message = ("batch_size=1000000 texts of up to 128 tokens take about 1465 GiB in one forward pass of "
               "'sentence-transformers/all-MiniLM-L6-v2', more than this machine's "
               f"{physical_memory() / 2**30:.1f} GiB of memory; lower batch_size or max_length.")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        BertEmbedder(batch_size=10**6).transform(["a text"])
    for argv in (["embed", str(ray_inputs["corpus"]), "--output", str(tmp_path / "out")],
                 ["evaluate", "--sets", "stsb", "--output", str(tmp_path / "results")]):
        assert main([*argv, "--batch-size", "1000000", "--quiet"]) == 2
        assert capsys.readouterr().err == f"error: {message}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "emb", "flow.joblib"]
    BertEmbedder(batch_size=1024).transform([])  # 1.5 GiB: passes the check
    # what runs no forward pass is not bounded by one: the feature names, the export (its folder has no batch size)
    embedder = BertEmbedder(batch_size=10**6, pooling="cls").fit([])
    assert len(embedder.get_feature_names_out()) == 384
    pipe = make_pipeline(embedder, MeanDirectionRemover().fit(np.random.RandomState(0).normal(size=(50, 384))))
    assert (export_sentence_transformer(pipe, tmp_path / "exported") / "modules.json").is_file()


def _skflow_estimators() -> list[type]:
    """Every estimator class skflow defines (subclasses of scikit-learn's BaseEstimator, its bases included)."""
    from sklearn.base import BaseEstimator

    import skflow.compression
    import skflow.whitening  # noqa: F401

    found, pending = set(), [BaseEstimator]
    while pending:
        for cls in pending.pop().__subclasses__():
            found.add(cls)
            pending.append(cls)
    return sorted((cls for cls in found if cls.__module__.startswith("skflow")), key=lambda cls: cls.__name__)


def test_every_integer_parameter_refuses_a_bool_in_scikit_learns_words():
    """`ITQRotation(n_iter=True)` fitted 1 step: True is an Integral to Python and to scikit-learn. Every integer
    constraint of every estimator (and of the Ray commands' actor options) is `skflow.base.Integers`, which refuses
    True and numpy's True, and takes the ints it took."""
    from sklearn.utils._param_validation import Interval, InvalidParameterError, validate_parameter_constraints

    from skflow.base import Integers

    owners = {cls.__name__: (getattr(cls, "_parameter_constraints", {}), cls) for cls in _skflow_estimators()}
    owners["skflow.distributed (actor options)"] = (distributed.ACTOR_OPTIONS, None)
    checked = []
    for owner, (constraints, cls) in owners.items():
        for param, options in constraints.items():
            options = options if isinstance(options, list) else []  # "no_validation"
            integers = [c for c in options if isinstance(c, Interval) and c.type is Integral or c in (Integral, int)]
            if not integers:
                continue
            assert all(isinstance(c, Integers) for c in integers), f"{owner}.{param}: {integers} (use Integers)"
            interval = integers[0]
            valid = interval.left if interval.left is not None else 0
            valid = valid if interval.closed in ("left", "both") or interval.left is None else valid + 1
            for value, accepted in ((True, False), (np.True_, False), (valid, True), (np.int64(valid), True)):
                if cls is None:
                    call = functools.partial(validate_parameter_constraints, constraints, {param: value}, owner)
                else:
                    call = cls(**{param: value})._validate_params
                if accepted:
                    call()
                else:
                    message = (rf"The '{param}' parameter of {re.escape(owner)} must be an int in the range .*\. Got "
                               rf"{re.escape(repr(value))} instead\.")
                    with pytest.raises(InvalidParameterError, match=message):
                        call()
            checked.append(f"{owner}.{param}")
    assert len(checked) == 17, checked
    assert {"ITQRotation.n_iter", "ITQRotation.n_components", "Whitener.n_components", "BertEmbedder.layers",
            "TransformCoder.n_bytes",
            "FlowGaussianizer.max_epochs", "EngineIndex.n_jobs",
            "skflow.distributed (actor options).workers"} <= set(checked)
