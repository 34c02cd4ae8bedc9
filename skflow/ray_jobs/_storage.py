"""One ``pyarrow.fs`` layer for local paths and URIs (pyarrow's filesystems, else fsspec's). Credentials come from
the environment only: a URI holding them is refused without repeating it; messages from a store are scrubbed."""

import functools
import os
import re
import secrets
from pathlib import Path
from typing import NamedTuple

from skflow.utils import OutputPathError, UnreadableFileError, check_name, open_regular_file, printable, read_at_most

_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)$", re.DOTALL)
_S3_BUCKET = re.compile(r"^(?=.{3,63}$)[a-z0-9][a-z0-9.-]*[a-z0-9]$")
_SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AZURE_STORAGE_KEY",
                     "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_CLIENT_SECRET", "HF_TOKEN",
                     "HUGGING_FACE_HUB_TOKEN", "GOOGLE_API_KEY")
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")
_PASSWORD = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*:[^/@\s]*@")
_USER_IS_CONTAINER = ("abfs", "abfss", "az")  # abfs://container@account.dfs.core.windows.net/path
_VARIABLES = ("AWS_", "AZURE_", "GOOGLE_", "HF_")  # what a filesystem reads when it starts
_UNREADABLE_PARTS = ("", ".", "..")  # pyarrow cannot open a key with such a part (it normalises the path)


class Location(NamedTuple):
    """A file or folder: its filesystem, its path there, how messages name it, and what comparisons use."""

    filesystem: object  # pyarrow.fs.FileSystem
    path: str  # in the filesystem's terms: an absolute local path, or ``bucket/key``
    shown: str  # the local path as given (``~`` expanded), or the URI, without a trailing slash
    key: str  # the local real path (links resolved), or the URI: equal for the same file

    @property
    def is_remote(self) -> bool:
        return "://" in self.key

    def child(self, name: str) -> "Location":
        return Location(self.filesystem, f"{self.path}/{name}", f"{self.shown.rstrip('/')}/{name}",
                        f"{self.key.rstrip('/')}/{name}")

    @property
    def parent(self) -> "Location":
        return Location(self.filesystem, *(os.path.dirname(part) or "." for part in self[1:]))


def scrub(text: str) -> str:
    """``text`` with the value of every credential variable of the environment, and any ``user:pass@``, masked."""
    text = _PASSWORD.sub(r"\g<scheme>***@", str(text))
    for variable in _SECRET_VARIABLES:
        value = os.environ.get(variable, "")
        if len(value) >= 4:
            text = text.replace(value, "***")
    return text


def one_line(exc: BaseException) -> str:
    """An exception's message on one line, credentials masked."""
    return scrub(" ".join(str(exc).split()))


def is_remote(item) -> bool:
    """Whether ``item`` names a location that is not a local path (a URI other than ``file://``)."""
    return isinstance(item, str) and _SCHEME.match(item) is not None and not item.lower().startswith("file://")


