"""The output folder: make sure OUT is ours to write, and keep its journal of finished shards.

States of OUT, and what a pack does with each:

* missing or empty: a fresh pack; a journal is started.
* holding a journal (an interrupted pack): with ``resume``, the journal's finished shards whose bytes
  still hash to what it recorded are kept, if the journal's job fingerprint is this job's.
* holding a manifest (a finished pack): with ``resume`` and the same job, nothing to do (a journal left
  by a kill between the manifest write and the journal removal is removed); with another job, refused
  with what differs.
* anything else, or any of the above without ``resume``: refused unless ``overwrite``, which removes only
  what a pack writes.

OUT is a local folder (:class:`LocalOutput`: shards written in place, the journal appended to) or an
object-store prefix (``shardpipe.store_output.StoreOutput``: shards staged locally, uploaded whole and
checked, the journal an object rewritten after each shard). :func:`open_output` picks one; the pack talks
to either through :class:`Output`, so it never asks where OUT lives.

Errors are in library terms (:class:`OutputNotEmptyError`, :class:`JobMismatchError`); the CLI names
the flags.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from shardpipe import write
from shardpipe.atomic import sweep_temporaries, write_bytes_atomic
from shardpipe.errors import UsageError
from shardpipe.manifest import (
    MANIFEST_NAME,
    Manifest,
    ShardEntry,
    load_manifest,
    sha256_file,
    write_manifest,
)
from shardpipe.storage import as_location, is_remote, redact_url

JOURNAL_NAME = ".shardpipe-journal.jsonl"


@dataclass(frozen=True, slots=True)
class Job:
    """What identifies a pack job: its fingerprint, the options that shape its output, and its source."""

    fingerprint: str
    options: dict[str, Any]
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "options": self.options, "source": self.source}


@dataclass(frozen=True, slots=True)
class Prepared:
    """OUT made ready: the journal's finished shards to consider, or the finished dataset already there."""

    finished: dict[str, ShardEntry]
    complete: Manifest | None = None


class OutputNotEmptyError(UsageError):
    """OUT holds a dataset or other files, and the pack was not asked to resume or replace them."""

    def __init__(self, out: Path | str, holds_dataset: bool) -> None:
        what = "a shardpipe dataset" if holds_dataset else "other files"
        super().__init__(f"output {out} already holds {what}")
        self.out, self.holds_dataset = out, holds_dataset

    def __reduce__(self) -> tuple[object, ...]:
        return OutputNotEmptyError, (self.out, self.holds_dataset)


class JobMismatchError(UsageError):
    """A resume found another pack job in OUT; ``differences`` says what differs, found vs expected."""

    def __init__(self, out: Path | str, differences: tuple[str, ...], complete: bool) -> None:
        state = "finished" if complete else "interrupted"
        super().__init__(
            f"cannot resume in {out}: it holds a {state} pack of another job: {'; '.join(differences)}"
        )
        self.out, self.differences, self.complete = out, differences, complete

    def __reduce__(self) -> tuple[object, ...]:
        return JobMismatchError, (self.out, self.differences, self.complete)


def prepare_output(out: Path, job: Job, *, resume: bool, overwrite: bool) -> Prepared:
    """Check OUT is ours to write and start (or continue) its journal; see the module docstring."""
    journal = out / JOURNAL_NAME
    if out.exists() and not out.is_dir():
        raise UsageError(f"output {out} exists and is not a directory")
    has_manifest = (out / MANIFEST_NAME).exists()
    if overwrite:
        remove_outputs(out)
    elif resume and has_manifest:
        manifest = load_manifest(out)
        differences = compare_jobs(manifest.job, job)
        if differences:
            raise JobMismatchError(out, differences, complete=True)
        journal.unlink(missing_ok=True)  # killed after the manifest was written: the pack is complete
        sweep_temporaries(out)
        return Prepared({}, manifest)
    elif resume and journal.exists():
        header, entries = read_journal(journal)
        differences = compare_jobs(header, job)
        if differences:
            raise JobMismatchError(out, differences, complete=False)
        sweep_temporaries(out)
        return Prepared({e.path: e for e in entries})
    elif out.exists() and any(out.iterdir()):
        raise OutputNotEmptyError(out, has_manifest)
    out.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(journal, (json.dumps(job.to_json()) + "\n").encode())
    return Prepared({})


def compare_jobs(found: dict[str, Any], expected: Job) -> tuple[str, ...]:
    """What differs between a recorded job (manifest or journal) and this one; empty when they match."""
    if found.get("fingerprint") == expected.fingerprint:
        return ()
    if "options" not in found:
        return (
            f"found pack job {found.get('fingerprint') or 'unrecorded'}, expected {expected.fingerprint} "
            "(an older shardpipe recorded no options to compare)",
        )
    differences = [
        f"{name}: found {found['options'].get(name)!r}, expected {value!r}"
        for name, value in expected.options.items()
        if found["options"].get(name) != value
    ]
    if found.get("source") != expected.source:
        differences.append(f"source: found {found.get('source')!r}, expected {expected.source!r}")
    if not differences:
        differences.append(
            "the same options and source, but the source's content changed (samples added, removed, "
            f"renamed or resized): found pack job {found['fingerprint']}, expected {expected.fingerprint}"
        )
    return tuple(differences)


