"""The project's exception types.

Data errors name the file, shard and position they concern; the CLI maps them to exit code 1 and usage
errors to exit code 2, never to a traceback.
"""

from __future__ import annotations


class ShardpipeError(Exception):
    """Base class of every error shardpipe raises on purpose."""


class UsageError(ShardpipeError):
    """An option or argument is invalid (CLI exit code 2)."""


class DataError(ShardpipeError):
    """Input or shard data is missing, unreadable, corrupt or inconsistent (CLI exit code 1)."""


class CorruptShardError(DataError):
    """A shard's bytes do not parse; names the shard and the sample position or byte offset."""

    def __init__(
        self, shard: str, detail: str, *, sample_index: int | None = None, offset: int | None = None
    ):
        where = [shard]
        if sample_index is not None:
            where.append(f"sample {sample_index}")
        if offset is not None:
            where.append(f"byte {offset}")
        super().__init__(f"corrupt shard {', '.join(where)}: {detail}")
        self.shard = shard
        self.detail = detail
        self.sample_index = sample_index
        self.offset = offset

    def __reduce__(self) -> tuple[object, ...]:  # keyword-only arguments: pickle (to a worker pool) by hand
        return _rebuild_corrupt, (self.shard, self.detail, self.sample_index, self.offset)


def _rebuild_corrupt(
    shard: str, detail: str, sample_index: int | None, offset: int | None
) -> CorruptShardError:
    return CorruptShardError(shard, detail, sample_index=sample_index, offset=offset)
