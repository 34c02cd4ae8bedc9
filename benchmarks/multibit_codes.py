"""1-, 2- and 4-bit codes and int8 after a rotation, against the bytes stored a vector: retrieval nDCG@10 on SciFact,
Cranfield and CISI over seeds, the quantizers the literature offers side by side, and the speed of coding and search
as a ratio to int8.

Each set is embedded with all-MiniLM-L6-v2 as MTEB runs it (mean pooling, 256 tokens, float32). Every code is
fitted on the corpus only: unit vectors (``Normalizer``), then ``ITQRotation(n_components=K)`` (``n_iter=0``: the
top K principal directions randomly rotated, "random"; ``n_iter=50``: ITQ, "itq"), then a ``Quantizer``. The float
query is made a unit vector and rotated, not centred (``unit(q) @ rotation.components_.T``), and scored by its dot
product with the vectors the documents' codes stand for (``search(..., metric="dot", codes=quantizer)``): where K
keeps every direction and the codes lose nothing, that ranks the documents by their cosine with the query, as raw
float32 does (the documents' mean only adds ``q . m``, the same for every document). The rows marked "centred
query" map the query by the whole pipeline, ``(unit(q) - m) @ components_.T``, as `evaluate` maps queries through a
method: that ranks by ``q . x - m . x``, another ranking, neither the cosine nor the ``center`` method's. Bytes a
vector: ``K * bits / 8``. Rows:

- ``binary`` (1 bit), ``int2``, ``int4`` (a Gaussian's Lloyd-Max levels around each dimension's mean and spread,
  skflow's), ``int8`` (per-dimension ranges cut in 256, sentence-transformers');
- the same codes with RaBitQ's per-vector correction (``correction=True``, 4 bytes more a vector);
- the alternatives for 2 and 4 bits, after the same random rotation: ``min-max`` (each dimension's range cut in
  equal steps, MTEB's int4: ``floor((x - min) / ((max - min) / (2**bits - 1)))``, decoded to the step's centre) and
  ``equal-count`` (each dimension's bins holding equal shares of the corpus, decoded to their means);
- ``faiss RaBitQ``: faiss's own RaBitQ index (``IndexRaBitQ`` with ``nb_bits`` 1, 2, 4 behind a seeded random
  rotation, inner product of the unit vectors, its per-vector factors in the bytes given), with a float query and
  with its default 4-bit query;
- ``TransformCoder``: ``make_pipeline(Normalizer(), TransformCoder(n_bytes=size))``, the bytes spent on the
  principal directions by their variance (4, 2, 1 or 0 bits each), searched with the unit query as it is
  (``search(..., metric="dot", codes=coder)``), and with ``correction=True`` (its 4 bytes within the size);
  ``--transform-only`` runs these rows and the codes of one width at
  the same sizes that they are compared with, over ``--seeds``;
- ``faiss PQ`` and ``faiss OPQ + PQ`` (``--product-only``, 24 bytes): faiss's product quantizer, one byte (256
  centroids) for each of ``bytes`` sub-vectors, with and without its fitted rotation (``OPQMatrix``), trained on
  the unit corpus vectors, the k-means seeded by ``--seeds`` (OPQ's own starting rotation is faiss's fixed one),
  searched with the float query by inner product (``IndexPQ``, ``METRIC_INNER_PRODUCT``: the query against the
  centroids the codes name); the fitted state, the codebook (256 x 384 float32, 393 KB) and OPQ's rotation (384 x
  384 float32, 590 KB), is not counted in the bytes a vector, as no code's fitted directions are;
- ``truncation``: the first ``bytes / 4`` coordinates in float32, the cosine (Matryoshka's cut; this encoder was not
  trained for it).

Every randomised row is reported over ``--seeds`` (mean and range), as a share of the corpus's raw float32 nDCG@10.
The speed: ``--speed-rows`` corpus rows (the SciFact vectors tiled, with Gaussian noise of 0.01 a coordinate, after
the random rotation), the time to code them (``Quantizer.transform``) and to search 100 float queries against the
codes (top 10), each per vector and as a ratio to int8's (int8 searched as its integer dot with the query's codes,
as an engine does).

    python benchmarks/multibit_codes.py --cache-dir DIR [--data-home DATA] [--seeds 0 1 2 3 4] [--speed-rows 200000]
        [--transform-only | --product-only]
"""

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from _study import Clock, environment
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import Normalizer