def read_journal(journal: Path) -> tuple[dict[str, Any], list[ShardEntry]]:
    """The journal's job header and its finished shards, up to a line cut short by a kill."""
    return parse_journal(journal.read_text())


def parse_journal(text: str) -> tuple[dict[str, Any], list[ShardEntry]]:
    """:func:`read_journal` on the journal's text (an object store's journal is read whole)."""
    lines = text.splitlines()
    try:
        header = json.loads(lines[0]) if lines else {}
    except ValueError:
        header = {}
    if "job" in header:  # the header of an older shardpipe: the fingerprint alone
        header = {"fingerprint": header["job"]}
    entries = []
    for line in lines[1:]:
        try:
            entries.append(ShardEntry.from_json(json.loads(line)))
        except (ValueError, KeyError):
            break  # the line being written when the process died
    return header, entries


def reusable(out: Path, entry: ShardEntry | None) -> ShardEntry | None:
    """A journaled shard is kept only if its bytes (and index) still hash to what was recorded."""
    if entry is None or not (out / entry.path).is_file() or sha256_file(out / entry.path) != entry.sha256:
        return None
    if entry.index_path is not None:
        index = out / entry.index_path
        if not index.is_file() or sha256_file(index) != entry.index_sha256:
            return None
    return entry


def remove_journal(out: Path) -> None:
    """The last step of a pack, after the manifest is in place."""
    (out / JOURNAL_NAME).unlink()


def remove_outputs(out: Path) -> None:
    """For ``overwrite``: remove what a pack writes (manifest, journal, split folders of shards) only."""
    if not out.is_dir():
        return
    for name in (MANIFEST_NAME, JOURNAL_NAME):
        (out / name).unlink(missing_ok=True)
    for split_dir in (p for p in out.iterdir() if p.is_dir()):
        for path in split_dir.glob("shard-*"):
            path.unlink()
        if not any(split_dir.iterdir()):
            shutil.rmtree(split_dir)


Writer = tuple[Callable[..., ShardEntry], tuple[Any, ...]]
"""A shard-writing task: a module-level function and its arguments after the ``ShardJob`` (they pickle)."""


class Output(Protocol):
    """Where a pack writes: the states of the module docstring, the journal, the final commit."""

    @property
    def display(self) -> str:
        """OUT, safe to print (no credentials)."""
        ...

    def prepare(self, job: Job, *, resume: bool, overwrite: bool) -> Prepared: ...

    def reusable(self, entry: ShardEntry | None) -> ShardEntry | None:
        """``entry`` if its shard (and index) in OUT may be kept by a resume, else None."""
        ...

    def writer(self, format_name: str, source_options: Mapping[str, Any] | None) -> Writer: ...

    def journal(self) -> AbstractContextManager[Callable[[ShardEntry], None]]:
        """A context whose value records one finished shard, durably, before the next is recorded."""
        ...

    def commit(self, manifest: Manifest) -> None:
        """The last step: the manifest goes in place, then the journal goes."""
        ...


class LocalOutput:
    """OUT on this machine: shards are written in place; this is the pack's path since before URLs."""

    def __init__(self, out: Path) -> None:
        self.out = out

    @property
    def display(self) -> str:
        return str(self.out)

    def prepare(self, job: Job, *, resume: bool, overwrite: bool) -> Prepared:
        return prepare_output(self.out, job, resume=resume, overwrite=overwrite)

    def reusable(self, entry: ShardEntry | None) -> ShardEntry | None:
        return reusable(self.out, entry)

    def writer(self, format_name: str, source_options: Mapping[str, Any] | None) -> Writer:
        if source_options:  # only for URL cells in the source: a local pack's task is as it always was
            return write.write_shard, (self.out, format_name, dict(source_options))
        return write.write_shard, (self.out, format_name)

    @contextmanager
    def journal(self) -> Iterator[Callable[[ShardEntry], None]]:
        with (self.out / JOURNAL_NAME).open("a") as journal:

            def record(entry: ShardEntry) -> None:
                journal.write(json.dumps(entry.to_json()) + "\n")
                journal.flush()

            yield record

    def commit(self, manifest: Manifest) -> None:
        sweep_temporaries(self.out)  # an attempt an engine killed mid-write and retried left its temporary
        write_manifest(self.out, manifest)
        remove_journal(self.out)


def open_output(out: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> Output:
    """A local folder for a path (or ``file://`` URL), an object-store prefix for a remote URL."""
    if is_remote(out):
        if urlsplit(str(out)).scheme.lower() in ("http", "https"):
            raise UsageError(
                f"cannot pack to {redact_url(str(out))}: http(s) has no standard upload; write to a "
                "local folder, s3:// or gs:// and serve that"
            )
        from shardpipe.storage import open_store
        from shardpipe.store_output import StoreOutput  # imported here: fsspec stays off local packs

        return StoreOutput(open_store(out, storage_options=storage_options))
    return LocalOutput(Path(as_location(out)))
