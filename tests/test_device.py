"""Where the in-process engines run (``device``), the GPU memory metric, and what the preflight checks about the
machine: a GPU for ``device: cuda``, and the packages every named component declares (a verifier's library).

The GPU side itself is run by ``benchmarks/gpu_check.sh`` (docs/gpu.md: an H100, both runs); on this CPU these
tests check that the CPU stays the default and that asking for a GPU that is not there is refused by field.
"""

from __future__ import annotations

import types

import pytest
import torch

import rlzoo
from rlzoo.config.resolution import build_config
from rlzoo.engines.device import device_memory_metrics, resolve_device
from rlzoo.errors import ConfigError, RlzooError
from rlzoo.interfaces import Verifier
from rlzoo.preflight.checks import preflight
from rlzoo.registry import Registry
from rlzoo.runtime.assembly import load_tokenizer

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


def test_auto_and_cpu_run_on_the_cpu_and_cuda_without_a_gpu_is_an_error():
    assert resolve_device("auto") == "cpu" and resolve_device("cpu") == "cpu"
    with pytest.raises(RlzooError, match="device: cuda, but torch sees no GPU"):
        resolve_device("cuda")
    assert device_memory_metrics() == {}  # no GPU touched: no memory/gpu_* metric


def test_the_preflight_refuses_device_cuda_without_a_gpu_by_field(tmp_path):
    registry = Registry.discover()
    config = build_config({"output_dir": str(tmp_path / "run"), "device": "cuda"}, registry=registry)
    with pytest.raises(ConfigError) as err:
        preflight(config, registry)
    assert [field for field, _ in err.value.problems] == ["device"]
    assert "allowed: auto, cpu, cuda" in err.value.problems[0][1]


def test_a_bad_device_value_names_the_allowed_ones(tmp_path):
    with pytest.raises(ConfigError) as err:
        build_config({"device": "tpu"}, registry=Registry.discover())
    ((field, message),) = err.value.problems
    assert field == "device" and "'auto', 'cpu' or 'cuda'" in message


class NeedsMissingLibrary(Verifier):
    """A verifier whose library is not installed."""

    name = "needs-missing"
    requires = ("no_such_module_for_rlzoo_tests",)
    install_hint = "pip install no-such-module"

    def verify(self, sample, response):  # pragma: no cover - never started
        raise AssertionError


def test_a_component_whose_package_is_missing_is_refused_before_the_run(tmp_path):
    registry = Registry.discover()
    module = types.ModuleType("device_test_plugins")
    module.rlzoo_verifiers = rlzoo.hookimpl(lambda: [NeedsMissingLibrary])
    module.rlzoo_verifiers.__name__ = "rlzoo_verifiers"
    registry.add_plugin(module, name="device-test", distribution="device-test-dist")
    config = build_config(
        {"output_dir": str(tmp_path / "run"), "verifier": {"name": "needs-missing"}}, registry=registry
    )
    with pytest.raises(ConfigError) as err:
        preflight(config, registry)
    assert err.value.problems == [
        (
            "verifier",
            "'needs-missing' needs the Python package 'no_such_module_for_rlzoo_tests', which is not installed "
            "(pip install no-such-module)",
        )
    ]


def test_a_tokenizer_without_a_pad_token_pads_with_its_eos(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "a": 1, "b": 2}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>").save_pretrained(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == 0
