"""The results table: pooling x post-processing on the seven STS sets, beside the paper's numbers.

For the default encoder (the embedded all-MiniLM-L6-v2), each pooling in
{cls, mean, first_last_avg} and each label-free post-processing in
``TABLE_METHODS`` (raw, centring, mean-direction removal, whitening, whitening-256, soft whitening,
all-but-the-top, flow) is evaluated with ``skflow.evaluation.evaluate`` (post-processing fitted
on each set's own sentences, no labels: the paper's "target" setting), on every
set whose data is present, under both the "wmean" and the "all" protocol. The
paper's BERT-base rows are printed beside, averaged over the same sets.

    python benchmarks/sts_table.py [--output docs/results.md] [--cache-dir DIR] [--poolings ...]
"""

import argparse
import json
import platform
import sys
import time

import numpy as np
import sklearn
import torch
import transformers

from skflow import BertEmbedder, __version__
from skflow.datasets import STS_SETS
from skflow.embedding._encoding import resolve_dtype
from skflow.evaluation import SET_LABELS, evaluate, stderr_log

# BERT-base, "wmean", Spearman x100, in STS_SETS order (reference notes, section 2).
PAPER = {
    "wmean": {
        "CLS-vector (SBERT paper)": [20.16, 30.01, 20.09, 36.88, 38.03, 16.50, 42.63],
        "last-layer avg (Li et al.)": [49.07, 55.92, 54.75, 62.75, 65.19, 47.29, 58.21],
        "first-last avg (Li et al.)": [57.84, 61.95, 62.48, 70.95, 69.81, 59.04, 63.75],
        "whitening, target (Su et al.)": [63.62, 73.02, 69.23, 74.52, 72.15, 71.34, 60.60],
        "whitening-256, target (Su et al.)": [63.89, 73.76, 69.08, 74.59, 74.40, 71.43, 62.20],
        "flow, target (Li et al.)": [63.48, 72.14, 68.42, 73.77, 75.37, 70.72, 63.11],
    },
    "all": {
        "whitening, target (SimCSE C.1)": [42.88, 77.77, 66.28, 63.60, 67.58, 71.34, 60.40],
        "flow, target (SimCSE C.1)": [53.15, 78.38, 66.02, 62.09, 70.84, 71.70, 61.97],
    },
}
POOLINGS = ("cls", "mean", "first_last_avg")
# abtt-4: Mu and Viswanath remove about d/100 directions; d = 384 here.
TABLE_METHODS = ("none", "center", "renorm", "whiten", "whiten-256", "soft-whiten", "abtt-4", "flow")
# Hand-written sections of an earlier report that a new one keeps, each before its anchor.
KEPT_SECTIONS = {"## Recommendation": "## Flow minus raw", "## Tuning": "## Anisotropy",
                 "## How small can the vectors get?": "## Anisotropy",
                 "## Where post-processing pays: every hidden layer": "## Anisotropy"}


