"""Where a run folder lives when `--output-dir` is a URI: an object store (s3://, gs://, ...) or any other
filesystem pyarrow or fsspec opens, and the local folder on this node that stages it.

Credentials never appear here: pyarrow and fsspec read them on the node that opens the filesystem, from its
environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL for an S3-compatible store...), `~/.aws` or the instance's
role. A URI carrying a key is refused, since config.yaml and the logs record the URI.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from cluster.models.cache import staging_root
from evaluators.errors import EvalInputError

if TYPE_CHECKING:
    import pyarrow.fs

PYARROW_SCHEMES = frozenset({"s3", "gs", "gcs", "hdfs", "viewfs"})  # the file systems pyarrow opens itself
# `s3:/bucket`, `gs:/b/p`: a scheme of two letters or more (not a drive letter) followed by one slash
SCHEME_ONE_SLASH = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]+):/(?!/)")
URI_INSIDE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s,;'\"]+")  # a URI within a longer value
# query parameters that carry a secret beside those whose name's last word says so (`_secret_query_key`)
SECRET_QUERY_KEYS = frozenset({"code", "x-amz-credential", "x-amz-security-token"})
# the last word of a query parameter's name that says it holds a secret
SECRET_WORDS = frozenset(
    {
        "key",
        "apikey",
        "token",
        "secret",
        "password",
        "passwd",
        "pwd",
        "sig",
        "signature",
        "credential",
        "credentials",
    }
)
# a `*_key` query parameter whose word before `key` names what the key indexes, not a secret (partition_key,
# sort_key, object_key); a bare `key`, `api_key`, `access_key`, `account_key` or Azure's `primary_key` is one
INDEX_KEY_WORDS = frozenset({"partition", "sort", "object", "cache", "routing", "row", "shard", "hash", "lookup",
                             "group", "order", "foreign", "idempotency", "dedup", "range"})  # fmt: skip
# where an s3:// URI's store is named outside it: the environment pyarrow's S3 reads, first match wins
S3_ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


def may_carry_credentials(value: str) -> bool:
    """Whether a value is URI-shaped enough for `credentials_in` to look at (`s3://...`, or `s3:/...` with
    one slash missing)."""
    return "://" in value or SCHEME_ONE_SLASH.match(value) is not None


def credentials_in(uri: str) -> str | None:
    """Where a URI carries a credential (USER:PASSWORD@ or a secret query key), named without its value;
    None where it carries none."""
    typo = SCHEME_ONE_SLASH.match(uri)  # s3:/KEY:SECRET@bucket reads as a path: look at it as meant
    if typo is not None:
        uri = f"{typo['scheme']}://{uri[typo.end() :]}"
    try:
        parts = urlsplit(uri)
        if parts.password:  # a user alone is no secret (hdfs://user@namenode, ssh://git@host)
            return f"{parts.scheme}://USER:...@..."
    except ValueError:  # not a URI urllib can read (an unclosed IPv6 bracket): its own check says what
        scheme, _, rest = uri.partition("://")
        userinfo, at, _ = rest.split("/", 1)[0].rpartition("@")
        return f"{scheme}://USER:...@..." if at and ":" in userinfo else None
    return _secret_query(parts.query)


def credentials_anywhere(text: str) -> str | None:
    """`credentials_in` for every URI inside `text` (`mlflow:https://USER:PASS@host`, `a=s3://K:S@b`), and
    the query of one without a scheme (`host:8000/v1?api_key=...`): the first credential found, named
    without its value; None where there is none."""
    candidates = [text, *URI_INSIDE.findall(text)] if may_carry_credentials(text) else []
    found = next((found for found in map(credentials_in, candidates) if found is not None), None)
    if found is None and "?" in text:
        found = _secret_query(text.partition("?")[2])
    return found


def _secret_query(query: str) -> str | None:
    """The secret keys a URL's query holds, named without their values; None where it holds none."""
    secret = sorted(key for key in parse_qs(query, keep_blank_values=True) if _secret_query_key(key))
    return f"its query's {', '.join(secret)}" if secret else None


