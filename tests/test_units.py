"""Memory sizes beyond a float's range are refused with the usual one-line message, never an OverflowError
(issue 36): ``parse_bytes`` itself, ``trainer.device_memory`` in the config. The ``--device-memory`` flag through the
real CLI: tests/test_fault_table_config.py. The accepted forms: tests/test_memory_estimate.py."""

from __future__ import annotations

import pytest

from rlzoo.config.resolution import build_config
from rlzoo.errors import ConfigError
from rlzoo.util.units import parse_bytes


@pytest.mark.parametrize("text", ["1e400GB", "1e400", "1e309", "1e300TiB", "9" * 400])
def test_a_size_beyond_a_float_is_refused(text):
    with pytest.raises(ValueError, match=r"is too large a memory size \(beyond 1.8e\+308 bytes\): write e.g. 80GB"):
        parse_bytes(text)


def test_the_largest_finite_sizes_still_parse():
    assert parse_bytes("1e308") == int(1e308)
    assert parse_bytes("1e299GB") == int(1e308)


@pytest.mark.parametrize("value", ["1e400GB", 1e400])  # YAML's 1.0e+400 is already a float: inf
def test_trainer_device_memory_beyond_a_float_is_a_config_error(value):
    with pytest.raises(ConfigError) as info:
        build_config({"trainer": {"device_memory": value}})
    ((loc, message),) = info.value.problems
    assert loc == "trainer.device_memory" and "memory size" in message