def locate(item, error: type[Exception] = ValueError) -> Location:
    """The :class:`Location` of a local path or URI; ``error`` (one line, no credentials) if it cannot be used."""
    item = os.fspath(item)
    if item.lower().startswith("file://"):
        item = item[len("file://"):]
    match = _SCHEME.match(item)
    if match is None:
        import pyarrow.fs as pafs

        shown = str(Path(item).expanduser())
        return Location(pafs.LocalFileSystem(), os.path.abspath(shown), shown, os.path.realpath(shown))
    scheme, rest = match["scheme"].lower(), match["rest"]
    uri = item.split("?", 1)[0].split("#", 1)[0]
    shown = (_PASSWORD if scheme in _USER_IS_CONTAINER else _USERINFO).sub(r"\g<scheme>***@", uri)
    authority = rest.split("/", 1)[0]
    user, at, _ = authority.rpartition("@")
    if at and (scheme not in _USER_IS_CONTAINER or ":" in user):
        raise error(f"{shown}: a URI must not hold credentials; skflow reads them from the environment "
                    "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ...)")
    if "?" in rest or "#" in rest:
        raise error(f"{shown}: a URI with a query string or fragment is not accepted; set options such as the "
                    "region or endpoint in the environment (AWS_REGION, AWS_ENDPOINT_URL)")
    rest = rest.rstrip("/")
    if not authority:
        raise error(f"{shown}: no bucket or host in the URI")
    if scheme in ("s3", "s3a") and not _S3_BUCKET.match(authority):
        raise error(f"{shown}: {authority!r} is not a valid S3 bucket name (3 to 63 lowercase letters, digits, dots "
                    "and hyphens)")
    key = rest[len(authority) + 1:]
    if key and any(part in _UNREADABLE_PARTS for part in key.split("/")):
        raise error(f"{printable(shown)}: a part of the key is empty, '.' or '..', which cannot be read back")
    try:
        variables = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_VARIABLES)))
        filesystem, root = _root(scheme, authority, variables)  # a new filesystem when the variables change
    except KeyError:
        raise error(f"{shown}: unknown scheme {scheme!r}; skflow reads local paths and the URIs that pyarrow or an "
                    "installed fsspec package opens (s3://, gs://, abfs://, hf://, ...)") from None
    except Exception as exc:  # noqa: BLE001 - a filesystem that cannot start (credentials, a package) is one line
        raise error(f"{shown}: cannot be opened ({type(exc).__name__}: {one_line(exc)})") from None
    uri = f"{scheme}://{rest}"
    return Location(filesystem, f"{root}/{key}" if key else root, uri, uri)


@functools.lru_cache(maxsize=64)  # pyarrow's S3 asks the store for the region
def _root(scheme: str, authority: str, variables: tuple):
    import pyarrow as pa
    import pyarrow.fs as pafs

    uri = f"{scheme}://{authority}/"
    try:
        filesystem, path = pafs.FileSystem.from_uri(uri)
    except pa.ArrowInvalid as exc:
        if "Unrecognized filesystem type" not in str(exc):
            raise
        import fsspec

        try:
            native, path = fsspec.core.url_to_fs(uri)
        except ValueError:  # "Protocol not known"
            raise KeyError(scheme) from None
        filesystem = pafs.PyFileSystem(pafs.FSSpecHandler(native))
    return filesystem, path.rstrip("/")


def _hint(exc: BaseException) -> str:
    if any(word in str(exc) for word in ("ACCESS_DENIED", "AccessDenied", "403")):
        return "; check the credentials in the environment (AWS_ACCESS_KEY_ID, AWS_PROFILE, ...) and the permissions"
    return ""


def file_type(where: Location, error: type[Exception] = ValueError, *, must_exist: bool = False) -> str:
    """``"file"``, ``"folder"``, ``"missing"`` or ``"other"`` (a FIFO, a device); ``error`` if the store fails, if
    the bucket (or container) is missing, or (``must_exist``) for the last two."""
    import pyarrow.fs as pafs

    try:
        info = where.filesystem.get_file_info(where.path)
    except Exception as exc:  # noqa: BLE001 - access denied, a network error: one line
        raise error(f"{where.shown}: cannot be read ({one_line(exc)}){_hint(exc)}") from None
    kind = {pafs.FileType.File: "file", pafs.FileType.Directory: "folder",
            pafs.FileType.NotFound: "missing"}.get(info.type, "other")
    bucket = where._replace(path=where.path.split("/", 1)[0])
    if kind == "missing" and where.is_remote and bucket != where and file_type(bucket, error) == kind:
        raise error(f"{where.shown}: no such bucket {bucket.path!r} (or no access to it)")
    if must_exist and kind == "missing":
        raise error(f"{where.shown}: no such file or folder")
    if must_exist and kind == "other":
        raise error(f"{where.shown}: not a regular file")
    return kind