from skflow import BertEmbedder, ITQRotation, Quantizer, TransformCoder
from skflow.compression import search
from skflow.datasets import load_beir
from skflow.evaluation import retrieval_report

SETS = ("scifact", "cranfield", "cisi")
# (bytes, K, precision): every code of skflow's at each size
CODES = [(24, 192, "binary"), (24, 96, "int2"), (24, 48, "int4"),
         (48, 384, "binary"), (48, 192, "int2"), (48, 96, "int4"),
         (96, 384, "int2"), (96, 192, "int4"), (96, 96, "int8"),
         (192, 384, "int4"), (192, 192, "int8"),
         (384, 384, "int8")]
CENTRED_QUERY = [(48, 384, "binary", "itq"), (96, 384, "int2", "random"), (192, 384, "int4", "random"),
                 (384, 384, "int8", "random")]
CORRECTED = [(24, 192, "binary"), (48, 384, "binary"), (48, 192, "int2"), (96, 384, "int2"), (192, 384, "int4")]
# the TransformCoder's sizes, and the best code of one width at each (the frontier's), compared in the same seeds
TRANSFORM_SIZES = [(24, 192, "binary", "itq"), (48, 384, "binary", "itq"), (48, 192, "int2", "random"),
                   (96, 192, "int4", "itq"), (192, 384, "int4", "random")]
ALTERNATIVES = [(48, 192, 2), (96, 384, 2), (96, 192, 4), (192, 384, 4)]  # (bytes, K, bits), random rotation


def share(ndcg: float, base: float) -> float:
    return 100 * ndcg / base


def ndcg_at_10(found, data) -> float:
    return 100 * retrieval_report(*found, data.qrels, data.query_ids, data.corpus_ids)["ndcg@10"]


def skflow_code(documents, queries, K: int, precision: str, n_iter: int, seed: int, correction: bool = False,
                centred: bool = False):
    """The top 100 of each query: unit vectors, rotation, Quantizer, float query against the codes."""
    pipeline = make_pipeline(Normalizer(), ITQRotation(n_components=K, n_iter=n_iter, random_state=seed),
                             Quantizer(precision=precision, correction=correction)).fit(documents)
    mapped = (pipeline[:-1].transform(queries) if centred
              else Normalizer().transform(queries) @ pipeline[1].components_.T.astype(np.float32))
    return search(mapped, pipeline.transform(documents), 100, metric="dot", codes=pipeline[-1])


def transform_code(documents, queries, size: int, seed: int, correction: bool = False):
    """The top 100 of each query: unit vectors coded by a TransformCoder of ``size`` bytes, the unit query as it is."""
    coder = TransformCoder(n_bytes=size, correction=correction, random_state=seed)
    pipeline = make_pipeline(Normalizer(), coder).fit(documents)
    return search(Normalizer().transform(queries), pipeline.transform(documents), 100, metric="dot",
                  codes=pipeline[-1])


def allocation(documents, size: int, correction: bool = False) -> str:
    """The widths a TransformCoder of ``size`` bytes gives the corpus's directions, e.g. ``4x32 + 2x96 + 1x64``."""
    coder = TransformCoder(n_bytes=size, correction=correction, random_state=0)
    bits = make_pipeline(Normalizer(), coder).fit(documents)[-1].n_bits_
    return " + ".join(f"{width}x{np.count_nonzero(bits == width)}" for width in (4, 2, 1) if (bits == width).any())


def transform_study(data, documents, queries, seeds) -> dict:
    """The TransformCoder's rows and the codes of one width it is compared with, at each size."""
    base = ndcg_at_10(search(queries, documents, 100), data)
    rows = {"float32": [base]}
    for size, K, precision, rotation in TRANSFORM_SIZES:
        rows[f"{size} B: {precision} of {K}, {rotation}"] = [
            share(ndcg_at_10(skflow_code(documents, queries, K, precision, 50 if rotation == "itq" else 0, seed),
                             data), base) for seed in seeds]
    return rows | transform_rows(data, documents, queries, seeds, base)


