"""Ray Data reads that give exactly the rows the driver's checks counted, and vector columns.

Each format is read with the driver's parser: pyarrow's through Ray's readers, text files whole and split by
:func:`~skflow.ray_jobs._corpus.text_rows` (Ray's ``read_text`` splits at every Unicode line break). Each file's
compression is given (Ray infers it from lower-case extensions only), and its store's filesystem: one read per
store and compression, then their union.
"""

import numpy as np

from skflow.ray_jobs._corpus import Corpus, InputError, csv_convert_options, file_format, text_rows
from skflow.ray_jobs._storage import locate


def _text_batch(batch):
    import pyarrow as pa

    texts = []
    for data, path in zip(batch.column("bytes").to_pylist(), batch.column("path").to_pylist()):
        texts += text_rows(data, path)
    return pa.table({"text": pa.array(texts, pa.string())})


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
        stream = {"compression": compression}
        where = {"file_extensions": None, "filesystem": filesystem}
        if corpus.kind == "parquet":
            dataset = ray.data.read_parquet(files, **where)
        elif corpus.kind == "csv":
            dataset = ray.data.read_csv(files, **where, arrow_open_stream_args=stream,
                                        convert_options=csv_convert_options(text_column))
        elif corpus.kind == "json":  # lines=False: pyarrow's reader (JSON lines), as on the driver
            dataset = ray.data.read_json(files, **where, arrow_open_stream_args=stream)
        else:
            dataset = ray.data.read_binary_files(files, include_paths=True, filesystem=filesystem,
                                                 arrow_open_stream_args=stream)
            dataset = dataset.map_batches(_text_batch, batch_format="pyarrow", batch_size=1)
        datasets.append(dataset)
    return datasets[0].union(*datasets[1:]) if len(datasets) > 1 else datasets[0]


def vectors_column(vectors: np.ndarray):
    """An ``(n, d)`` array as a fixed-length float32 list column."""
    import pyarrow as pa

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1])


def vectors_array(values) -> np.ndarray:
    """A list column of equal-length vectors as an ``(n, d)`` float32 array."""
    import pyarrow as pa

    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    flat = values.flatten().to_numpy(zero_copy_only=False)
    return np.asarray(flat, dtype=np.float32).reshape(len(values), -1)
