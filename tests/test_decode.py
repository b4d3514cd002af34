"""Field decoders: chosen by extension or by name; nothing is ever unpickled."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from loaders.reading.decode import decode_image, resolve_decoders


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def test_auto_picks_decoders_by_last_extension() -> None:
    auto = resolve_decoders("auto", ("cls", "json", "seg.png", "bin", "npy"))
    assert set(auto) == {"cls", "json", "seg.png", "npy"}
    assert auto["cls"](b"12") == 12
    assert auto["json"](b'{"a": [1]}') == {"a": [1]}
    assert auto["npy"](npy_bytes(np.arange(6).reshape(2, 3))).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert resolve_decoders(None, ("cls",)) == {}


def test_nothing_is_unpickled() -> None:
    auto = resolve_decoders("auto", ("npy", "pth"))
    with pytest.raises(ValueError, match="allow_pickle"):
        auto["npy"](npy_bytes(np.array([{"x": 1}], dtype=object)))  # an object array would need unpickling
    buffer = io.BytesIO()
    torch.save({"f": print}, buffer)  # a function needs the unpickler's globals
    with pytest.raises(Exception, match=r"[Ww]eights only"):
        auto["pth"](buffer.getvalue())


def test_image_decodes_to_uint8_chw() -> None:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", (5, 3), color=7).save(buffer, format="PNG")
    image = decode_image(buffer.getvalue())
    assert image.shape == (1, 3, 5) and image.dtype == torch.uint8 and int(image[0, 0, 0]) == 7


def test_mappings_name_fields_and_decoders() -> None:
    decoders = resolve_decoders({"txt": "txt", "bin": len}, ("txt", "bin"))
    assert decoders["txt"](b"hi") == "hi" and decoders["bin"](b"abc") == 3
    with pytest.raises(ValueError, match="unknown decoder 'nope'"):
        resolve_decoders({"txt": "nope"}, ("txt",))
    with pytest.raises(ValueError, match="names field 'jpg', but the dataset's fields are txt"):
        resolve_decoders({"jpg": "jpg"}, ("txt",))
    with pytest.raises(ValueError, match="decode must be None, 'auto' or a mapping"):
        resolve_decoders("everything", ("txt",))


def test_an_int_column_parses_like_int_on_every_item() -> None:
    from loaders.batches import RaggedBytes
    from loaders.reading.decode import int_column

    uniform_not_digits = [b"-3", b"12", b" 7", b"+1"]  # one width, but signs and spaces: parsed one by one
    for items in (
        [b"3", b"0", b"9"],
        [b"007", b"120", b"999"],
        [b"12", b"1", b"-3", b" 4\n"],
        [b"5"],
        [],
        uniform_not_digits,
    ):
        got = int_column(RaggedBytes.from_list(items))
        assert got.dtype == torch.int64 and got.tolist() == [int(item) for item in items]
    with pytest.raises(ValueError):
        int_column(RaggedBytes.from_list([b"1", b"x"]))
