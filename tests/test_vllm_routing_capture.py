"""The vllm engine's routing-capture strategies on fake vLLM objects (no vLLM needed): choice, options, matching.

The real worker capture is exercised against vLLM in integration_tests/test_vllm_routing.py; vLLM's own
``routed_experts`` path needs a GPU, so its column selection is checked here only.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlzoo.engines.vllm.routing import RoutedExpertsCapture, WorkerCapture, routing_capture
from rlzoo.errors import RlzooError
from rlzoo.moe import RoutingError


class FakeLLM:
    """``collective_rpc`` answering from a dict (an in-process engine core)."""

    def __init__(self, replies):
        self.replies, self.calls = replies, []
        self.llm_engine = SimpleNamespace(engine_core=type("InprocClient", (), {})())

    def collective_rpc(self, method, kwargs=None):
        self.calls.append(method)
        reply = self.replies.get(method)
        if isinstance(reply, Exception):
            raise reply
        return [reply() if callable(reply) else reply]


def test_the_strategy_is_chosen_from_the_mode_and_the_platform():
    assert isinstance(routing_capture("auto", on_cuda=False, enable_prefix_caching=False), WorkerCapture)
    assert isinstance(routing_capture("auto", on_cuda=True, enable_prefix_caching=False), RoutedExpertsCapture)
    assert isinstance(routing_capture("worker", on_cuda=True, enable_prefix_caching=False), WorkerCapture)
    assert isinstance(routing_capture("vllm", on_cuda=False, enable_prefix_caching=False), RoutedExpertsCapture)
    assert RoutedExpertsCapture.fixed_at_build and not WorkerCapture.fixed_at_build


def test_worker_capture_refuses_prefix_caching_before_anything_is_built():
    with pytest.raises(RlzooError, match="prefix caching"):
        WorkerCapture(enable_prefix_caching=True).build_kwargs()
    assert WorkerCapture(enable_prefix_caching=False).build_kwargs() == {}
    assert RoutedExpertsCapture().build_kwargs() == dict(enable_return_routed_experts=True, enable_prefix_caching=True)


def test_worker_capture_matches_records_to_samples():
    # two samples (n = 2) of one request "0": vLLM names them "<sample>_0-<random>"
    routing = torch.arange(5 * 1 * 2, dtype=torch.uint8).reshape(5, 1, 2)
    records = {
        "req_ids": ["0_0-abcdefgh", "1_0-ijklmnop"],
        "offsets": torch.tensor([0, 2, 5]),
        "positions": torch.tensor([0, 1, 0, 1, 2]),
        "tokens": torch.tensor([7, 8, 7, 9, 4], dtype=torch.int32),
        "routing": routing,
    }
    llm = FakeLLM({"rlzoo_routing_start": {"layers": [0], "top_k": 2, "num_experts": 8}, "rlzoo_routing_take": records})
    capture = WorkerCapture(enable_prefix_caching=False)
    capture.start(llm)
    capture.begin(llm)
    capture.end(llm)
    first = capture.routing("0", SimpleNamespace(index=0), 2, [7, 8, 5])
    second = capture.routing("0", SimpleNamespace(index=1), 2, [7, 9, 4, 3])
    assert torch.equal(first, routing[0:2]) and torch.equal(second, routing[2:5])
    with pytest.raises(RuntimeError, match="tokens do not match"):
        capture.routing("0", SimpleNamespace(index=0), 2, [7, 6, 5])
    capture.stop(llm)
    assert llm.calls == ["rlzoo_routing_start", "rlzoo_routing_clear", "rlzoo_routing_take", "rlzoo_routing_stop"]
    with pytest.raises(RoutingError, match="no fused-MoE"):
        capture.start(FakeLLM({"rlzoo_routing_start": RuntimeError("vLLM's model has no fused-MoE layer")}))


def test_routed_experts_keep_the_moe_layers_columns():
    llm = FakeLLM({"rlzoo_moe_layout": {"layers": [1, 3], "top_k": 2, "num_experts": 300}})
    capture = RoutedExpertsCapture()
    capture.start(llm)
    routed = np.arange(6 * 4 * 2).reshape(6, 4, 2)  # [seq_len, every decoder layer, top_k]
    got = capture.routing("0", SimpleNamespace(index=0, routed_experts=routed), 1, [1, 2, 3, 4, 5])
    assert got.dtype == torch.int16 and tuple(got.shape) == (4, 2, 2)
    assert torch.equal(got.long(), torch.as_tensor(routed[:4][:, [1, 3]]))
    with pytest.raises(RuntimeError, match="routed experts of shape"):
        capture.routing("0", SimpleNamespace(index=0, routed_experts=None), 1, [1, 2])
