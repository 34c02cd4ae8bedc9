"""MTEB, the field's evaluator, on skflow: MTEB's nDCG@10 of raw all-MiniLM-L6-v2 through `skflow.mteb` (SciFact:
MTEB's 64.51), and MTEB's own compression beside skflow's codes fitted on the corpus, on SciFact, Cranfield, CISI.

The encoder runs as MTEB runs it (mean pooling, 256 tokens, float32). Every figure is nDCG@10 x 100 on a set's
test queries, and its share of the set's raw float32:

- MTEB's rows are `mteb.evaluate`'s main score of `MTEBEncoder(embedder)` on `retrieval_task(set)`, plain
  (float32) or wrapped in MTEB's `CompressionWrapper` (int8 and int4: each dimension's range taken from the vectors
  of each encode call, the queries' from the queries, the documents' from the documents; codes
  ``floor((x - min) / step) - offset`` compared by cosine; binary: ``x > 0`` as 0/1, compared by cosine).
- skflow's rows are `skflow.evaluation.retrieval_report` of `skflow.compression.search` on the very vectors that
  `MTEBEncoder` handed MTEB (float32 is measured both ways): `Quantizer`s fitted on the corpus and applied to
  queries and documents alike (int8: the codes compared by cosine as MTEB compares its own, then the dequantized
  codes as skflow scores them; binary: Hamming, and the float query against the bits), and the bits of the
  centred corpus rotated by `ITQRotation` (fitted) or at random (``n_iter=0``), over five seeds.

Cranfield and CISI are read from ``--data-home`` by a small reader here (BEIR layout) until `load_beir` takes
folders; SciFact by `load_beir`, verified. Writes the section "## The compression table" into ``--output``.

    python benchmarks/mteb_compression.py --output docs/mteb.md --cache-dir DIR
"""

import argparse
import os
import sys
import warnings
from pathlib import Path

import numpy as np
from _study import Clock, environment, write_section
from sklearn.utils import Bunch

from skflow import BertEmbedder, ITQRotation, Quantizer
from skflow.compression import search
from skflow.datasets import load_beir
from skflow.evaluation import retrieval_report, search_stored
from skflow.mteb import MTEBEncoder, retrieval_task

SETS = ("scifact", "cranfield", "cisi")
LABELS = {"scifact": "SciFact", "cranfield": "Cranfield", "cisi": "CISI"}
SEEDS = range(5)
MTEB_DTYPES = ("int8", "int4", "binary")


