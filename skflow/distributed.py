"""Corpora beyond one machine, on Ray Data: embed text files, fit the flow on the embeddings, transform them.

Needs skflow's ``ray`` extra (Ray Data); see ``docs/scale.md``.
"""

import functools
import gc
import os
import sys
from collections.abc import Sequence
from numbers import Real

from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, validate_parameter_constraints

from skflow import ray_jobs
from skflow.base import Integers
from skflow.embedder import BertEmbedder
from skflow.embedding import pinned_model_source
from skflow.gaussianizer import FlowGaussianizer, check_trainable
from skflow.ray_jobs import InputError, JobFailedError, JobInterrupted, RayClusterError, load_model, ray_session
from skflow.utils import OutputPathError, check_given_name, resolve_device, torch_threads

__all__ = ["InputError", "JobFailedError", "JobInterrupted", "RayClusterError", "embed", "fit", "load_model",
           "read_texts", "transform"]

EMBEDDING_COLUMN = "embedding"
ROWS_PER_CALL = 8192  # per actor call (the encoder cuts them into its own batches) and per partial_fit call
SHUFFLE_BUFFER_ROWS = 32768
# BertEmbedder parameters that leave its vectors as they are: not part of an embed job's fingerprint
_SAME_VECTORS = ("model_name_or_path", "revision", "batch_size", "device", "show_progress_bar", "cache_dir", "token",
                 "trust_remote_code")
# The actors' options, checked by sklearn before any work (a ValueError); the command line reads their ranges here.
ACTOR_OPTIONS = {
    "workers": [Integers(1, None, closed="left")],
    "gpus_per_worker": [Interval(Real, 0, None, closed="left")],
    "threads_per_worker": [Integers(1, None, closed="left"), None],
}


class _MapBatches:
    """Ray actor: applies a model (loaded once per actor) to the input column of each batch, adds the output column."""

    def __init__(self, model, input_column: str, output_column: str, threads: int):
        self.model, self.input_column, self.output_column, self.threads = model, input_column, output_column, threads
        if isinstance(model, BertEmbedder):
            model.transform(["warm-up"])  # load the encoder now, once per actor

    def __call__(self, table):
        # In the thread that runs the model, every call: Ray starts a worker that reserves one CPU with
        # OMP_NUM_THREADS=1, and OpenMP keeps that count per thread, so setting it once in __init__ left oneDNN's
        # matrix products single-threaded when Ray ran a call in another thread (22% slower). An actor runs one call
        # at a time: torch's process-wide count is safe here, and reaches runtimes no per-thread limit does.
        values = table.column(self.input_column)
        X = ray_jobs.vectors_array(values) if isinstance(self.model, FlowGaussianizer) else values.to_pylist()
        with torch_threads(self.threads, process_wide=True):
            return table.append_column(self.output_column, ray_jobs.vectors_column(self.model.transform(X)))


