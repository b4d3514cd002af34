"""The pack side of field compression (:mod:`.compression`): each field's values compressed into zstd
frames, and the dictionaries small records get, trained once per pack."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import zstandard

from shardpipe.formats.compression import DICTIONARY_BYTES, DICTIONARY_MEAN_BYTES


def train_dictionary(samples: Sequence[bytes], level: int) -> bytes | None:
    """A zstd dictionary for ``samples`` (a field's sampled values), or None where one would not help
    (large values, or too few or too uniform to train on). Deterministic: the same samples give the same
    bytes on any machine (zstd's trainer is a pure function of its input, run single-threaded, and the
    dictionary's id is a hash of its content)."""
    given: list[bytes | bytearray | memoryview] = [bytes(s) for s in samples if len(s)]
    if len(given) < 8 or sum(map(len, given)) > DICTIONARY_MEAN_BYTES * len(given):
        return None
    try:
        trained = zstandard.train_dictionary(DICTIONARY_BYTES, given, level=level, threads=0)
    except zstandard.ZstdError:
        return None  # zstd found nothing to train on (too little data, or values all alike)
    data: bytes = trained.as_bytes()
    return data


@dataclass(slots=True)
class FieldCompressor:
    """The pack side: compresses the chosen fields' values of a batch. Pickles as its settings and
    dictionaries (any executor runs it); the zstd contexts are made on first use, in the process that
    uses them."""

    level: int
    dictionaries: dict[str, bytes | None]
    """Each compressed field's dictionary (None: none)."""
    _contexts: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __getstate__(self) -> tuple[int, dict[str, bytes | None]]:
        return self.level, self.dictionaries

    def __setstate__(self, state: tuple[int, dict[str, bytes | None]]) -> None:
        self.level, self.dictionaries = state
        self._contexts = {}

    def compress_column(self, name: str, column: Iterable[Any]) -> list[Any]:
        """The values of field ``name``, compressed when it is one of the compressed fields."""
        if name not in self.dictionaries:
            return list(column)
        context = self._contexts.get(name)
        if context is None:
            data = self.dictionaries[name]
            context = self._contexts[name] = zstandard.ZstdCompressor(
                level=self.level,
                dict_data=None if data is None else zstandard.ZstdCompressionDict(data),
                write_checksum=False,
                write_content_size=True,
                write_dict_id=True,
            )
        return [None if value is None else context.compress(value) for value in column]

    def compress(self, names: Sequence[str], columns: Sequence[Iterable[Any]]) -> list[list[Any]]:
        """A writer batch's columns (one per name), the compressed fields' values as frames."""
        return [self.compress_column(name, column) for name, column in zip(names, columns, strict=True)]