class Recorder(MTEBEncoder):
    """An `MTEBEncoder` that keeps the texts and vectors of its last call for each role."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = {}

    def encode(self, inputs, **kwargs):
        texts = [text for batch in inputs for text in batch["text"]]
        vectors = super().encode([{"text": texts}], **kwargs)
        self.seen[str(kwargs["prompt_type"].value)] = texts, vectors
        return vectors


def mteb_ndcg(model, task) -> float:
    import mteb

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Estimating quantization parameters")  # MTEB's: under 10,000 rows
        result = mteb.evaluate(model, task, cache=None, show_progress_bar=False)
    return 100 * result.task_results[0].scores[task.metadata.eval_splits[0]][0]["ndcg_at_10"]


def study(data: Bunch, embedder: BertEmbedder, log) -> dict:
    """``{row: nDCG@10 x 100, or a list over seeds}`` of one set."""
    import mteb

    def ndcg(found) -> float:
        return 100 * retrieval_report(*found, data.qrels, data.query_ids, data.corpus_ids)["ndcg@10"]

    task = retrieval_task(data)
    recorder = Recorder(embedder)
    rows = {"MTEB float32": mteb_ndcg(recorder, task)}
    (query_texts, Q), (document_texts, D) = recorder.seen["query"], recorder.seen["document"]
    assert document_texts == data.corpus and query_texts == data.queries, "MTEB embedded other texts"
    log(f"[{data.name}] MTEB float32 {rows['MTEB float32']:.3f}: {len(D):,} documents as title + ' ' + text")
    for dtype in MTEB_DTYPES:
        compressed = mteb.models.CompressionWrapper(MTEBEncoder(embedder), mteb.types.OutputDType(dtype))
        rows[f"MTEB {dtype}"] = mteb_ndcg(compressed, task)
        log(f"[{data.name}] MTEB {dtype} {rows[f'MTEB {dtype}']:.3f}")
    found = search_stored(Q, D, ("float32", "int8", "binary"))
    codes = Quantizer(precision="int8").fit(D)
    rows["skflow float32"] = ndcg(found["float32"])
    rows["skflow int8, codes by cosine"] = ndcg(search(codes.transform(Q).astype(np.float32),
                                                       codes.transform(D).astype(np.float32), 100))
    rows["skflow int8, dequantized"] = ndcg(found["int8"])
    rows["skflow binary, Hamming"] = ndcg(found["binary"])
    rows["skflow binary, float query"] = ndcg(found["binary-asym"])
    for name, n_iter in (("ITQ", 50), ("random rotation", 0)):
        for seed in SEEDS:
            rotation = ITQRotation(n_iter=n_iter, random_state=seed).fit(D)
            bits = search_stored(rotation.transform(Q), rotation.transform(D), ("binary",))
            rows.setdefault(f"skflow {name} + binary, Hamming", []).append(ndcg(bits["binary"]))
            rows.setdefault(f"skflow {name} + binary, float query", []).append(ndcg(bits["binary-asym"]))
        log(f"[{data.name}] {name}: {np.mean(rows[f'skflow {name} + binary, float query']):.3f} (float query)")
    return rows


BYTES = {"float32": 1536, "int8": 384, "int4": 192, "binary": 48}
ROWS = (  # (row, bytes a vector, what it is)
    ("MTEB float32", 1536, "MTEB, `MTEBEncoder(embedder)`"),
    ("skflow float32", 1536, "skflow's `search` and `retrieval_report` on the same vectors"),
    ("MTEB int8", 384, "MTEB's `CompressionWrapper`, int8: ranges of each call, codes by cosine"),
    ("skflow int8, codes by cosine", 384, "`Quantizer('int8')` fitted on the corpus, codes by cosine"),
    ("skflow int8, dequantized", 384, "the same codes, dequantized, by cosine (skflow's int8)"),
    ("MTEB int4", 192, "MTEB's int4: ranges of each call, 16 levels, by cosine"),
    ("MTEB binary", 48, "MTEB's binary: x > 0 as 0/1, by cosine"),
    ("skflow binary, Hamming", 48, "`Quantizer('binary')`: sign bits, Hamming"),
    ("skflow binary, float query", 48, "the same bits, the float query against them (asymmetric)"),
    ("skflow ITQ + binary, Hamming", 48, "`ITQRotation` fitted on the corpus, then sign bits, Hamming"),
    ("skflow ITQ + binary, float query", 48, "the same, float query"),
    ("skflow random rotation + binary, Hamming", 48, "`ITQRotation(n_iter=0)`: centred, randomly rotated, Hamming"),
    ("skflow random rotation + binary, float query", 48, "the same, float query"),
)


def cell(value, raw: float) -> str:
    if isinstance(value, list):
        mean = float(np.mean(value))
        return (f"{mean:.2f} ({100 * mean / raw:.1f}%; {min(value):.2f}-{max(value):.2f})")
    return f"{value:.2f} ({100 * value / raw:.1f}%)"


def table(results: dict) -> list[str]:
    names = list(results)
    lines = ["| stored as | bytes | " + " | ".join(LABELS[n] for n in names) + " | what |",
             "|---|---|" + "---|" * len(names) + "---|"]
    for row, size, what in ROWS:
        cells = [cell(results[n][row], results[n]["MTEB float32"]) for n in names]
        lines.append(f"| {row} | {size:,} | " + " | ".join(cells) + f" | {what} |")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="docs/mteb.md")
    parser.add_argument("--cache-dir", help="embedding cache: SciFact's 5,183 documents take ~20 min on 2 cores")
    parser.add_argument("--data-home", default=os.environ.get("SKFLOW_RETRIEVAL_DATA"),
                        help="the folder of the sets in BEIR's layout (default: $SKFLOW_RETRIEVAL_DATA)")
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    args = parser.parse_args(argv)
    clock = Clock()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    import datasets

    datasets.disable_progress_bars()  # MTEB's dataset maps
    embedder = BertEmbedder(pooling="mean", max_length=256, dtype="float32", cache_dir=args.cache_dir,
                            show_progress_bar=False)
    results = {}
    for name in args.sets:
        data = load_beir(name if name == "scifact" else Path(args.data_home) / name, data_home=args.data_home)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "BertEmbedder: .* longer than max_length")  # as MTEB truncates
            results[name] = study(data, embedder, log)
    import mteb

    command = " ".join(sys.argv[1:] if argv is None else argv)
    lines = ["## The compression table", "",
             f"Written by `python benchmarks/mteb_compression.py {command}` in {clock}. {environment()}, "
             f"mteb {mteb.__version__}. all-MiniLM-L6-v2 as MTEB runs it (mean pooling, 256 tokens, float32). "
             "nDCG@10 x 100 on each set's test queries and, in brackets, its share of MTEB's float32 on that set; "
             f"rotations: the mean over seeds {SEEDS[0]}-{SEEDS[-1]}, then the range. Bytes: a stored 384-dimension "
             "vector.", "", *table(results), ""]
    text = "\n".join(lines)
    print(text)
    write_section(args.output, text, before="## Bad input")


if __name__ == "__main__":
    main()
