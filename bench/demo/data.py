"""The demo's input: scikit-learn's 1,797 8x8 handwritten digits, one grayscale PNG per sample in class
folders (``<root>/<class>/<index:05d>.png``), written once and kept while complete."""

from __future__ import annotations

import shutil
from pathlib import Path

NUM_DIGITS = 1797  # sklearn.datasets.load_digits()


def digit_paths(root: Path) -> list[Path]:
    """Where each digit goes: ``<root>/<class>/<index:05d>.png``, in dataset order."""
    from sklearn.datasets import load_digits

    targets = load_digits().target
    return [root / str(int(label)) / f"{index:05d}.png" for index, label in enumerate(targets)]


def write_digits(root: Path) -> bool:
    """Write the digits as grayscale PNGs unless ``root`` already holds all of them; True if written.

    Files are written into ``<root>.partial`` and the folder renamed when complete, so an interrupted run
    never leaves a half-written tree that the next run would take for complete.
    """
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    expected = digit_paths(root)
    if all(p.is_file() and p.stat().st_size > 0 for p in expected) and _count_files(root) == len(expected):
        return False
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    digits = load_digits()
    for path, image in zip(digit_paths(partial), digits.images, strict=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        pixels = np.clip(np.rint(image * (255.0 / 16.0)), 0, 255).astype(np.uint8)  # 0..16 -> 0..255
        Image.fromarray(pixels).save(path, format="PNG")  # 2-D uint8 -> mode "L"
    shutil.rmtree(root, ignore_errors=True)
    partial.rename(root)
    return True


def _count_files(root: Path) -> int:
    return sum(1 for p in root.rglob("*") if p.is_file())
