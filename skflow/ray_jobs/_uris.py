"""Object-store URIs (``s3://``, ``gs://``, ``abfs://``, ``hf://``, ...) for the Ray commands' inputs and outputs.

A path with a scheme (``scheme://...``) is opened with pyarrow's filesystem
for it (:meth:`pyarrow.fs.FileSystem.from_uri`: S3, GCS, Azure, HDFS), else
with fsspec's (``hf://``, ``memory://``, or any scheme an installed fsspec
package registers), wrapped as a pyarrow filesystem; ``file://`` is a local
path. The driver checks and Ray Data's readers and writer use the same
filesystem object, so both see the same files.

Credentials come from the environment the filesystem reads (for S3:
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, instance
roles; ``AWS_ENDPOINT_URL`` for another endpoint, which pyarrow 26 reads in
``from_uri`` but not in a bare ``S3FileSystem()``, hence ``from_uri`` here;
``AWS_REGION``), never
from the command line: a URI holding a user or password (``s3://KEY:SECRET@bucket``)
or a query string (pyarrow reads ``?secret_key=...`` from it) is refused,
and the refusal does not repeat it. Every message built from a filesystem
error goes through :func:`scrub`, which masks the values of the credential
variables set in the environment.
"""

import functools
import os
import re
from typing import NamedTuple

_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)$", re.DOTALL)
_S3_BUCKET = re.compile(r"^(?=.{3,63}$)[a-z0-9][a-z0-9.-]*[a-z0-9]$")
_SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AZURE_STORAGE_KEY",
                     "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_CLIENT_SECRET", "HF_TOKEN",
                     "HUGGING_FACE_HUB_TOKEN", "GOOGLE_API_KEY")
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")
_PASSWORD = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*:[^/@\s]*@")
_USER_IS_CONTAINER = ("abfs", "abfss", "az")  # abfs://container@account.dfs.core.windows.net/path


class Remote(NamedTuple):
    """A location on a filesystem opened from a URI: the filesystem, the path in it, and the URI to show."""

    filesystem: object  # pyarrow.fs.FileSystem
    path: str  # in the filesystem's terms: ``bucket/key``, no trailing slash
    uri: str  # ``scheme://bucket/key``, no trailing slash: how messages name it and how locations are compared

    def child(self, name: str) -> "Remote":
        return Remote(self.filesystem, f"{self.path}/{name}", f"{self.uri}/{name}")

    @property
    def parent(self) -> "Remote":
        return Remote(self.filesystem, self.path.rsplit("/", 1)[0], self.uri.rsplit("/", 1)[0])

    @property
    def name(self) -> str:
        return self.uri.rsplit("/", 1)[-1]


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


def is_uri(item) -> bool:
    """Whether ``item`` is a ``scheme://`` string (``file://`` included)."""
    return isinstance(item, str) and _SCHEME.match(item) is not None


def local_path(item):
    """A ``file://`` URI as a local path; anything else unchanged."""
    if isinstance(item, str) and item.lower().startswith("file://"):
        return item[len("file://"):]
    return item


def is_remote(item) -> bool:
    """Whether ``item`` names a location that is not a local path (a URI other than ``file://``)."""
    return is_uri(item) and not item.lower().startswith("file://")


def _shown(uri: str) -> str:
    """A URI as messages may show it: no user information, no query string."""
    uri = uri.split("?", 1)[0].split("#", 1)[0]
    return _PASSWORD.sub(r"\g<scheme>***@", uri) if uri.lower().startswith(_USER_IS_CONTAINER) else \
        _USERINFO.sub(r"\g<scheme>***@", uri)


def resolve(uri: str, error: type[Exception] = ValueError) -> Remote:
    """The filesystem and path of ``uri``; ``error`` (one line, no credentials) if it cannot be used.

    Raises
    ------
    error
        The URI holds credentials or a query string, an S3 bucket name is not
        valid, no filesystem knows the scheme, or opening it failed.
    """
    match = _SCHEME.match(uri)
    scheme, rest = match["scheme"].lower(), match["rest"]
    shown = _shown(uri)
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
    try:
        filesystem, path = _open(scheme, authority, f"{scheme}://{rest}")
    except KeyError:
        raise error(f"{shown}: unknown scheme {scheme!r}; skflow reads local paths and the URIs that pyarrow or an "
                    "installed fsspec package opens (s3://, gs://, abfs://, hf://, ...)") from None
    except Exception as exc:  # noqa: BLE001 - a filesystem that cannot start (credentials, a package) is one line
        raise error(f"{shown}: cannot be opened ({type(exc).__name__}: {one_line(exc)})") from None
    return Remote(filesystem, path.rstrip("/"), f"{scheme}://{rest}")


@functools.lru_cache(maxsize=64)
def _root(scheme: str, authority: str, variables: tuple):
    """The filesystem of ``scheme://authority/`` and the path of that root in it, once per credential environment.

    Cached: pyarrow's S3 asks the store for the bucket's region when AWS_REGION is not set.
    """
    filesystem, path = _from_uri(f"{scheme}://{authority}/")
    return filesystem, path.rstrip("/")


