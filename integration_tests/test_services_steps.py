"""Per-step rewards over HTTP end to end (issue 49): the ``process`` advantage on the ``chain`` task trains the same
through the ``remote`` verifier, against rlzoo's verifier server for the ``process`` verifier on 127.0.0.1, as with
the ``process`` verifier in process: the steps' rewards and spans come over rlzoo's protocol (``steps``) and land on
the same tokens. Slow: the unit of the promise is tests/test_serve_verifier.py's (the verdicts over HTTP equal the
in-process ones); this one shows them reach the advantages."""

from __future__ import annotations

import sys

import pytest
from runs_testlib import REPO, assert_finite_metrics, make_config, metrics_without_times

sys.path.append(str(REPO / "tests"))  # the loopback server of the service tests (appended: nothing is shadowed)
from service_testlib import serving  # noqa: E402

from rlzoo.registry import default_registry  # noqa: E402
from rlzoo.runtime.run import train  # noqa: E402
from rlzoo.services.server import app_for  # noqa: E402

CHAIN = [
    "algorithm.preset=gspo-token",
    "algorithm.advantage={name: process}",
    "task={name: chain, terms: 3}",
    "rollout.max_new_tokens=12",
]


@pytest.mark.slow
def test_process_advantages_from_a_served_process_verifier_match_the_in_process_run(tmp_path, cold_start_root):
    local = make_config(tmp_path / "local", cold_start_root, *CHAIN, "verifier={name: process}", task="chain")
    expected = assert_finite_metrics(train(local, progress=False), local.train.steps)
    with serving(app_for(default_registry().create("verifier", "process", {}))) as url:
        served = make_config(
            tmp_path / "served",
            cold_start_root,
            *CHAIN,
            f"verifier={{name: remote, url: '{url}/verify_batch'}}",
            task="chain",
        )
        actual = assert_finite_metrics(train(served, progress=False), served.train.steps)
    assert any(r["advantage/abs_mean"] > 0 for r in expected if "advantage/abs_mean" in r)  # step rewards moved it

    def comparable(rows):
        return [{k: v for k, v in r.items() if not k.startswith(("remote/", "eval/remote_"))} for r in rows]

    assert comparable(metrics_without_times(actual)) == metrics_without_times(expected)
    assert sum(r.get("remote/requests", 0) for r in actual) > 0
