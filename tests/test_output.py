"""OUT's states (fresh, interrupted, finished, foreign) and what a pack may do with each."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from shardpipe.errors import UsageError
from shardpipe.manifest import MANIFEST_NAME, Manifest, load_manifest, write_manifest
from shardpipe.packing.output import (
    JOURNAL_NAME,
    Job,
    JobMismatchError,
    Output,
    OutputNotEmptyError,
    Prepared,
    compare_jobs,
    parse_journal,
)
from shardpipe.shardtable import ShardEntry
from shardpipe.storage import open_store
from shardpipe.storage.files import sha256_file


def prepare_output(out: Path, job: Job, *, resume: bool, overwrite: bool) -> Prepared:
    return Output(open_store(out)).prepare(job, resume=resume, overwrite=overwrite)


def reusable(out: Path, entry: ShardEntry | None) -> ShardEntry | None:
    return Output(open_store(out)).reusable(entry)


def read_journal(path: Path) -> tuple[dict[str, object], list[ShardEntry]]:
    header, entries, pieces = parse_journal(path.read_text())
    assert pieces == []  # pieces are journaled by packs with a map only
    return header, entries


OPTIONS = {"format": "tar", "seed": 0, "order": "hashed", "max_samples": 10}
JOB = Job("aaaa", OPTIONS, "src")


def _entry(out: Path, name: str, data: bytes) -> ShardEntry:
    path = out / "train" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return ShardEntry(f"train/{name}", 1, len(data), sha256_file(path))


def _manifest(out: Path, job: dict[str, object]) -> Manifest:
    entry = _entry(out, "shard-000000.lmdb", b"shard")  # LMDB: a manifest that needs no index files
    manifest = Manifest("lmdb", ("bin",), {"train": (entry,)}, {"method": "m"}, job=job)
    write_manifest(open_store(out), manifest)
    return manifest


def test_fresh_output_gets_a_journal_naming_the_job(tmp_path: Path) -> None:
    out = tmp_path / "a" / "out"
    prepared = prepare_output(out, JOB, resume=False, overwrite=False)
    assert prepared.finished == {} and prepared.complete is None
    header, entries = read_journal(out / JOURNAL_NAME)
    assert header == JOB.to_json() and entries == []
    (tmp_path / "empty").mkdir()
    assert prepare_output(tmp_path / "empty", JOB, resume=True, overwrite=False).finished == {}


def test_output_holding_files_is_refused_in_library_terms(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutputNotEmptyError) as caught:
        prepare_output(tmp_path, JOB, resume=False, overwrite=False)
    assert not caught.value.holds_dataset and "--" not in str(caught.value)
    with pytest.raises(OutputNotEmptyError):  # resume with nothing to resume
        prepare_output(tmp_path, JOB, resume=True, overwrite=False)
    _manifest(tmp_path, JOB.to_json())
    with pytest.raises(OutputNotEmptyError) as caught:
        prepare_output(tmp_path, JOB, resume=False, overwrite=False)
    assert caught.value.holds_dataset
    again = pickle.loads(pickle.dumps(caught.value))
    assert again.holds_dataset and str(again) == str(caught.value)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="not a directory"):
        prepare_output(tmp_path / "file", JOB, resume=False, overwrite=False)


def test_resume_keeps_the_journal_of_the_same_job(tmp_path: Path) -> None:
    prepare_output(tmp_path, JOB, resume=False, overwrite=False)
    entry = _entry(tmp_path, "shard-000000.tar", b"done")
    with (tmp_path / JOURNAL_NAME).open("a") as journal:
        journal.write(json.dumps(entry.to_json()) + "\n" + '{"path": "train/shard-0000')  # cut by a kill
    (tmp_path / "train" / "shard-000001.tar.tmp-123").write_bytes(b"partial")
    prepared = prepare_output(tmp_path, JOB, resume=True, overwrite=False)
    assert prepared.finished == {entry.path: entry} and prepared.complete is None
    assert not list(tmp_path.rglob("*.tmp-*"))


def test_resume_refuses_another_job_saying_what_differs(tmp_path: Path) -> None:
    prepare_output(tmp_path, JOB, resume=False, overwrite=False)
    other = Job("bbbb", {**OPTIONS, "seed": 4, "max_samples": 20}, "src")
    with pytest.raises(JobMismatchError) as caught:
        prepare_output(tmp_path, other, resume=True, overwrite=False)
    assert caught.value.differences == ("seed: found 0, expected 4", "max_samples: found 10, expected 20")
    assert not caught.value.complete and "interrupted" in str(caught.value)
    again = pickle.loads(pickle.dumps(caught.value))
    assert again.differences == caught.value.differences


def test_finished_dataset_of_the_same_job_is_complete(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, JOB.to_json())
    prepared = prepare_output(tmp_path, JOB, resume=True, overwrite=False)
    assert prepared.complete == manifest and not (tmp_path / JOURNAL_NAME).exists()
    # killed between the manifest write and the journal removal: still complete, journal cleaned up
    (tmp_path / JOURNAL_NAME).write_text(json.dumps(JOB.to_json()) + "\n")
    prepared = prepare_output(tmp_path, JOB, resume=True, overwrite=False)
    assert prepared.complete == manifest and not (tmp_path / JOURNAL_NAME).exists()


def test_finished_dataset_of_another_job_is_refused(tmp_path: Path) -> None:
    _manifest(tmp_path, JOB.to_json())
    with pytest.raises(JobMismatchError, match="finished") as caught:
        prepare_output(
            tmp_path, Job("cccc", {**OPTIONS, "order": "sorted"}, "src"), resume=True, overwrite=False
        )
    assert caught.value.differences == ("order: found 'hashed', expected 'sorted'",)
    assert (tmp_path / MANIFEST_NAME).exists()  # nothing touched


def test_compare_jobs_names_a_changed_source_and_an_unrecorded_job() -> None:
    assert compare_jobs(JOB.to_json(), JOB) == ()
    (moved,) = compare_jobs(JOB.to_json(), Job("dddd", OPTIONS, "elsewhere"))
    assert moved == "source: found 'src', expected 'elsewhere'"
    (content,) = compare_jobs(JOB.to_json(), Job("eeee", OPTIONS, "src"))
    assert "content changed" in content and "found pack job aaaa, expected eeee" in content
    (old,) = compare_jobs({}, JOB)
    assert "unrecorded" in old and "older shardpipe" in old
    (old_journal,) = compare_jobs({"fingerprint": "ffff"}, JOB)
    assert "found pack job ffff, expected aaaa" in old_journal


def test_journal_of_an_older_shardpipe_reads_as_its_fingerprint(tmp_path: Path) -> None:
    (tmp_path / JOURNAL_NAME).write_text('{"job": "aaaa"}\n')
    assert read_journal(tmp_path / JOURNAL_NAME) == ({"fingerprint": "aaaa"}, [])
    assert prepare_output(tmp_path, JOB, resume=True, overwrite=False).finished == {}


def test_reusable_needs_the_recorded_bytes_and_index(tmp_path: Path) -> None:
    entry = _entry(tmp_path, "shard-000000.tar", b"shard")
    assert reusable(tmp_path, entry) == entry
    assert reusable(tmp_path, None) is None
    index = tmp_path / "train" / "shard-000000.tar.idx"
    index.write_bytes(b"index")
    with_index = ShardEntry(entry.path, 1, 5, entry.sha256, "train/shard-000000.tar.idx", sha256_file(index))
    assert reusable(tmp_path, with_index) == with_index
    index.write_bytes(b"indeX")
    assert reusable(tmp_path, with_index) is None
    (tmp_path / entry.path).write_bytes(b"shart")
    assert reusable(tmp_path, entry) is None
    (tmp_path / entry.path).unlink()
    assert reusable(tmp_path, entry) is None


def test_overwrite_removes_only_what_a_pack_writes(tmp_path: Path) -> None:
    _manifest(tmp_path, JOB.to_json())
    (tmp_path / "train" / "notes.txt").write_text("mine")
    (tmp_path / "mine.txt").write_text("mine")
    (tmp_path / "val").mkdir()
    (tmp_path / "val" / "shard-000000.tar").write_bytes(b"x")  # a split folder holding only shards goes
    _entry(tmp_path, "shard-000001.tar", b"x")
    (tmp_path / JOURNAL_NAME).write_text("{}\n")
    Output(open_store(tmp_path))._remove_outputs()
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert left == ["mine.txt", "train", "train/notes.txt"]
    prepared = prepare_output(tmp_path, JOB, resume=False, overwrite=True)
    assert prepared.finished == {} and (tmp_path / JOURNAL_NAME).exists()


def test_dataset_of_an_older_shardpipe_reads_and_resume_says_why_it_refuses(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, {})
    data = json.loads((tmp_path / MANIFEST_NAME).read_text())
    assert "job" not in data and "order" not in data  # what an older shardpipe wrote
    assert load_manifest(tmp_path) == manifest and manifest.order == {}
    with pytest.raises(JobMismatchError, match="older shardpipe recorded no options"):
        prepare_output(tmp_path, JOB, resume=True, overwrite=False)