def _apply(model, inputs: list, output, *, column: str, text_column: str, output_column: str, protected=(),
           workers: int, gpus_per_worker: float, threads_per_worker: int | None, overwrite: bool, restart: bool,
           address, quiet: bool, command: str, fingerprint: dict) -> int:
    """Make ``output`` hold every row of ``inputs``, checked for ``model`` as Ray reads it (a FlowGaussianizer reads
    ``column``, any other model texts), with ``output_column`` added, computed in ``workers`` actors; returns the
    count. ``fingerprint`` (the model's part) names the job: an unfinished run of it in ``output`` is resumed."""
    ray_jobs.check_actors_before_ray(address, workers, gpus_per_worker, threads_per_worker)
    corpus = ray_jobs.input_files(inputs)
    vectors = isinstance(model, FlowGaussianizer)
    input_column = column if vectors else "text" if corpus.kind == "text" else text_column
    _, read, rows = ray_jobs.check_rows(corpus, input_column, vectors=vectors, new_column=output_column,
                                        length=model.n_features_in_ if vectors else None)
    fingerprint = ray_jobs.job_fingerprint(fingerprint | {
        "command": command, "inputs": [len(corpus.files), corpus.listing], "column": input_column,
        "output_column": output_column})
    target = ray_jobs.OutputFolder(output, overwrite=overwrite, inputs=[*inputs, *protected, *corpus.files],
                                   fingerprint=fingerprint, restart=restart, sources=corpus.files)
    actor = {"model": model, "input_column": input_column, "output_column": output_column,
             "threads": threads_per_worker or max(1, (os.cpu_count() or 1) // workers)}
    expected = sum(rows.values()) if rows else None
    say = (lambda line: None) if quiet else functools.partial(print, file=sys.stderr, flush=True)
    if target.complete is not None:  # the same command, once more
        say(f"already complete: {target.out.shown} holds the {target.complete:,} rows of this command")
        return target.complete
    if written := target.written():
        say(f"resuming: {ray_jobs.rows_held(target.parts.values(), expected, len(corpus.files))} already written, "
            f"in {len(target.parts):,} parts of earlier runs")
    try:
        if not (items := ray_jobs.read_items(corpus, rows, written)):  # an earlier run wrote every row: no Ray
            try:
                target.begin()
                return target.commit([], rows=expected, command=command)
            except Exception:
                target.failed(keep=True)  # but after a refusal: the earlier runs' parts, and the checkpoint, stay
                raise
        with ray_session(address, quiet=quiet):
            _run_job(target, corpus, read, rows, items, actor, command=command, expected=expected, workers=workers,
                     gpus_per_worker=gpus_per_worker, threads_per_worker=threads_per_worker)
    except KeyboardInterrupt:  # Ctrl-C (or SIGTERM, on the command line), once Ray has stopped: what was kept
        raise ray_jobs.JobInterrupted(target.interrupted(expected)) from None
    except BaseException as exc:
        if not isinstance(exc, Exception):  # a SystemExit: the parts written so far are kept for a resume
            target.failed(keep=True)
        raise
    if target.spare:  # another run of this command committed it meanwhile (two resumes at once)
        say(f"already complete: {target.out.shown} holds the {target.complete:,} rows of this command, committed by "
            "another run of it meanwhile")
    return target.complete


def _run_job(target, corpus, read, rows: dict, items, actor: dict, *, command: str, expected: int | None,
             workers: int, gpus_per_worker: float, threads_per_worker: int | None) -> None:
    """The Ray job of :func:`_apply`, in its session: the rows of ``items`` read, computed by the actors and written
    as parts, then committed (``target.complete``, the output's rows)."""
    from ray.data import ActorPoolStrategy

    options = ray_jobs.actor_resources(workers, gpus_per_worker, threads_per_worker)
    # Ray Data's default runs each call in a helper thread of the actor (the encoder ran 10% slower, measured);
    # with true multi-threading, in the actor's own task thread. An actor that dies is restarted, its batch rerun.
    options["compute"] = ActorPoolStrategy(size=workers, enable_true_multi_threading=True)
    # committed when the write completes (all the footers' rows, where they gave them)
    sink = target.sink(command, empty=corpus.no_rows, rows=expected)
    try:
        # blocks of exactly one call's rows, across files and within one (the last may be smaller): each actor task
        # is one call and its output one part, so a kill loses at most a call's rows per actor, whatever the files'
        # sizes. The streaming repartition also keeps the read tasks of their own (fused into the actors that
        # follow, one actor's call would read every file of its bundle one after another).
        dataset = ray_jobs.read_dataset(corpus, read, rows, items=items).repartition(
            target_num_rows_per_block=ROWS_PER_CALL, strict=True)
        dataset.map_batches(_MapBatches, fn_constructor_kwargs=actor, batch_size=ROWS_PER_CALL,
                            batch_format="pyarrow", **options).write_datasink(sink)
        return
    except Exception as exc:  # noqa: BLE001 - a failed job is one line
        failure = ray_jobs.job_failure(exc)
    if target.failed(keep=not isinstance(failure, InputError)):  # a bad input must change: no resume
        said = str(failure).replace("nothing was written", "nothing was committed", 1)  # but parts were
        failure = type(failure)(f"{said}; the rows written so far are kept in {target.out.shown} (not an output "
                                "yet): run the same command to resume, or pass --restart")
    gc.collect()  # Ray Data leaves a failed job's actors to reference cycles: they held their CPUs
    raise failure


def embed(inputs: Sequence[str | os.PathLike], output: str | os.PathLike, *, embedder: BertEmbedder | None = None,
          text_column: str = "text", workers: int = 1, gpus_per_worker: float = 0,
          threads_per_worker: int | None = None, overwrite: bool = False, restart: bool = False,
          address: str | None = None, quiet: bool = False) -> int:
    """Embed the texts of ``inputs`` into Parquet shards in ``output``; returns the row count.

    Parameters
    ----------
    inputs : sequence of paths
        Parquet, CSV, JSON lines (``.jsonl``) or plain text files (one text a line, column ``text``; all but
        Parquet optionally compressed), or folders of them (read recursively, hidden names skipped); one format.
    output : path
        An absent or empty folder: receives Parquet shards with every input column plus ``embedding``
        (fixed-length float32), then the manifest ``.skflow-output`` that lists them, written last.
    embedder : BertEmbedder, default=None
        The encoder and its settings (default: ``BertEmbedder()``).
    text_column : str, default="text"
    workers, gpus_per_worker, threads_per_worker : int, float, int or None, default=1, 0, None
        Ray actors, each with its own copy of the encoder (together they reserve all but one of the cluster's
        CPUs, at most one each; at most 4 per CPU of the cluster); GPUs and torch threads per actor (None: this
        machine's cores shared among them; at most the CPUs of a node). Checked against this machine before Ray
        starts when Ray runs here, against the cluster's resources once joined (``RayClusterError``).
    overwrite, address, quiet : bool, str or None, bool, default=False, None, False
        Replace ``output`` if it is a folder that skflow wrote (the old files deleted once the new manifest is in);
        the Ray cluster to join (else ``RAY_ADDRESS``, else a local instance); no progress bar, and no line on
        resuming (``resuming: ...``) or on an output already complete (``already complete: ...``), on stderr.
    restart : bool, default=False
        Discard an unfinished run found in ``output`` instead of resuming it. A run that was killed or failed
        (but for a bad input) keeps the parts it wrote and a checkpoint; the same call resumes it, reading and
        embedding only the rows not yet written. Another encoder, setting, column or input listing is refused,
        naming what differs (``docs/scale.md``, "Runs that resume").

    Raises
    ------
    InputError, OutputPathError, EncoderNotFoundError, RayClusterError, ValueError
        Found before any work; nothing is written.
    JobFailedError
        The Ray job failed or wrote another number of rows; nothing is committed (the parts written so far are
        kept for a resume, as the message says).
    JobInterrupted
        Ctrl-C (a ``KeyboardInterrupt``) during the job, once Ray stopped: the message says what was kept.
    """
    validate_parameter_constraints(ACTOR_OPTIONS, locals(), caller_name="embed")  # the arguments, as given
    check_given_name("--output", output, OutputPathError)
    embedder = BertEmbedder() if embedder is None else embedder
    if ray_jobs.is_remote(str(embedder.model_name_or_path)):
        shown = ray_jobs.scrub(str(embedder.model_name_or_path).split("?", 1)[0])
        raise InputError(f"--model {shown}: an encoder on object storage is not supported; copy the model folder to "
                         "a local path (or give a Hugging Face hub id)")
    embedder.transform([])  # the embedder's own checks, on the driver: it reads the model's config, loads no weights
    settings = {k: v for k, v in embedder.get_params().items() if k not in _SAME_VECTORS}
    encoder = {"encoder": pinned_model_source(embedder).identity, "settings": settings}  # the weights, by content
    return _apply(embedder, list(inputs), output, column="", text_column=text_column, output_column=EMBEDDING_COLUMN,
                  workers=workers, gpus_per_worker=gpus_per_worker, threads_per_worker=threads_per_worker,
                  overwrite=overwrite, restart=restart, address=address, quiet=quiet, command="embed",
                  fingerprint=encoder)


def read_texts(inputs: Sequence[str | os.PathLike], *, text_column: str = "text") -> list[str]:
    """The texts of ``inputs``, read and checked in this process (no Ray) as :func:`embed` reads them.

    What ``python -m skflow evaluate --fit-on FILE`` fits on: a corpus that fits in memory.

    Parameters
    ----------
    inputs : sequence of paths
        Files or folders, local or on object storage, as :func:`embed` takes them.
    text_column : str, default="text"
        The column of texts in Parquet, CSV or JSON lines files.

    Returns
    -------
    texts : list of str
        In the order of the files (sorted within a folder) and of their rows.

    Raises
    ------
    InputError
        A missing or unreadable file, another format, a missing column, a null or non-text value: one line naming
        the file (and the row).

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from skflow.distributed import read_texts
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "texts.txt"
    >>> _ = path.write_text("A man plays a guitar.\\n\\nA dog runs in a park.\\n", encoding="utf-8")
    >>> read_texts([path])  # blank lines skipped
    ['A man plays a guitar.', 'A dog runs in a park.']
    """
    corpus = ray_jobs.input_files(inputs)
    _, read, rows = ray_jobs.check_rows(corpus, text_column, only_column=True)  # a Parquet file's other columns unread
    return [text for path in corpus.files for text in read(path, rows.get(path)).column(text_column).to_pylist()]


def fit(input_dir: str | os.PathLike, output: str | os.PathLike, *, flow: FlowGaussianizer | None = None,
        column: str = EMBEDDING_COLUMN, epochs: int = 1, overwrite: bool = False, address: str | None = None,
        quiet: bool = False) -> FlowGaussianizer:
    """Fit a flow on the embeddings of the Parquet shards in ``input_dir`` and save it to ``output``.

    ``output`` ending in ``.skops`` is written with :func:`skflow.dump` (safe to share, read with
    :func:`skflow.load`), any other name with joblib: the old model or the whole new one, never a part. With
    ``overwrite``, only a model file is replaced; without it, not even one that appeared while the fit ran.

    Ray streams the vectors, checked finite, in blocks of a random order through a local shuffle buffer of
    32,768 rows (all the driver holds) into :meth:`FlowGaussianizer.partial_fit`, 8,192 rows a call; ``epochs``
    passes. The order and the shuffle follow ``flow.random_state``: with an integer, the same input gives the same
    model every run. A flow this machine cannot train is a ValueError before Ray starts when the Parquet footers
    give the vectors' length. See ``docs/scale.md``.
    """
    validate_parameter_constraints({"epochs": FlowGaussianizer._parameter_constraints["max_epochs"]}, locals(), "fit")
    check_given_name("--output", output, OutputPathError, file=True)
    flow = FlowGaussianizer() if flow is None else flow
    flow._validate_params()
    resolve_device(flow.device)
    corpus = ray_jobs.input_files([input_dir])
    length, read, rows = ray_jobs.check_rows(corpus, column, vectors=True, only_column=True)
    if length is not None:  # known from the footers: a flow this machine cannot train is refused before Ray
        check_trainable(flow, length)
    out = ray_jobs.check_model_output(output, overwrite=overwrite, inputs=[input_dir, *corpus.files])
    seeds = check_random_state(flow.random_state)  # the block order and shuffle follow the flow's seed
    with ray_session(address, quiet=quiet):
        ray_jobs.actor_resources(1)  # a cluster without a CPU would never read
        dataset = ray_jobs.read_dataset(corpus, read, rows)
        dataset.context.execution_options.preserve_order = True  # the seeded order, whichever read ends first
        try:
            for _ in range(epochs):
                epoch = dataset.randomize_block_order(seed=int(seeds.randint(2**31)))
                for batch in epoch.iter_batches(batch_size=ROWS_PER_CALL, batch_format="pyarrow",
                                                local_shuffle_buffer_size=SHUFFLE_BUFFER_ROWS,
                                                local_shuffle_seed=int(seeds.randint(2**31))):
                    X = ray_jobs.vectors_array(batch.column(column))
                    if length is None:  # no footer gave it: a flow this machine cannot train is the input's fault
                        length = X.shape[1]
                        try:
                            check_trainable(flow, length)
                        except ValueError as exc:
                            raise InputError(str(exc)) from None
                    flow.partial_fit(X)
        except FloatingPointError:  # the flow's own error (a non-finite loss), as partial_fit raises it
            raise
        except Exception as exc:  # noqa: BLE001 - a failed job is one line
            raise ray_jobs.job_failure(exc) from None
    if not getattr(flow, "n_samples_seen_", 0):
        raise JobFailedError(f"{input_dir}: no rows reached the flow; nothing was written")
    ray_jobs.save_model(flow, out, overwrite=overwrite)
    return flow


def transform(input_dir: str | os.PathLike, model: str | os.PathLike, output: str | os.PathLike, *,
              column: str = EMBEDDING_COLUMN, text_column: str = "text", output_column: str = "z", workers: int = 1,
              gpus_per_worker: float = 0, threads_per_worker: int | None = None, overwrite: bool = False,
              restart: bool = False, address: str | None = None, quiet: bool = False) -> int:
    """Apply a fitted model to every row of ``input_dir`` and write Parquet shards with ``output_column`` added.

    ``model`` is a ``.skops`` (read with :func:`skflow.load`) or joblib file of a fitted FlowGaussianizer (reads
    ``column``) or of a fitted pipeline that starts with a BertEmbedder (reads ``text_column`` of any input format).
    ``output`` is written as in :func:`embed`: complete or not at all, replacing only skflow's own output; a
    killed run resumes (``restart`` discards it), the job named by the model file's content (SHA-256).
    """
    validate_parameter_constraints(ACTOR_OPTIONS | {"output_column": [str]}, locals(), caller_name="transform")
    check_given_name("--output", output, OutputPathError)
    check_given_name("--model", model, InputError)
    check_given_name("--output-column", output_column, InputError)
    return _apply(load_model(model), [input_dir], output, column=column, text_column=text_column,
                  output_column=output_column, protected=[model], workers=workers,
                  gpus_per_worker=gpus_per_worker, threads_per_worker=threads_per_worker, overwrite=overwrite,
                  restart=restart, address=address, quiet=quiet, command="transform",
                  fingerprint={"model": ray_jobs.model_digest(model)})
