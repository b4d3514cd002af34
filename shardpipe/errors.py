"""The project's exception types.

Data errors name the file, shard and position they concern; the CLI maps them to exit code 1 and usage
errors to exit code 2, never to a traceback.

Every project error is rebuilt from its message alone: a DataLoader re-raises a worker's exception in the
trainer as ``type(exc)(message)`` (falling back to ``RuntimeError`` when that call fails), and pickling (to
and from a pack's worker pool) calls ``type(exc)(*exc.args)`` and then restores the attributes. So the
message is the one positional argument, and details are keyword arguments with defaults; a class whose
message is composed from its details builds it in a classmethod.

Part of the shared core (``shardpipe.manifest``, ``.shardtable``, ``.errors``, ``.formats``, ``.storage``,
``.units``), which the pack stage (``shardpipe.packing``) and the loaders (``loaders``) both stand on: it
imports neither of them, nor the sources, tools or CLI (the import-linter contracts in pyproject.toml, run
by ``make lint``).
"""

from __future__ import annotations


class ShardpipeError(Exception):
    """Base class of every error shardpipe raises on purpose."""


class UsageError(ShardpipeError):
    """An option or argument is invalid (CLI exit code 2)."""


class DataError(ShardpipeError):
    """Input or shard data is missing, unreadable, corrupt or inconsistent (CLI exit code 1)."""


class SampleIndexError(UsageError, IndexError):
    """A sample asked for by a position the split does not have."""


class SampleKeyError(UsageError, KeyError):
    """A sample asked for by a key the split does not hold."""

    __str__ = Exception.__str__  # the message as written, not KeyError's repr of it


class CorruptShardError(DataError):
    """A shard's bytes do not parse; names the shard and the sample position or byte offset.

    Rebuilt from its message alone (in a DataLoader's trainer process), the details are unknown (empty or
    None); the message still says all of them.
    """

    def __init__(
        self,
        message: str,
        *,
        shard: str = "",
        detail: str = "",
        sample_index: int | None = None,
        offset: int | None = None,
    ) -> None:
        super().__init__(message)
        self.shard, self.detail, self.sample_index, self.offset = shard, detail, sample_index, offset

    @classmethod
    def at(
        cls, shard: str, detail: str, *, sample_index: int | None = None, offset: int | None = None
    ) -> CorruptShardError:
        """The error for ``shard``: "corrupt shard <shard>, sample <i>, byte <offset>: <detail>"."""
        where = [shard]
        if sample_index is not None:
            where.append(f"sample {sample_index}")
        if offset is not None:
            where.append(f"byte {offset}")
        message = f"corrupt shard {', '.join(where)}: {detail}"
        return cls(message, shard=shard, detail=detail, sample_index=sample_index, offset=offset)
