"""``lmdb-loop``: the bare LMDB reader a user writes by hand, as the baseline shardpipe must beat.

The same samples as the packs, in ONE LMDB: key = the sample index (8 bytes, big-endian, so keys sort in
index order), value = a trivial fixed layout ``u32 key_length, u32 cls_length, key, cls, bin`` (no pickle:
nothing read back is ever unpickled). The reader is a map-style ``Dataset`` doing one ``txn.get`` per
sample through one long-lived read transaction, with the environment opened lazily in the process that
reads (each DataLoader worker opens its own; one a fork copied from the parent is closed unused), read by
a plain ``DataLoader`` with ``DistributedSampler(shuffle=True)``: the usual set-up, and the fastest we know.
As bench-io's ``lmdb-loop`` it is the loop a user writes, with no shardpipe code: the label parsed to an
int per sample (``labels=True``) and a list collate (:func:`collate_list`).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lmdb
import torch
from torch.utils.data import Dataset

HEADER = struct.Struct("<II")
INDEX = struct.Struct(">Q")
COUNT_KEY = b"__count__"  # the sample count; sorts after every 8-byte index key
COMMIT_SAMPLES = 1000  # samples per write transaction: bounds the dirty pages held before a commit


def encode(key: str, cls: bytes, data: bytes) -> bytes:
    raw_key = key.encode()
    return b"".join((HEADER.pack(len(raw_key), len(cls)), raw_key, cls, data))


def decode(value: bytes) -> dict[str, Any]:
    """``{"__key__", "cls", "bin"}`` from one value: one unpack and three slices."""
    key_length, cls_length = HEADER.unpack_from(value)
    cls_start = HEADER.size + key_length
    bin_start = cls_start + cls_length
    return {
        "__key__": value[HEADER.size : cls_start].decode(),
        "bin": value[bin_start:],
        "cls": value[cls_start:bin_start],
    }


def user_sample(value: bytes) -> dict[str, Any]:
    """:func:`decode` with the label parsed to an int, as a user's own loop would."""
    sample = decode(value)
    sample["cls"] = int(sample["cls"])
    return sample


def collate_list(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The collate a user writes: keys and payloads as lists, the labels one int64 tensor."""
    return {
        "__key__": [s["__key__"] for s in samples],
        "cls": torch.tensor([s["cls"] for s in samples], dtype=torch.int64),
        "bin": [s["bin"] for s in samples],
    }


def write(path: Path, samples: Iterable[tuple[str, bytes, bytes]], payload_bytes: int) -> int:
    """Write ``(key, cls, bin)`` samples under their index; return the count. ``path`` is a folder."""
    path.mkdir(parents=True, exist_ok=True)
    map_size = 2 * payload_bytes + (256 << 20)  # payload, keys, headers and B-tree pages fit with room
    env = lmdb.open(str(path), map_size=map_size, subdir=True, sync=False, metasync=False)
    count = 0
    try:
        txn = env.begin(write=True)
        for count, (key, cls, data) in enumerate(samples, start=1):
            txn.put(INDEX.pack(count - 1), encode(key, cls, data), append=True)
            if count % COMMIT_SAMPLES == 0:
                txn.commit()
                txn = env.begin(write=True)
        txn.put(COUNT_KEY, b"%d" % count)
        txn.commit()
        env.sync(True)
    finally:
        env.close()
    return count


class LmdbLoopDataset(Dataset[dict[str, Any]]):
    """``dataset[i]`` = sample i, read with one ``txn.get``; the environment opens lazily per process."""

    def __init__(self, path: Path, *, labels: bool = False) -> None:
        """``labels``: ``cls`` parsed to an int (:func:`user_sample`), else left as its bytes."""
        self.path = str(path)
        self._decode = user_sample if labels else decode
        env = lmdb.open(self.path, readonly=True, lock=False, subdir=True)
        try:
            with env.begin() as txn:
                count = txn.get(COUNT_KEY)
        finally:
            env.close()  # opened only to count: the readers open their own after the fork
        if count is None:
            raise ValueError(f"{path} has no {COUNT_KEY!r} entry: not written by bench.io.lmdb_loop.write")
        self.length = int(count)
        self._env: Any = None
        self._txn: Any = None
        self._pid = -1

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self._pid != os.getpid():  # first read in this process (a fresh worker, or the main one)
            if self._env is not None:  # the parent's, copied by the fork: never used, only let go here
                self._env.close()  # read-only, lock-free: no lock file or reader slot shared with the parent
            self._env = lmdb.open(
                self.path, readonly=True, lock=False, readahead=False, meminit=False, subdir=True
            )
            self._txn = self._env.begin(buffers=False)
            self._pid = os.getpid()
        value = self._txn.get(INDEX.pack(index))
        if value is None:
            raise IndexError(f"{self.path}: no sample {index} (the LMDB holds {self.length})")
        return self._decode(value)

    def __getstate__(self) -> dict[str, Any]:
        """Workers started by spawn get the path, never an open environment."""
        return {**self.__dict__, "_env": None, "_txn": None, "_pid": -1}


def files(path: Path) -> list[Path]:
    """The LMDB's files, for cold-cache eviction."""
    return sorted(p for p in path.iterdir() if p.suffix == ".mdb")
