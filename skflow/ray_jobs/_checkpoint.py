"""What lets a killed ``embed`` or ``transform`` resume: the job's fingerprint in the output's ``.skflow-checkpoint``,
and, in each Parquet part the job writes, the input rows it holds (``[file, start, stop, file's rows]`` ranges in its
footer). The parts are the progress: the state grows with the files written and read, never with the rows."""

import bisect
import functools
import hashlib
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from skflow.ray_jobs import _storage as storage
from skflow.ray_jobs._storage import Location
from skflow.utils import printable

CHECKPOINT = ".skflow-checkpoint"
PART_TEMPORARY = ".skflow-part-"  # a part being written to a local disk, renamed when whole
# [0-9], not \d: \d takes '٣' or '３', which int() reads as a pid, so a user's file could pass for a dead run's
RUN_NAME = re.compile(r"^skflow-(?P<pid>[0-9]+)@(?P<host>[A-Za-z0-9._]+)-[0-9a-f]{8}$")  # a run of one process
CHECKPOINT_LIMIT = 2**20  # bytes: a fingerprint and the runs that worked on it
# Where each row came from, carried beside it from the read to the write (which drops them), and the footer keys
FILE_COLUMN, ROW_COLUMN, FILE_ROWS_COLUMN = "__skflow_file", "__skflow_row", "__skflow_file_rows"
PROVENANCE = (FILE_COLUMN, ROW_COLUMN, FILE_ROWS_COLUMN)
JOB_KEY, ROWS_KEY = b"skflow.job", b"skflow.rows"
LAYOUT = 1  # how parts record their rows: a checkpoint of another layout is another job
_LABELS = {"command": "the command", "layout": "skflow's checkpoint layout", "encoder": "the encoder's weights",
           "settings": "the encoder's settings", "model": "the model file", "inputs": "the input files (names, "
           "sizes, modification times)", "column": "the input column", "output_column": "the output column"}


class DamagedCheckpointError(ValueError):
    """A checkpoint or a part of it that skflow cannot trust; ``--restart`` discards it."""


def job_fingerprint(settings: dict) -> dict:
    """A job's fingerprint as its checkpoint stores it: ``settings`` and the layout, in JSON's terms (a value JSON
    has no type for, by its ``repr``)."""
    return json.loads(json.dumps(settings | {"layout": LAYOUT}, default=repr, sort_keys=True))


def job_id(fingerprint: dict) -> str:
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:32]


def differences(old: dict, new: dict) -> str:
    """What differs between two fingerprints, in words: ``the encoder's settings (pooling: cls then, mean now)``."""
    said = []
    for key in sorted(set(old) | set(new), key=lambda k: list(_LABELS).index(k) if k in _LABELS else len(_LABELS)):
        before, now = old.get(key), new.get(key)
        if before == now:
            continue
        if isinstance(before, dict) and isinstance(now, dict):
            detail = ", ".join(f"{k}: {before.get(k)!r} then, {now.get(k)!r} now"
                               for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k))
        elif key == "inputs" and isinstance(before, list) and isinstance(now, list) and len(before) == len(now) == 2:
            detail = f"{before[0]:,} files then, {now[0]:,} now" if before[0] != now[0] else "a file changed"
        else:
            detail = f"{printable(repr(before))[:80]} then, {printable(repr(now))[:80]} now"
        said.append(f"{_LABELS.get(key, printable(key))} ({detail})")
    return "; ".join(said)


def checkpoint_text(fingerprint: dict, runs: list[str]) -> str:
    return json.dumps({"skflow_checkpoint": LAYOUT, "job": job_id(fingerprint), "fingerprint": fingerprint,
                       "runs": runs}, indent=1, sort_keys=True) + "\n"


def read_checkpoint(where: Location) -> tuple[dict, list[str]]:
    """The fingerprint and the runs (``skflow-PID@HOST-HEX``, the last one the latest) of a checkpoint file;
    DamagedCheckpointError if it is not one that skflow wrote, whole."""
    try:
        content = json.loads(storage.read_bytes(where, CHECKPOINT_LIMIT).decode("utf-8"))
        fingerprint, runs = content["fingerprint"], content["runs"]
        whole = (content["skflow_checkpoint"] == LAYOUT and isinstance(fingerprint, dict) and isinstance(runs, list)
                 and runs and all(isinstance(run, str) and RUN_NAME.fullmatch(run) for run in runs)
                 and content["job"] == job_id(fingerprint))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise DamagedCheckpointError(storage.one_line(exc) or type(exc).__name__) from None
    if not whole:
        raise DamagedCheckpointError("not a checkpoint that skflow wrote, or altered since")
    return fingerprint, runs


