"""The output: make sure OUT is ours to write, keep its journal of finished shards, commit the manifest.

OUT is any store (a local folder or an object-store prefix); the same steps run on both. States of OUT,
and what a pack does with each:

* missing or empty: a fresh pack; a journal is started.
* holding a journal (an interrupted pack): with ``resume``, the journal's finished shards are kept if
  they are still as it recorded them (:meth:`Output.reusable`) and the journal's job is this job.
* holding a manifest (a finished pack): with ``resume`` and the same job, nothing to do (a journal left
  by a kill between the manifest write and the journal removal is removed); with another job, refused
  with what differs.
* anything else, or any of the above without ``resume``: refused unless ``overwrite``, which removes only
  what a pack writes.

The journal (``OUT/.shardpipe-journal.jsonl``) gets one line per finished shard, recorded only after
the shard (and its index) is in place; the manifest goes last, then the journal goes: the dataset is
complete exactly when its manifest exists. Errors are in library terms (:class:`OutputNotEmptyError`,
:class:`JobMismatchError`); the CLI names the flags.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from shardpipe.errors import UsageError
from shardpipe.formats.compression import DICTIONARY_FOLDER
from shardpipe.manifest import MANIFEST_NAME, Manifest, read_manifest, write_manifest
from shardpipe.packing.mapping.pieces import STAGING, MappedPiece
from shardpipe.shardtable import TABLE_SUFFIX, ShardEntry
from shardpipe.storage import ObjectNotFoundError, Store

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
    """OUT made ready: the journal's finished shards (and mapped pieces) to consider, or the finished
    dataset already there."""

    finished: dict[str, ShardEntry]
    complete: Manifest | None = None
    pieces: dict[int, MappedPiece] = field(default_factory=dict)


class OutputNotEmptyError(UsageError):
    """OUT holds a dataset or other files, and the pack was not asked to resume or replace them."""

    def __init__(self, message: str, *, holds_dataset: bool = False) -> None:
        super().__init__(message)
        self.holds_dataset = holds_dataset

    @classmethod
    def at(cls, out: str, holds_dataset: bool) -> OutputNotEmptyError:
        what = "a shardpipe dataset" if holds_dataset else "other files"
        return cls(f"output {out} already holds {what}", holds_dataset=holds_dataset)


class JobMismatchError(UsageError):
    """A resume found another pack job in OUT; ``differences`` says what differs, found vs expected."""

    def __init__(self, message: str, *, differences: tuple[str, ...] = (), complete: bool = False) -> None:
        super().__init__(message)
        self.differences, self.complete = differences, complete

    @classmethod
    def at(cls, out: str, differences: tuple[str, ...], complete: bool) -> JobMismatchError:
        state = "finished" if complete else "interrupted"
        message = f"cannot resume in {out}: it holds a {state} pack of another job: {'; '.join(differences)}"
        return cls(message, differences=differences, complete=complete)


class Output:
    """A pack's OUT (see the module docstring), over any store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @property
    def display(self) -> str:
        """OUT, safe to print (no credentials)."""
        return self.store.display

    def prepare(self, job: Job, *, resume: bool, overwrite: bool) -> Prepared:
        """Check OUT is ours to write and start (or continue) its journal."""
        store = self.store
        root = store.local_path()
        if root is not None and root.exists() and not root.is_dir():
            raise UsageError(f"output {root} exists and is not a directory")
        has_manifest = store.exists(MANIFEST_NAME)
        if overwrite:
            self._remove_outputs()
        elif resume and has_manifest:
            manifest = read_manifest(store)
            differences = compare_jobs(manifest.job, job)
            if differences:
                raise JobMismatchError.at(self.display, differences, complete=True)
            if store.exists(JOURNAL_NAME):  # killed after the manifest was written: the pack is complete
                store.remove(JOURNAL_NAME)
            store.remove_temporaries()
            return Prepared({}, manifest)
        elif resume and store.exists(JOURNAL_NAME):
            header, entries, pieces = parse_journal(store.read(JOURNAL_NAME).decode())
            differences = compare_jobs(header, job)
            if differences:
                raise JobMismatchError.at(self.display, differences, complete=False)
            store.remove_temporaries()
            return Prepared({e.path: e for e in entries}, pieces={p.index: p for p in pieces})
        else:
            if resume:  # killed before its journal was published: at most a temporary of it is left
                store.remove_temporaries()
            if store.list_keys():
                raise OutputNotEmptyError.at(self.display, has_manifest)
        store.put(JOURNAL_NAME, (json.dumps(job.to_json()) + "\n").encode())
        return Prepared({})

    def reusable(self, entry: ShardEntry | None) -> ShardEntry | None:
        """``entry`` if its shard (and index) in OUT may be kept by a resume, else None.

        The shard must exist with the journaled size; where its bytes are on this machine they are hashed
        again too. A remote shard is not downloaded to re-hash: its journal entry was written only after
        its upload was read back and matched the sha256 it records, so a re-hash would cost a full
        download of every kept shard to guard against a third party replacing an object with one of the
        same size; ``shardpipe verify`` is the check for that.
        """
        if entry is None or not self._unchanged(entry.path, entry.num_bytes, entry.sha256):
            return None
        if entry.index_path is not None and not self._unchanged(entry.index_path, None, entry.index_sha256):
            return None
        return entry

    def reusable_piece(self, piece: MappedPiece | None) -> MappedPiece | None:
        """A journaled mapped piece whose staged shard is still as recorded (or that gave no output)."""
        if piece is None or (piece.staged is not None and self.reusable(piece.staged) is None):
            return None
        return piece

    def record(self, done: ShardEntry | MappedPiece) -> None:
        """Journal one finished shard or mapped piece (one line), before the next is recorded."""
        self.store.append(JOURNAL_NAME, (json.dumps(done.to_json()) + "\n").encode())

    def commit(self, manifest: Manifest) -> None:
        """The last step: the manifest goes in place, then the journal goes, then what was staged."""
        self.store.remove_temporaries()  # an attempt an engine killed mid-write and retried left one
        write_manifest(self.store, manifest)
        self.store.remove(JOURNAL_NAME)
        for key in self.store.list_keys(STAGING):
            self.store.remove(key)

    def _unchanged(self, key: str, size: int | None, sha256: str | None) -> bool:
        try:
            found = self.store.size(key)
        except ObjectNotFoundError:
            return False
        if size is not None and found != size:
            return False
        return self.store.local_path(key) is None or self.store.sha256(key)[0] == sha256

    def _remove_outputs(self) -> None:
        """For ``overwrite``: what a pack writes (manifest, journal, shard tables, ``<split>/shard-*``, the
        staging folder, the compression dictionaries), nothing else."""
        for key in self.store.list_keys():
            parts = key.split("/")
            ours = key in (MANIFEST_NAME, JOURNAL_NAME) or parts[0] == STAGING or key.endswith(TABLE_SUFFIX)
            ours = ours or (len(parts) == 2 and parts[0] == DICTIONARY_FOLDER and parts[1].endswith(".zdict"))
            if ours or (len(parts) == 2 and parts[1].startswith("shard-")):
                self.store.remove(key)


