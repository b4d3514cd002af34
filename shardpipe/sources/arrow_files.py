"""Arrow IPC files as a table's files: what ``datasets``' ``save_to_disk`` writes (``load_from_disk``'s
input), read as a Parquet dataset's files are, record batches standing where row groups do.

``save_to_disk`` writes each split's rows as Arrow IPC streams (``data-00000-of-00001.arrow``) beside
``state.json`` and ``dataset_info.json``, a split to a folder under ``dataset_dict.json`` for a
``DatasetDict``. The features ride in the schema's metadata, as in Parquet files ``datasets`` writes. A
local file is memory-mapped (its batches are views, read as they are sliced); a remote one is read through
its store. Both the stream and the file form of IPC are read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from shardpipe.errors import DataError
from shardpipe.sources.list_piece import ListSource

SUFFIX = ".arrow"


def is_arrow(location: str) -> bool:
    return location.split("?", 1)[0].lower().endswith(SUFFIX)


@contextmanager
def arrow_batches(
    location: str, storage_options: Mapping[str, Any] | None
) -> Iterator[tuple[Any, list[Any]]]:
    """``(schema, record batches)`` of an Arrow IPC file, stream or file form; a file that is neither
    is a :class:`DataError` naming it."""
    import pyarrow as pa

    source = ListSource(location, "arrow", storage_options=storage_options)
    store, key = source.store()
    local = store.local_path(key)
    try:
        with pa.memory_map(str(local)) if local is not None else store.open(key) as file:
            try:
                reader = pa.ipc.open_file(file)
                batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            except pa.ArrowInvalid:
                file.seek(0)
                reader = pa.ipc.open_stream(file)
                batches = list(reader)
            yield reader.schema, batches
    except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid is a ValueError
        raise DataError(f"cannot read Arrow file {source.shown}: {exc}") from exc


def arrow_layout(
    location: str, storage_options: Mapping[str, Any] | None
) -> tuple[Any, list[int], list[int]]:
    """``(schema, rows of each batch, bytes of each batch)``."""
    with arrow_batches(location, storage_options) as (schema, batches):
        return schema, [b.num_rows for b in batches], [b.nbytes for b in batches]


def read_arrow_batches(
    location: str, storage_options: Mapping[str, Any] | None, start: int, stop: int, columns: list[str]
) -> Any:
    """Record batches ``[start, stop)`` of the file, as one table of ``columns``."""
    import pyarrow as pa

    with arrow_batches(location, storage_options) as (schema, batches):
        table = pa.Table.from_batches(batches[start:stop], schema=schema).select(columns)
        return table.combine_chunks() if table.num_rows else table