def row_ranges(table) -> tuple[object, list[list[int]]]:
    """``table`` without the provenance columns, and the ``[file, start, stop, file's rows]`` ranges of its rows."""
    files, rows, of = (table.column(name).to_numpy() for name in PROVENANCE)
    table = table.drop_columns(list(PROVENANCE))
    order = np.lexsort((rows, files))
    files, rows, of = files[order], rows[order], of[order]
    breaks = np.flatnonzero((np.diff(files) != 0) | (np.diff(rows) != 1)) + 1
    starts, stops = np.r_[0, breaks], np.r_[breaks, len(files)]
    return table, [[int(files[a]), int(rows[a]), int(rows[b - 1]) + 1, int(of[a])] for a, b in zip(starts, stops)]


def with_ranges(table, job: str, ranges: list[list[int]]):
    """``table`` whose schema carries the job and its rows' ranges into the Parquet footer."""
    metadata = {k: v for k, v in (table.schema.metadata or {}).items() if k not in (JOB_KEY, ROWS_KEY)}
    return table.replace_schema_metadata(metadata | {JOB_KEY: job.encode(), ROWS_KEY: json.dumps(ranges).encode()})


class Part(NamedTuple):
    rows: int
    ranges: list


def earlier_parts(out: Location, names: list[str], job: str, n_files: int) -> dict[str, Part]:
    """The parts among ``names`` (run files of this job's earlier runs) whose footers say they hold rows of ``job``;
    a part that cannot be read is left out (a write cut short: its rows are written again). DamagedCheckpointError
    for a part of this job whose ranges do not add up."""
    def footer(name):  # the little that is kept of it: a footer object is some 8 KB
        try:
            metadata = storage.parquet_metadata(out.child(name))
        except Exception:  # noqa: BLE001 - a part cut short (no footer yet), gone since the listing
            return name, None, {}
        kv = metadata.metadata or {}
        return name, metadata.num_rows, {k: kv[k] for k in (JOB_KEY, ROWS_KEY) if k in kv}

    parts = {}
    pool = ThreadPoolExecutor(storage.FOOTER_READS, thread_name_prefix="skflow-parts")
    try:
        for name, rows, kv in storage.in_order(pool, footer, names):
            if kv.get(JOB_KEY) != job.encode():
                continue
            try:
                ranges = json.loads(kv[ROWS_KEY])
                sound = all(len(r) == 4 and all(type(v) is int for v in r) and 0 <= r[0] < n_files
                            and 0 <= r[1] < r[2] <= r[3] for r in ranges)
            except (KeyError, ValueError, TypeError):
                sound = False
            if not sound or sum(r[2] - r[1] for r in ranges) != rows:
                raise DamagedCheckpointError(f"{printable(out.child(name).shown)}: its footer's record of the rows "
                                             "it holds does not add up")
            parts[name] = Part(rows, ranges)
    finally:  # a damaged part ends the reading at once
        pool.shutdown(cancel_futures=True)
    return parts


def one_part_a_row(parts: dict[str, Part], runs: list[str], shown: str, files=()) -> dict[str, Part]:
    """``parts`` less each part that holds a row a part of an earlier run holds: a part that a killed run's Ray
    worker finished after the next run had listed the folder, whose rows that run wrote again. Parts taken in the
    runs' order (then by name), so the earlier run's part is kept and the later one's left out (its rows written
    again, the file deleted at the commit); DamagedCheckpointError naming the file if two parts of one run hold
    one row (a run never writes a row twice)."""
    taken: dict[int, list[tuple[int, int, str]]] = {}  # file: sorted (start, stop, run) of the parts kept
    kept = {}
    for name in sorted(parts, key=lambda name: (runs.index(run_of(name)) if run_of(name) in runs else len(runs),
                                                name)):
        clash = None
        for file, start, stop, _ in parts[name].ranges:
            spans = taken.get(file, [])
            i = bisect.bisect_left(spans, (start,))
            near = spans[max(i - 1, 0):i + 1]
            if found := next((span for span in near if span[0] < stop and start < span[1]), None):
                clash = (file, max(start, found[0]), found[2])
                break
        if clash is None:
            kept[name] = parts[name]
            for file, start, stop, _ in parts[name].ranges:
                bisect.insort(taken.setdefault(file, []), (start, stop, run_of(name)))
        elif clash[2] == run_of(name):
            raise DamagedCheckpointError(f"{shown}: two parts of one run hold row {clash[1] + 1} of "
                                         f"{input_name(clash[0], files)}")
    return kept


