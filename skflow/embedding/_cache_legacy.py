"""The notice for folders of the embedding cache's old layout (one ``.npy`` file per text), which is no longer read."""

import contextlib
import os
import re
import stat
import warnings
from pathlib import Path

_LEGACY_SUBFOLDER = re.compile(r"^[0-9a-f]{2}$")
_noticed: set[str] = set()


def notice_legacy_layout(folder: Path, store_name: str) -> None:
    """Warn once per folder and process when ``folder`` holds subfolders of the one-file-per-text layout."""
    if str(folder) in _noticed:
        return
    with contextlib.suppress(OSError):
        if stat.S_ISLNK(os.lstat(folder).st_mode):
            return
        with os.scandir(folder) as entries:  # a few entries: key.json, the store and its -wal, -shm
            old = [e.name for e in entries if _LEGACY_SUBFOLDER.match(e.name) and e.is_dir(follow_symlinks=False)]
        if old:
            _noticed.add(str(folder))
            warnings.warn(
                f"skflow: {folder} holds {len(old)} folders of the old one-file-per-text embedding cache, "
                f"which is no longer read (its texts are encoded again once, into {store_name}); "
                f"delete {folder / '??'} to free their space.",
                UserWarning,
                stacklevel=3,
            )
