"""Command line: ``skflow evaluate`` (the paper's STS evaluation) and ``skflow embed | fit | transform`` (Ray)."""

import argparse
import contextlib
import json
import math
import os
import platform
import re
import signal
import sys
import threading
import warnings
from pathlib import Path

import numpy as np

from skflow import __version__
from skflow.datasets import STS_SETS
from skflow.embedder import DTYPES, POOLINGS, BertEmbedder
from skflow.evaluation import METHODS, evaluate, markdown_tables, stderr_log, strict_json
from skflow.flows import COUPLINGS, PERMUTATIONS
from skflow.gaussianizer import MAX_EPOCHS, FlowGaussianizer
from skflow.metrics import PROTOCOLS
from skflow.utils import (
    RESULTS_JSON,
    RESULTS_TABLE,
    check_output_file,
    check_replaceable,
    name_problem,
    write_text_atomically,
)

# The defaults the commands show and pass on are the estimators' own, read once.
_EMBEDDER = BertEmbedder().get_params()
_FLOW = FlowGaussianizer().get_params()
_DEVICES = "auto, cpu, cuda, cuda:N"  # what skflow.utils.resolve_device takes
MAX_SEED = 2**32 - 1  # numpy's RandomState takes seeds 0 to 2**32 - 1


class _OneLineErrors(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit status 2, like every other user error."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineErrors(prog="python -m skflow", description="skflow: BERT-flow as scikit-learn estimators.")
    parser.add_argument("--version", action="version", version=f"skflow {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineErrors)
    ev = commands.add_parser(
        "evaluate",
        help="STS Spearman of raw, whitened and flow-transformed embeddings",
        description=(
            "For each STS set, embed its sentences, fit each post-processing on them without labels "
            "(BERT-flow's 'target' setting), and report the Spearman correlation x100 of cosine "
            "similarities with the gold scores (STS-B and SICK-R: test split)."
        ),
    )
    _add_encoder_arguments(ev)
    ev.add_argument("--method", nargs="+", default=list(METHODS), metavar="METHOD",
                    help="none (the raw vectors), center, whiten, whiten-K (the first K whitened directions, K an "
                    "integer >= 1 in digits 0-9), soft-whiten, abtt-D (all-but-the-top: the top D directions "
                    "removed, D an integer >= 1 in digits 0-9), pca-K (PCA to K dimensions, no whitening), "
                    "renorm (the mean direction projected out, without centring), flow (default: %(default)s)")
    ev.add_argument("--sets", nargs="+", choices=STS_SETS, metavar="SET",
                    help=f"STS sets among {', '.join(STS_SETS)} (default: all seven, skipping those whose data "
                    "is missing; a set named here must be there)")
    ev.add_argument("--protocol", nargs="+", default=["wmean"], choices=PROTOCOLS, metavar="PROTOCOL",
                    help=f"aggregation over subsets: {', '.join(PROTOCOLS)} (default: %(default)s)")
    ev.add_argument("--output", default="skflow_results", metavar="FILE", type=_file_name,
                    help="writes FILE.json and FILE.md, replacing only results files that evaluate wrote "
                    "(default: %(default)s)")
    ev.add_argument("--data-home", type=_name,
                    help="folder of the STS data (default: $SKFLOW_DATA, else ~/skflow_data)")
    ev.add_argument("--no-download", action="store_true", help="never download missing data")
    ev.add_argument("--allow-modified-data", action="store_true",
                    help="read STS files whose sha256 differs from the distributed files' (your own modified copy)")
    ev.add_argument("--device", default="auto",
                    help=f"where the encoder runs and the flow trains: {_DEVICES} (default: %(default)s)")
    ev.add_argument("--cache-dir", type=_name,
                    help="embedding cache folder, reused across runs, a non-empty path (default: no cache)")
    ev.add_argument("--epochs", type=_count(1, MAX_EPOCHS), default=1,
                    help=f"flow epochs, an integer from 1 to {MAX_EPOCHS} (default: %(default)s, as the paper)")
    ev.add_argument("--seed", type=_count(0, MAX_SEED), default=0,
                    help=f"flow seed, an integer from 0 to {MAX_SEED} (default: %(default)s)")
    ev.add_argument("--quiet", action="store_true", help="no progress output")
    _add_scale_commands(commands)
    return parser


def _count(minimum: int, maximum: int | None = None):
    """An argparse type: an integer of at least ``minimum`` (and at most ``maximum``), in the digits 0-9 (``int``
    also reads other scripts' digits, '٣' or '３', and underscores)."""

    def parse(text: str) -> int:
        if not re.fullmatch(r"[+-]?[0-9]+", text.strip()):
            raise argparse.ArgumentTypeError(f"expected an integer in the digits 0-9, got {text!r}")
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, got {value}")
        return value

    return parse


def _name(text: str) -> str:
    """An argparse type: a path or name that is not empty, is UTF-8 and holds no line break or control character
    (:func:`skflow.utils.name_problem`, the check every name skflow is given passes)."""
    if (problem := name_problem(text)) is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def _file_name(text: str) -> str:
    """An argparse type: a :func:`_name` that names a file (not ``.``, ``..`` or ending with a separator)."""
    if (problem := name_problem(text, file=True)) is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def _number(minimum: float, *, above: bool = False):
    """An argparse type: a finite number >= ``minimum`` (> with ``above``), in ASCII (``float`` also reads other
    scripts' digits)."""
    relation = ">" if above else ">="

    def parse(text: str) -> float:
        try:
            value = float(text) if text.isascii() else math.nan
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < minimum or (above and value == minimum):
            raise argparse.ArgumentTypeError(f"must be a finite number {relation} {minimum:g}, got {text!r}")
        return value

    return parse


def _add_encoder_arguments(sub) -> None:
    """The BertEmbedder options that ``evaluate`` and ``embed`` share."""
    sub.add_argument("--model", default=_EMBEDDER["model_name_or_path"],
                     help="Hugging Face model id or local folder (default: %(default)s, embedded, offline)")
    sub.add_argument("--pooling", default=_EMBEDDER["pooling"], choices=sorted(POOLINGS), metavar="POOLING",
                     help=f"{', '.join(sorted(POOLINGS))} (default: %(default)s; first_last_avg is the paper's "
                     "'last2avg', and skflow's last2avg a deprecated alias of last_two_avg)")
    sub.add_argument("--max-length", type=_count(2), default=_EMBEDDER["max_length"],
                     help="tokens per sentence, an integer >= 2 and at most what the model supports "
                     "(default: %(default)s)")
    sub.add_argument("--batch-size", type=_count(1), default=_EMBEDDER["batch_size"],
                     help="texts per forward pass, an integer >= 1 (default: %(default)s)")
    sub.add_argument("--dtype", default=_EMBEDDER["dtype"], choices=["auto", *DTYPES], metavar="DTYPE",
                     help=f"the encoder's dtype: {', '.join(['auto', *DTYPES])} (default: %(default)s)")


_OUTPUT_DIR = "the folder (or s3:// prefix) of the Parquet shards written: absent or empty, or pass --overwrite"
_INPUT_SHARDS = "a folder (or s3:// prefix) of Parquet shards, as embed writes them"


def _add_scale_commands(commands) -> None:
    def common(sub, workers: bool = True):
        if workers:
            sub.add_argument("--workers", type=_count(1), default=1,
                             help="Ray actors, an integer >= 1, each with its own model (default: 1); together they "
                             "reserve all but one of the cluster's CPUs, at most one each, so more workers than cores "
                             "share the cores")
            sub.add_argument("--gpus-per-worker", type=_number(0), default=0,
                             help="GPUs per actor, a number >= 0 (default: 0)")
            sub.add_argument("--threads-per-worker", type=_count(1), help="torch threads per actor, an integer >= 1 "
                             "(default: this machine's cores shared among the workers)")
        sub.add_argument("--address", help="Ray cluster to join (default: $RAY_ADDRESS, else a local instance)")
        sub.add_argument("--overwrite", action="store_true",
                         help="replace an existing output that skflow wrote, once the new one is complete")
        sub.add_argument("--quiet", action="store_true", help="print nothing unless the command fails")

    em = commands.add_parser("embed", help="embed text files into Parquet shards with Ray",
                             description="Read Parquet, CSV, JSON lines or text files (one text a line), embed their "
                             "texts with BertEmbedder in Ray actors, and write Parquet shards with every input column "
                             "plus 'embedding'.")
    em.add_argument("inputs", nargs="+", metavar="INPUT", help="files or folders of one format")
    em.add_argument("--output", required=True, metavar="DIR", type=_name, help=_OUTPUT_DIR)
    em.add_argument("--text-column", default="text",
                    help="the column of texts in Parquet, CSV or JSON lines input (default: %(default)s)")
    _add_encoder_arguments(em)
    common(em)

    fi = commands.add_parser("fit", help="fit a FlowGaussianizer on Parquet embeddings, streamed with Ray",
                             description="Stream the embeddings of Parquet shards (random block order, local "
                             "shuffle buffer) into FlowGaussianizer.partial_fit and save the model: MODEL.skops "
                             "with skops (safe "
                             "to share; skflow.load reads it), any other name with joblib.")
    fi.add_argument("input_dir", metavar="INPUT_DIR", help=_INPUT_SHARDS)
    fi.add_argument("--output", required=True, metavar="MODEL", type=_file_name,
                    help="the model file: .skops (recommended) or joblib")
    fi.add_argument("--column", default="embedding", help="the column of vectors (default: %(default)s)")
    fi.add_argument("--epochs", type=_count(1, MAX_EPOCHS), default=_FLOW["max_epochs"],
                    help=f"passes over the input, an integer from 1 to {MAX_EPOCHS} (default: %(default)s)")
    for flag, kind, what in (
        ("batch-size", _count(1), "rows per training step, an integer >= 1"),
        ("learning-rate", _number(0, above=True), "AdamWeightDecay's learning rate, a number > 0"),
        ("weight-decay", _number(0), "AdamWeightDecay's decoupled weight decay, a number >= 0"),
        ("n-levels", _count(1), "levels of the Glow, an integer >= 1"),
        ("depth", _count(1), "steps per level, an integer >= 1; depth x levels at most 1000"),
        ("hidden-channels", _count(1), "width of the coupling networks, an integer >= 1; the flow's weights must "
         "fit in this machine's memory"),
    ):
        fi.add_argument(f"--{flag}", type=kind, default=_FLOW[flag.replace("-", "_")],
                        help=f"{what} (default: %(default)s)")
    fi.add_argument("--coupling", default=_FLOW["coupling"], choices=sorted(COUPLINGS), metavar="COUPLING",
                    help=f"{', '.join(sorted(COUPLINGS))} (default: %(default)s)")
    fi.add_argument("--permutation", default=_FLOW["permutation"], choices=PERMUTATIONS, metavar="PERMUTATION",
                    help=f"{', '.join(PERMUTATIONS)} (default: %(default)s)")
    fi.add_argument("--device", default=_FLOW["device"], help=f"where the flow trains: {_DEVICES} "
                    "(default: %(default)s)")
    fi.add_argument("--seed", type=_count(0, MAX_SEED), default=0,
                    help=f"an integer from 0 to {MAX_SEED}: the same input and seed give the same model "
                    "(default: %(default)s)")
    common(fi, workers=False)

    tr = commands.add_parser("transform", help="apply a fitted model to Parquet shards with Ray",
                             description="Apply a fitted FlowGaussianizer (to the embedding column) or a fitted "
                             "pipeline that starts with BertEmbedder (to the text column) in Ray actors, and write "
                             "Parquet shards with the result column added.")
    tr.add_argument("input_dir", metavar="INPUT_DIR", help=_INPUT_SHARDS + "; for a pipeline, any format embed reads")
    tr.add_argument("--model", required=True, metavar="MODEL", type=_name,
                    help="a .skops file (read safely) or a joblib file")
    tr.add_argument("--output", required=True, metavar="DIR", type=_name, help=_OUTPUT_DIR)
    tr.add_argument("--column", default="embedding",
                    help="the column of vectors a FlowGaussianizer transforms (default: %(default)s)")
    tr.add_argument("--text-column", default="text",
                    help="the column of texts a pipeline that starts with BertEmbedder transforms "
                    "(default: %(default)s)")
    tr.add_argument("--output-column", default="z", type=_name,
                    help="the name of the column added, not one the input has (default: %(default)s)")
    common(tr)


def _run_scale_command(args) -> int:
    # SIGTERM ends the command like Ctrl-C: unwinding, so that the staging folder and Ray are cleaned up.
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return _scale_command(args)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _silenced(quiet: bool):
    """With ``--quiet``, the process's stdout and stderr go nowhere while the command runs; its error line follows.

    Both the file descriptors (Ray's processes and the driver's C++ log lines,
    such as core_worker's, write there) and Python's streams (which need not be
    those descriptors: a caller's redirection, pytest's capture).
    """
    if not quiet:
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        for fd, copy in zip((1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)
        os.close(null)


def _scale_command(args) -> int:
    from skflow import distributed

    try:
        with _silenced(args.quiet):  # errors are printed below, once the streams are back
            done = _scale_step(args)
    except ModuleNotFoundError as exc:
        if exc.name not in ("ray", "pyarrow"):
            raise
        print(f"error: skflow {args.command} needs Ray Data: pip install 'skflow[ray]' ({exc})", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:  # InputError, OutputPathError, EncoderNotFoundError, RayClusterError
        return _user_error(exc)
    except (distributed.JobFailedError, FloatingPointError) as exc:  # after the checks: nothing was written
        _one_line("error", exc)
        return 1
    if not args.quiet:
        print(done, file=sys.stderr)
    return 0


def _scale_step(args) -> str:
    """Run ``skflow embed | fit | transform``; returns what it did, in words."""
    from skflow import distributed

    if args.command == "embed":
        embedder = BertEmbedder(args.model, pooling=args.pooling, dtype=args.dtype, batch_size=args.batch_size,
                                max_length=args.max_length, show_progress_bar=False)
        n = distributed.embed(args.inputs, args.output, embedder=embedder, text_column=args.text_column,
                              workers=args.workers, gpus_per_worker=args.gpus_per_worker,
                              threads_per_worker=args.threads_per_worker, overwrite=args.overwrite,
                              address=args.address, quiet=args.quiet)
        return f"embedded {n:,} rows into {args.output}"
    if args.command == "fit":
        flow = FlowGaussianizer(batch_size=args.batch_size, learning_rate=args.learning_rate,
                                weight_decay=args.weight_decay, n_levels=args.n_levels, depth=args.depth,
                                hidden_channels=args.hidden_channels, coupling=args.coupling,
                                permutation=args.permutation, device=args.device, random_state=args.seed)
        flow = distributed.fit(args.input_dir, args.output, flow=flow, column=args.column, epochs=args.epochs,
                               overwrite=args.overwrite, address=args.address, quiet=args.quiet)
        return f"fitted on {flow.n_samples_seen_:,} rows ({flow.n_steps_:,} steps); wrote {args.output}"
    n = distributed.transform(args.input_dir, args.model, args.output, column=args.column,
                              text_column=args.text_column, output_column=args.output_column,
                              workers=args.workers, gpus_per_worker=args.gpus_per_worker,
                              threads_per_worker=args.threads_per_worker, overwrite=args.overwrite,
                              address=args.address, quiet=args.quiet)
    return f"transformed {n:,} rows into {args.output}"


def _one_line(label: str, what, file=None) -> None:
    """``label: what`` as one line on stderr (or ``file``): how the command line reports errors and warnings."""
    print(f"{label}: {' '.join(str(what).split())}", file=sys.stderr if file is None else file)


def _user_error(exc: BaseException) -> int:
    """One line on stderr, exit status 2: how every user error ends."""
    _one_line("error", exc)
    return 2


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as the command line shows it: one line, like its errors (no source file, no code line)."""
    _one_line("warning", message, file)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        if args.command != "evaluate":
            return _run_scale_command(args)
        return _evaluate_command(args)


def _evaluate_command(args) -> int:
    log = None if args.quiet else stderr_log
    output = Path(args.output).expanduser()
    stem = output.with_suffix("") if output.suffix in (".json", ".md") else output
    try:
        outputs = [check_output_file(f"{stem}{suffix}", kind=kind) for suffix, kind in _RESULTS.items()]
        embedder = BertEmbedder(
            args.model,
            pooling=args.pooling,
            max_length=args.max_length,
            batch_size=args.batch_size,
            dtype=args.dtype,
            device=args.device,
            cache_dir=args.cache_dir,
            show_progress_bar=not args.quiet,
        )
        results = _run(args, embedder, log)
    except (OSError, ValueError) as exc:  # missing data, encoder, cache_dir or output folder; bad options
        return _user_error(exc)
    if not results["sets"]:
        print("No STS data found; nothing evaluated. " + " ".join(results["skipped"].values()), file=sys.stderr)
        return 1
    title = f"{args.model}, pooling {args.pooling}"
    tables = markdown_tables(results, args.protocol, title=title)
    print(tables)
    for name in results["skipped"]:
        print(f"(skipped {name}: data not found)")
    results["config"] = {
        "model": args.model,
        "pooling": args.pooling,
        "methods": args.method,
        "max_length": args.max_length,
        "dtype": args.dtype,
        "flow_epochs": args.epochs,
        "seed": args.seed,
        "skflow": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    texts = [json.dumps(strict_json(results), indent=1, allow_nan=False) + "\n", tables]
    try:
        for path, kind in zip(outputs, _RESULTS.values()):  # again, both before either is written: a file may
            check_replaceable(path, kind)  # have appeared, or been changed, during the run
        replaced = {path for path in outputs if os.path.lexists(path)}  # one appearing from now on: not replaced
        for path, text, kind in zip(outputs, texts, _RESULTS.values()):  # the old results or the whole new ones
            write_text_atomically(path, text, kind=kind, overwrite=path in replaced)
    except (OSError, ValueError) as exc:  # the table is printed above: the results are not lost
        return _user_error(f"the results are printed above, but writing them failed: {exc}")
    if log:
        log(f"wrote {outputs[0]} and {outputs[1]}")
    return 0


# What evaluate writes: ``evaluate --output README`` never replaces README.md, only results that it wrote
# (``.json``: an object with the ``sets`` and the ``config`` evaluate writes; ``.md``: only its tables).
_RESULTS = {".json": RESULTS_JSON, ".md": RESULTS_TABLE}


def _run(args, embedder, log) -> dict:
    return evaluate(
        embedder,
        methods=args.method,
        sets=args.sets or STS_SETS,
        data_home=args.data_home,
        download_if_missing=not args.no_download,
        allow_modified=args.allow_modified_data,
        skip_missing=args.sets is None,
        random_state=args.seed,
        flow_params={"max_epochs": args.epochs, "device": args.device},
        log=log,
    )
