"""Downloading a data set (STS, BEIR): each archive from its sources in turn, verified, moved into place atomically.

Every archive lists its sources, https first: the organisers' site, then a
copy of the same archive in the Internet Archive. A source whose archive is
unreachable, unreadable or does not hold files with the expected sha256 is
skipped for the next. SICK also has a release on Zenodo in another format,
used only when every source of the SemEval files fails (see `zenodo_sick`).
The files are staged in a hidden folder beside the set's and renamed into
place (:func:`skflow.utils.temporary_sibling`); a download killed at any point
leaves only that staging folder, which the next download removes once its
process is gone. A set checked by its content rather than by checksums (BEIR's,
whose published bytes are not pinned) passes a ``check`` of the extracted
folder, which refuses a source the way a wrong sha256 does.
"""

import hashlib
import io
import lzma
import os
import shutil
import tarfile
import urllib.request
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from skflow.datasets._files import SICK_HEADER
from skflow.utils import temporary_sibling

MAX_ARCHIVE_BYTES = 256 << 20
T = TypeVar("T")


@dataclass(frozen=True)
class Archive:
    urls: tuple[str, ...]  # sources of the same bytes, tried in order
    inner: str  # folder inside the archive holding the files
    rename: tuple[tuple[str, str], ...] = ()  # (prefix in archive, prefix on disk)


def mirrored(url: str) -> tuple[str, ...]:
    """An organisers' URL (http), its https form, and the Internet Archive's copy of the original bytes."""
    plain = url.replace("https://", "http://", 1)
    secure = plain.replace("http://", "https://", 1).replace("ixa2.si.ehu.es/", "ixa2.si.ehu.eus/", 1)
    return secure, plain, f"https://web.archive.org/web/2020id_/{plain}"


def download(
    folder: str,
    archives: tuple[Archive, ...],
    expected: dict[str, str | None],
    home: Path,
    fallback: Callable[[Path], None] | None = None,
    check: Callable[[Path], None] | None = None,
) -> None:
    """Fetch, check and move a set's files (``expected``: path in the folder -> sha256 or None) into ``home/folder``.

    Nothing is left in ``home/folder`` unless every file is there and verified.
    ``check(folder)`` (a ValueError if the files are wrong) runs on each
    source's extracted files, after their sha256.
    """
    home.mkdir(parents=True, exist_ok=True)
    target = home / folder
    with temporary_sibling(target, folder=True) as staging_root:
        staging = staging_root / folder
        staging.mkdir()
        try:
            for archive in archives:
                _fetch_archive(archive, expected, staging, check)
        except DownloadError:
            if fallback is None:
                raise
            shutil.rmtree(staging)
            staging.mkdir()
            fallback(staging)
        missing = [name for name in expected if not (staging / name).is_file()]
        if missing:
            raise DownloadError(f"the downloaded archives do not contain {', '.join(missing)}")
        if not target.exists():
            os.replace(staging, target)  # atomic: the folder appears complete or not at all
            return
        for path in sorted(staging.rglob("*")):  # a partial folder: fill it file by file, each atomically
            if path.is_file():
                (target / path.relative_to(staging)).parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target / path.relative_to(staging))


class DownloadError(OSError):
    """Every source of an archive failed; the message says why for each."""


def _from_first_source(urls: tuple[str, ...], attempt: Callable[[str], T]) -> T:
    """``attempt(url)`` for each source in turn until one works; DownloadError with every reason if none does."""
    reasons = []
    for url in urls:
        try:
            return attempt(url)
        except (OSError, ValueError, StopIteration, zipfile.BadZipFile, tarfile.TarError) as exc:
            reasons.append(f"{url}: {type(exc).__name__}: {exc}")
    raise DownloadError("; ".join(reasons))


def _fetch_archive(
    archive: Archive, expected: dict[str, str | None], staging: Path, check: Callable[[Path], None] | None = None
) -> None:
    """The archive's files, from its first source whose files all have the expected sha256 (and pass ``check``),
    into ``staging``."""

    def attempt(url: str) -> None:
        folder = staging.parent / "attempt"
        try:
            folder.mkdir()
            _extract(fetch(url), archive, folder, expected)
            for path in folder.rglob("*"):
                name = path.relative_to(folder).as_posix()
                if path.is_file() and expected.get(name) is not None and (digest := _sha256(path)) != expected[name]:
                    raise ValueError(f"{name} has sha256 {digest}, expected {expected[name]}")
            if check is not None:
                check(folder)
            for path in folder.iterdir():
                os.replace(path, staging / path.name)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    _from_first_source(archive.urls, attempt)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch(url: str) -> bytes:
    """The body at ``url``, at most MAX_ARCHIVE_BYTES."""
    with urllib.request.urlopen(url, timeout=60) as response:
        data = response.read(MAX_ARCHIVE_BYTES + 1)
    if len(data) > MAX_ARCHIVE_BYTES:
        raise ValueError(f"larger than {MAX_ARCHIVE_BYTES >> 20} MiB: not a data archive")
    return data


