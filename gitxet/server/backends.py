"""Server-side object storage: one small interface, a local directory and S3 behind it.

The CAS server keeps three kinds of objects, all immutable once written::

    xorbs/default/<xorb hex>     serialized xorb + CasObjectInfo footer (chunk index)
    shards/<content hex>.shard   upload shards as received (the source of truth for files)
    meta/url-signing.key         the HMAC key for signed data URLs, shared by all replicas

Because objects never change, any number of server processes can share one bucket with no
coordination beyond "write, then register": a reader that misses in its in-memory index
asks the backend (see ``gitxet.server.index``). The backend methods are blocking; the app
calls them from worker threads.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gitxet.errors import BackendError, ConfigError, NotFoundError
from gitxet.util.atomic import (
    STALE_TEMP_SECONDS,
    atomic_create,
    atomic_write,
    remove_stale_temps,
)

__all__ = ["Backend", "LocalBackend", "S3Backend", "open_backend"]

_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$")


def check_key(key: str) -> str:
    """Refuse keys that could escape the storage root (``..``, absolute, odd bytes)."""
    if not _KEY_RE.match(key) or len(key) > 512:
        raise BackendError(key[:80], "invalid object key")
    return key


class ObjectMissingError(NotFoundError):
    """No object under this key."""

    def __init__(self, key: str) -> None:
        super().__init__(f"object {key} not found")
        self.key = key


class Backend(ABC):
    """Immutable-object storage. Every method may raise :class:`BackendError`."""

    #: A short description for logs (never contains credentials).
    description: str = ""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The whole object. Raises :class:`ObjectMissingError`."""

    @abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` (fewer only at the end of the object).

        Raises :class:`ObjectMissingError`.
        """

    @abstractmethod
    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        """The last ``length`` bytes (all of a shorter object) and the object's size.

        Raises :class:`ObjectMissingError`.
        """

    @abstractmethod
    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        """Store ``data`` atomically; readers see the whole object or nothing.

        With ``if_absent`` an existing object is kept and ``False`` returned; this is the
        only operation where two writers of *different* bytes can race.
        """

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether ``key`` holds an object."""

    @abstractmethod
    def list(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        """Keys that start with ``prefix`` (and sort after ``start_after``), in order."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object (missing is fine). Used by tests and maintenance only."""

    def local_path(self, key: str) -> str | None:
        """A filesystem path for ``key`` when the backend has one (fast ranged reads)."""
        return None

    def version(self, prefix: str) -> tuple[float, Hashable] | None:
        """``(when it last changed, token)`` for the keys directly under ``prefix`` (a
        "directory" ending in ``/``): the token changes whenever a key is added there. None
        when the backend cannot tell cheaply (then callers list)."""
        return None

    def remove_stale_temps(self, older_than: float = STALE_TEMP_SECONDS) -> int:
        """Remove what killed writers left (older than any live writer could be); returns
        how many. Run at server start."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


class LocalBackend(Backend):
    """Objects as files under ``root``; writes are temp file + fsync + rename."""

    def __init__(self, root: str, *, durable: bool = True) -> None:
        self.root = os.path.abspath(root)
        self.durable = durable
        self.description = f"local directory {self.root}"
        # temp files of writes go here (keys never start with "."), so a sweep lists one
        # small directory instead of every xorb
        self.tmp = os.path.join(self.root, ".tmp")
        try:
            os.makedirs(self.tmp, exist_ok=True)
        except OSError as e:
            raise BackendError(self.root, f"cannot create: {e.strerror}") from None

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *check_key(key).split("/"))

    def local_path(self, key: str) -> str | None:
        return self._path(key)

    def get(self, key: str) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise ObjectMissingError(key) from None
        except OSError as e:
            raise BackendError(key, e.strerror or str(e)) from None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except FileNotFoundError:
            raise ObjectMissingError(key) from None
        except OSError as e:
            raise BackendError(key, e.strerror or str(e)) from None
        try:
            return os.pread(fd, length, start)
        finally:
            os.close(fd)

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except FileNotFoundError:
            raise ObjectMissingError(key) from None
        except OSError as e:
            raise BackendError(key, e.strerror or str(e)) from None
        try:
            size = os.fstat(fd).st_size
            n = min(length, size)
            return os.pread(fd, n, size - n), size
        finally:
            os.close(fd)

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        path = self._path(key)
        try:
            if if_absent:  # exactly one of concurrent writers wins
                return atomic_create(path, data, durable=self.durable, tmp_dir=self.tmp)
            atomic_write(path, data, durable=self.durable, tmp_dir=self.tmp)
            return True
        except OSError as e:
            raise BackendError(key, e.strerror or str(e)) from None

    def exists(self, key: str) -> bool:
        return os.path.exists(self._path(key))

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        # Walk only the directory the prefix names; keys are "dir/dir/name".
        head, _, _ = prefix.rpartition("/")
        base = os.path.join(self.root, *head.split("/")) if head else self.root
        out: list[str] = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel = os.path.relpath(dirpath, self.root)
            for name in filenames:
                if name.startswith("."):
                    continue
                key = name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}"
                if key.startswith(prefix) and (start_after is None or key > start_after):
                    out.append(key)
        yield from sorted(out)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(key))

    def version(self, prefix: str) -> tuple[float, Hashable] | None:
        # A directory's mtime changes when an entry is created in it.
        head = prefix.rstrip("/")
        try:
            st = os.stat(os.path.join(self.root, *head.split("/")) if head else self.root)
        except FileNotFoundError:
            return 0.0, "missing"
        except OSError:
            return None
        return st.st_mtime, (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)

    def remove_stale_temps(self, older_than: float = STALE_TEMP_SECONDS) -> int:
        n = remove_stale_temps(self.tmp, older_than=older_than)
        marker = os.path.join(self.root, ".swept-v1")  # not in tmp/: that stays empty
        if os.path.exists(marker):
            return n
        # once: older versions wrote temp files beside the objects
        for dirpath, dirnames, _ in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            if dirpath != self.root:
                n += remove_stale_temps(dirpath, older_than=older_than, any_suffix=True)
        with contextlib.suppress(OSError):
            atomic_write(marker, b"", durable=False)
        return n


class S3Backend(Backend):
    """Objects in an S3-compatible bucket under ``prefix``.

    Credentials and region come from boto3's usual chain (``AWS_ACCESS_KEY_ID`` and friends,
    profiles, instance roles); ``endpoint_url`` points at non-AWS servers (MinIO, moto, Ceph).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        client: Any = None,
        max_connections: int = 32,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        where = f" at {endpoint_url}" if endpoint_url else ""
        self.description = f"s3://{bucket}/{self.prefix}{where}"
        if client is None:
            import boto3
            from botocore.config import Config

            client = boto3.session.Session().client(
                "s3",
                endpoint_url=endpoint_url,
                region_name=region,
                config=Config(
                    max_pool_connections=max_connections,
                    retries={"max_attempts": 5, "mode": "standard"},
                    s3={"addressing_style": "path"} if endpoint_url else {},
                    # Only checksum when the API requires it: S3-compatible servers differ in
                    # which flexible checksums they accept, and xorbs carry their own hash.
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                ),
            )
        self.client = client

    def _k(self, key: str) -> str:
        return self.prefix + check_key(key)

    @staticmethod
    def _code(e: Exception) -> str:
        resp = getattr(e, "response", None) or {}
        return str(resp.get("Error", {}).get("Code", ""))

    def _fail(self, key: str, e: Exception) -> Exception:
        code = self._code(e)
        if code in ("NoSuchKey", "404", "NotFound"):
            return ObjectMissingError(key)
        return BackendError(key, f"S3 {code or type(e).__name__}")

    def get(self, key: str) -> bytes:
        try:
            obj = self.client.get_object(Bucket=self.bucket, Key=self._k(key))
            return bytes(obj["Body"].read())
        except Exception as e:  # botocore raises many types; map them all
            raise self._fail(key, e) from None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        try:
            obj = self.client.get_object(
                Bucket=self.bucket, Key=self._k(key), Range=f"bytes={start}-{start + length - 1}"
            )
            return bytes(obj["Body"].read())
        except Exception as e:
            if self._code(e) == "InvalidRange":
                return b""
            raise self._fail(key, e) from None

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        try:
            obj = self.client.get_object(
                Bucket=self.bucket, Key=self._k(key), Range=f"bytes=-{max(1, length)}"
            )
            data = bytes(obj["Body"].read())
        except Exception as e:
            raise self._fail(key, e) from None
        total = str(obj.get("ContentRange", "")).rpartition("/")[2]
        size = int(total) if total.isdigit() else len(data)
        return data, size

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        kw: dict[str, Any] = {"Bucket": self.bucket, "Key": self._k(key), "Body": data}
        if if_absent:
            if self.exists(key):
                return False
            kw["IfNoneMatch"] = "*"  # S3 conditional write; 412 if someone won the race
        try:
            self.client.put_object(**kw)
            return True
        except Exception as e:
            if if_absent and self._code(e) in ("PreconditionFailed", "412"):
                return False
            raise self._fail(key, e) from None

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._k(key))
            return True
        except Exception as e:
            err = self._fail(key, e)
            if isinstance(err, ObjectMissingError):
                return False
            raise err from None

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        kw: dict[str, str] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix}
        if start_after is not None:
            kw["StartAfter"] = self.prefix + start_after
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(**kw)
            for page in pages:
                for obj in page.get("Contents", ()):
                    yield str(obj["Key"])[len(self.prefix) :]
        except Exception as e:
            raise self._fail(prefix or "/", e) from None

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._k(key))
        except Exception as e:
            raise self._fail(key, e) from None

    def remove_stale_temps(self, older_than: float = STALE_TEMP_SECONDS) -> int:
        # Objects are written with single PUTs (nothing partial is ever visible); what can
        # be left is a multipart upload some tool started under the prefix and never ended.
        # Those cost storage until aborted.
        cutoff = time.time() - older_than
        n = 0
        try:
            pages = self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=self.prefix
            )
            for page in pages:
                for up in page.get("Uploads", ()):
                    if up["Initiated"].timestamp() < cutoff:
                        self.client.abort_multipart_upload(
                            Bucket=self.bucket, Key=up["Key"], UploadId=up["UploadId"]
                        )
                        n += 1
        except Exception as e:
            raise self._fail(self.prefix or "/", e) from None
        return n

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()


def open_backend(url: str | None, root: str) -> Backend:
    """Build a backend from a ``--storage`` URL.

    * ``None`` or ``""``: ``<root>/cas`` on local disk;
    * ``file:///abs/path`` or a plain path: that directory;
    * ``s3://bucket[/prefix][?endpoint_url=http://host:port&region=xx]``.

    Raises:
        ConfigError: an unsupported scheme or a missing bucket.
    """
    if not url:
        return LocalBackend(os.path.join(root, "cas"))
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        path = parts.path if parts.scheme else url
        if not path:
            raise ConfigError(f"storage URL {url!r} names no directory")
        return LocalBackend(path)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ConfigError("s3 storage URL needs a bucket: s3://bucket/prefix")
        q = parse_qs(parts.query)
        unknown = set(q) - {"endpoint_url", "region"}
        if unknown:
            raise ConfigError(f"unknown s3 storage option(s): {', '.join(sorted(unknown))}")
        return S3Backend(
            parts.netloc,
            parts.path,
            endpoint_url=q.get("endpoint_url", [None])[0],
            region=q.get("region", [None])[0],
        )
    raise ConfigError(f"unsupported storage URL scheme {parts.scheme!r} (use a path or s3://)")