def table(all_results: dict, protocol: str) -> str:
    sets = list(next(iter(all_results.values()))["sets"])
    lines = [
        "| encoder, pooling | method | " + " | ".join(SET_LABELS[s] for s in sets) + " | Avg |",
        "|---|---|" + "---|" * (len(sets) + 1),
    ]
    for pooling, results in all_results.items():
        for method in results["sets"][sets[0]]:
            values = [100 * results["sets"][s][method][protocol] for s in sets]
            cells = " | ".join(f"{v:.2f}" for v in values)
            lines.append(f"| MiniLM-L6, {pooling} | {method} | {cells} | {np.mean(values):.2f} |")
    columns = [STS_SETS.index(s) for s in sets]
    for label, row in PAPER[protocol].items():
        values = [row[i] for i in columns]
        cells = " | ".join(f"{v:.2f}" for v in values)
        lines.append(f"| *paper: BERT-base, {label}* | | {cells} | {np.mean(values):.2f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", help="write the Markdown report here (e.g. docs/results.md)")
    parser.add_argument("--json", help="write all numbers here")
    parser.add_argument("--cache-dir", help="embedding cache folder")
    parser.add_argument("--data-home")
    parser.add_argument("--poolings", nargs="+", default=list(POOLINGS))
    parser.add_argument("--sets", nargs="+", default=list(STS_SETS))
    args = parser.parse_args(argv)

    start = time.perf_counter()
    all_results = {}
    for pooling in args.poolings:
        stderr_log(f"== pooling {pooling}")
        embedder = BertEmbedder(pooling=pooling, cache_dir=args.cache_dir, show_progress_bar=False)
        all_results[pooling] = evaluate(
            embedder, methods=TABLE_METHODS, sets=args.sets, data_home=args.data_home,
            download_if_missing=False, skip_missing=True, log=stderr_log,
        )
    minutes = (time.perf_counter() - start) / 60
    skipped = next(iter(all_results.values()))["skipped"]
    command = "python benchmarks/sts_table.py " + " ".join(argv if argv is not None else sys.argv[1:])
    dtype = str(resolve_dtype("auto", torch.device("cpu"))).removeprefix("torch.")
    report = [
        "# Results: STS Spearman x 100 of the label-free post-processings",
        "",
        f"Written by `{command.strip()}` in {minutes:.1f} minutes.",
        "",
        f"Encoder: the embedded `sentence-transformers/all-MiniLM-L6-v2` (6 layers, 384-d), max_length 128, "
        f"dtype='auto' ({dtype} here). Post-processing fitted on each set's own sentences without labels "
        "(BERT-flow's \"target\" setting: STS-B and SICK-R train+dev+test, every STS12-16 subset), evaluated on "
        "the STS-B / SICK-R test split and on every STS12-16 pair. The methods are `skflow.evaluation.make_method`'s "
        "(`docs/evaluation.md`): `center` is `Centerer()`, `whiten` `Whitener()`, `whiten-256` keeps 256 "
        "directions, `soft-whiten` is `Whitener(power=0.25)`, `abtt-4` removes the mean and the top 4 directions, "
        "`renorm` is `MeanDirectionRemover()` (the mean direction projected out, without centring), "
        "`flow` is `FlowGaussianizer()` with the official defaults (1 epoch, seed 0). Avg is over the sets shown; "
        "the paper rows are averaged over the same sets.",
        "",
        f"Environment: skflow {__version__}, Python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, scikit-learn {sklearn.__version__}, "
        f"{torch.get_num_threads()} CPU threads, no GPU.",
        "",
    ]
    if skipped:
        report += [f"Sets left out because their data is not present: {', '.join(SET_LABELS[s] for s in skipped)}.", ""]
    for protocol, what in [("wmean", "size-weighted mean over subsets: what BERT-flow and BERT-whitening report"),
                           ("all", "all subsets pooled: what SBERT and SimCSE report")]:
        report += [f"## Protocol `{protocol}` ({what})", "", table(all_results, protocol), ""]
    report += ["## Best method per pooling (wmean average)", ""]
    for pooling, results in all_results.items():
        sets = list(results["sets"])
        averages = {m: np.mean([100 * results["sets"][s][m]["wmean"] for s in sets]) for m in TABLE_METHODS}
        ranked = sorted(averages, key=averages.get, reverse=True)
        cells = ", ".join(f"{m} {averages[m]:.2f}" for m in ranked)
        report.append(f"- {pooling}: {cells}")
    report += ["", "## Flow minus raw, in points (wmean)", ""]
    for pooling, results in all_results.items():
        sets = list(results["sets"])
        deltas = {s: 100 * (results["sets"][s]["flow"]["wmean"] - results["sets"][s]["none"]["wmean"]) for s in sets}
        cells = ", ".join(f"{SET_LABELS[s]} {d:+.2f}" for s, d in deltas.items())
        report.append(f"- {pooling}: {cells}; average {np.mean(list(deltas.values())):+.2f}")
    report += [
        "",
        "## Anisotropy",
        "",
        "![random-pair cosines and covariance spectra before and after the flow](figures/anisotropy.png)",
        "",
        "Written by `python benchmarks/anisotropy_figure.py`; its numbers are in `docs/figures/anisotropy.md`.",
        "",
    ]
    text = "\n".join(report)
    print(text)
    if args.output:
        text = _keep_sections(args.output, text)
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(all_results, f, indent=1)


def _keep_sections(path: str, text: str) -> str:
    """The hand-written sections of the old report (``KEPT_SECTIONS``), moved into the new one before their anchors."""
    try:
        old = open(path, encoding="utf-8").read()
    except FileNotFoundError:
        return text
    for heading, before in KEPT_SECTIONS.items():
        start = old.find(heading + "\n")
        if start < 0:
            continue
        end = old.find("\n## ", start + 1)
        section = old[start : end if end >= 0 else len(old)].rstrip() + "\n\n"
        anchor = text.find(before)
        text = text[:anchor] + section + text[anchor:] if anchor >= 0 else text + "\n" + section
    return text


if __name__ == "__main__":
    main()