def transform_rows(data, documents, queries, seeds, base: float) -> dict:
    """The TransformCoder's share at each size, over ``seeds``, and the widths it gives."""
    rows = {}
    for size in sorted({size for size, *_ in TRANSFORM_SIZES}):
        rows[f"{size} B: TransformCoder"] = [share(ndcg_at_10(transform_code(documents, queries, size, seed), data),
                                                   base) for seed in seeds]
        rows[f"{size} B: TransformCoder's widths"] = allocation(documents, size)
        rows[f"{size} B: TransformCoder, correction=True"] = [
            share(ndcg_at_10(transform_code(documents, queries, size, seed, correction=True), data), base)
            for seed in seeds]
        rows[f"{size} B: TransformCoder, correction=True: widths"] = allocation(documents, size, correction=True)
    return rows


def product_code(documents, queries, size: int, seed: int, rotate: bool):
    """The top 100 of each query by faiss's product quantizer of ``size`` bytes (``OPQ{size},PQ{size}x8`` where
    ``rotate``), trained on the unit corpus, its k-means seeded."""
    import faiss

    unit = np.ascontiguousarray(Normalizer().transform(documents), dtype=np.float32)
    codes = faiss.IndexPQ(unit.shape[1], size, 8, faiss.METRIC_INNER_PRODUCT)
    codes.pq.cp.seed = seed
    index = codes
    if rotate:
        rotation = faiss.OPQMatrix(unit.shape[1], size)
        trainer = faiss.ProductQuantizer(unit.shape[1], size, 8)  # the PQ that OPQ's iterations train, seeded
        trainer.cp.seed = seed
        rotation.pq = trainer
        index = faiss.IndexPreTransform(rotation, codes)
    index.train(unit)
    index.add(unit)
    return index.search(np.ascontiguousarray(Normalizer().transform(queries), dtype=np.float32), 100)


def product_study(data, documents, queries, seeds) -> dict:
    """faiss's product quantizer at 24 bytes, with and without OPQ, beside the best codes of skflow's there."""
    base = ndcg_at_10(search(queries, documents, 100), data)
    rows = {"float32": [base]}
    size, K, precision, rotation = TRANSFORM_SIZES[0]  # 24 bytes
    rows[f"{size} B: {precision} of {K}, {rotation}"] = [
        share(ndcg_at_10(skflow_code(documents, queries, K, precision, 50 if rotation == "itq" else 0, seed), data),
              base) for seed in seeds]
    rows[f"{size} B: TransformCoder"] = [
        share(ndcg_at_10(transform_code(documents, queries, size, seed), data), base) for seed in seeds]
    for rotate in (False, True):
        rows[f"{size} B: faiss {'OPQ + ' if rotate else ''}PQ{size}x8"] = [
            share(ndcg_at_10(product_code(documents, queries, size, seed, rotate), data), base) for seed in seeds]
    return rows


def alternative(rotated, mapped, bits: int, kind: str):
    """The top 100 with per-dimension min-max steps or equal-count bins (decoded to their means)."""
    levels = 2**bits
    if kind == "min-max":
        low, high = rotated.min(axis=0), rotated.max(axis=0)
        step = np.where(high > low, (high - low) / (levels - 1), 1)
        codes = np.clip(np.floor((rotated - low) / step), 0, levels - 1)
        decoded = low + (codes + 0.5) * step
    else:
        cuts = np.quantile(rotated, np.arange(1, levels) / levels, axis=0)
        codes = (rotated[None] > cuts[:, None]).sum(axis=0)
        means = np.zeros((levels, rotated.shape[1]))
        for level in range(levels):
            inside = codes == level
            means[level] = np.where(inside.any(axis=0), (rotated * inside).sum(axis=0) / np.maximum(inside.sum(axis=0),
                                                                                                     1), 0)
        decoded = np.take_along_axis(means, codes, axis=0)
    return search(mapped, decoded.astype(np.float32), 100, metric="dot")


