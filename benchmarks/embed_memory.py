"""Peak memory of one long batch: the fused bf16 encoder against transformers' forward (issue #36).

Same model (the embedded all-MiniLM-L6-v2, bf16 on the CPU), same texts (``--texts`` texts of ``--tokens``
tokens, cut from STS-B sentences joined), one batch of all of them, same torch threads. Each configuration runs
in its own process: it loads the encoder and encodes one short text (the fused blocks are built and checked
then), and the peak resident memory above that level while the batch is encoded is reported
(``benchmarks/_memory.py``), with the time. Configurations:

- ``fused``: BertEmbedder's fused blocks, the attention in chunks of at most ``SCORES_BYTES`` of scores;
- ``fused-whole``: the same blocks with the scores of the whole batch at once (before issue #36);
- ``transformers``: transformers' own forward in bf16 (``attn_implementation="sdpa"``, its default).

    python benchmarks/embed_memory.py [--texts 64] [--tokens 512] [--rounds 1]
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

CONFIGS = ("fused", "fused-whole", "transformers")


def texts_of(n_texts: int, n_tokens: int) -> list[str]:
    """``n_texts`` different texts of at least ``n_tokens`` tokens each (STS-B sentences joined)."""
    from skflow.datasets import load_sts

    sentences = list(dict.fromkeys(load_sts("stsb", split="train").pairs.ravel().tolist()))
    words_per_text = 2 * n_tokens  # a sentence token is at most a word; the embedder cuts at max_length
    words = " ".join(sentences).split()
    return [" ".join(words[i * 37 : i * 37 + words_per_text]) for i in range(n_texts)]


def measure(config: str, n_texts: int, n_tokens: int) -> dict:
    import torch
    from _memory import PeakMemory

    from skflow import BertEmbedder
    from skflow.embedding import _fused_bert

    kwargs = {"model_kwargs": {"attn_implementation": "sdpa"}} if config == "transformers" else {}
    if config == "fused-whole":
        _fused_bert.SCORES_BYTES = 2**62
    embedder = BertEmbedder(pooling="mean", dtype="bfloat16", max_length=n_tokens, batch_size=n_texts,
                            show_progress_bar=False, **kwargs)
    texts = texts_of(n_texts, n_tokens)
    embedder.transform(texts[:1])
    with PeakMemory() as memory:
        start = time.perf_counter()
        vectors = embedder.transform(texts)
        seconds = time.perf_counter() - start
    return {"config": config, "peak_mb": memory.mb, "seconds": seconds, "threads": torch.get_num_threads(),
            "vector0": vectors[0, :8].tolist()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.texts, args.tokens)))
        return
    runs: dict[str, list[dict]] = {config: [] for config in args.configs}
    for _ in range(args.rounds):
        for config in args.configs:
            done = subprocess.run([sys.executable, __file__, "--child", config, "--texts", str(args.texts),
                                   "--tokens", str(args.tokens)], capture_output=True, text=True, check=True)
            runs[config].append(json.loads(done.stdout.splitlines()[-1]))
    base = statistics.median(run["peak_mb"] for run in runs["transformers"]) if "transformers" in runs else None
    print(f"{args.texts} texts x {args.tokens} tokens, bf16, {runs[args.configs[0]][0]['threads']} threads, "
          f"median of {args.rounds} round(s)")
    print("| configuration | peak memory above the loaded model (MB) | vs transformers | seconds |")
    print("|---|---:|---:|---:|")
    for config, results in runs.items():
        peak = statistics.median(run["peak_mb"] for run in results)
        ratio = f"{peak / base:.2f}x" if base else "-"
        print(f"| {config} | {peak:,.0f} | {ratio} | {statistics.median(r['seconds'] for r in results):.2f} |")


if __name__ == "__main__":
    main()
