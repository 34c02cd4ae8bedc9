"""What the driver makes of a failed Ray job: the error a worker raised, and when the files are read to name one."""

import pytest

from skflow.ray_jobs import InputError, RowChecks, bad_remote_file, raised_error
from skflow.ray_jobs._corpus import Corpus

RAY_TEXT = (
    "\x1b[36mray::MapWorker(MapBatches(_EmbedBatches))\x1b[39m (pid=4242, ip=10.0.0.1)\n"
    "ray.exceptions.UserCodeException: UDF failed to process a data block.\n"
    "Traceback (most recent call last):\n"
    '  File "skflow/distributed.py", line 97, in __call__\n'
    "skflow.ray_jobs._corpus_files.InputError: s3://b/x.parquet: row 3 of column 'text' is empty (null), not a string\n"
)


def test_the_last_error_a_worker_raised_is_found_in_rays_text_without_rays_wrappers():
    assert raised_error(RuntimeError(RAY_TEXT)) == (
        "skflow.ray_jobs._corpus_files.InputError",
        "s3://b/x.parquet: row 3 of column 'text' is empty (null), not a string",
    )
    assert raised_error(ValueError("no traceback here\nsecond line")) == ("ValueError", "no traceback here")


class _Scanned(RowChecks):
    def find_the_bad_file(self) -> None:
        self.scans.append(1)
        raise InputError("s3://b/x.parquet: cannot be read as Parquet (damaged page)")


@pytest.mark.parametrize(
    ("raised", "scanned"),
    [("OSError", True), ("pyarrow.lib.ArrowInvalid", True), ("RuntimeError", False), ("ValueError", False)],
)
def test_the_remote_files_are_read_to_name_one_only_after_an_error_of_reading(raised, scanned):
    checks = _Scanned(Corpus(("s3://b/x.parquet",), "parquet", (None,)), "embedding", vectors=True)
    object.__setattr__(checks, "scans", [])
    found = bad_remote_file(checks, raised)
    assert checks.scans == ([1] if scanned else [])  # an encoder that breaks never downloads the corpus
    assert (str(found) if found else None) == ("s3://b/x.parquet: cannot be read as Parquet (damaged page)"
                                               if scanned else None)
    assert bad_remote_file(None, "OSError") is None  # local files: the driver read them all already
