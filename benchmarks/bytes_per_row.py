"""Bytes per row of a corpus and of its embeddings as Parquet (pyarrow's defaults: snappy, dictionary encoding), at
float32, int8 and binary: the unique sentences of the STS sets embedded by the bundled encoder, written as ``embed``
writes them (every input column plus a fixed-length list column).

    python benchmarks/bytes_per_row.py --rows 20000
"""

import argparse
import io
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from skflow import BertEmbedder  # noqa: E402
from skflow.compression import Quantizer  # noqa: E402
from skflow.datasets import load_sts  # noqa: E402


def _size(table: pa.Table) -> int:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.tell()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    args = parser.parse_args()
    texts = []
    for name in ("stsb", "sts12", "sts13", "sts14", "sts15", "sts16"):
        for split in ("train", "dev", "test"):
            try:
                texts += load_sts(name, split=split, download_if_missing=False).pairs.ravel().tolist()
            except (ValueError, OSError):
                continue
    texts = list(dict.fromkeys(texts))[: args.rows]
    X = BertEmbedder(show_progress_bar=False).transform(texts)  # the defaults: what `skflow embed` writes
    corpus = pa.table({"id": np.arange(len(texts)), "text": texts})
    n, d = X.shape
    columns = {
        "float32": pa.FixedSizeListArray.from_arrays(pa.array(X.astype(np.float32).ravel()), d),
        "int8": pa.FixedSizeListArray.from_arrays(pa.array(Quantizer(precision="int8").fit_transform(X).ravel()), d),
        "binary": pa.FixedSizeListArray.from_arrays(
            pa.array(Quantizer(precision="binary").fit_transform(X).ravel()), d // 8),
    }
    base = _size(corpus)
    print(f"{n:,} texts, mean {np.mean([len(t) for t in texts]):.0f} characters; d = {d}\n")
    print("| what | bytes per row (Parquet) | of which the vector | raw vector bytes |\n|---|---|---|---|")
    print(f"| the input (id, text) | {base / n:.0f} | | |")
    for name, column in columns.items():
        size = _size(corpus.append_column("embedding", column))
        raw = column.values.nbytes / n
        print(f"| input + {name} embedding | {size / n:.0f} | {(size - base) / n:.0f} | {raw:.0f} |")


if __name__ == "__main__":
    main()
