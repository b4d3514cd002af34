"""``LocalStore``: the storage seam over a local folder, with plain ``os`` calls and no fsspec in the way.

Puts go to a temporary name, are flushed and renamed (:mod:`.files`), so a final name never holds partial
content; reads use ``pread`` for ranges. A folder is not an object: removing a folder's last key removes
the folder, as an object store's listing would show it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TypeVar

from shardpipe.errors import CorruptShardError
from shardpipe.storage.base import AccessDeniedError, ObjectNotFoundError
from shardpipe.storage.files import fsync_file, open_regular, publish, sweep_temporaries, temp_path
from shardpipe.storage.ranges import coalesce_ranges, slice_blocks

T = TypeVar("T")
_CHUNK = 1 << 20


class LocalStore:
    """A folder on this machine: plain ``os`` calls, atomic puts by temporary name + fsync + rename."""

    def __init__(self, root: Path):
        self._root = Path(root)

    @property
    def root(self) -> str:
        return str(self._root)

    @property
    def display(self) -> str:
        return str(self._root)

    def local_path(self, key: str = "") -> Path:
        return self._root / key if key else self._root

    def url(self, key: str = "") -> str:
        return str(self.local_path(key))

    def exists(self, key: str) -> bool:
        return self.local_path(key).exists()

    def size(self, key: str) -> int:
        return self._call(key, lambda p: p.stat().st_size)

    def list_keys(self, prefix: str = "") -> list[str]:
        base = self.local_path(prefix)
        if base.is_file():
            return [prefix]
        if not base.is_dir():
            return []
        return sorted(p.relative_to(self._root).as_posix() for p in base.rglob("*") if p.is_file())

    def list_sizes(self, prefix: str = "") -> dict[str, int]:
        return {key: self.local_path(key).stat().st_size for key in self.list_keys(prefix)}

    def open(self, key: str) -> BinaryIO:
        return self._call(key, open_regular)

    def read(self, key: str) -> bytes:
        def read_all(path: Path) -> bytes:
            with open_regular(path) as f:
                return f.read()

        return self._call(key, read_all)

    def read_range(self, key: str, start: int, stop: int) -> bytes:
        return self.read_ranges(key, [(start, stop)])[0]

    def read_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        blocks, block_of = coalesce_ranges(ranges)

        def read_blocks(path: Path) -> list[bytes]:
            fd = os.open(path, os.O_RDONLY)
            try:
                return [os.pread(fd, stop - start, start) for start, stop in blocks]
            finally:
                os.close(fd)

        return slice_blocks(ranges, blocks, block_of, self._call(key, read_blocks))

    def iter_chunks(self, key: str, size: int, chunk_size: int = _CHUNK) -> Iterator[bytes]:
        """The file's first ``size`` bytes in chunks (fewer if it is shorter)."""
        with self.open(key) as f:
            remaining = size
            while remaining > 0 and (chunk := f.read(min(chunk_size, remaining))):
                remaining -= len(chunk)
                yield chunk

    def sha256(self, key: str) -> tuple[str, int]:
        digest, size = hashlib.sha256(), 0
        with self.open(key) as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
        return digest.hexdigest(), size

    def put(self, key: str, data: bytes, *, sha256: str | None = None) -> str:
        digest = hashlib.sha256(data).hexdigest()
        _check_digest(self.url(key), digest, sha256)
        with self.staging(key) as temp:
            temp.write_bytes(data)
            publish(temp, self.local_path(key))
        return digest

    def move(self, source: str, key: str) -> None:
        final = self.local_path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        self._call(source, lambda path: os.replace(path, final))
        fsync_file(final.parent)
        self._prune(self.local_path(source).parent)

    def _prune(self, folder: Path) -> None:
        """Remove ``folder`` and the folders above it, up to the root, while they are empty."""
        while folder != self._root and self._root in folder.parents:
            try:
                folder.rmdir()
            except OSError:  # not empty: the folders above are not empty either
                break
            folder = folder.parent

    def put_file(self, key: str, source: Path, *, sha256: str | None = None) -> str:
        digest = hashlib.sha256()
        with self.staging(key) as temp:
            with open(source, "rb") as src, open(temp, "wb") as dst:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    dst.write(chunk)
            _check_digest(str(source), digest.hexdigest(), sha256)
            publish(temp, self.local_path(key))
        return digest.hexdigest()

    def append(self, key: str, data: bytes) -> None:
        path = self.local_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as f:
            f.write(data)

    @contextmanager
    def staging(self, key: str) -> Iterator[Path]:
        """A temporary sibling of the final file (so publishing is a rename), removed if left behind."""
        final = self.local_path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        temp = temp_path(final)
        try:
            yield temp
        finally:
            temp.unlink(missing_ok=True)

    def publish(self, key: str, staged: Path, sha256: str) -> None:
        publish(staged, self.local_path(key))

    def remove(self, key: str, *, missing_ok: bool = True) -> None:
        path = self.local_path(key)
        if path.is_dir():
            shutil.rmtree(path)
        else:
            self._call(key, lambda p: p.unlink(missing_ok=missing_ok))
        self._prune(path.parent)

    def remove_temporaries(self) -> int:
        return sweep_temporaries(self._root) if self._root.is_dir() else 0

    def _call(self, key: str, fn: Callable[[Path], T]) -> T:
        path = self.local_path(key)
        try:
            return fn(path)
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"no file at {path}; check the path", str(path)) from exc
        except PermissionError as exc:
            raise AccessDeniedError(f"permission denied reading {path}; check its mode", str(path)) from exc


def _check_digest(where: str, actual: str, expected: str | None) -> None:
    if expected is not None and actual != expected:
        raise CorruptShardError.at(where, f"sha256 {actual} does not match the expected {expected}")
