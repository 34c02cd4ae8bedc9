"""Test helpers shared by the STS download tests: in-memory archives and a fake network."""

import io
import urllib.error
import zipfile

from skflow.datasets import _download as _sts_download


def zip_bytes(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buffer.getvalue()


def serve(monkeypatch, archives: dict[str, bytes]) -> list[str]:
    """Answer downloads of these URLs with these bytes, any other URL as unreachable; returns the URLs fetched."""
    fetched = []

    def fetch(url):
        fetched.append(url)
        if url not in archives:
            raise urllib.error.URLError("unreachable in this test")
        return archives[url]

    monkeypatch.setattr(_sts_download, "fetch", fetch)
    return fetched
