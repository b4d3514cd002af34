"""The mixture benchmark's sources: three datasets of different sizes and formats, and their count twins.

Each source is a byte profile of ``bench.io.data`` (a tree of ``.bin`` files packed by ``shardpipe pack``
in every format, cached under its fingerprint), read in its own format by the mixture and as tar by
webdataset. Its count twin has the same number of samples, hence the same shards (``bench.io.data`` cuts
every profile into the same number of shards), with payloads of ``TWIN_BYTES``: a mixture's plan depends on
the sources' sizes and shard layout, never on their bytes, so the twins give the same source sequence at a
fraction of the reading.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.io import data as io_data

TWIN_BYTES = 16  # the least payload a bench.io profile takes


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """One source of the mixture: its name there, the format it is read in, its size, its weight."""

    name: str
    format: str
    num_samples: int
    sample_bytes: int
    weight: float

    def __post_init__(self) -> None:
        if self.format not in io_data.FORMATS:
            raise ValueError(f"source {self.name}: format {self.format!r}, expected one of {io_data.FORMATS}")
        if not self.weight > 0:
            raise ValueError(f"source {self.name}: weight must be > 0, got {self.weight}")

    def profile(self, *, twin: bool = False) -> io_data.Profile:
        if twin:
            return io_data.Profile(f"mix-{self.name}-twin", self.num_samples, TWIN_BYTES)
        return io_data.Profile(f"mix-{self.name}", self.num_samples, self.sample_bytes)


SOURCES = (
    SourceSpec("web", "tar", 60_000, 1024, 0.5),
    SourceSpec("code", "lmdb", 8_000, 64 * 1024, 0.3),
    SourceSpec("books", "tfrecord", 20_000, 4 * 1024, 0.2),
)
QUICK_SIZES = (6_000, 800, 2_000)


def specs(
    sizes: Sequence[int] | None = None, weights: Sequence[float] | None = None
) -> tuple[SourceSpec, ...]:
    """:data:`SOURCES` with other sample counts and weights, if given (one per source, in order)."""
    for name, values in (("sizes", sizes), ("weights", weights)):
        if values is not None and len(values) != len(SOURCES):
            raise ValueError(f"{name}: {len(values)} values, expected one per source ({len(SOURCES)})")
    return tuple(
        SourceSpec(
            s.name,
            s.format,
            s.num_samples if sizes is None else int(sizes[i]),
            s.sample_bytes,
            s.weight if weights is None else float(weights[i]),
        )
        for i, s in enumerate(SOURCES)
    )


@dataclass(frozen=True, slots=True)
class Source:
    """A prepared source: where its packs are."""

    spec: SourceSpec
    data: io_data.Dataset

    @property
    def path(self) -> Path:
        """The pack the mixture reads: the source's own format."""
        return self.data.packed(self.spec.format)

    @property
    def tar_shards(self) -> list[Path]:
        """The tar pack's shard files, for webdataset."""
        return self.data.shard_files("tar")

    @property
    def shard_files(self) -> list[Path]:
        return self.data.shard_files(self.spec.format, with_index=True)


def prepare(
    sources: Sequence[SourceSpec], cache: Path, *, twin: bool, workers: int = 2
) -> tuple[Source, ...]:
    """Every source (or its count twin) under ``cache``, built and packed when its fingerprint is absent."""
    return tuple(
        Source(spec, io_data.prepare(spec.profile(twin=twin), cache, workers=workers)) for spec in sources
    )


def weights(sources: Sequence[SourceSpec]) -> list[float]:
    """The weights as fractions of one, in source order."""
    total = sum(s.weight for s in sources)
    return [s.weight / total for s in sources]
