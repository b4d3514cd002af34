"""Which files of a folder form a Parquet dataset, and which split each file belongs to.

A folder (local, or an object-store prefix) is a Parquet dataset when it holds ``.parquet`` files and
nothing else but side files (:data:`SIDE_FIELDS`: a README, JSON metadata, a LICENSE): the layout that
Hugging Face's hub serves and ``hf download`` fetches, and that Spark or pandas write
(``part-00000.snappy.parquet``). Hidden names (``.gitattributes``, ``.cache/``) are skipped, as in a tree.
A folder of ``.arrow`` files and JSON side files is what ``datasets``' ``save_to_disk`` writes: read the
same way (:mod:`.arrow_files`), each file's split being its folder (a ``DatasetDict``'s split folders).

A file's split (:func:`split_of`), first rule that applies:

1. ``{split}-NNNNN-of-NNNNN.parquet``, the name ``datasets``' ``push_to_hub`` writes: the split as written
   (``train_sft-00000-of-00002.parquet`` is split ``train_sft``);
2. a name whose first word (up to ``-``, ``_``, ``.`` or a digit) is one of Hugging Face's split keywords
   (:data:`SPLIT_KEYWORDS`): that split (``dev.parquet`` is ``validation``, as ``datasets`` names it);
3. a name of digits only (``0000.parquet``, the hub's Parquet conversion, ``{config}/{split}/0000.parquet``):
   its folder's name;
4. a folder on the file's path named by a keyword (``train/part-0.parquet``): that split;
5. otherwise ``train``.

Pure functions of relative paths: the same files give the same splits wherever they are.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from shardpipe.sources.table import Grouped

SIDE_FIELDS = frozenset({"md", "json", "txt", "yaml", "yml"})
"""Extensions of files that may sit beside the Parquet files of a dataset folder (read or passed over)."""
SPLIT_KEYWORDS = {
    **dict.fromkeys(("train", "training"), "train"),
    **dict.fromkeys(("validation", "valid", "val", "dev"), "validation"),
    **dict.fromkeys(("test", "testing", "eval", "evaluation"), "test"),
}
"""Hugging Face's split keywords (``datasets.data_files``), each to the split it names."""
SPLIT_ORDER = ("train", "validation", "test")
"""Splits in this order first, as ``datasets`` lists them; any others after, by name."""

_PUSHED = re.compile(r"^(?P<split>[A-Za-z0-9_-]+?)-\d+-of-\d+$")
_FIRST_WORD = re.compile(r"^([A-Za-z]+)(?:[-_.\d]|$)")
_SPLIT_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def parquet_files(grouped: Grouped) -> list[tuple[str, str]] | None:
    """``(relative path, cell)`` of every Parquet file of a scanned folder, sorted by path, when the folder
    is a Parquet dataset (see the module docstring), or of every Arrow file when it is what ``datasets``'
    ``save_to_disk`` writes (Arrow files beside JSON side files); None when it is a tree of samples."""
    for kind in ("parquet", "arrow"):
        tables = [name for name in grouped if name == kind or name.endswith(f".{kind}")]
        if tables and all(name in SIDE_FIELDS for name in grouped if name not in tables):
            files = [(f"{key}.{name}", cell) for name in tables for key, (cell, _) in grouped[name].items()]
            return sorted((relpath, str(cell)) for relpath, cell in files)
    return None


def readme_cell(grouped: Grouped) -> str | None:
    """The path or URL of the folder's top-level ``README.md`` (where a hub dataset keeps its card)."""
    found = grouped.get("md", {}).get("README")
    return None if found is None else str(found[0])


def split_of(relpath: str) -> str:
    """The split of the Parquet file at ``relpath`` (relative to the dataset folder): the module's rules.
    An Arrow file written by ``save_to_disk`` is in its split's folder (``DatasetDict``), else ``train``
    (a ``Dataset`` saved alone names its split in ``state.json``, which the scan reads)."""
    *folders, name = relpath.split("/")
    if name.lower().endswith(".arrow"):
        return folders[-1] if folders else "train"
    stem = name.split(".", 1)[0]
    pushed = _PUSHED.match(stem)
    if pushed:
        return pushed["split"]
    word = _FIRST_WORD.match(stem)
    if word and word[1].lower() in SPLIT_KEYWORDS:
        return SPLIT_KEYWORDS[word[1].lower()]
    if stem.isdigit() and folders and _SPLIT_NAME.match(folders[-1]):
        return folders[-1]
    for folder in reversed(folders):
        if folder.lower() in SPLIT_KEYWORDS:
            return SPLIT_KEYWORDS[folder.lower()]
    return "train"


def ordered_splits(names: Iterable[str]) -> list[str]:
    """Split names in :data:`SPLIT_ORDER` first, the others after them by name."""
    found = set(names)
    return [name for name in SPLIT_ORDER if name in found] + sorted(found - set(SPLIT_ORDER))
