"""What the studies share: each STS set embedded once, post-processings fitted on its sentences, both protocols.

The protocol is ``skflow.evaluation.evaluate``'s (BERT-flow's "target"
setting): a post-processing is fitted without labels on every sentence of a
set, then STS-B and SICK-R are scored on their test split and STS12-16 on
every pair, under "wmean" and "all". Every set whose data is present is
used, SICK-R included.
"""

import os
import platform
import time
from collections.abc import Callable, Iterator

import numpy as np
import sklearn
import torch
import transformers

from skflow import BertEmbedder, __version__
from skflow.datasets import STS_SETS, load_sts
from skflow.metrics import sts_report

EVAL_SPLIT = {"stsb": "test", "sickr": "test"}


def present_sets(sets=None) -> tuple[dict, list[str]]:
    """``({name: STS data}, [names left out])``, nothing downloaded: every set whose data is present, or exactly
    the ``sets`` named (one missing is an error, as in ``evaluate``)."""
    data, missing = {}, []
    for name in sets or STS_SETS:
        try:
            data[name] = load_sts(name, download_if_missing=False)
        except FileNotFoundError:
            if sets:
                raise
            missing.append(name)
    return data, missing


def study_parser(description: str, figure: str):
    """The options every study takes: ``--output``, ``--figure``, ``--json``, ``--cache-dir`` and ``--sets``."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--output", default="docs/results.md",
                        help="the Markdown file whose section this study writes (the rest is kept)")
    parser.add_argument("--figure", default=figure)
    parser.add_argument("--json", help="also write the numbers here")
    parser.add_argument("--cache-dir", help="embedding cache (each set and setting embedded once)")
    parser.add_argument("--sets", nargs="+", choices=STS_SETS, metavar="SET",
                        help=f"among {', '.join(STS_SETS)} (default: every set whose data is present; a set named "
                        "here must be there)")
    return parser


def line_figure(panels: dict, xs: list, xlabel: str, ylabel: str, path: str, *, log_x: bool = False,
                zero_line: bool = False) -> None:
    """One panel per key of ``panels`` (a pooling), one line per ``{label: values at xs}`` in it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), sharey=True)
    for ax, (pooling, lines) in zip(np.atleast_1d(axes), panels.items()):
        for label, values in lines.items():
            ax.plot(xs, values, marker="o", label=label)
        if log_x:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
        if zero_line:
            ax.axhline(0, color="black", linewidth=0.8)
        ax.set_title(f"pooling {pooling}")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel(ylabel)
    np.atleast_1d(axes)[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def embedded(data: dict, embedder: BertEmbedder) -> Iterator[tuple]:
    """For each set: ``(name, train rows, test pairs, gold scores, subsets)``, embedded once (the cache reuses it)."""
    for name, full in data.items():
        rows = full.subsets == EVAL_SPLIT[name] if name in EVAL_SPLIT else np.ones(len(full.scores), bool)
        embeddings = embedder.transform(full.pairs)
        train = embeddings.reshape(-1, embeddings.shape[-1])
        yield name, train, embeddings[rows], full.scores[rows], full.subsets[rows]


def score(latent_pairs: np.ndarray, gold: np.ndarray, subsets: np.ndarray) -> dict:
    """Spearman x 100 under both protocols."""
    report = sts_report(latent_pairs, gold, subsets)
    return {"wmean": 100 * report["wmean"], "all": 100 * report["all"]}


def apply(transform: Callable, pairs: np.ndarray) -> np.ndarray:
    """A row-wise map applied to ``(n, 2, d)`` pairs."""
    return transform(pairs.reshape(-1, pairs.shape[-1])).reshape(*pairs.shape[:2], -1)


def section(heading: str, script: str, argv, clock, sets: list[str], missing: list[str], xs: list, rows: list,
            average, columns: str, figure: tuple[str, str, str]) -> str:
    """A study's Markdown section: how it was made, then per protocol a table of ``average(pooling, method, x,
    protocol)`` over ``rows`` (``(pooling, method)``) and ``xs`` (``columns`` says what they are), then the figure
    ``(alt text, its path, the Markdown file's path)``."""
    import sys

    from skflow.evaluation import SET_LABELS

    command = " ".join(sys.argv[1:] if argv is None else argv)
    left_out = f"; left out, their data not present: {', '.join(SET_LABELS[s] for s in missing)}." if missing else "."
    lines = [heading, "", f"Written by `python benchmarks/{script} {command}` in {clock}. {environment()}.",
             f"Sets: {', '.join(SET_LABELS[s] for s in sets)}{left_out}", ""]
    for protocol in ("wmean", "all"):
        lines += [f"### Protocol `{protocol}`: Spearman x 100, average of the sets, {columns}", "",
                  "| pooling | method | " + " | ".join(map(str, xs)) + " |", "|---|---|" + "---|" * len(xs)]
        for pooling, method in rows:
            values = [average(pooling, method, x, protocol) for x in xs]
            lines.append(f"| {pooling} | {method} | " + " | ".join(map(cell, values)) + " |")
        lines.append("")
    alt, path, output = figure
    lines += [f"![{alt}]({os.path.relpath(path, os.path.dirname(os.path.abspath(output)))})", ""]
    return "\n".join(lines)


def write_numbers(path: str | None, results: dict) -> None:
    """Write ``results`` (keyed by tuples) as JSON to ``path``, keys joined by ``|``; nothing if ``path`` is None."""
    import json

    if path:
        with open(path, "w") as f:
            json.dump({"|".join(map(str, key)): value for key, value in results.items()}, f)


def write_section(path: str, text: str, before: str = "## Anisotropy") -> None:
    """Put ``text`` (a ``## `` section) into the Markdown file ``path``: in place of the section with its heading,
    else before the ``before`` heading, else at the end; the rest of the file is kept."""
    heading = text.split("\n", 1)[0]
    try:
        old = open(path, encoding="utf-8").read()
    except FileNotFoundError:
        old = ""
    text = text.rstrip() + "\n\n"
    start = old.find(heading + "\n")
    if start >= 0:
        end = old.find("\n## ", start + 1)
        new = old[:start] + text + (old[end + 1 :] if end >= 0 else "")
    elif (anchor := old.find(before + "\n")) >= 0:
        new = old[:anchor] + text + old[anchor:]
    else:
        new = old + ("\n" if old and not old.endswith("\n\n") else "") + text
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)


def cell(value: float) -> str:
    """A Spearman x 100 for a table: two decimals, n/a where undefined."""
    return "n/a" if np.isnan(value) else f"{value:.2f}"


def environment() -> str:
    return (f"skflow {__version__}, Python {platform.python_version()}, torch {torch.__version__}, "
            f"transformers {transformers.__version__}, scikit-learn {sklearn.__version__}, "
            f"{torch.get_num_threads()} CPU threads")


class Clock:
    """Seconds since it was made."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __str__(self) -> str:
        return f"{(time.perf_counter() - self.start) / 60:.1f} minutes"
