"""Corpora beyond one machine, on Ray Data: embed text files, fit the flow on the embeddings, transform them.

Each step reads sharded files with Ray Data's readers, runs the model inside
Ray actors (loaded once per actor, not per batch) and writes Parquet shards
that keep every input column. The flow is fitted on the driver by streaming
the embeddings into :meth:`FlowGaussianizer.partial_fit`. A local Ray
instance is started (and shut down) unless one is running or an address is
given. Needs the ``ray`` extra: ``pip install "skflow[ray]"``.
"""

import contextlib
import inspect
import os
from collections.abc import Iterator, Sequence

from skflow._corpus_files import (
    InputError,
    check_embeddings,
    check_texts,
    input_files,
    load_model,
    save_model,
    vectors_array,
    vectors_column,
)
from skflow.embedder import BertEmbedder
from skflow.gaussianizer import FlowGaussianizer
from skflow.outputs import check_output_file, prepare_output_folder

__all__ = ["InputError", "embed", "fit", "load_model", "transform"]

EMBEDDING_COLUMN = "embedding"
# Rows per actor call (the encoder cuts them into its own batches) and per partial_fit call.
ROWS_PER_CALL = 8192
ROWS_PER_PARTIAL_FIT = 8192
SHUFFLE_BUFFER_ROWS = 32768


# --------------------------------------------------------------------- Ray
@contextlib.contextmanager
def ray_session(address: str | None = None, *, quiet: bool = False) -> Iterator[None]:
    """Join ``address`` (or ``RAY_ADDRESS``, or a running instance); else start a local one for the block."""
    import ray

    started = False
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=not quiet, logging_level="ERROR")
        started = True
    context = ray.data.DataContext.get_current()
    bars = context.enable_progress_bars
    context.enable_progress_bars = not quiet
    try:
        yield
    finally:
        context.enable_progress_bars = bars
        if started:
            ray.shutdown()


def _read(files: list[str], kind: str):
    import ray

    if kind == "text":
        return ray.data.read_text(files)  # empty lines are skipped, as in check_texts
    if kind == "json":
        return ray.data.read_json(files, lines=True)
    return getattr(ray.data, f"read_{kind}")(files)


def _set_threads(threads: int | None) -> None:
    import torch

    # Called in the thread that runs the model, every call: Ray starts a worker that reserves one CPU with
    # OMP_NUM_THREADS=1, and OpenMP keeps that count per thread (torch.get_num_threads does not show it), so
    # setting it once in __init__ left oneDNN's matrix products single-threaded when Ray ran a call in another
    # thread (22% slower).
    if threads:
        torch.set_num_threads(threads)


class _EmbedBatches:
    """Ray actor: loads the encoder once, then adds an embedding column to each batch."""

    def __init__(self, embedder: BertEmbedder, text_column: str, threads: int | None) -> None:
        _set_threads(threads)
        self.embedder, self.text_column, self.threads = embedder, text_column, threads
        self.embedder.transform(["warm-up"])  # load the encoder now, once per actor

    def __call__(self, table):
        _set_threads(self.threads)
        vectors = self.embedder.transform(table.column(self.text_column).to_pylist())
        return table.append_column(EMBEDDING_COLUMN, vectors_column(vectors))


class _TransformBatches:
    """Ray actor: applies a fitted model to the input column of each batch, adds the output column."""

    def __init__(self, model, input_column: str, output_column: str, threads: int | None) -> None:
        _set_threads(threads)
        self.model, self.input_column, self.output_column = model, input_column, output_column
        self.threads = threads

    def __call__(self, table):
        _set_threads(self.threads)
        values = table.column(self.input_column)
        if isinstance(self.model, FlowGaussianizer):
            X = vectors_array(values)
        else:
            X = values.to_pylist()
        return table.append_column(self.output_column, vectors_column(self.model.transform(X)))


def _actor_options(workers: int, gpus_per_worker: float) -> dict:
    # Ray Data restarts an actor that dies and retries its batch, without limit (its actor-pool
    # default: max_restarts=-1, max_task_retries=-1); the tests kill one to check.
    # One logical CPU each, so that Ray can still schedule the read and write tasks beside them; the
    # actor sets its real thread count itself (_set_threads). No runtime_env: an actor with one needs a
    # worker process of its own, while without one it takes a worker Ray has already started (1 s less a job).
    options = dict(compute=_actor_pool(workers), num_cpus=1)
    if gpus_per_worker:
        options["num_gpus"] = gpus_per_worker
    return options


def _actor_pool(workers: int):
    import ray

    # By default Ray Data runs each call in a helper thread of the actor, beside the thread that slices
    # and formats batches; the encoder then ran 10% slower than in process (24.6 s against 22.0 s for
    # 8,192 sentences on 2 cores, measured). With true multi-threading and one call at a time per actor
    # (Ray's default), the call runs in the actor's own task thread. Older Ray lacks the option.
    if "enable_true_multi_threading" in inspect.signature(ray.data.ActorPoolStrategy).parameters:
        return ray.data.ActorPoolStrategy(size=workers, enable_true_multi_threading=True)
    return ray.data.ActorPoolStrategy(size=workers)


