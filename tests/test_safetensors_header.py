"""The safetensors header check (:mod:`rlzoo.util.safetensors_header`): what it refuses, safetensors refuses too; what
it passes, safetensors loads. Damage is made by hand, byte by byte, on files safetensors itself wrote."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from rlzoo.util.safetensors_header import HeaderProblem, TensorInfo, header_problem, read_header

TENSORS = {
    "a": torch.arange(12, dtype=torch.float32).reshape(3, 4),
    "b": torch.ones(5, dtype=torch.bfloat16),
    "c": torch.zeros(0, 2, dtype=torch.int64),  # empty: zero bytes, still a tensor
    "d": torch.tensor([True, False]),
}


def _written(tmp_path: Path) -> Path:
    path = tmp_path / "w.safetensors"
    save_file(TENSORS, str(path), metadata={"format": "pt"})
    return path


def _split(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    length = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def _write(path: Path, header: dict, body: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)


def _library_refuses(path: Path) -> bool:
    try:
        load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError):
        return True
    return False


def test_a_whole_file_gives_every_tensor_without_loading_one(tmp_path):
    tensors = read_header(_written(tmp_path))
    assert tensors == {
        "a": TensorInfo("F32", (3, 4)),
        "b": TensorInfo("BF16", (5,)),
        "c": TensorInfo("I64", (0, 2)),
        "d": TensorInfo("BOOL", (2,)),
    }
    assert header_problem(_written(tmp_path)) is None


@pytest.mark.parametrize("keep", [0, 5, 8, 20, -1, -7])
def test_a_truncated_file_is_refused_wherever_it_is_cut(tmp_path, keep):
    path = _written(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: keep if keep >= 0 else len(data) + keep])
    problem = header_problem(path)
    assert problem is not None and problem.startswith(("truncated", "truncated or damaged header")), problem
    assert _library_refuses(path)


def test_the_sizes_are_named(tmp_path):
    path = _written(tmp_path)
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:-7])
    assert header_problem(path) == f"truncated ({size - 7} of {size} bytes)"
    path.write_bytes(b"\x01\x02")
    assert header_problem(path) == "truncated (2 bytes, not even a header)"


def test_a_file_longer_than_its_header_says_is_refused(tmp_path):
    path = _written(tmp_path)
    size = path.stat().st_size
    path.write_bytes(path.read_bytes() + b"\0" * 3)
    assert header_problem(path) == f"longer than its header says ({size + 3} bytes, {size} expected)"
    assert _library_refuses(path)


def damaged_headers():
    """``(id, change to the header dict)``: each leaves a header safetensors refuses."""

    def shape(header):
        header["a"]["shape"] = [4, 4]  # 64 bytes, given 48

    def gap(header):
        header["b"]["data_offsets"] = [header["b"]["data_offsets"][0] + 2, header["b"]["data_offsets"][1] + 2]

    def overlap(header):
        header["b"]["data_offsets"][0] -= 2

    def reversed_offsets(header):
        begin, end = header["a"]["data_offsets"]
        header["a"]["data_offsets"] = [end, begin]

    def no_dtype(header):
        del header["a"]["dtype"]

    def negative(header):
        header["a"]["shape"] = [-3, -4]

    def boolean(header):
        header["d"]["shape"] = [True, True]

    def text_offsets(header):
        header["a"]["data_offsets"] = ["0", "48"]

    def not_a_dict(header):
        header["a"] = [1, 2]

    return [shape, gap, overlap, reversed_offsets, no_dtype, negative, boolean, text_offsets, not_a_dict]


@pytest.mark.parametrize("damage", damaged_headers(), ids=lambda f: f.__name__)
def test_a_damaged_header_is_refused_and_safetensors_agrees(tmp_path, damage):
    path = _written(tmp_path)
    header, body = _split(path)
    damage(header)
    _write(path, header, body)
    problem = header_problem(path)
    assert problem is not None and problem.startswith("damaged header"), problem
    assert _library_refuses(path)


@pytest.mark.parametrize("raw", [b"not json at all", b"[1, 2, 3]", b"\xff\xfe{}", b'{"a": '])
def test_a_header_that_is_no_json_object_is_refused(tmp_path, raw):
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    assert header_problem(path) == "damaged header (not valid safetensors: the header is no JSON object)"
    assert _library_refuses(path)


def test_a_header_length_beyond_the_file_is_refused_before_reading_it(tmp_path):
    path = _written(tmp_path)
    data = bytearray(path.read_bytes())
    data[:8] = struct.pack("<Q", 2**40)
    path.write_bytes(bytes(data))
    with pytest.raises(HeaderProblem, match=r"truncated or damaged header \(\d+ bytes, header of 1099511627776 "):
        read_header(path)


def test_metadata_and_an_unknown_dtype_are_accepted(tmp_path):
    """A dtype a later safetensors adds is not refused: its byte count is simply not checked."""
    path = _written(tmp_path)
    header, body = _split(path)
    header["b"]["dtype"] = "F12_FUTURE"
    _write(path, header, body)
    assert read_header(path)["b"] == TensorInfo("F12_FUTURE", (5,))


def test_flipped_tensor_bytes_are_not_visible_in_the_header(tmp_path):
    """What the check cannot see (digests tell these): the header is whole, the values changed."""
    path = _written(tmp_path)
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF
    path.write_bytes(bytes(data))
    assert header_problem(path) is None
    assert not torch.equal(load_file(str(path))["a"], TENSORS["a"])


def test_an_unreadable_path_is_named_as_such(tmp_path):
    assert header_problem(tmp_path).startswith("unreadable (IsADirectoryError")
    assert header_problem(tmp_path / "missing.safetensors").startswith("unreadable (FileNotFoundError")