def run_of(name: str) -> str:
    """The run that wrote part ``name`` (``RUN-TASK-BLOCK.parquet``)."""
    return name.rsplit("-", 2)[0]


def input_name(file: int, files=()) -> str:
    """How an error names input file ``file``: its path among ``files`` (the job's inputs, in order), else a number."""
    return printable(files[file]) if 0 <= file < len(files) else f"input file {file + 1}"


def coverage(parts, shown: str, files=()) -> dict[int, tuple[list[tuple[int, int]], int]]:
    """Each input file's rows that ``parts`` hold, ``{file: (merged ranges, its rows)}``; DamagedCheckpointError
    naming the file (its path among ``files``) if two parts hold one row, or disagree on its rows."""
    spans: dict[int, list] = {}
    for part in parts:
        for file, start, stop, of in part.ranges:
            spans.setdefault(file, []).append((start, stop, of))
    merged = {}
    for file, found in spans.items():
        found.sort()
        if len({of for _, _, of in found}) > 1:
            raise DamagedCheckpointError(f"{shown}: two parts disagree on the rows of {input_name(file, files)} "
                                         f"({', '.join(f'{n:,}' for n in sorted({of for _, _, of in found}))}): it "
                                         "changed since an earlier run, keeping its size and modification time")
        ranges = []
        for start, stop, _ in found:
            if ranges and start < ranges[-1][1]:
                raise DamagedCheckpointError(f"{shown}: two parts hold row {start + 1} of "
                                             f"{input_name(file, files)}")
            if ranges and start == ranges[-1][1]:
                ranges[-1] = (ranges[-1][0], stop)
            else:
                ranges.append((start, stop))
        merged[file] = (ranges, found[0][2])
    return merged


def is_complete(ranges: list[tuple[int, int]], rows: int) -> bool:
    return ranges == [(0, rows)]



def rows_held(parts, rows: int | None, n_files: int) -> str:
    """``30,000 of 70,000 rows``: the rows ``parts`` hold, of ``rows`` (else of the input files' rows that the parts
    record, where they hold rows of every input file)."""
    files = {file: of for part in parts for file, _, _, of in part.ranges}
    total = rows if rows is not None else sum(files.values()) if len(files) == n_files else None
    return f"{sum(part.rows for part in parts):,}{f' of {total:,}' if total is not None else ''} rows"


@functools.cache
def parts_sink():
    """The Ray Data sink class of a job's parts (Ray imported when first asked for)."""
    import pyarrow.parquet as pq
    from ray.data import Datasink
    from ray.data.block import BlockAccessor

    class ParquetParts(Datasink):
        """Each block written as ``RUN-TASK-BLOCK.parquet`` (a retried task writes the same names), its rows' input
        ranges in its footer (locally through a hidden temporary, renamed: a part is whole or absent); committed
        by the output folder (``target``, an ``OutputFolder``) when Ray reports the write complete."""

        def __init__(self, target, command: str, empty: Exception, expected: int | None) -> None:
            self.target, self.command, self.empty, self.expected, self.rows = target, command, empty, expected, None

        def on_write_start(self, *args) -> None:
            self.target.begin()

        def write(self, blocks, ctx) -> list[tuple[str, int, list]]:
            written, folder = [], self.target.out
            job = job_id(self.target.fingerprint) if self.target.fingerprint is not None else ""
            for i, block in enumerate(blocks):
                table = BlockAccessor.for_block(block).to_arrow()
                if not table.num_rows:
                    continue
                ranges = []
                if PROVENANCE[0] in table.column_names:
                    table, ranges = row_ranges(table)
                    table = with_ranges(table, job, ranges)
                name = f"{self.target.run}-{ctx.task_idx}-{i}.parquet"
                final = folder.child(name)
                if folder.is_remote:  # one upload: the object appears whole, or not at all
                    pq.write_table(table, final.path, filesystem=folder.filesystem)
                else:
                    temporary = folder.child(f"{PART_TEMPORARY}{name}")
                    pq.write_table(table, temporary.path, filesystem=folder.filesystem)
                    os.replace(temporary.path, final.path)
                written.append((name, table.num_rows, ranges))
            return written

        def on_write_complete(self, result) -> None:  # result.num_rows: the rows that reached the write tasks
            written = [file for returned in result.write_returns for file in returned]
            if not result.num_rows and not self.target.parts:
                raise self.empty
            self.rows = self.target.commit(written, command=self.command, rows=self.expected if self.expected
                                           is not None else result.num_rows + sum(p.rows for p in
                                                                                  self.target.parts.values()))

        def on_write_failed(self, error: Exception) -> None:
            pass  # the command decides: a resumable failure keeps the parts (OutputFolder.failed)

    return ParquetParts
