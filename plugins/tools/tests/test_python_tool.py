"""The python tool end to end in the code verifier's kernel sandbox (skipped, with the reason, where this machine
cannot start it), and its refusal to start without the sandbox, exactly as the code verifier refuses."""

from __future__ import annotations

import time

import pytest

from rlzoo.errors import RlzooError
from rlzoo.interfaces import ToolCall, ToolTimeout
from rlzoo.tools import run_tool_calls


def _sandbox_or_reason():
    from rlzoo_tools.python_tool import PythonTool

    try:
        return PythonTool(PythonTool.Params(timeout_s=2.0, memory_mb=128)), ""
    except RlzooError as err:
        return None, str(err)


TOOL, WHY = _sandbox_or_reason()
needs_sandbox = pytest.mark.skipif(TOOL is None, reason=f"the code verifier's kernel sandbox is unavailable: {WHY}")


def run(code: str) -> str:
    return TOOL.call({"code": code})


@needs_sandbox
def test_prints_come_back_without_the_runners_nonce():
    assert run("print(6 * 7)") == "42"
    assert run("print('a')\nprint('b')") == "a\nb"
    assert run("x = 1") == "(no output)"
    assert run("```python\nprint(sum(range(10)))\n```") == "45"  # fences stripped


@needs_sandbox
def test_an_exception_shows_the_output_so_far_and_the_traceback():
    out = run("print('before')\n1 / 0")
    assert out.startswith("before\nTraceback") and 'File "<code>", line 2' in out
    assert "ZeroDivisionError: division by zero" in out and out.endswith("[exit: runtime error]")
    assert "runner.py" not in out
    assert run("def f(:\n    pass").endswith("[exit: syntax error]")


@needs_sandbox
def test_the_sandbox_limits_hold():
    assert run("open('/etc/rlzoo-tool-test', 'w')").endswith("[exit: write outside sandbox]")
    assert run("import socket; socket.socket()").endswith("[exit: network access]")
    assert run("x = bytearray(1 << 30)").endswith("[exit: memory limit]")
    assert "ok" in run("open('scratch.txt', 'w').write('ok'); print(open('scratch.txt').read())")


@needs_sandbox
def test_output_is_truncated():
    out = run("print('x' * 100000)")
    assert out.startswith("x" * 4000) and "truncated to 4000 characters" in out and len(out) < 4100


@needs_sandbox
def test_a_hung_program_is_killed_at_its_budget_and_counted_timeout():
    start = time.monotonic()
    with pytest.raises(ToolTimeout, match="killed after 2 s; it printed:\nstarted"):
        run("import time\nprint('started')\nwhile True: pass")
    assert time.monotonic() - start < 4.0
    start = time.monotonic()
    (outcome,) = run_tool_calls([ToolCall("python", {"code": "import time; time.sleep(60)"})], {"python": TOOL})
    assert outcome.status == "timeout" and time.monotonic() - start < 4.0


@needs_sandbox
def test_calls_run_concurrently_through_the_runner():
    calls = [ToolCall("python", {"code": "import time; time.sleep(1.5); print(1)"})] * 2
    start = time.monotonic()
    outcomes = run_tool_calls(calls, {"python": TOOL})
    # one after the other would take 3 s and two sandbox starts; the margin absorbs a loaded 2-core machine
    assert [o.content for o in outcomes] == ["1", "1"] and time.monotonic() - start < 2.7


def test_missing_bwrap_is_the_code_verifiers_error(monkeypatch):
    from rlzoo_tools.python_tool import PythonTool

    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RlzooError, match="bubblewrap.*isolation: process"):
        PythonTool()


def test_the_process_isolation_opt_out_runs_without_bwrap(monkeypatch):
    from rlzoo_tools.python_tool import PythonTool

    monkeypatch.setenv("PATH", "/nonexistent")
    tool = PythonTool(PythonTool.Params(isolation="process", timeout_s=5.0))
    assert tool.call({"code": "print(2 ** 10)"}) == "1024"
