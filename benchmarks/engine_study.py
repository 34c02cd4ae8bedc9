"""What an engine index does to skflow's vectors: nDCG@10 through faiss and usearch, exact and HNSW, on every
BEIR-layout corpus given.

Each corpus folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/test.tsv``) is
read here, its documents embedded as ``(title + " " + text).strip()`` and its
judged test queries as they are, with all-MiniLM-L6-v2 as MTEB runs it (mean
pooling, 256 tokens, float32). Every pipeline is fitted on the corpus only.
Three tables, each figure nDCG@10 x 100 with its share of the corpus's raw
float32 nDCG@10 (skflow's exact numpy search):

- float32 vectors in each engine, exact and HNSW (the engine's defaults),
  with the recall@100 of the engine's top 100 against its exact top 100;
- int8 codes as each engine stores and compares them: per-dimension ranges
  (sentence-transformers' codes) and one symmetric range
  (``Quantizer(ranges="symmetric")``), of the raw and of the unit vectors;
- binary codes (raw sign bits, and a centred random rotation over 5 seeds:
  mean and range) in a binary HNSW, alone and as the first of two stages: its
  top 100 or 1,000 rescored by the float query against the bits
  (asymmetric), or against the raw float32 vectors kept aside (or their int8 codes).

    python benchmarks/engine_study.py $SKFLOW_RETRIEVAL_DATA/scifact $SKFLOW_RETRIEVAL_DATA/cranfield \
        $SKFLOW_RETRIEVAL_DATA/cisi --cache-dir DIR
"""

import argparse
import json
import os
import platform
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import Normalizer

from skflow import BertEmbedder, ITQRotation, Quantizer, __version__
from skflow.compression import search
from skflow.engines import EngineIndex, require_engine
from skflow.evaluation import overlap, retrieval_report, search_stored

ENGINES = ("faiss", "usearch")
SEEDS = (0, 1, 2, 3, 4)
K = 100


