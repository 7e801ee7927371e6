"""Model folders for tests that check a folder's files, never load its weights: :func:`write_weights` writes the
``model.safetensors`` its ``config.json`` describes (the names and shapes :mod:`rlzoo.models.folder_tensors` expects),
zero-filled and sparse, so a folder of any size costs a header."""

from __future__ import annotations

import json
import math
import struct
import threading
from pathlib import Path

from rlzoo.models.folder_tensors import build_problem, expected_tensors, hf_config

#: the fault tables set their cases up from threads, and transformers' lazy imports are not thread-safe
_ONE_AT_A_TIME = threading.Lock()


def write_weights(folder: Path, head: str = "lm") -> None:
    """``folder/model.safetensors`` holding, in F16 zeros, every tensor of the model ``folder/config.json`` describes
    for the role ``head``; a whole file without tensors where transformers cannot build that model (the config's
    own problem is what such a test is about)."""
    config = json.loads((folder / "config.json").read_text())
    with _ONE_AT_A_TIME:
        built, _ = hf_config(config, head)
        model = build_problem(built, head)[0] if built is not None else None
        shapes = expected_tensors(model) if model is not None else {}
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = math.prod(shape) * 2
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with open(folder / "model.safetensors", "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw)
        handle.truncate(8 + len(raw) + offset)