def _extract(data: bytes, archive: Archive, out: Path, expected: dict[str, str | None]) -> None:
    """The archive's files directly in its ``inner`` folder (data, readme, licence), renamed, and those of its
    subfolders that ``expected`` names (BEIR's ``qrels/test.tsv``)."""
    prefix = f"{archive.inner}/" if archive.inner else ""
    if zipfile.is_zipfile(io.BytesIO(data)):
        zf = zipfile.ZipFile(io.BytesIO(data))
        members = [(m.filename, m.file_size, lambda m=m: zf.read(m)) for m in zf.infolist() if not m.is_dir()]
    else:
        tf = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
        members = [(m.name, m.size, lambda m=m: tf.extractfile(m).read()) for m in tf.getmembers() if m.isfile()]
    unpacked = 0
    for member_name, size, read in members:
        if not member_name.startswith(prefix):
            continue
        relative = member_name[len(prefix) :]
        nested = relative in expected and "/" in relative  # one of our own names: never ``..``, never absolute
        if not relative or ("/" in relative and not nested) or relative.startswith("."):
            continue  # only the files directly in the data folder; never write outside ``out``
        if size > MAX_ARCHIVE_BYTES:  # as declared in the archive, which the readers hold it to
            raise ValueError(f"{member_name} is larger than {MAX_ARCHIVE_BYTES >> 20} MiB unpacked")
        if (unpacked := unpacked + size) > MAX_ARCHIVE_BYTES:  # many members each below the bound: the disk's
            raise ValueError(f"its files are larger than {MAX_ARCHIVE_BYTES >> 20} MiB unpacked (at {member_name})")
        for old, new in archive.rename:
            if relative.startswith(old):
                relative = new + relative[len(old) :]
        try:
            content = read()
        except (RuntimeError, NotImplementedError, EOFError, zlib.error, lzma.LZMAError) as exc:
            # an encrypted member, an unknown compression method, a damaged or cut stream: a bad source, not a bug
            raise ValueError(f"{member_name} cannot be extracted ({exc})") from None
        (out / relative).parent.mkdir(parents=True, exist_ok=True)
        (out / relative).write_bytes(content)


# ------------------------------------------------------------------- Zenodo
ZENODO_SICK_URLS = (
    "https://zenodo.org/records/2787612/files/SICK.zip?download=1",
    "https://web.archive.org/web/2024id_/https://zenodo.org/records/2787612/files/SICK.zip?download=1",
)
# sha256 of SICK.txt in SICK.zip, as found in a public copy of the release
ZENODO_SICK_TXT_SHA256 = "1539c2d059809b5bd40694e26d8121cc85b6b496f91c7b40f2fc83bbd7dcd957"
_ZENODO_SPLITS = {"TRAIN": "SICK_train.txt", "TRIAL": "SICK_trial.txt", "TEST": "SICK_test_annotated.txt"}


def zenodo_sick(staging: Path) -> None:
    """The three SemEval files rebuilt from the SICK release on Zenodo (its ``SemEval_set`` column).

    That release holds 9,840 pairs, not the 9,927 of the SemEval 2014 files
    (test: 4,906 pairs, not 4,927), so `load_sts` flags data from it.
    """
    def attempt(url: str) -> bytes:
        with zipfile.ZipFile(io.BytesIO(fetch(url))) as zf:
            data = zf.read(next(n for n in zf.namelist() if n.rsplit("/", 1)[-1] == "SICK.txt"))
        digest = hashlib.sha256(data).hexdigest()
        if digest != ZENODO_SICK_TXT_SHA256:
            raise ValueError(f"SICK.txt has sha256 {digest}, expected {ZENODO_SICK_TXT_SHA256}")
        return data

    data = _from_first_source(ZENODO_SICK_URLS, attempt)
    for file_name, text in sick_files_from_release(data.decode("utf-8")).items():
        (staging / file_name).write_text(text, encoding="utf-8", newline="")


def sick_files_from_release(text: str) -> dict[str, str]:
    """SICK.txt (all pairs, ``SemEval_set`` column) -> the three SemEval files' texts, ``\\n`` line ends."""
    rows = [line.rstrip("\r").split("\t") for line in text.split("\n") if line.strip()]
    header, rows = rows[0], rows[1:]
    column = {name: i for i, name in enumerate(header)}
    out = {name: [SICK_HEADER] for name in _ZENODO_SPLITS.values()}
    for row in rows:
        values = [row[column[c]] for c in ("pair_ID", "sentence_A", "sentence_B", "relatedness_score")]
        out[_ZENODO_SPLITS[row[column["SemEval_set"]]]].append("\t".join([*values, row[column["entailment_label"]]]))
    return {name: "\n".join(lines) + "\n" for name, lines in out.items()}
