"""Command line: ``skflow evaluate`` (the paper's STS evaluation, and retrieval) and ``skflow embed | fit | transform``
(Ray)."""

import argparse
import contextlib
import functools
import inspect
import json
import os
import platform
import re
import signal
import sys
import threading
import warnings
from numbers import Integral
from pathlib import Path

import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions

from skflow import __version__, distributed, utils
from skflow.datasets import BEIR_SETS, STS_SETS, beir_folder, command_line_words
from skflow.embedder import BertEmbedder
from skflow.evaluation import (
    EVALUATION_SETS,
    FIT_CORPORA,
    INDEXES,
    METHODS,
    PRECISIONS,
    SEARCH_ENGINES,
    evaluate,
    markdown_tables,
    stderr_log,
    strict_json,
)
from skflow.gaussianizer import FlowGaussianizer
from skflow.metrics import PROTOCOLS

SEEDS = Interval(Integral, 0, 2**32 - 1, closed="both")  # numpy's RandomState takes seeds 0 to 2**32 - 1
# What evaluate writes, recognised by content: ``--output README`` never replaces README.md, only results it wrote
_RESULTS = {".json": utils.RESULTS_JSON, ".md": utils.RESULTS_TABLE}


class _OneLineErrors(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit status 2, like every other user error."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _name(text: str, file: bool = False) -> str:
    """An argparse type: a name :func:`skflow.utils.name_problem` passes (the check of every name skflow is given)."""
    if (problem := utils.name_problem(text, file=file)) is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def _set(text: str) -> str:
    """An argparse type: a set's name, or the path of a folder in BEIR's layout (checked when it is read)."""
    if text in EVALUATION_SETS or beir_folder(text) is not None:
        return _name(text)
    raise argparse.ArgumentTypeError(f"unknown set {text!r}: give one of {', '.join(EVALUATION_SETS)}, or the path "
                                     "of a folder in BEIR's layout (with a '/', e.g. ./mydata)")


def _within(interval: Interval, text: str):
    """An argparse type: a number in ``interval``, in ASCII (``int`` and ``float`` also read '٣' or '３')."""
    value = utils.ascii_number(text, int if interval.type is Integral else float)
    if value is not None and interval.is_satisfied_by(value):
        return value
    raise argparse.ArgumentTypeError(f"must be {interval}, got {text!r}")


def _option(sub, flag: str, what: str, constraints: dict, defaults: dict, param: str = "", shown="%(default)s"):
    """``flag`` for ``param``: its default, and its values (the parser's check and the help text alike) from its
    sklearn constraint, read from the estimator (or function) it is passed to, not copied."""
    param = param or flag.removeprefix("--").replace("-", "_")
    constraint = constraints[param][0]
    if isinstance(constraint, StrOptions):
        kwargs = {"choices": sorted(constraint.options), "metavar": param.upper()}
        what = f"{what}: {', '.join(kwargs['choices'])}"
    else:
        kwargs = {"type": functools.partial(_within, constraint)}
        what = f"{what}, {constraint}"
    sub.add_argument(flag, default=defaults[param], help=f"{what} (default: {shown})", **kwargs)


_ENCODER = BertEmbedder._parameter_constraints, BertEmbedder().get_params()
_FLOW = FlowGaussianizer._parameter_constraints, FlowGaussianizer().get_params()
_ACTORS = distributed.ACTOR_OPTIONS, {p: v.default for p, v in inspect.signature(distributed.embed).parameters.items()}
_ENCODER_OPTIONS = {
    "pooling": "how tokens are pooled (first_last_avg is the paper's 'last2avg'; last2avg is deprecated: last_two_avg)",
    "max_length": "tokens per sentence (at most what the model supports)",
    "batch_size": "texts per forward pass",
    "dtype": "the encoder's dtype",
}
# what retrieval sets take from the encoder's sentence-transformers files where evaluate is not given it
_STOCK = {"pooling": "pooling (all-MiniLM-L6-v2: mean)", "max_length": "max_seq_length (all-MiniLM-L6-v2: 256)"}
_FIT_OPTIONS = {
    "batch_size": "rows per training step",
    "learning_rate": "AdamWeightDecay's learning rate",
    "weight_decay": "AdamWeightDecay's decoupled weight decay",
    "n_levels": "levels of the Glow",
    "depth": "steps per level (depth x levels at most 1000)",
    "hidden_channels": "width of the coupling networks (the flow's weights must fit in this machine's memory)",
    "coupling": "the coupling layers",
    "permutation": "the channel permutation between steps",
}


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineErrors(prog="python -m skflow", description="skflow: BERT-flow as scikit-learn estimators.")
    parser.add_argument("--version", action="version", version=f"skflow {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineErrors)
    # Options that several commands share, built once (argparse parents); skflow.distributed checks the Ray names
    encoder, evaluated = argparse.ArgumentParser(add_help=False), argparse.ArgumentParser(add_help=False)
    for parent in encoder, evaluated:
        parent.add_argument("--model", default=_ENCODER[1]["model_name_or_path"],
                            help="Hugging Face model id or local folder (default: %(default)s, embedded, offline)")
        for param, what in _ENCODER_OPTIONS.items():
            if parent is evaluated and param in _STOCK:  # unset: each kind of set has its own default
                _option(parent, "--" + param.replace("_", "-"), what, _ENCODER[0], {param: None},
                        shown=f"{_ENCODER[1][param]} for STS sets; for retrieval sets the encoder's own "
                        f"{_STOCK[param]}, as MTEB runs it")
            else:
                _option(parent, "--" + param.replace("_", "-"), what, *_ENCODER)
    flow = argparse.ArgumentParser(add_help=False)
    _option(flow, "--epochs", "passes over the data (the paper: 1)", *_FLOW, param="max_epochs")
    _option(flow, "--seed", "the flow's seed: the same input and seed give the same model", {"seed": [SEEDS]},
            {"seed": 0})
    flow.add_argument("--device", default=_FLOW[1]["device"], help="where the flow trains (and evaluate's encoder "
                      "runs): auto, cpu, cuda, cuda:N (default: %(default)s)")
    scale = argparse.ArgumentParser(add_help=False)
    scale.add_argument("--address", help="Ray cluster to join (default: $RAY_ADDRESS, else a local instance)")
    scale.add_argument("--overwrite", action="store_true",
                       help="replace an existing output that skflow wrote, once the new one is complete")
    scale.add_argument("--quiet", action="store_true", help="print nothing unless the command fails")
    actors = argparse.ArgumentParser(add_help=False)
    _option(actors, "--workers", "Ray actors, each with its own model; together they reserve all but one of the "
            "cluster's CPUs, at most one each, so more workers than cores share the cores (at most 4 per CPU)",
            *_ACTORS)
    _option(actors, "--gpus-per-worker", "GPUs per actor (at most what a node has)", *_ACTORS)
    _option(actors, "--threads-per-worker", "torch threads per actor (at most the CPUs of a node)", *_ACTORS,
            shown="this machine's cores shared among the workers")
    actors.add_argument("--output", required=True, metavar="DIR", help="the folder (or s3:// prefix) of the Parquet "
                        "shards written: absent or empty, or pass --overwrite")
    actors.add_argument("--restart", action="store_true", help="discard an unfinished run in --output (killed, or "
                        "failed) instead of resuming it; by default the same command resumes it")
    actors.add_argument("--text-column", default="text",
                        help="the column of texts in Parquet, CSV or JSON lines input (default: %(default)s)")
    shards = argparse.ArgumentParser(add_help=False)
    shards.add_argument("input_dir", metavar="INPUT_DIR", help="a folder (or s3:// prefix) of Parquet shards, as "
                        "embed writes them (transform with a pipeline: any format embed reads)")
    shards.add_argument("--column", default="embedding", help="the column of vectors (default: %(default)s)")

    ev = commands.add_parser("evaluate", parents=[evaluated, flow],
                             help="STS Spearman (retrieval: nDCG@10) of raw, whitened and flow-transformed embeddings",
                             description="For each STS set, embed its sentences, fit each post-processing on them "
                             "without labels (BERT-flow's 'target' setting), and report the Spearman correlation x100 "
                             "of cosine similarities with the gold scores (STS-B and SICK-R: test split). For a "
                             "retrieval set (scifact, or a folder in BEIR's layout), embed its corpus (title + ' ' + "
                             "text) and test queries, fit "
                             "each post-processing on the corpus only, rank the corpus by cosine similarity and report "
                             "nDCG@10 and recall@100 x100, in a table of their own.")
    ev.add_argument("--method", nargs="+", default=list(METHODS), metavar="METHOD",
                    help="none (the raw vectors), center (the mean subtracted), whiten, whiten-K (the first K "
                    "whitened directions, K an integer >= 1 in digits 0-9), soft-whiten, abtt-D (all-but-the-top: "
                    "the top D directions removed, D an integer >= 1 in digits 0-9), pca (the centred vectors "
                    "rotated onto their principal axes), pca-K (PCA to K dimensions, no whitening), "
                    "renorm (the mean direction projected out, without centring), flow, itq (a rotation fitted for "
                    "binary codes), itq-K (on K principal directions), rotation (a random one: itq's baseline) "
                    "(default: %(default)s)")
    ev.add_argument("--sets", nargs="+", type=_set, metavar="SET",
                    help=f"STS sets among {', '.join(STS_SETS)}, retrieval sets among {', '.join(BEIR_SETS)}, or the "
                    "path of a folder in BEIR's layout (corpus.jsonl, queries.jsonl, qrels/test.tsv; named by the "
                    "folder's name, not verified) (default: the seven STS sets, skipping those whose data is "
                    "missing; a set named here must be there)")
    ev.add_argument("--fit-on", nargs="+", default=["target"], type=_name, metavar="CORPUS",
                    help="what each method is fitted on, each giving its own rows: target (each set's own "
                    "sentences, rows METHOD), or for every set alike (rows METHOD@NAME) a set's sentences (sts12, "
                    "..., stsb, sickr; scifact, or a folder in BEIR's layout: its documents), stsb-train or "
                    "sickr-train (a train split), or your own texts: a file or folder as embed reads them, named by "
                    "its file name (default: target)")
    ev.add_argument("--text-column", default="text", help="the column of texts in a --fit-on file of Parquet, CSV "
                    "or JSON lines (default: %(default)s)")
    ev.add_argument("--precision", nargs="+", default=["float32"], choices=PRECISIONS, metavar="PRECISION",
                    help="how vectors are stored, after each method: float32, int8 (codes fitted where the method "
                    "is: the set's corpus, or the --fit-on corpus; scored by the cosine of their dequantized "
                    "vectors), float8 (e4m3 codes after one scale fitted there, 1 byte a dimension, scored by the "
                    "cosine of the numbers they code; numpy's search only), binary (one bit a dimension, scored "
                    "by Hamming distance; retrieval also reports float queries against the bits and the Hamming "
                    "top 100 rescored in float32), int4 or int2 (4 or 2 bits a dimension, a Gaussian's levels around "
                    "each dimension's mean and spread fitted there; retrieval scores the float query against them; "
                    "numpy's search only); one or several (default: float32)")
    ev.add_argument("--engine", default="numpy", choices=SEARCH_ENGINES,
                    help="where retrieval sets are ranked: numpy (skflow's exact search), faiss or usearch (an engine "
                    "index of the stored vectors; int8 rows store the symmetric codes of the unit vectors, binary-asym "
                    "rescores the engine's Hamming top 1,000; needs skflow's engines extra: faiss-cpu, usearch) "
                    "(default: "
                    "%(default)s)")
    ev.add_argument("--index", default="flat", choices=INDEXES,
                    help="the engine's index: flat (exact) or hnsw (the engine's default settings; each row also "
                    "reports the recall@100 of its top 100 against the exact one) (default: %(default)s)")
    ev.add_argument("--protocol", nargs="+", default=["wmean"], choices=PROTOCOLS, metavar="PROTOCOL",
                    help=f"aggregation over subsets: {', '.join(PROTOCOLS)} (default: %(default)s)")
    ev.add_argument("--output", default="skflow_results", metavar="FILE", type=functools.partial(_name, file=True),
                    help="writes FILE.json and FILE.md, replacing only results files that evaluate wrote "
                    "(default: %(default)s)")
    ev.add_argument("--data-home", type=_name,
                    help="folder of the data (default: $SKFLOW_DATA, else ~/skflow_data; for retrieval sets "
                    "$SKFLOW_RETRIEVAL_DATA first)")
    ev.add_argument("--no-download", action="store_true", help="never download missing data")
    ev.add_argument("--allow-modified-data", action="store_true",
                    help="read STS files whose sha256 differs from the distributed files', or a retrieval set whose "
                    "counts or ids differ from the published set's (your own modified copy)")
    ev.add_argument("--cache-dir", type=_name,
                    help="embedding cache folder, reused across runs, a non-empty path (default: no cache)")
    ev.add_argument("--quiet", action="store_true", help="no progress output")

    em = commands.add_parser("embed", parents=[encoder, actors, scale],
                             help="embed text files into Parquet shards with Ray",
                             description="Read Parquet, CSV, JSON lines or text files (one text a line), embed their "
                             "texts with BertEmbedder in Ray actors, and write Parquet shards with every input column "
                             "plus 'embedding'.")
    em.add_argument("inputs", nargs="+", metavar="INPUT", help="files or folders of one format")

    fi = commands.add_parser("fit", parents=[shards, flow, scale],
                             help="fit a FlowGaussianizer on Parquet embeddings, streamed with Ray",
                             description="Stream the embeddings of Parquet shards (random block order, local "
                             "shuffle buffer) into FlowGaussianizer.partial_fit and save the model: MODEL.skops "
                             "with skops (safe to share; skflow.load reads it), any other name with joblib.")
    fi.add_argument("--output", required=True, metavar="MODEL", help="the model file: .skops (recommended) or joblib")
    for param, what in _FIT_OPTIONS.items():
        _option(fi, "--" + param.replace("_", "-"), what, *_FLOW)

    tr = commands.add_parser("transform", parents=[shards, actors, scale],
                             help="apply a fitted model to Parquet shards with Ray",
                             description="Apply a fitted FlowGaussianizer (to the embedding column) or a fitted "
                             "pipeline that starts with BertEmbedder (to the text column) in Ray actors, and write "
                             "Parquet shards with the result column added.")
    tr.add_argument("--model", required=True, metavar="MODEL", help="a .skops file (read safely) or a joblib file")
    tr.add_argument("--output-column", default="z",
                    help="the name of the column added, not one the input has (default: %(default)s)")
    return parser


def main(argv=None) -> int:
    if getattr(signal.getsignal(signal.SIGINT), "__module__", None) == "skflow":  # loaded (skflow/__init__.py's)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _main(argv)
    except KeyboardInterrupt:  # the skflow script too (python -m skflow's __main__ said it alone)
        print("interrupted", file=sys.stderr)
        return 130


def _main(argv) -> int:
    args = _parser().parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = lambda message, *args, **kwargs: _error(message, label="warning")
        try:
            return _evaluate_command(args) if args.command == "evaluate" else _scale_command(args)
        except ModuleNotFoundError as exc:
            if exc.name in SEARCH_ENGINES:  # evaluate --engine faiss without faiss: the engine's own line
                return _error(exc)
            if exc.name not in ("ray", "pyarrow"):
                raise
            return _error(f"skflow {args.command} needs Ray Data: {utils.install_hint('ray')} ({exc})")
        except (OSError, ValueError) as exc:  # before any work: options, inputs, outputs, data, encoder, cluster
            return _error(exc)
        except (distributed.JobFailedError, FloatingPointError) as exc:  # after the checks: nothing was written
            return _error(exc, status=1)


def _error(what, status: int = 2, label: str = "error") -> int:
    """``label: what`` as one line on stderr (how the command line reports errors and warnings); returns ``status``."""
    print(f"{label}: {' '.join(line.strip() for line in str(what).splitlines())}", file=sys.stderr)
    return status


@contextlib.contextmanager
def _silenced():
    """File descriptors 1 and 2 go nowhere (Ray's C++ log lines), and Python's streams too; flushed on both sides."""
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as sink:
        try:
            for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
                stream.flush()
                os.dup2(sink.fileno(), fd)
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                yield
        finally:
            for fd, stream, copy in zip((1, 2), (sys.stdout, sys.stderr), saved):
                stream.flush()  # what was written while silenced goes nowhere too
                os.dup2(copy, fd)
                os.close(copy)


_RAY_NATIVE_LINE = re.compile(rb"\[[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8},[0-9]{3} [DIWEF] [0-9]+ [0-9]+\] ")


@contextlib.contextmanager
def _without_ray_native_lines():
    """File descriptor 2 through a thread that drops the lines of Ray's C++ core (``[2026-12-07 02:12:53,076 E 61
    61] core_worker.cc:2465: ...``: in its session's log files; one error-level line, of Ray Data's own making,
    showed on every run) and passes the rest on as it comes."""
    sys.stderr.flush()
    terminal, (read, write) = os.dup(2), os.pipe()

    def pump(pending=b""):
        while chunk := os.read(read, 65536):
            *lines, pending = re.split(rb"(?<=\n)", pending + chunk)
            if pending[:1] != b"[":  # a progress bar's redraw (no newline): at once
                lines, pending = [*lines, pending], b""
            os.write(terminal, b"".join(line for line in lines if not _RAY_NATIVE_LINE.match(line)))
        os.write(terminal, pending)
        os.close(read)
        os.close(terminal)

    (thread := threading.Thread(target=pump, name="skflow-stderr", daemon=True)).start()
    os.dup2(write, 2)
    os.close(write)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(terminal, 2)  # the pipe's last writer gone: the thread reads it to its end
        thread.join(timeout=10)


def _scale_command(args) -> int:
    # SIGTERM ends the command as Ctrl-C does (a KeyboardInterrupt): unwinding, the parts kept, Ray shut down
    stopped = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stopped.append(signum) or
                             signal.default_int_handler(signum, frame))
    try:  # errors are printed once the streams are back
        with _silenced() if args.quiet else _without_ray_native_lines():
            print(_scale_step(args), file=sys.stderr)
    except KeyboardInterrupt as exc:  # one line: what was kept, and how to resume
        return _error(str(exc) or "nothing was written", status=128 + (stopped[0] if stopped else signal.SIGINT),
                      label="terminated" if stopped else "interrupted")
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _scale_step(args) -> str:  # what it did, in words
    ray = {"overwrite": args.overwrite, "address": args.address, "quiet": args.quiet}
    if args.command == "fit":
        flow = FlowGaussianizer(**{param: vars(args)[param] for param in _FIT_OPTIONS}, device=args.device,
                                random_state=args.seed)
        flow = distributed.fit(args.input_dir, args.output, flow=flow, column=args.column, epochs=args.epochs, **ray)
        return f"fitted on {flow.n_samples_seen_:,} rows ({flow.n_steps_:,} steps); wrote {args.output}"
    ray.update(workers=args.workers, gpus_per_worker=args.gpus_per_worker, threads_per_worker=args.threads_per_worker,
               restart=args.restart)
    if args.command == "embed":
        embedder = BertEmbedder(args.model, **{param: vars(args)[param] for param in _ENCODER_OPTIONS},
                                show_progress_bar=False)
        n = distributed.embed(args.inputs, args.output, embedder=embedder, text_column=args.text_column, **ray)
        return f"embedded {n:,} rows into {args.output}"
    n = distributed.transform(args.input_dir, args.model, args.output, column=args.column,
                              text_column=args.text_column, output_column=args.output_column, **ray)
    return f"transformed {n:,} rows into {args.output}"


def _evaluate_command(args) -> int:
    stem = Path(args.output).with_suffix("") if Path(args.output).suffix in _RESULTS else args.output
    outputs = [utils.check_output_file(f"{stem}{suffix}", kind=kind) for suffix, kind in _RESULTS.items()]
    settings = {param: vars(args)[param] for param in _ENCODER_OPTIONS}
    given = {param: settings[param] for param in _STOCK if settings[param] is not None}
    settings.update({param: _ENCODER[1][param] for param in _STOCK if param not in given})
    embedder = BertEmbedder(args.model, **settings, device=args.device, cache_dir=args.cache_dir,
                            show_progress_bar=not args.quiet)
    labels = {}
    for corpus in args.fit_on:  # before any file is read
        if labels.setdefault(label := _fitting_label(corpus), corpus) != corpus:
            raise ValueError(f"--fit-on {labels[label]} and {corpus} would both give rows METHOD@{label} (a file's "
                             "rows are named by its file name): rename one")
    fit_on = [_fitting_corpus(corpus, args.text_column) for corpus in args.fit_on]
    with command_line_words():  # the data's messages name --no-download, not download_if_missing=False
        results = evaluate(embedder, methods=args.method, sets=args.sets or STS_SETS, fit_on=fit_on,
                           data_home=args.data_home,
                           download_if_missing=not args.no_download, allow_modified=args.allow_modified_data,
                           skip_missing=args.sets is None, random_state=args.seed,
                           flow_params={"max_epochs": args.epochs, "device": args.device,
                                        "verbose": int(not args.quiet)},  # the flow's progress bar
                           retrieval_params=given, precisions=args.precision, engine=args.engine,
                           index=args.index, log=None if args.quiet else stderr_log)
    if not results["sets"] and not results.get("retrieval"):
        print("No STS data found; nothing evaluated. " + " ".join(results["skipped"].values()), file=sys.stderr)
        return 1
    stock = next(iter(results.get("retrieval_settings", {}).values()), {})
    tables = markdown_tables(results, args.protocol, title=f"{args.model}, pooling {settings['pooling']}",
                             retrieval_title=f"{args.model}, pooling {stock.get('pooling')}, max_length "
                             f"{stock.get('max_length')}")
    print(tables)
    for name in results["skipped"]:
        print(f"(skipped {name}: data not found)")
    results["config"] = {
        "model": args.model, "pooling": settings["pooling"], "methods": args.method, "fit_on": args.fit_on,
        "precisions": args.precision, "engine": args.engine, "index": args.index,
        "max_length": settings["max_length"],
        "dtype": args.dtype, "flow_epochs": args.epochs, "seed": args.seed, "skflow": __version__,
        "python": platform.python_version(), "numpy": np.__version__,
    }
    texts = [json.dumps(strict_json(results), indent=1, allow_nan=False) + "\n", tables]
    try:  # each file checked again (it may have appeared, or changed, during the run) before either is renamed
        with contextlib.ExitStack() as both:
            for path, text, kind in zip(outputs, texts, _RESULTS.values()):
                both.enter_context(utils.replaced_atomically(path, kind=kind)).write_text(text, encoding="utf-8")
    except (OSError, ValueError) as exc:  # the table is printed above: the results are not lost
        return _error(f"the results are printed above, but writing them failed: {exc}")
    if not args.quiet:
        stderr_log(f"wrote {outputs[0]} and {outputs[1]}")
    return 0


def _fitting_corpus(corpus: str, text_column: str) -> str | tuple[str, list[str]]:
    """A ``--fit-on`` value as `evaluate` takes it: a corpus's name, a folder in BEIR's layout (its path: evaluate
    reads its documents), or a file's (or folder's) name and texts; a value that is neither a corpus nor a file says
    both."""
    if corpus in FIT_CORPORA or os.path.lexists(os.path.join(os.path.expanduser(corpus), "corpus.jsonl")):
        return corpus
    try:
        return _fitting_label(corpus), distributed.read_texts([corpus], text_column=text_column)
    except distributed.InputError as exc:
        if os.path.lexists(corpus) or "://" in corpus:
            raise
        raise ValueError(f"--fit-on {corpus}: neither a corpus ({', '.join(FIT_CORPORA)}) nor a file or folder "
                         f"({exc})") from None


def _fitting_label(corpus: str) -> str:
    """The name of a ``--fit-on`` value's rows: the corpus's, or the file's or folder's (``.`` and ``..`` resolved:
    the folder's own name)."""
    if corpus in FIT_CORPORA:
        return corpus
    if "://" in corpus:
        return os.path.basename(corpus.rstrip("/"))
    return os.path.basename(os.path.abspath(os.path.expanduser(corpus)))