def read_folder(folder: Path) -> dict:
    """A BEIR-layout folder: documents as MTEB embeds them, the test split's judged queries, its judgements."""
    documents = [json.loads(line) for line in (folder / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
                 if line.strip()]
    queries = {record["_id"]: record["text"] for record in map(json.loads, (folder / "queries.jsonl").read_text(
        encoding="utf-8").splitlines()) if record}
    qrels = {}
    for line in (folder / "qrels" / "test.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        query, document, relevance = line.split("\t")
        qrels.setdefault(query, {})[document] = int(relevance)
    query_ids = [query for query in queries if query in qrels]
    return {"name": folder.name, "corpus_ids": [d["_id"] for d in documents],
            "corpus": [(d.get("title", "") + " " + d["text"]).strip() for d in documents],
            "query_ids": query_ids, "queries": [queries[q] for q in query_ids], "qrels": qrels}


class Corpus:
    """One corpus embedded, and nDCG@10 of any top 100 found for its queries."""

    def __init__(self, data: dict, embedder: BertEmbedder):
        self.data = data
        self.documents = embedder.transform(data["corpus"])
        self.queries = embedder.transform(data["queries"])
        self.k = min(K, len(self.documents))  # each query's top 100 (a smaller corpus: all of it)
        self.raw = self.ndcg(search(self.queries, self.documents, self.k))

    def ndcg(self, found) -> float:
        report = retrieval_report(*found, self.data["qrels"], self.data["query_ids"], self.data["corpus_ids"])
        return 100 * report["ndcg@10"]

    def cell(self, value: float) -> str:
        return f"{value:.2f} ({100 * value / self.raw:.1f}%)"


def float32_rows(corpus: Corpus) -> dict:
    rows = {"numpy, exact (skflow's reference)": (corpus.raw, None)}
    for engine in ENGINES:
        exact = EngineIndex(engine=engine).fit(corpus.documents).search(corpus.queries, corpus.k)
        hnsw = EngineIndex(engine=engine, index="hnsw").fit(corpus.documents).search(corpus.queries, corpus.k)
        rows[f"{engine}, flat"] = (corpus.ndcg(exact), None)
        rows[f"{engine}, hnsw"] = (corpus.ndcg(hnsw), overlap(hnsw[1], exact[1]))
    return rows


def int8_rows(corpus: Corpus) -> dict:
    documents, queries = corpus.documents, corpus.queries
    rows = {"numpy: cosine of the dequantized codes (skflow's int8 row)":
            corpus.ndcg(search_stored(queries, documents, ["int8"], k=corpus.k)["int8"])}
    codes = {"per-dimension ranges, raw vectors": Quantizer(),
             "per-dimension ranges, unit vectors": make_pipeline(Normalizer(), Quantizer()),
             "symmetric range, raw vectors": Quantizer(ranges="symmetric"),
             "symmetric range, unit vectors": make_pipeline(Normalizer(), Quantizer(ranges="symmetric"))}
    for name, pipeline in codes.items():
        pipeline.fit(documents)
        for engine in ENGINES:
            for kind in ("flat", "hnsw"):
                found = EngineIndex(pipeline, engine=engine, index=kind).fit(documents).search(queries, corpus.k)
                rows[(engine, name, kind)] = corpus.ndcg(found)
    return rows


def binary_rows(corpus: Corpus) -> dict:
    """``{(code, row): [nDCG@10 of each seed]}``."""
    documents, queries = corpus.documents, corpus.queries
    rows = {}
    for code, seeds in (("raw sign bits", (None,)), ("centred random rotation", SEEDS)):
        for seed in seeds:
            front = [] if seed is None else [ITQRotation(n_iter=0, random_state=seed)]
            pipeline = make_pipeline(*front, Quantizer(precision="binary")).fit(documents)
            bits = pipeline.transform(documents)
            unit = Normalizer().transform(documents)  # the raw vectors kept aside as int8 codes, 384 bytes
            int8 = Quantizer(ranges="symmetric").fit(unit).transform(unit)
            mapped_queries = pipeline[:-1].transform(queries) if front else queries
            add = rows.setdefault
            add((code, "numpy, Hamming (exact)"), []).append(corpus.ndcg(search(
                pipeline.transform(queries), bits, corpus.k, metric="hamming")))
            add((code, "numpy, float query against the bits (exact)"), []).append(corpus.ndcg(search(
                mapped_queries, bits, corpus.k, metric="asymmetric")))
            for engine in ENGINES:
                index = EngineIndex(pipeline, engine=engine, index="hnsw").fit(documents)
                add((code, f"{engine} hnsw, Hamming"), []).append(corpus.ndcg(index.search(queries, corpus.k)))
                for top in sorted({min(100, len(documents)), min(1000, len(documents))}):
                    add((code, f"{engine} hnsw top {top:,}, rescored against the bits"), []).append(
                        corpus.ndcg(index.search(queries, corpus.k, rescore=top)))
                    add((code, f"{engine} hnsw top {top:,}, rescored against float32 kept aside"), []).append(
                        corpus.ndcg(index.search(queries, corpus.k, rescore=top, rescore_with=documents)))
                    add((code, f"{engine} hnsw top {top:,}, rescored against int8 kept aside"), []).append(
                        corpus.ndcg(index.search(queries, corpus.k, rescore=top, rescore_with=int8)))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="BEIR-layout corpus folders")
    parser.add_argument("--cache-dir", help="embedding cache (each text embedded once)")
    args = parser.parse_args(argv)
    faiss, _ = require_engine("faiss"), require_engine("usearch")
    start = time.perf_counter()
    embedder = BertEmbedder(pooling="mean", max_length=256, dtype="float32", cache_dir=args.cache_dir,
                            show_progress_bar=False)
    corpora = [Corpus(read_folder(folder), embedder) for folder in args.folders]
    names = [c.data["name"] for c in corpora]
    print(f"skflow {__version__}, faiss {faiss.__version__}, usearch {version('usearch')}, Python "
          f"{platform.python_version()}, {os.cpu_count()} CPUs; nDCG@10 x 100 (share of the corpus's raw float32)\n")
    print("| corpus | documents | judged test queries | raw float32 nDCG@10 |\n|---|---|---|---|")
    for c in corpora:
        print(f"| {c.data['name']} | {len(c.documents):,} | {len(c.queries):,} | {c.raw:.2f} |")

    print("\n### float32\n\n| index | " + " | ".join(f"{n} nDCG@10 | {n} recall@100 vs exact" for n in names)
          + " |\n|---|" + "---|---|" * len(names))
    tables = [float32_rows(c) for c in corpora]
    for row in tables[0]:
        cells = []
        for c, table in zip(corpora, tables):
            value, recall = table[row]
            cells += [c.cell(value), "" if recall is None else f"{100 * recall:.1f}"]
        print(f"| {row} | " + " | ".join(cells) + " |")

    print("\n### int8, as each engine stores and compares the codes\n")
    tables = [int8_rows(c) for c in corpora]
    print("| engine | codes | index | " + " | ".join(names) + " |\n|---|---|---|" + "---|" * len(names))
    for row in tables[0]:
        label = ("numpy", row, "exact") if isinstance(row, str) else row
        print(f"| {' | '.join(label)} | " + " | ".join(c.cell(t[row]) for c, t in zip(corpora, tables)) + " |")

    print("\n### binary codes (48 bytes), one stage and two (rotation: mean over seeds 0-4, and range)\n")
    tables = [binary_rows(c) for c in corpora]
    print("| code | search | " + " | ".join(names) + " |\n|---|---|" + "---|" * len(names))
    for row in tables[0]:
        cells = []
        for c, table in zip(corpora, tables):
            values = np.array(table[row])
            cell = c.cell(values.mean())
            if len(values) > 1:
                cell += f" [{values.min():.2f}-{values.max():.2f}]"
            cells.append(cell)
        print(f"| {row[0]} | {row[1]} | " + " | ".join(cells) + " |")
    print(f"\n{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