def _threads(workers: int) -> int:
    return max(1, (os.cpu_count() or 1) // workers)


def _map_in_actors(files, kind, out, actor_class, actor_kwargs, workers, gpus_per_worker, address, quiet) -> None:
    """Read ``files``, run ``actor_class`` over them in ``workers`` actors, write Parquet shards to ``out``."""
    with ray_session(address, quiet=quiet):
        dataset = _read(files, kind).map_batches(
            actor_class,
            fn_constructor_kwargs=actor_kwargs,
            batch_size=ROWS_PER_CALL,
            batch_format="pyarrow",
            **_actor_options(workers, gpus_per_worker),
        )
        dataset.write_parquet(str(out))


# -------------------------------------------------------------- the three steps
def embed(
    inputs: Sequence[str | os.PathLike],
    output: str | os.PathLike,
    *,
    embedder: BertEmbedder | None = None,
    text_column: str = "text",
    workers: int = 1,
    gpus_per_worker: float = 0,
    threads_per_worker: int | None = None,
    overwrite: bool = False,
    address: str | None = None,
    quiet: bool = False,
) -> int:
    """Embed the texts of ``inputs`` into Parquet shards in ``output``; returns the row count.

    Parameters
    ----------
    inputs : sequence of paths
        Parquet, CSV, JSON lines (``.jsonl``) or plain text files (one text
        a line, column ``text``), or folders of them; one format.
    output : path
        A folder that does not exist or is empty; receives Parquet shards with
        every input column plus ``embedding`` (fixed-length float32).
    embedder : BertEmbedder, default=None
        The encoder and its settings (default: ``BertEmbedder()``).
    text_column : str, default="text"
    workers : int, default=1
        Ray actors, each with its own copy of the encoder.
    gpus_per_worker : float, default=0
    threads_per_worker : int, default=None
        torch threads per actor; None shares this machine's cores among the workers.
    overwrite : bool, default=False
        Replace a non-empty ``output`` folder.
    address : str, default=None
        A Ray cluster to join (else ``RAY_ADDRESS``, else a local instance).
    quiet : bool, default=False
        No progress bars.
    """
    files, kind = input_files(inputs)
    text_column = "text" if kind == "text" else text_column
    n_rows = check_texts(files, kind, text_column)
    out = prepare_output_folder(output, overwrite=overwrite)
    embedder = BertEmbedder() if embedder is None else embedder
    embedder._validate_params()
    threads = threads_per_worker or _threads(workers)
    actor = dict(embedder=embedder, text_column=text_column, threads=threads)
    _map_in_actors(files, kind, out, _EmbedBatches, actor, workers, gpus_per_worker, address, quiet)
    return n_rows


def fit(
    input_dir: str | os.PathLike,
    output: str | os.PathLike,
    *,
    flow: FlowGaussianizer | None = None,
    column: str = EMBEDDING_COLUMN,
    epochs: int = 1,
    overwrite: bool = False,
    address: str | None = None,
    quiet: bool = False,
) -> FlowGaussianizer:
    """Fit a flow on the embeddings of the Parquet shards in ``input_dir`` and save it to ``output``.

    ``output`` ending in ``.skops`` is written with :func:`skflow.dump` (safe
    to share, read with :func:`skflow.load`); any other name with joblib.

    Ray streams the vectors in blocks of a random order through a local
    shuffle buffer of 32,768 rows into :meth:`FlowGaussianizer.partial_fit`,
    8,192 rows a call; ``epochs`` passes. The driver never holds more than
    the buffer.
    """
    files, kind = input_files([input_dir])
    if kind != "parquet":
        raise InputError(f"{input_dir}: skflow fit reads Parquet shards (as written by skflow embed)")
    check_embeddings(files, column)
    out = check_output_file(output, overwrite=overwrite)
    flow = FlowGaussianizer() if flow is None else flow
    flow._validate_params()
    with ray_session(address, quiet=quiet):
        import ray

        dataset = ray.data.read_parquet(files).select_columns([column])
        for _ in range(epochs):
            for batch in dataset.randomize_block_order().iter_batches(
                batch_size=ROWS_PER_PARTIAL_FIT,
                batch_format="pyarrow",
                local_shuffle_buffer_size=SHUFFLE_BUFFER_ROWS,
            ):
                flow.partial_fit(vectors_array(batch.column(column)))
    save_model(flow, out)
    return flow


def transform(
    input_dir: str | os.PathLike,
    model: str | os.PathLike,
    output: str | os.PathLike,
    *,
    column: str = EMBEDDING_COLUMN,
    text_column: str = "text",
    output_column: str = "z",
    workers: int = 1,
    gpus_per_worker: float = 0,
    threads_per_worker: int | None = None,
    overwrite: bool = False,
    address: str | None = None,
    quiet: bool = False,
) -> int:
    """Apply a fitted model to every row of ``input_dir`` and write Parquet shards with ``output_column`` added.

    ``model`` is a ``.skops`` (read with :func:`skflow.load`) or joblib file of a fitted FlowGaussianizer (reads
    ``column``) or of a fitted pipeline that starts with a BertEmbedder
    (reads ``text_column`` of any input format).
    """
    fitted = load_model(model)
    files, kind = input_files([input_dir])
    if isinstance(fitted, FlowGaussianizer):
        if kind != "parquet":
            raise InputError(f"{input_dir}: a FlowGaussianizer reads the embedding column of Parquet shards")
        n_rows, length = check_embeddings(files, column)
        if length != fitted.n_features_in_:
            raise InputError(f"{input_dir}: vectors of length {length}; the model expects {fitted.n_features_in_}")
        input_column = column
    else:
        input_column = "text" if kind == "text" else text_column
        n_rows = check_texts(files, kind, input_column)
    out = prepare_output_folder(output, overwrite=overwrite)
    threads = threads_per_worker or _threads(workers)
    actor = dict(model=fitted, input_column=input_column, output_column=output_column, threads=threads)
    _map_in_actors(files, kind, out, _TransformBatches, actor, workers, gpus_per_worker, address, quiet)
    return n_rows