def compare_jobs(found: dict[str, Any], expected: Job) -> tuple[str, ...]:
    """What differs between a recorded job (manifest or journal) and this one; empty when they match."""
    if found.get("fingerprint") == expected.fingerprint:
        return ()
    if "options" not in found:
        return (
            f"found pack job {found.get('fingerprint') or 'unrecorded'}, expected {expected.fingerprint} "
            "(an older shardpipe recorded no options to compare)",
        )
    names = dict.fromkeys([*expected.options, *found["options"]])  # an option one of them lacks differs too
    differences = [
        f"{name}: found {found['options'].get(name)!r}, expected {expected.options.get(name)!r}"
        for name in names
        if found["options"].get(name) != expected.options.get(name)
    ]
    if found.get("source") != expected.source:
        differences.append(f"source: found {found.get('source')!r}, expected {expected.source!r}")
    if not differences:
        differences.append(
            "the same options and source, but the source's content changed (samples added, removed, "
            f"renamed or resized): found pack job {found['fingerprint']}, expected {expected.fingerprint}"
        )
    return tuple(differences)


def parse_journal(text: str) -> tuple[dict[str, Any], list[ShardEntry], list[MappedPiece]]:
    """A journal's job header, its finished shards and mapped pieces, up to a line cut short by a kill."""
    lines = text.splitlines()
    try:
        header = json.loads(lines[0]) if lines else {}
    except ValueError:
        header = {}
    if "job" in header:  # the header of an older shardpipe: the fingerprint alone
        header = {"fingerprint": header["job"]}
    entries, pieces = [], []
    for line in lines[1:]:
        try:
            data = json.loads(line)
            if "piece" in data:
                pieces.append(MappedPiece.from_json(data))
            else:
                entries.append(ShardEntry.from_json(data))
        except (ValueError, KeyError, TypeError):
            break  # the line being written when the process died
    return header, entries, pieces