def rabitq(d: int, bits: int, query_bits: int, seed: int):
    """faiss's own RaBitQ (``"RR{d},RaBitQ{bits}"``, the random rotation seeded), inner product, the query
    quantized to ``query_bits`` (0: a float query)."""
    import faiss

    rotation = faiss.RandomRotationMatrix(d, d)
    rotation.init(seed)
    codes = faiss.IndexRaBitQ(d, faiss.METRIC_INNER_PRODUCT, bits)
    codes.qb = query_bits
    index = faiss.IndexPreTransform(rotation, codes)
    return index


def study(data, documents, queries, seeds) -> dict:
    """``{row: [share, ...]}`` for every code and alternative; ``"float32"``: the raw nDCG@10."""
    base = ndcg_at_10(search(queries, documents, 100), data)
    rows = {"float32": [base]}
    for size, K, precision in CODES:
        for rotation, n_iter in (("random", 0), ("itq", 50)):
            rows[f"{size} B: {precision} of {K}, {rotation}"] = [
                share(ndcg_at_10(skflow_code(documents, queries, K, precision, n_iter, seed), data), base)
                for seed in seeds]
    for size, K, precision, rotation in CENTRED_QUERY:
        rows[f"{size} B: {precision} of {K}, {rotation}, centred query"] = [
            share(ndcg_at_10(skflow_code(documents, queries, K, precision, 50 if rotation == "itq" else 0, seed,
                                         centred=True), data), base) for seed in seeds]
    for size, K, precision in CORRECTED:
        for rotation, n_iter in (("random", 0), ("itq", 50)):
            rows[f"{size + 4} B: {precision} of {K} + correction, {rotation}"] = [
                share(ndcg_at_10(skflow_code(documents, queries, K, precision, n_iter, seed, True), data), base)
                for seed in seeds]
    unit = Normalizer().fit_transform(documents)
    for size, K, bits in ALTERNATIVES:
        for kind in ("min-max", "equal-count"):
            values = []
            for seed in seeds:
                rotation = ITQRotation(n_components=K, n_iter=0, random_state=seed).fit(unit)
                rotated = rotation.transform(unit).astype(np.float64)
                mapped = Normalizer().transform(queries) @ rotation.components_.T
                values.append(share(ndcg_at_10(alternative(rotated, mapped, bits, kind), data), base))
            rows[f"{size} B: {bits} bits of {K}, random, {kind}"] = values
    unit_queries = Normalizer().transform(queries)
    for bits in (1, 2, 4):
        for query_bits in (0, 4):
            values = []
            for seed in seeds:
                index = rabitq(unit.shape[1], bits, query_bits, seed)
                index.train(unit)
                index.add(unit)
                values.append(share(ndcg_at_10(index.search(unit_queries, 100), data), base))
            query = "float query" if query_bits == 0 else "4-bit query (faiss's default)"
            rows[f"faiss RaBitQ, {bits} bit{'s' if bits > 1 else ''} ({index.sa_code_size()} B), {query}"] = values
    rows |= transform_rows(data, documents, queries, seeds, base)
    for size in (24, 48, 96, 192, 384, 768):
        width = size // 4
        rows[f"{size} B: truncation to {width} float32"] = [
            share(ndcg_at_10(search(queries[:, :width], documents[:, :width], 100), data), base)]
    return rows


