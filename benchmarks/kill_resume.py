"""A killed ``skflow embed`` of one large file, resumed: the rows a kill halfway keeps, and the resumed output against
a clean run's (``docs/scale.md``, "Runs that resume").

    python benchmarks/kill_resume.py --rows 100000 --max-length 16

For each format (one Parquet file, one text file of ``--rows`` distinct sentences), the command is Ctrl-C'd (its pid
sent SIGINT) as soon as its own written parts hold half the rows or more: the kill is placed by what the run has
written, not by a clock, so the machine's load (shared, changing) cannot move it. The rows the killed run's parts
keep are counted; then the same command once more, whose output must hold every row once, each vector equal to a
clean run's of the same command. Default settings but ``--max-length`` (one worker, 8,192 rows a call), float32.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]


def _start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "skflow", *argv], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def _parts(out: Path, seen: dict) -> list[tuple[float, int]]:
    """``(when it was seen, its rows)`` of each part in ``out`` (``seen`` keeps them), in the order they appeared."""
    for part in sorted(out.glob("skflow-*.parquet"), key=lambda p: p.stat().st_mtime_ns) if out.exists() else ():
        if part.name not in seen:
            seen[part.name] = (time.monotonic(), pq.read_metadata(part).num_rows)
    return sorted(seen.values())


def _killed_halfway(argv: list[str], out: Path, rows: int) -> tuple[int, str, int, float]:
    """SIGINT to the run once its parts in ``out`` hold half the rows or more. Its exit status, what it printed, the
    rows its parts held when the signal was sent, and the seconds from its first part to the signal."""
    killed, seen, sent = _start([*argv, "--output", str(out)]), {}, None
    while killed.poll() is None:
        parts = _parts(out, seen)
        if sent is None and sum(n for _, n in parts) >= rows / 2:
            killed.send_signal(signal.SIGINT)
            sent = (sum(n for _, n in parts), time.monotonic() - parts[0][0])
        time.sleep(0.02)
    _, err = killed.communicate()
    assert sent is not None, f"the run ended before half its rows were written: {err.strip()!r}"
    return killed.returncode, err.strip(), *sent


def _vectors(out: Path) -> dict[str, np.ndarray]:
    files = json.loads((out / ".skflow-output").read_text())["files"]
    table = pa.concat_tables([pq.read_table(out / name) for name in files])
    texts = table.column("text").to_pylist()
    assert len(set(texts)) == len(texts), "a row written twice"
    return dict(zip(texts, np.stack(table.column("embedding").to_numpy(zero_copy_only=False))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--max-length", type=int, default=16)
    parser.add_argument("--formats", nargs="+", default=["parquet", "text"], choices=["parquet", "text"])
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="skflow-kill-resume-"))
    topics = ["cats", "dogs", "rivers", "engines", "songs", "markets", "storms", "gardens"]
    texts = [f"sentence {i} is about {topics[i % 8]} and {topics[(i // 8) % 8]}" for i in range(args.rows)]
    try:
        for kind in args.formats:
            source = work / ("corpus.parquet" if kind == "parquet" else "corpus.txt")
            if kind == "parquet":
                pq.write_table(pa.table({"text": texts}), source)
            else:
                source.write_text("\n".join(texts) + "\n", encoding="utf-8")
            clean, out = work / f"clean-{kind}", work / f"out-{kind}"
            argv = ["embed", str(source), "--max-length", str(args.max_length), "--dtype", "float32"]
            status, said, at_signal, after = _killed_halfway(argv, out, args.rows)
            kept = sum(pq.read_metadata(part).num_rows for part in out.glob("skflow-*.parquet"))
            print(f"{kind}: {args.rows:,} rows; Ctrl-C once its parts held {at_signal:,} rows ({after:.0f} s after its "
                  f"first part): exit {status}, {kept:,} rows kept ({kept / args.rows:.1%}); it said: {said!r}",
                  flush=True)
            clean_run = _start([*argv, "--output", str(clean), "--quiet"])
            assert clean_run.wait() == 0, clean_run.stderr.read()
            resumed = _start([*argv, "--output", str(out)])
            _, said = resumed.communicate()
            status = resumed.returncode
            reference, resumed = _vectors(clean), _vectors(out)
            assert status == 0 and set(resumed) == set(reference) and len(resumed) == args.rows
            worst = max(float(np.abs(resumed[text] - reference[text]).max()) for text in reference)
            print(f"{kind}: resumed, exit {status}, every row once, largest difference to the clean run's vectors "
                  f"{worst:g}; it said: {said.strip()!r}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
