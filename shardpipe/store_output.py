"""OUT as an object-store prefix (``s3://``, ``gs://``, any remote URL the storage seam takes).

An object store has no rename and no append, so the local output's steps become:

* a shard is written by the same :func:`shardpipe.write.write_shard` into a staging folder of its own (a
  fresh temporary folder per task, removed when the task ends), then its index and then the shard are
  uploaded with ``Store.put_file``, each read back and checked against its sha256; a final object name
  never holds a partial object, and a shard object is never visible before its index;
* the journal (``OUT/.shardpipe-journal.jsonl``) is one object, rewritten whole after each finished
  shard, and only after that shard's upload was checked;
* the manifest is uploaded last, then the journal removed: the dataset is complete exactly when its
  manifest exists.

A resume keeps a journaled shard when its object and its index object exist with the journaled sizes. It
does not download them again to re-hash: the journal entry was written only after the upload was read
back and matched the sha256 it records, so a re-hash would cost a full download of every kept shard to
guard against a third party replacing an object with one of the same size; ``shardpipe verify`` is the
check for that.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from shardpipe.manifest import MANIFEST_NAME, Manifest, ShardEntry, manifest_from_text
from shardpipe.output import (
    JOURNAL_NAME,
    Job,
    JobMismatchError,
    OutputNotEmptyError,
    Prepared,
    Writer,
    compare_jobs,
    parse_journal,
)
from shardpipe.plan import ShardJob
from shardpipe.remote_source import task_store
from shardpipe.storage import ObjectNotFoundError, Store
from shardpipe.write import write_shard

STAGING_PREFIX = "shardpipe-stage-"
"""Staging folders are made by ``tempfile`` (``TMPDIR``) with this prefix."""


class StoreOutput:
    """A pack's output in an object store (see the module docstring)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._journal_lines: list[str] = []

    @property
    def display(self) -> str:
        return self.store.display

    def prepare(self, job: Job, *, resume: bool, overwrite: bool) -> Prepared:
        store = self.store
        has_manifest = store.exists(MANIFEST_NAME)
        if overwrite:
            self._remove_outputs()
        elif resume and has_manifest:
            text = store.read(MANIFEST_NAME).decode()
            manifest = manifest_from_text(text, f"{self.display}/{MANIFEST_NAME}")
            differences = compare_jobs(manifest.job, job)
            if differences:
                raise JobMismatchError(self.display, differences, complete=True)
            if store.exists(JOURNAL_NAME):  # killed after the manifest was uploaded: the pack is complete
                store.remove(JOURNAL_NAME)
            return Prepared({}, manifest)
        elif resume and store.exists(JOURNAL_NAME):
            text = store.read(JOURNAL_NAME).decode()
            header, entries = parse_journal(text)
            differences = compare_jobs(header, job)
            if differences:
                raise JobMismatchError(self.display, differences, complete=False)
            self._journal_lines = [json.dumps(header), *(json.dumps(e.to_json()) for e in entries)]
            return Prepared({e.path: e for e in entries})
        elif store.list_keys():
            raise OutputNotEmptyError(self.display, has_manifest)
        self._journal_lines = [json.dumps(job.to_json())]
        self._put_journal()
        return Prepared({})

    def reusable(self, entry: ShardEntry | None) -> ShardEntry | None:
        if entry is None or not self._has(entry.path, entry.num_bytes):
            return None
        if entry.index_path is not None and not self._has(entry.index_path, None):
            return None
        return entry

    def writer(self, format_name: str, source_options: Mapping[str, Any] | None) -> Writer:
        return write_and_upload, (self.store, format_name, dict(source_options or {}))

    @contextmanager
    def journal(self) -> Iterator[Callable[[ShardEntry], None]]:
        def record(entry: ShardEntry) -> None:
            self._journal_lines.append(json.dumps(entry.to_json()))
            self._put_journal()

        yield record

    def commit(self, manifest: Manifest) -> None:
        self.store.put(MANIFEST_NAME, manifest.dumps().encode())
        self.store.remove(JOURNAL_NAME)

    def _put_journal(self) -> None:
        self.store.put(JOURNAL_NAME, "".join(line + "\n" for line in self._journal_lines).encode())

    def _has(self, key: str, size: int | None) -> bool:
        try:
            found = self.store.size(key)
        except ObjectNotFoundError:
            return False
        return size is None or found == size

    def _remove_outputs(self) -> None:
        """For ``overwrite``: what a pack writes (manifest, journal, ``<split>/shard-*``), nothing else."""
        for key in self.store.list_keys():
            parts = key.split("/")
            ours = key in (MANIFEST_NAME, JOURNAL_NAME) or (len(parts) == 2 and parts[1].startswith("shard-"))
            if ours:
                self.store.remove(key)


def write_and_upload(
    job: ShardJob, store: Store, format_name: str, source_options: Mapping[str, Any] | None = None
) -> ShardEntry:
    """The shard-writing task for a store: write into a staging folder, upload index then shard, checked.

    Module-level and picklable (the store pickles as its root and options), so any executor runs it.
    """
    store = task_store(store)
    with tempfile.TemporaryDirectory(prefix=STAGING_PREFIX) as staging:
        entry = write_shard(job, Path(staging), format_name, source_options)
        if entry.index_path is not None:
            store.put_file(entry.index_path, Path(staging, entry.index_path), sha256=entry.index_sha256)
        store.put_file(entry.path, Path(staging, entry.path), sha256=entry.sha256)
    return entry
