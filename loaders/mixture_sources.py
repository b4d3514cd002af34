"""The checks that a mixture's sources can be read as one stream: each refusal names the culprit."""

from __future__ import annotations

from collections.abc import Mapping

from loaders.dataset import ShardedDataset


def checked_sources(sources: Mapping[str, ShardedDataset]) -> tuple[ShardedDataset, ...]:
    """The sources in order, refused where they cannot be read as one stream (naming the culprit)."""
    if not isinstance(sources, Mapping) or not sources:
        raise ValueError("a Mixture needs a non-empty mapping of source name -> ShardedDataset")
    datasets = []
    for name, dataset in sources.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"source names must be non-empty strings, got {name!r}")
        if not isinstance(dataset, ShardedDataset):  # a Mixture is not one: no mixture of mixtures
            raise TypeError(f"source {name!r} must be a ShardedDataset, got {type(dataset).__name__}")
        if sum(dataset.shard_sizes) == 0:
            raise ValueError(
                f"source {name!r} ({dataset.root}, split {dataset.options.split!r}) has no samples; "
                "leave it out or give it a split that holds samples"
            )
        datasets.append(dataset)
    first_name, first = next(iter(sources.items()))
    for name, dataset in sources.items():
        mine, theirs = set(dataset.fields), set(first.fields)
        if mine != theirs:
            raise ValueError(
                f"sources {first_name!r} and {name!r} cannot form one batch: fields only in {first_name!r}: "
                f"{sorted(theirs - mine)}, only in {name!r}: {sorted(mine - theirs)}; read the fields they "
                f"share, ShardedDataset(..., fields={sorted(mine & theirs)!r}), or repack"
            )
        differ = sorted(
            f
            for f in set(dataset.decoders) | set(first.decoders)
            if dataset.decoders.get(f) != first.decoders.get(f)
        )
        if differ:
            raise ValueError(
                f"sources {first_name!r} and {name!r} decode fields {differ} differently; give every source "
                "the same decode="
            )
        for option in ("shuffle", "remainder"):
            if getattr(dataset.options, option) != getattr(first.options, option):
                raise ValueError(
                    f"source {name!r} has {option}={getattr(dataset.options, option)!r} but {first_name!r} "
                    f"has {getattr(first.options, option)!r}; a mixture reads all its sources one way"
                )
        if dataset.transform is not first.transform:
            raise ValueError(f"sources {first_name!r} and {name!r} have different transforms; give them one")
        if (dataset.rank, dataset.world_size) != (first.rank, first.world_size):
            raise ValueError(
                f"source {name!r} is on rank {dataset.rank} of {dataset.world_size}, {first_name!r} on "
                f"rank {first.rank} of {first.world_size}"
            )
    return tuple(datasets)