def speed(documents: np.ndarray, queries: np.ndarray, n_rows: int) -> list[str]:
    """Per vector: coding and searching ``n_rows`` tiled rows at each precision, and the ratio to int8's."""
    rng = np.random.RandomState(0)
    rotation = make_pipeline(Normalizer(), ITQRotation(n_iter=0, random_state=0)).fit(documents)
    rows = np.resize(rotation.transform(documents), (n_rows, documents.shape[1]))
    rows += rng.normal(scale=0.01, size=rows.shape).astype(np.float32)
    mapped = rotation.transform(queries[:100])
    timings = {}
    for precision in ("int8", "int4", "int2", "binary", "TransformCoder, 48 B", "TransformCoder, 48 B, corrected"):
        quantizer = (Quantizer(precision=precision) if "Transform" not in precision else
                     TransformCoder(n_bytes=48, correction="corrected" in precision, random_state=0)).fit(rows)
        start = time.perf_counter()
        codes = quantizer.transform(rows)
        coded = time.perf_counter() - start
        start = time.perf_counter()
        if precision == "int8":  # as an engine compares int8: the integer dot of the codes
            search(quantizer.transform(mapped), codes, 10, metric="dot")
        else:
            search(mapped, codes, 10, metric="dot", codes=quantizer)
        timings[precision] = (coded / n_rows, (time.perf_counter() - start) / (n_rows * len(mapped)), codes.nbytes)
    lines = ["| code | bytes a vector | coding, ns a vector | ratio to int8 | search, ns a vector and query | "
             "ratio to int8 |", "|---|---:|---:|---:|---:|---:|"]
    for precision, (coding, searching, nbytes) in timings.items():
        lines.append(f"| {precision} | {nbytes // n_rows} | {1e9 * coding:.0f} | {coding / timings['int8'][0]:.2f} | "
                     f"{1e9 * searching:.1f} | {searching / timings['int8'][1]:.2f} |")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", help="embedding cache (each text embedded once)")
    parser.add_argument("--data-home", default=os.environ.get("SKFLOW_RETRIEVAL_DATA"),
                        help="the folder of the sets in BEIR's layout (default: $SKFLOW_RETRIEVAL_DATA)")
    parser.add_argument("--sets", nargs="*", default=list(SETS), choices=SETS,
                        help="the sets of the study (none: the speed alone, on SciFact's vectors)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--speed-rows", type=int, default=200_000, help="rows of the speed run (0: none)")
    rows = parser.add_mutually_exclusive_group()
    rows.add_argument("--transform-only", action="store_true",
                      help="the TransformCoder's rows and the codes it is compared with, no other")
    rows.add_argument("--product-only", action="store_true",
                      help="faiss's product quantizer (PQ, OPQ + PQ) at 24 bytes beside skflow's best codes")
    args = parser.parse_args(argv)
    clock = Clock()
    embedder = BertEmbedder(pooling="mean", max_length=256, dtype="float32", cache_dir=args.cache_dir,
                            show_progress_bar=False)
    results, text = {}, []
    for name in args.sets:
        data, documents, queries = embedded(name, embedder, args.data_home)
        run = transform_study if args.transform_only else product_study if args.product_only else study
        results[name] = run(data, documents, queries, args.seeds)
        print(f"[{clock}] {name} done", file=sys.stderr, flush=True)
    if results:
        text += [f"The share of each corpus's raw float32 nDCG@10, mean over seeds {args.seeds} (range):", "",
                 *table(results), ""]
    if args.speed_rows:
        _, documents, queries = embedded("scifact", embedder, args.data_home)
        text += [f"Speed, {args.speed_rows:,} rows of {documents.shape[1]} dimensions (SciFact's vectors tiled with "
                 "noise):", "", *speed(documents, queries, args.speed_rows)]
    command = " ".join(sys.argv[1:] if argv is None else argv)
    print("\n".join([f"Written by `python benchmarks/multibit_codes.py {command}` in {clock}. {environment()}.", "",
                     *text]))


def embedded(name: str, embedder: BertEmbedder, data_home) -> tuple:
    """A set, and its documents' and queries' vectors."""
    data = load_beir(name if name == "scifact" else Path(data_home) / name, data_home=data_home)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "BertEmbedder: .* longer than max_length")  # as MTEB truncates
        return data, embedder.transform(data.corpus), embedder.transform(data.queries)


def table(results: dict) -> list[str]:
    """The Markdown table of the study: a row per code, a column per corpus."""
    names = list(results)
    lines = ["| code | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    lines.append("| float32 nDCG@10 | " + " | ".join(f"{results[n]['float32'][0]:.2f}" for n in names) + " |")
    for row in results[names[0]]:
        if row != "float32":
            cells = []
            for name in names:
                values = results[name][row]
                if isinstance(values, str):  # a TransformCoder's widths
                    cells.append(values)
                    continue
                cells.append(f"{np.mean(values):.1f}%" + (f" ({min(values):.1f}-{max(values):.1f})"
                                                           if len(values) > 1 else ""))
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return lines


if __name__ == "__main__":
    main()