def list_files(folder: Location, error: type[Exception] = ValueError) -> list[tuple[str, tuple | bool]]:
    """Every entry under ``folder`` but folders, sorted: ``(path relative to it, stamp)``, the stamp of a regular
    file its ``(size, modification time in ns)`` as listed, False for anything else."""
    import pyarrow.fs as pafs

    try:
        infos = folder.filesystem.get_file_info(pafs.FileSelector(folder.path, recursive=True, allow_not_found=True))
        start = len(folder.path.rstrip("/")) + 1
        return sorted((info.path[start:], stamp(info)) for info in infos if info.type != pafs.FileType.Directory)
    except UnicodeDecodeError as exc:  # a local name that is not UTF-8: the bytes of its path, in pyarrow's error
        check_name(folder.shown + os.fsdecode(exc.object)[len(folder.path):], error)
        raise error(f"{folder.shown}: cannot be listed (a name in it is not valid UTF-8)") from None
    except Exception as exc:  # noqa: BLE001
        raise error(f"{folder.shown}: cannot be listed ({one_line(exc)}){_hint(exc)}") from None


def stamp(info) -> tuple | bool:
    """A listed file's ``(size, modification time in ns)``; False if it is not a regular file."""
    import pyarrow.fs as pafs

    return info.type == pafs.FileType.File and (info.size, info.mtime_ns)


def check_writable(folder: Location, what: str) -> None:
    """A hidden file written into ``folder`` and deleted: OutputPathError naming it if that fails."""
    probe = folder.child(f".skflow-probe-{secrets.token_hex(8)}")
    try:
        write_bytes(probe, b"")
        folder.filesystem.delete_file(probe.path)
    except Exception as exc:  # noqa: BLE001 - no bucket, access denied, a read-only disk: one line
        reason = os.strerror(exc.errno) if getattr(exc, "errno", None) else one_line(exc)  # not the probe's name
        raise OutputPathError(f"{folder.shown}: {what} cannot be written ({reason}){_hint(exc)}") from None


def write_bytes(where: Location, data: bytes) -> None:
    """One call into Arrow: on object storage, one object, whole."""
    with where.filesystem.open_output_stream(where.path) as stream:
        stream.write(data)


def parquet_metadata(where: Location):
    """A Parquet file's footer; a local file opened by the one reader, so a FIFO or device swapped in since the
    listing is UnreadableFileError, never blocked on."""
    import pyarrow.parquet as pq

    with _random_access(where) as file:
        return pq.read_metadata(file)


def read_parquet(where: Location, columns: list[str] | None = None):
    """A Parquet file's table (its ``columns`` only, if given), read through its footer: only their pages are read,
    opened as :func:`parquet_metadata` opens it."""
    import pyarrow.parquet as pq

    with _random_access(where) as file:
        return pq.read_table(file, columns=columns)


FOOTER_READS = 32  # Parquet footers read at a time: each a round trip to object storage


def in_order(pool, read, items, window: int = 1024):
    """``pool.map(read, items)``, at most ``window`` reads submitted ahead of the caller: a future and its result
    for each of 10**6 files at once would hold gigabytes."""
    for start in range(0, len(items), window):
        yield from pool.map(read, items[start:start + window])


def _random_access(where: Location):
    return where.filesystem.open_input_file(where.path) if where.is_remote else open_regular_file(where.path)


def read_bytes(where: Location, limit: int, compression: str | None = None) -> bytes:
    """A regular file's bytes (decompressed), at most ``limit`` of them, of a file of at most ``limit`` bytes
    (compressed or not); else UnreadableFileError, nothing read. Streamed: a compressed file is never held whole."""
    import pyarrow as pa
    import pyarrow.fs as pafs

    if where.is_remote and (info := where.filesystem.get_file_info(where.path)).type != pafs.FileType.File:
        raise UnreadableFileError("not a regular file")
    if where.is_remote and info.size > limit:
        raise UnreadableFileError(f"larger than {limit:,} bytes")
    with (where.filesystem.open_input_stream(where.path, compression=None) if where.is_remote else
          pa.PythonFile(open_regular_file(where.path, limit), mode="r")) as raw, pa.input_stream(
            raw, compression=compression) as stream:
        return read_at_most(stream, limit)
