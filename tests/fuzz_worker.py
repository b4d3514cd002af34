"""The child process of ``test_fuzz``: damages packed datasets and reads them back, one case at a time.

Run as ``python -m tests.fuzz_worker BASE SEED FIRST COUNT``: BASE holds the packed datasets of
``DATASETS`` (``BASE/<name>``: one per format, and one with compressed fields and their dictionaries)
and ``BASE/expected.json``. For each case ``FIRST <= i < FIRST + COUNT`` it prints ``begin i``, copies one
dataset, damages it as ``(SEED, i)`` decide (bytes of a file, a key's bytes, a path the manifest names,
or a file replaced by a FIFO or a link to a device), reads the whole split through
``loaders.ShardedDataset``, looks samples up by position and by key through ``ShardedMapDataset``, and
runs ``verify``, then prints ``result <json>``. A case that kills the process (a fault in native code) or
hangs is named by the last ``begin`` line its parent saw.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from shardpipe.errors import ShardpipeError

DATASETS = {"lmdb": "lmdb", "tar": "tar", "tfrecord": "tfrecord", "zstd": "tfrecord"}
"""Each packed dataset and its format; ``zstd`` stores its fields compressed, with dictionaries."""
DAMAGES = ("flip", "zero", "truncate", "append")
KEY_DAMAGES = ("high bit", "low bit")
PATH_DAMAGES = ("/dev/zero", "../../../../etc/passwd", "/etc/passwd")
SPECIAL_DAMAGES = ("fifo", "link to /dev/zero")


def plan_case(base: Path, seed: int, case: int) -> dict[str, Any]:
    """Which dataset, file and damage case ``case`` of ``seed`` is: the same on every run."""
    rng = random.Random(f"{seed}:{case}")
    name = list(DATASETS)[case % len(DATASETS)]  # every dataset equally often
    root = base / name
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    named = [f for f in files if f.endswith((".idx", ".zdict"))]  # the files a manifest names but shards
    kinds = {
        "manifest": [f for f in files if f == "manifest.json"],
        "index": [f for f in files if f.endswith(".idx")],
        "dictionary": [f for f in files if f.endswith(".zdict")],
        "shard": [f for f in files if f != "manifest.json" and f not in named],
        "key": [f for f in files if f.endswith((".tar", ".tfrecord"))],  # keys located by the index
        "path": named,  # the manifest points it elsewhere (its digest recomputed)
        "special": named,  # the file becomes a FIFO, or a link to a device
    }
    kind = rng.choice([k for k, v in kinds.items() if v])
    damages = {"key": KEY_DAMAGES, "path": PATH_DAMAGES, "special": SPECIAL_DAMAGES}.get(kind, DAMAGES)
    return {
        "case": case,
        "format": name,
        "kind": kind,
        "file": rng.choice(kinds[kind]),
        "damage": rng.choice(damages),
        "seed": rng.getrandbits(32),
    }


def damage_case(root: Path, plan: dict[str, Any]) -> str:
    """Apply the planned damage to the dataset at ``root``; return what was done."""
    path = root / plan["file"]
    if plan["kind"] == "key":
        return damage_key(root, plan["file"], plan["damage"], plan["seed"])
    if plan["kind"] == "path":
        return repoint(root, plan["file"], plan["damage"])
    if plan["kind"] == "special":
        path.unlink()
        if plan["damage"] == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to("/dev/zero")
        return f"{plan['file']} is now a {plan['damage']}"
    return damage(path, plan["damage"], plan["seed"])


def damage_key(root: Path, shard: str, how: str, seed: int) -> str:
    """Flip one bit of one sample's key bytes, found through the shard's index."""
    from shardpipe.formats.layout import ShardIndex
    from shardpipe.manifest import load_manifest

    manifest = load_manifest(root)
    entry = next(e for split in manifest.splits.values() for e in split if e.path == shard)
    index = ShardIndex.read(root / str(entry.index_path), entry.num_samples, manifest.fields)
    rng = random.Random(seed)
    plain = [i for i in range(entry.num_samples) if index.key_starts[i] < index.key_stops[i]]  # not PAX
    sample = rng.choice(plain)
    start, stop = int(index.key_starts[sample]), int(index.key_stops[sample])
    raw = bytearray((root / shard).read_bytes())
    at = rng.randrange(start, stop)
    raw[at] ^= 0x80 if how == "high bit" else 1 << rng.randrange(7)
    (root / shard).write_bytes(bytes(raw))
    return f"sample {sample}'s key, byte {at}: {how} flipped"


def repoint(root: Path, named: str, target: str) -> str:
    """Point the manifest's entry for ``named`` (an index or a dictionary) at ``target``, recomputing the
    manifest's digest as a hand edit would."""
    from shardpipe.manifest import DIGEST_KEY, content_digest

    data = json.loads((root / "manifest.json").read_text())
    entries = [shard.get("index") for split in data["splits"].values() for shard in split["shards"]]
    entries += [codec.get("dictionary") for codec in data.get("compression", {}).values()]
    for entry in entries:
        if entry is not None and entry["path"] == named:
            entry["path"] = target
    data[DIGEST_KEY] = content_digest(data)
    (root / "manifest.json").write_text(json.dumps(data))
    return f"the manifest points {named} at {target}"


