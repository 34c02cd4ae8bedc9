"""What the studies share: each STS set embedded once, post-processings fitted on its sentences, both protocols.

The protocol is ``skflow.evaluation.evaluate``'s (BERT-flow's "target"
setting): a post-processing is fitted without labels on every sentence of a
set, then STS-B and SICK-R are scored on their test split and STS12-16 on
every pair, under "wmean" and "all". Every set whose data is present is
used, SICK-R included.
"""

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


def add_set_arguments(parser) -> None:
    parser.add_argument("--sets", nargs="+", choices=STS_SETS, metavar="SET",
                        help=f"among {', '.join(STS_SETS)} (default: every set whose data is present; a set named "
                        "here must be there)")


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