def _secret_query_key(name: str) -> bool:
    """A query parameter whose name says it holds a secret: its last word (apart by `_`, `-`, `.` or case) is
    one (api_key, X-Amz-Signature, sessionToken, sig), or it is one of SECRET_QUERY_KEYS. Whole words: an
    `author`, `tokenizer`, `max_tokens`, `authSource` or `sslkey` parameter is none, and so is a key named
    for what it indexes (`partition_key`, INDEX_KEY_WORDS)."""
    words = [word.lower() for word in re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", name)]
    if name.lower() in SECRET_QUERY_KEYS:
        return True
    if len(words) > 1 and words[-1] == "key" and words[-2] in INDEX_KEY_WORDS:
        return False
    return bool(words) and words[-1] in SECRET_WORDS


def without_credentials(uri: str) -> str:
    """`uri` as a message may quote it: a USER:PASSWORD@ part and the values of secret query keys replaced
    by `...`; anything urllib cannot read is not quoted at all."""
    if credentials_in(uri) is None:
        return uri
    try:
        parts = urlsplit(uri)
        host = parts.netloc.rpartition("@")[2]
        query = "&".join(
            f"{key}={'...' if _secret_query_key(key) else value}"
            for key, values in parse_qs(parts.query, keep_blank_values=True).items()
            for value in values
        )
        return parts._replace(netloc=f"...@{host}" if "@" in parts.netloc else host, query=query).geturl()
    except ValueError:
        return f"{uri.partition('://')[0]}://(a URI with a credential)"


def _refuse_credentials(value: str, setting: str) -> None:
    carried = credentials_in(value)
    if carried is not None:
        raise EvalInputError(
            f"{setting}: the URI carries a credential ({carried}), which would be written into the run's "
            "config.yaml and logs; give it the standard way on the node that writes "
            "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, ~/.aws, the instance's role) and leave it out of the URI."
        )


def is_remote(value: str | None) -> bool:
    """Whether an --output-dir names a folder by URI other than a local file:// path."""
    if not value or "://" not in value:
        return False
    return value.partition("://")[0].lower() not in ("", "file")


def local_path(value: str) -> Path:
    """A local --output-dir as a path: `file:///abs/path` is `/abs/path`, `~` expanded."""
    if "://" in value and urlsplit(value).scheme.lower() == "file":
        return Path(urlsplit(value).path)
    return Path(value).expanduser()


def output_location(value: str, setting: str = "--output-dir") -> str:
    """An --output-dir as the run records it: a store's URI checked (its scheme in lower case), a local
    path as given; a URI missing a slash or a file:// URI naming a host is refused, as either would write
    somewhere other than meant (a local folder named `s3:`, or the host dropped)."""
    if is_remote(value):
        return RemoteFolder.parse(value, setting).uri
    _refuse_credentials(value, setting)  # first: the messages below quote the value
    typo = SCHEME_ONE_SLASH.match(value)
    if typo is not None:
        raise EvalInputError(
            f"{setting} {value}: a URI needs two slashes after its scheme ({typo['scheme']}://...); as given it "
            f"would be a local folder named '{typo['scheme']}:'. Write {typo['scheme']}://{value[typo.end() :]}."
        )
    if "://" in value and urlsplit(value).netloc not in ("", "localhost"):
        raise EvalInputError(
            f"{setting} {value}: a file:// URI names a folder on this machine (file:///abs/path); this one names "
            f"the host '{urlsplit(value).netloc}'. Give the path (file:///abs/path, or a plain path)."
        )
    return value


@dataclass(frozen=True)
class RemoteFolder:
    """A folder on a filesystem named by URI (no trailing slash)."""

    uri: str

    @classmethod
    def parse(cls, value: str, setting: str = "--output-dir") -> RemoteFolder:
        _refuse_credentials(value, setting)  # first: no message below may echo one
        try:
            parts = urlsplit(value)
        except ValueError as exc:
            raise EvalInputError(f"{setting} {value}: not a URI ({exc}).") from None
        if not parts.netloc and not parts.path.strip("/"):
            raise EvalInputError(
                f"{setting} {value}: the URI names no bucket or folder. Give one like s3://BUCKET/PREFIX."
            )
        if ".." in parts.path.split("/"):
            raise EvalInputError(f"{setting} {value}: a '..' in the URI's path; give the folder's own path.")
        return cls(parts.scheme.lower() + value[len(parts.scheme) :].rstrip("/"))  # S3:// is s3://

    @property
    def scheme(self) -> str:
        return urlsplit(self.uri).scheme.lower()

    @property
    def name(self) -> str:
        return urlsplit(self.uri).path.rstrip("/").rsplit("/", 1)[-1]

    def child(self, name: str) -> RemoteFolder:
        return self._at(f"{urlsplit(self.uri).path.rstrip('/')}/{name}")

    def sibling(self, name: str) -> RemoteFolder:
        """The folder `name` beside this one (in the same parent folder), on the same store."""
        return self._at(f"{urlsplit(self.uri).path.rstrip('/').rsplit('/', 1)[0]}/{name}")

    def _at(self, path: str) -> RemoteFolder:
        parts = urlsplit(self.uri)
        query = f"?{parts.query}" if parts.query else ""
        return RemoteFolder(f"{parts.scheme}://{parts.netloc}{path}{query}")

    def open(self) -> tuple[pyarrow.fs.FileSystem, str]:
        """The filesystem and this folder's path on it: pyarrow's own (S3, GCS, HDFS, ...) where it knows the
        scheme, else fsspec's (through pyarrow's FSSpecHandler)."""
        import pyarrow
        import pyarrow.fs as pafs

        try:
            filesystem, path = pafs.FileSystem.from_uri(self.uri)
            return filesystem, path.rstrip("/")
        except (pyarrow.ArrowNotImplementedError, pyarrow.ArrowInvalid) as exc:
            if self.scheme in PYARROW_SCHEMES:  # pyarrow's own scheme: the URI's form is what it refused
                raise EvalInputError(
                    f"{self.uri}: pyarrow cannot read this {self.scheme}:// URI ({exc}); write it as "
                    f"{self.scheme}://BUCKET/PREFIX, with no spaces (percent-encode them)."
                ) from None
            arrow_problem = str(exc)  # a scheme pyarrow lacks: fsspec may have it
        except OSError as exc:
            raise EvalInputError(f"--output-dir {self.uri}: {exc}") from None
        return _fsspec_filesystem(self.uri, arrow_problem)

    @property
    def staging(self) -> Path:
        """The folder on this node that holds this folder's files while a run writes them or a command reads
        them: under `staging_root()`, at the URI's own path (so a run folder keeps its name, the run id); a
        URI with a query (an endpoint override...) gets a folder of its own, and so does the store an s3:// URI
        reaches through AWS_ENDPOINT_URL: two stores with the same bucket and prefix never share a folder,
        whose journal a pull would merge with the other store's."""
        parts = urlsplit(self.uri)
        base = staging_root() / parts.scheme.lower()
        if parts.query:
            base = base / f"query-{_digest(parts.query)}"
        endpoint = _endpoint_from_environment(parts.scheme.lower(), parts.query)
        if endpoint:
            base = base / f"endpoint-{_digest(endpoint.rstrip('/'))}"
        return base.joinpath(parts.netloc or "_", *[p for p in parts.path.split("/") if p])


def _digest(text: str) -> str:
    """A short name for a folder that stands for `text` (an endpoint or query may hold any character)."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _endpoint_from_environment(scheme: str, query: str) -> str | None:
    """The S3 endpoint this node's environment names for an s3:// URI that names none itself."""
    if scheme != "s3" or "endpoint_override" in parse_qs(query):
        return None
    return next((os.environ[name] for name in S3_ENDPOINT_ENV if os.environ.get(name)), None)


def _fsspec_filesystem(uri: str, arrow_problem: str) -> tuple[pyarrow.fs.FileSystem, str]:
    import fsspec
    import pyarrow.fs as pafs

    try:
        filesystem, path = fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as exc:
        raise EvalInputError(
            f"{uri}: neither pyarrow nor fsspec can open this URI (pyarrow: {arrow_problem}; fsspec: {exc}). "
            "pyarrow opens s3://, gs:// and hdfs://; fsspec opens others once their package is installed "
            "(e.g. adlfs for az://)."
        ) from None
    except OSError as exc:  # fsspec's file systems that connect when made (ftp://, sftp://)
        raise EvalInputError(
            f"{uri}: fsspec could not reach it ({type(exc).__name__}: {exc}). Check the host in the URI, "
            "or give a local folder or an object store's URI (s3://, gs://)."
        ) from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(filesystem)), str(path).rstrip("/")