def damage(path: Path, how: str, seed: int) -> str:
    """Change ``path``'s bytes (always: a damage that leaves the file as it was is redrawn)."""
    rng = random.Random(seed)
    raw = bytearray(path.read_bytes())
    original = bytes(raw)
    for _ in range(100):
        if how == "flip":
            for _ in range(rng.randint(1, 4)):
                raw[rng.randrange(len(raw))] ^= rng.randint(1, 255)
            detail = "flipped bytes"
        elif how == "zero":
            start = rng.randrange(len(raw))
            length = rng.randint(1, 64)
            raw[start : start + length] = bytes(len(raw[start : start + length]))
            detail = f"zeroed [{start}, {start + length})"
        elif how == "truncate":
            raw = raw[: rng.randrange(len(raw))]
            detail = f"truncated to {len(raw)}"
        else:
            raw += rng.randbytes(rng.randint(1, 2048))
            detail = "junk appended"
        if bytes(raw) != original:
            break
        raw = bytearray(original)
    path.write_bytes(bytes(raw))
    return detail


def read_all(root: Path, keys: list[str]) -> list[dict[str, Any]]:
    """The split streamed, then the samples of ``keys`` looked up by key and by position."""
    from loaders import ShardedDataset, ShardedMapDataset

    streamed = list(ShardedDataset(root, "train", shuffle=False))
    with ShardedMapDataset(root, "train") as ds:
        looked_up = [ds.get(key) for key in keys] + [ds[-1], ds[0]]
    return streamed + looked_up


def run_case(base: Path, plan: dict[str, Any], expected: dict[str, dict[str, str]]) -> dict[str, Any]:
    from shardpipe.tools.verify import verify

    result = dict(plan)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        shutil.copytree(base / plan["format"], root)
        result["detail"] = damage_case(root, plan)
        keys = random.Random(plan["seed"]).sample(sorted(expected), 3)
        try:
            samples = read_all(root, keys)
        except ShardpipeError as exc:
            result["read"] = "error"
            result["error"] = f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            result["read"] = "foreign"
            result["error"] = "".join(traceback.format_exception(exc))[-1500:]
        else:
            got = {
                s["__key__"]: {k: v.hex() for k, v in s.items() if not k.startswith("__")} for s in samples
            }
            same = len(samples) == len(expected) + len(keys) + 2 and got == expected
            result["read"] = "identical" if same else "silent difference"
        try:
            problems = verify(root, quiet=True)
            result["verify"] = "problems" if problems else "clean"
        except ShardpipeError:
            result["verify"] = "error"
        except Exception as exc:
            result["verify"] = "foreign"
            result["verify_error"] = "".join(traceback.format_exception(exc))[-1500:]
    return result


def main() -> None:
    base, seed, first, count = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    expected = json.loads((base / "expected.json").read_text())
    import loaders  # noqa: F401 - pay the torch import before the first case's clock starts

    crash_at = os.environ.get("SHARDPIPE_FUZZ_CRASH_AT")  # the parent's own test of crash reporting
    print("ready", flush=True)
    for case in range(first, first + count):
        print(f"begin {case}", flush=True)
        if crash_at is not None and case == int(crash_at):
            os.kill(os.getpid(), signal.SIGSEGV)
        print("result " + json.dumps(run_case(base, plan_case(base, seed, case), expected)), flush=True)


if __name__ == "__main__":
    main()
