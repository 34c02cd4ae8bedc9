"""Encoding speed of BertEmbedder against sentence-transformers' SentenceTransformer.encode.

Same model (the embedded all-MiniLM-L6-v2), same texts (every unique STS-B
sentence, train+dev+test, so BertEmbedder's de-duplication gains nothing), same
batch size, same truncation (``--max-length``, sentence-transformers'
``max_seq_length`` for this model), mean pooling on both sides. Each
measurement runs in its own process after a warm-up batch; peak memory is the
max RSS above the process's level after loading the model. STS-B test Spearman
is computed from the same vectors.

    python benchmarks/embed_speed.py [--batch-sizes 32 128] [--max-length 256] [--limit 0]
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
from _memory import PeakMemory

# (label, library, dtype)
CONFIGS = [
    ("sentence-transformers float32", "st", "float32"),
    ("sentence-transformers bfloat16", "st", "bfloat16"),
    ("BertEmbedder float32", "skflow", "float32"),
    ("BertEmbedder dtype='auto'", "skflow", "auto"),
]


def _texts(limit: int):
    from skflow.datasets import load_sts

    train = load_sts("stsb")
    texts = list(dict.fromkeys(train.pairs.ravel().tolist()))
    if limit:
        texts = texts[:limit]
    test = load_sts("stsb", split="test")
    return texts, test


def _child(args):
    import torch

    texts, test = _texts(args.limit)
    warmup = texts[: args.batch_size]
    if args.library == "st":
        from sentence_transformers import SentenceTransformer

        from skflow.embedding._model_source import resolve_model_source

        path = resolve_model_source("sentence-transformers/all-MiniLM-L6-v2", None).path_or_id
        kwargs = {"torch_dtype": torch.bfloat16} if args.dtype == "bfloat16" else {}
        model = SentenceTransformer(path, device="cpu", model_kwargs=kwargs)
        model.max_seq_length = args.max_length

        def encode(batch):
            return model.encode(batch, batch_size=args.batch_size, convert_to_numpy=True).astype(np.float32)

    else:
        from skflow import BertEmbedder

        model = BertEmbedder(
            pooling="mean", dtype=args.dtype, max_length=args.max_length, batch_size=args.batch_size, device="cpu"
        )
        encode = model.transform
    encode(warmup)
    with PeakMemory() as memory:
        start = time.perf_counter()
        vectors = encode(texts)
        seconds = time.perf_counter() - start
    table = dict(zip(texts, vectors))
    rho = float("nan")
    if all(t in table for t in test.pairs.ravel()):
        from skflow.metrics import sts_spearman

        pairs = np.stack([[table[a], table[b]] for a, b in test.pairs])
        rho = sts_spearman(pairs, test.scores)
    print(json.dumps({"texts_per_s": len(texts) / seconds, "seconds": seconds, "peak_rss_mb": memory.mb,
                      "spearman": rho, "n_texts": len(texts)}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--limit", type=int, default=0, help="encode only the first N texts (0: all)")
    parser.add_argument("--library", choices=["st", "skflow"], help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.library:
        return _child(args)

    import torch

    from skflow.embedding._encoding import resolve_dtype

    results = {}
    for batch_size in args.batch_sizes:
        for label, library, dtype in CONFIGS:
            cmd = [sys.executable, __file__, "--library", library, "--dtype", dtype, "--batch-size",
                   str(batch_size), "--max-length", str(args.max_length), "--limit", str(args.limit)]
            env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
            results[label, batch_size] = json.loads(out.splitlines()[-1])
            print(f"  {label}, batch {batch_size}: {results[label, batch_size]}", file=sys.stderr)

    n_texts = next(iter(results.values()))["n_texts"]
    auto = str(resolve_dtype("auto", torch.device("cpu"))).removeprefix("torch.")
    print(f"{n_texts} unique STS-B sentences, all-MiniLM-L6-v2, mean pooling, max_length {args.max_length}, "
          f"CPU, {torch.get_num_threads()} threads, torch {torch.__version__}; dtype='auto' is {auto} here\n")
    print("| encoder | batch | sentences/s | vs ST float32 | peak memory (MB) | STS-B test Spearman |")
    print("|---|---|---|---|---|---|")
    for batch_size in args.batch_sizes:
        base = results[CONFIGS[0][0], batch_size]["texts_per_s"]
        for label, _, _ in CONFIGS:
            r = results[label, batch_size]
            print(f"| {label} | {batch_size} | {r['texts_per_s']:,.0f} | {r['texts_per_s'] / base:.2f}x | "
                  f"{r['peak_rss_mb']:,.0f} | {r['spearman']:.4f} |")


if __name__ == "__main__":
    main()
