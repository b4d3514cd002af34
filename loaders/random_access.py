"""``ShardedMapDataset``: any sample of a packed split by position or key, locally or from a bucket.

A map-style dataset (``len``, ``ds[i]``, and torch's batched fetch ``__getitems__``), for evaluation,
labelling, debugging and any sampler. A position maps to (shard, sample) through the manifest's counts;
the shard's index says where the sample's bytes are, so a local read takes just those bytes and a remote
one a ranged request for them (the index fetched once per node, through the shard cache; the shard itself
downloaded only for LMDB, which cannot be read by ranges). A batch is read shard by shard, each shard's
samples in one call (neighbouring ranges coalesced), remote shards concurrently. Every sample is checked
against its checksum, decoded by the same decoders as ``ShardedDataset`` and read under the same
``on_error`` policy.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from torch.utils.data import Dataset

from loaders.options import selected_fields
from loaders.planning.planner import Run, Window
from loaders.planning.position import STATE_VERSION, Position, decode_state
from loaders.reading.columns import Columns, Decoding, finished_samples, to_batch
from loaders.reading.decode import ColumnDecoder, DecodeContext, Decoder, resolve_decoders
from loaders.reading.keys import KeyTable
from loaders.reading.readers import ShardReaders
from loaders.reading.source import DatasetSource, RemoteOptions
from loaders.reading.windows import OnError, WindowReader
from loaders.transfer.collate import Batch
from shardpipe.errors import CorruptShardError, DataError, SampleIndexError, SampleKeyError
from shardpipe.formats import get_format
from shardpipe.formats.layout import ShardIndex, keys_checksum
from shardpipe.shardtable import ShardEntry

Sample = dict[str, Any]
_FIRST = np.zeros(1, dtype=np.int64)
REMOTE_THREADS = 16
"""Shards of one batch fetched at once from a remote dataset (each one request, ranges coalesced)."""


class ShardedMapDataset(Dataset[Sample]):
    """Samples of one split of a packed dataset, by position (``ds[i]``, ``ds.__getitems__([...])``) or by
    key (``ds.get("cat/0042")``); each a dict as ``ShardedDataset`` yields (``__key__``, the fields,
    ``__pad__``, True only for an unreadable sample replaced under ``on_error="skip"``)."""

    def __init__(
        self,
        path: str | Path,
        split: str = "train",
        *,
        fields: Sequence[str] | None = None,
        decode: str | Mapping[str, str | Decoder | ColumnDecoder] | None = None,
        transform: Callable[[Sample], Any] | None = None,
        on_error: OnError = "raise",
        check: bool = True,
        remote: RemoteOptions | None = None,
        seed: int = 0,
    ) -> None:
        """``path``, ``fields``, ``decode``, ``check`` and ``remote`` as for ``ShardedDataset``; ``seed``
        (with :meth:`set_epoch`) seeds decoders that draw, such as ``RandomResizedCrop``."""
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.source = DatasetSource(path, remote)
        self.manifest = self.source.manifest
        self.split = split
        self.shards = self.manifest.split_shards(split)
        self.starts = np.concatenate([[0], np.cumsum(self.shards.num_samples)])
        self._starts: list[int] = self.starts.tolist()
        self._shard_paths = self.shards.paths
        self.format = get_format(self.manifest.format)
        self.fields = selected_fields(self.manifest, fields, self.source.display)
        self.decoders = resolve_decoders(decode, self.fields, self.manifest.label_fields)
        self.transform = transform
        self.on_error: OnError = on_error
        self.check = check
        self.seed = seed
        self.position = Position()  # the epoch, in shared memory: set_epoch reaches persistent workers
        self._keys: KeyTable | None = None
        self._readers = self._new_readers()

    def _new_readers(self) -> ShardReaders:
        return ShardReaders(self.source, self.shards, self.format, check=self.check, sparse=True)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_readers"] = None  # open files never cross into a worker
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._readers = self._new_readers()

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def epoch(self) -> int:
        return self.position.epoch

    def set_epoch(self, epoch: int) -> None:
        """The epoch decoders that draw (random crops) take their draws from; it reaches DataLoader workers,
        persistent or not."""
        self.position.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The data and the epoch (small, JSON-safe): which samples a pass reads, and in what order, is the
        sampler's, whose state a stateful loader saves beside this one."""
        return {"version": STATE_VERSION, **self._identity(), "epoch": self.epoch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at ``state``'s epoch; another dataset, split or seed is refused (``ValueError``)."""
        epoch, _ = decode_state({**state, "segments": []}, self._identity())
        self.set_epoch(epoch)

    def _identity(self) -> dict[str, Any]:
        return {"manifest": self.manifest.fingerprint(), "split": self.split, "seed": self.seed}

    # ---- access -------------------------------------------------------------------------------------------
    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples at ``indices`` (torch's DataLoader calls this once per batch), read together."""
        if not self.decoders and self.transform is None:
            found = self._read_straight(indices)
            return found if found is not None else list(self.read(indices).samples())
        finished = finished_samples(
            [self.read(indices)], self.decoders, self.transform, self._context(), self.shards.paths, _no_count
        )
        return list(finished)

    def get_batch(self, indices: Sequence[int]) -> Batch:
        """The samples at ``indices`` as one batch, decoded a column at a time: what ``make_loader``'s batch
        path yields for the same samples (a ``RaggedBytes`` per raw field, ``__key__``, ``__pad__``)."""
        columns = self.read(indices)
        decoding = Decoding(self.decoders, self._context(), self._shard_paths) if self.decoders else None
        return to_batch(columns, 0, len(columns), decoding)

    def get(self, key: str) -> Any:
        """The sample with this key. The first call reads every key of the split once (keys are in the
        shards, not their indexes) into a table of 16 bytes per sample; later calls cost one sample read.

        Raises :class:`~shardpipe.errors.SampleKeyError` (a ``KeyError``) when no sample has it."""
        return self[self.position_of(key)]

    def position_of(self, key: str) -> int:
        """The position of the sample with this key (see :meth:`get`)."""
        if self._keys is None:
            self._keys = KeyTable.build(
                key for shard in range(len(self.shards)) for key in self._keys_of(shard)
            )
        for position in self._keys.candidates(key):
            if self.read([position]).keys[0] == key:
                return position
        raise SampleKeyError(
            f"split {self.split!r} of {self.source.display} has no sample with key {key!r}; "
            "`shardpipe inspect` lists its shards"
        )

    def read(self, indices: Sequence[int]) -> Columns:
        """The raw samples at ``indices`` (negative ones count from the end, repeats allowed) as columns."""
        reader = WindowReader(
            readers=self._readers,
            fields=self.fields,
            shard_paths=self._shard_paths,
            on_error=self.on_error,
            scattered=True,
        )
        if len(indices) == 1 and type(indices[0]) is int:  # one get: no array work (its fixed cost)
            position = self._position(indices[0])
            shard = bisect_right(self._starts, position) - 1
            start = position - self._starts[shard]
            return reader.read_window(Window([Run(shard, start, start + 1, 0)], None), _FIRST)
        positions = self._positions(indices)
        if not len(positions):
            return Columns(self.fields)
        unique, inverse = np.unique(positions, return_inverse=True)
        shard_of = np.searchsorted(self.starts, unique, side="right") - 1
        runs = _runs(shard_of, unique - self.starts[shard_of])
        by_shard = _groups(runs) if self.source.remote else []
        if len(by_shard) <= 1:
            return reader.read_window(Window(runs, None), inverse)
        pieces: list[Columns] = []
        limit = self._readers.limit
        for first in range(0, len(by_shard), limit):  # never more shards than stay open
            group = by_shard[first : first + limit]
            with ThreadPoolExecutor(min(len(group), REMOTE_THREADS)) as pool:
                windows = [Window(shard_runs, None) for shard_runs in group]
                self._readers.codecs  # noqa: B018 (loaded here once, not by racing threads)
                self._readers.load_indexes([runs[0].shard_index for runs in group], REMOTE_THREADS)
                for shard_runs in group:  # opened here: the threads only look readers up
                    self._readers.open(shard_runs[0].shard_index)
                pieces += pool.map(lambda w: reader.read_window(w, np.arange(len(w))), windows)
        return Columns.concat(self.fields, pieces).take(inverse.tolist())

    def close(self) -> None:
        """Close the shard files this process opened (reopened lazily if read again)."""
        self._readers.close()
        self.source.close()

    def __enter__(self) -> ShardedMapDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- helpers ------------------------------------------------------------------------------------------
    def _read_straight(self, indices: Sequence[int]) -> list[Sample] | None:
        """The raw samples at ``indices`` (Python ints), each read on its own (``ShardReaders.read_samples``)
        without the columns a batch or a decoder needs: what a random get costs is then the samples
        themselves. ``None`` where they cannot be read so (other index types, a remote or compressed
        dataset; under ``on_error="skip"``, a damaged sample among them): :meth:`read` reads them then."""
        starts, count = self._starts, self._starts[-1]
        picks: list[tuple[int, int]] = []
        pick = picks.append
        for index in indices:  # as _position, inline: per sample it costs what the read does
            if type(index) is not int:
                return None
            position = index + count if index < 0 else index
            if not 0 <= position < count:
                self._out_of_range(index)
            shard = bisect_right(starts, position) - 1
            pick((shard, position - starts[shard]))
        if not picks:
            return None
        try:
            samples = self._readers.read_samples(picks, self.fields)
        except DataError:
            if self.on_error == "raise":
                raise
            return None  # read() replaces the damaged samples
        if samples is None:
            return None
        for sample in samples:
            sample["__pad__"] = False
        return samples

    def _positions(self, indices: Sequence[int]) -> np.ndarray:
        given = np.asarray(indices)
        if given.size and given.dtype.kind not in "iu":
            raise TypeError(f"sample positions must be ints, got {indices!r}")
        positions = given.astype(np.int64).reshape(-1)
        size = len(self)
        positions = np.where(positions < 0, positions + size, positions)
        if ((positions < 0) | (positions >= size)).any():
            bad = next(i for i, p in zip(indices, positions.tolist(), strict=True) if not 0 <= p < size)
            self._out_of_range(bad)
        return positions

    def _position(self, index: int) -> int:
        """One position (an int), as :meth:`_positions` checks many."""
        position = index + self._starts[-1] if index < 0 else index
        if not 0 <= position < self._starts[-1]:
            self._out_of_range(index)
        return position

    def _out_of_range(self, index: int) -> NoReturn:
        where = f"split {self.split!r} of {self.source.display}"
        raise SampleIndexError(f"sample {index} is out of range: {where} has {len(self)} samples")

    def _keys_of(self, shard_index: int) -> list[str]:
        """Every key of one shard in order: their bytes alone when the index has their spans, checked
        against the manifest's checksum of them where it records one (keys read so skip their samples'
        checksums), so a damaged key is a corrupt shard, not a missing or a wrong sample."""
        entry = self.shards[shard_index]
        index = self._readers.index(shard_index)
        if isinstance(index, ShardIndex) and index.all_plain:
            spans = list(zip(index.key_starts[:-1].tolist(), index.key_stops[:-1].tolist(), strict=True))
            if self.source.remote:
                data = self.source.ranges(entry).read_ranges(spans)
            else:
                with (self.source.root / entry.path).open("rb") as f:
                    data = [os.pread(f.fileno(), stop - start, start) for start, stop in spans]
            keys = _checked_keys(data, entry, self.check)
        else:
            with self._readers.reading(shard_index) as reader:
                keys, _ = reader.read_runs([(0, entry.num_samples)], ())
        if self.check and entry.keys_checksum is not None and keys_checksum(keys) != entry.keys_checksum:
            raise CorruptShardError.at(
                f"{self.source.display}/{entry.path}",
                "its keys differ from the manifest's checksum of them (a damaged key); "
                "run `shardpipe verify` to find the sample",
            )
        return keys

    def _context(self) -> DecodeContext:
        return DecodeContext(self.seed, self.epoch, skip=self.on_error == "skip")


def _no_count() -> None:
    """Random gets count no skipped samples (a skipped one comes back flagged ``__pad__``)."""


def get(
    dataset: str | Path,
    sample: int | str,
    *,
    split: str = "train",
    storage_options: Mapping[str, Any] | None = None,
) -> Sample:
    """One sample of ``dataset`` (a folder, manifest or URL) by position (an int) or key (a str), raw:
    what ``shardpipe get`` shows. For many samples keep a :class:`ShardedMapDataset` open instead."""
    with ShardedMapDataset(dataset, split, remote=RemoteOptions(storage_options=storage_options)) as ds:
        position = sample if isinstance(sample, int) else ds.position_of(sample)
        found: Sample = ds[position]
        found["__position__"] = position % len(ds)
        return found


def _runs(shard_of: np.ndarray, positions: np.ndarray) -> list[Run]:
    """Sorted (shard, position) pairs as runs of consecutive positions of one shard."""
    breaks = np.flatnonzero((np.diff(shard_of) != 0) | (np.diff(positions) != 1)) + 1
    starts = np.concatenate([[0], breaks]).astype(np.int64)
    stops = np.concatenate([breaks, [len(positions)]]).astype(np.int64)
    firsts, lasts = positions[starts].tolist(), positions[stops - 1].tolist()
    return [
        Run(shard, first, last + 1, 0)
        for shard, first, last in zip(shard_of[starts].tolist(), firsts, lasts, strict=True)
    ]


def _groups(runs: list[Run]) -> list[list[Run]]:
    """Runs grouped by shard (they come sorted by shard)."""
    groups: list[list[Run]] = []
    for run in runs:
        if groups and groups[-1][0].shard_index == run.shard_index:
            groups[-1].append(run)
        else:
            groups.append([run])
    return groups


def _checked_keys(data: list[bytes], entry: ShardEntry, check: bool) -> list[str]:
    """Keys from their raw bytes; bytes that are no UTF-8 are a corrupt shard naming the sample."""
    try:
        return [item.decode() for item in data]
    except UnicodeDecodeError:
        bad = next(i for i, item in enumerate(data) if not _is_utf8(item))
        detail = f"its key is not UTF-8 ({data[bad]!r:.60})"
        if not check:
            detail += "; read with checks on to find what else is damaged"
        raise CorruptShardError.at(entry.path, detail, sample_index=bad) from None


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True
