"""Command line: ``python -m skflow evaluate`` runs the paper's STS evaluation."""

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np

from skflow import __version__
from skflow.datasets import STS_SETS
from skflow.embedder import DEFAULT_MODEL, DTYPES, POOLINGS, BertEmbedder, EncoderNotFoundError
from skflow.evaluation import METHODS, evaluate, markdown_tables, stderr_log
from skflow.metrics import PROTOCOLS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m skflow", description="skflow: BERT-flow as scikit-learn estimators.")
    parser.add_argument("--version", action="version", version=f"skflow {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    ev = commands.add_parser(
        "evaluate",
        help="STS Spearman of raw, whitened and flow-transformed embeddings",
        description=(
            "For each STS set, embed its sentences, fit each post-processing on them without labels "
            "(BERT-flow's 'target' setting), and report the Spearman correlation x100 of cosine "
            "similarities with the gold scores (STS-B and SICK-R: test split)."
        ),
    )
    ev.add_argument("--model", default=DEFAULT_MODEL, help="Hugging Face model id or local folder (default: %(default)s, embedded, offline)")
    ev.add_argument("--pooling", default="first_last_avg", choices=sorted(POOLINGS), metavar="POOLING",
                    help="cls, mean, first_last_avg (the paper's 'last2avg'), last_two_avg (default: %(default)s; "
                    "last2avg is a deprecated alias of last_two_avg)")
    ev.add_argument("--method", nargs="+", default=list(METHODS), metavar="METHOD",
                    help="none, whiten, whiten-K (PCA to K components), flow (default: %(default)s)")
    ev.add_argument("--sets", nargs="+", choices=STS_SETS, metavar="SET",
                    help=f"STS sets among {', '.join(STS_SETS)} (default: all seven, skipping those whose data "
                    "is missing; a set named here must be there)")
    ev.add_argument("--protocol", nargs="+", default=["wmean"], choices=PROTOCOLS,
                    help="aggregation over subsets (default: %(default)s)")
    ev.add_argument("--output", default="skflow_results", metavar="FILE",
                    help="writes FILE.json and FILE.md (default: %(default)s)")
    ev.add_argument("--data-home", help="folder of the STS data (default: $SKFLOW_DATA, else ~/skflow_data)")
    ev.add_argument("--no-download", action="store_true", help="never download missing data")
    ev.add_argument("--max-length", type=int, default=128, help="tokens per sentence (default: %(default)s)")
    ev.add_argument("--batch-size", type=int, default=32)
    ev.add_argument("--dtype", default="auto", choices=["auto", *DTYPES])
    ev.add_argument("--device", default="auto", help="where the encoder runs and the flow trains: auto, cpu, cuda, cuda:N")
    ev.add_argument("--cache-dir", help="embedding cache folder, reused across runs")
    ev.add_argument("--epochs", type=int, default=1, help="flow epochs (default: %(default)s, as the paper)")
    ev.add_argument("--seed", type=int, default=0, help="flow seed")
    ev.add_argument("--quiet", action="store_true", help="no progress output")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    log = None if args.quiet else stderr_log
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
    try:
        results = _run(args, embedder, log)
    except (FileNotFoundError, EncoderNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
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
    output = Path(args.output)
    stem = output.with_suffix("") if output.suffix in (".json", ".md") else output
    stem.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    Path(f"{stem}.md").write_text(tables, encoding="utf-8")
    if log:
        log(f"wrote {stem}.json and {stem}.md")
    return 0


def _run(args, embedder, log) -> dict:
    return evaluate(
        embedder,
        methods=args.method,
        sets=args.sets or STS_SETS,
        data_home=args.data_home,
        download_if_missing=not args.no_download,
        skip_missing=args.sets is None,
        random_state=args.seed,
        flow_params={"max_epochs": args.epochs, "device": args.device},
        log=log,
    )