def _open(scheme: str, authority: str, uri: str):
    filesystem, root = _root(scheme, authority, _environment())
    key = uri.split("://", 1)[1][len(authority):].strip("/")
    return filesystem, f"{root}/{key}" if key else root


def _from_uri(uri: str):
    """pyarrow's filesystem for ``uri``, else fsspec's; KeyError if neither knows the scheme."""
    import pyarrow as pa
    import pyarrow.fs as pafs

    try:
        return pafs.FileSystem.from_uri(uri)
    except pa.ArrowInvalid as exc:
        if "Unrecognized filesystem type" not in str(exc):
            raise
    import fsspec

    scheme = uri.split("://", 1)[0]
    try:
        fsspec.get_filesystem_class(scheme)
    except ValueError:
        raise KeyError(scheme) from None
    filesystem, path = fsspec.core.url_to_fs(uri)
    return pafs.PyFileSystem(pafs.FSSpecHandler(filesystem)), path


def _environment() -> tuple:
    """The variables a filesystem reads when it starts: a change of them gives a new filesystem."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(("AWS_", "AZURE_", "GOOGLE_", "HF_"))))


# --------------------------------------------------------------------------------------- inspecting
def file_type(remote: Remote, error: type[Exception] = ValueError) -> str:
    """``"file"``, ``"folder"`` or ``"missing"``; ``error`` naming the URI if the store refuses or fails."""
    import pyarrow.fs as pafs

    try:
        info = remote.filesystem.get_file_info(remote.path)
    except Exception as exc:  # noqa: BLE001 - access denied, a network error: one line
        raise error(f"{remote.uri}: cannot be read ({one_line(exc)}){_hint(exc)}") from None
    if info.type == pafs.FileType.File:
        return "file"
    if info.type == pafs.FileType.Directory:
        return "folder"
    return "missing"


def _hint(exc: BaseException) -> str:
    if "ACCESS_DENIED" in str(exc) or "AccessDenied" in str(exc) or "403" in str(exc):
        return "; check the credentials in the environment (AWS_ACCESS_KEY_ID, AWS_PROFILE, ...) and the permissions"
    return ""


def no_bucket(remote: Remote, error: type[Exception] = ValueError) -> Exception | None:
    """The error to raise if the bucket (or container) of ``remote`` does not exist, else None."""
    top = remote.path.lstrip("/").split("/", 1)[0]
    if remote.path.strip("/") != top and file_type(Remote(remote.filesystem, top, top), error) == "missing":
        return error(f"{remote.uri}: no such bucket {top!r} (or no access to it)")
    return None


def missing(remote: Remote, error: type[Exception] = ValueError) -> Exception:
    """The error for a location that does not exist: its bucket (or container) if that is what is missing."""
    return no_bucket(remote, error) or error(f"{remote.uri}: no such file or folder")


def children(remote: Remote) -> list[str]:
    """The names directly under ``remote`` (files and folders)."""
    import pyarrow.fs as pafs

    infos = remote.filesystem.get_file_info(pafs.FileSelector(remote.path, allow_not_found=True))
    return [info.base_name for info in infos]


def list_files(remote: Remote, error: type[Exception] = ValueError) -> list[tuple[str, int]]:
    """Every file under ``remote``: ``(path relative to it, size)``, sorted (folder placeholders left out)."""
    import pyarrow.fs as pafs

    try:
        infos = remote.filesystem.get_file_info(pafs.FileSelector(remote.path, recursive=True, allow_not_found=True))
    except Exception as exc:  # noqa: BLE001
        raise error(f"{remote.uri}: cannot be listed ({one_line(exc)}){_hint(exc)}") from None
    start = len(remote.path) + 1
    return sorted((info.path[start:], info.size) for info in infos if info.type == pafs.FileType.File)


def contains(outer: str, inner: str) -> bool:
    """Whether the location ``inner`` is ``outer`` or lies under it (both canonical URIs)."""
    return inner == outer or inner.startswith(outer + "/")


# ------------------------------------------------------------------------------------------ writing
def write_bytes(remote: Remote, data: bytes) -> None:
    """Write ``data`` as the object ``remote``: one upload, which a reader sees whole or not at all."""
    with remote.filesystem.open_output_stream(remote.path) as stream:
        stream.write(data)


def read_bytes(remote: Remote) -> bytes:
    with remote.filesystem.open_input_stream(remote.path) as stream:
        return stream.read()


def delete(remote: Remote, *, folder: bool = False) -> None:
    """Delete a file (or, with ``folder``, everything under a prefix); a missing one is no error."""
    try:
        if folder:
            remote.filesystem.delete_dir(remote.path)
        else:
            remote.filesystem.delete_file(remote.path)
    except FileNotFoundError:
        pass


def prove_writable(folder: Remote, error: type[Exception] = ValueError) -> None:
    """Write and delete a hidden object in ``folder``: ``error`` naming it if the store refuses."""
    import secrets

    probe = folder.child(f".skflow-probe-{secrets.token_hex(8)}")
    try:
        write_bytes(probe, b"")
        delete(probe)
    except Exception as exc:  # noqa: BLE001 - no bucket, access denied, bad credentials: one line
        raise error(f"{folder.uri}: cannot be written ({one_line(exc)}){_hint(exc)}") from None
