"""Ray Data reads that give exactly the rows the driver's checks counted, and vector columns.

Parquet is read by Ray's reader, every other file whole by the driver's :func:`~skflow.ray_jobs._corpus.parse`.
Each file's compression is given (Ray infers it from lower-case extensions only) and its store's filesystem: one
read per store and compression, then their union.
"""

import functools

import numpy as np

from skflow.ray_jobs._corpus import Corpus, InputError, file_format, parse
from skflow.ray_jobs._storage import locate


def _parsed(text_column, batch):  # one file a batch
    return parse(batch.column("bytes")[0].as_py(), batch.column("path")[0].as_py(), text_column)


def read_dataset(corpus: Corpus, text_column: str | None = None):
    """A Ray dataset of every row of ``corpus``."""
    import ray

    groups = {}
    for file in corpus.files:
        where, compression = locate(file, InputError), file_format(file)[1]
        store = file.split("/", 3)[:3] if where.is_remote else ""
        filesystem = where.filesystem if where.is_remote else None
        groups.setdefault(str((store, compression)), (filesystem, compression, []))[2].append(where.path)
    datasets = []
    for filesystem, compression, files in groups.values():
        if corpus.kind == "parquet":
            datasets.append(ray.data.read_parquet(files, file_extensions=None, filesystem=filesystem))
            continue
        dataset = ray.data.read_binary_files(files, include_paths=True, filesystem=filesystem,
                                             arrow_open_stream_args={"compression": compression})
        datasets.append(dataset.map_batches(functools.partial(_parsed, text_column), batch_format="pyarrow",
                                            batch_size=1))
    return datasets[0].union(*datasets[1:]) if len(datasets) > 1 else datasets[0]


def vectors_column(vectors: np.ndarray):
    """An ``(n, d)`` array as a fixed-length float32 list column."""
    import pyarrow as pa

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1])


def vectors_array(values) -> np.ndarray:
    """A list column of equal-length vectors as an ``(n, d)`` float32 array."""
    import pyarrow.compute as pc

    return np.asarray(pc.list_flatten(values), dtype=np.float32).reshape(len(values), -1)
