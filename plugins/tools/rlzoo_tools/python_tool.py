"""The ``python`` tool: run code in the ``code`` verifier's kernel sandbox and return what it printed."""

from __future__ import annotations

import os
import re
import tempfile
from typing import Any, Literal

from pydantic import Field

import rlzoo
from rlzoo.interfaces import Params, Tool, ToolError, ToolTimeout
from rlzoo_verifiers.code import RUNNER, CodeVerifier, _rmtree, strip_code_fences

# the code runs in the verifier's "tests" slot; this "solution" runs first, binds no name, and makes prints reach
# the output file line by line, so what was printed before a crash or a kill is not lost in a buffer
_PRELUDE = "__import__('sys').stdout.reconfigure(line_buffering=True)\n"
_START_GRACE_S = 1.0  # the runner waits this much longer than the sandbox's limit: the sandbox's own kill wins
_MARKER = "rlzoo-sandbox:"  # how the sandbox's runner prefixes its reports on stderr
_NONCE = re.compile(rb"\n[0-9a-f]{32}\n")  # the runner's completion line, the last of its stdout
_NONCE_LINE = 34
_RUNNER_FRAMES = ('  File "/sandbox/runner.py"', '  File "' + str(RUNNER))  # isolation: kernel / process


@rlzoo.register("tool", "python")
class PythonTool(Tool):
    """Run Python code in the ``code`` verifier's kernel sandbox; the observation is what it printed.

    Each call is a fresh sandbox (nothing is kept between calls): the ``code`` verifier's bubblewrap sandbox
    (no network, a read-only system, a private ``disk_mb`` scratch directory, a seccomp filter, uid 65534),
    with its limits: wall clock ``timeout_s`` (the sandbox is killed), ``memory_mb``, ``file_mb`` of output,
    ``max_processes``, and only the standard library unless ``site_packages``. Markdown fences around the code
    are stripped. The observation is stdout, then stderr (a traceback), each cut to ``max_output_chars``; when the
    code did not finish normally a last line says why (``[exit: runtime error]``, ``[exit: memory limit]``, ...,
    the verifier's reasons). Such a call still counts as ``ok``: the tool worked, the model's code failed. The
    sandbox killing the code at ``timeout_s`` raises :class:`rlzoo.interfaces.ToolTimeout` (counted
    ``timeout``, with what was printed so far); a sandbox that fails to start is an ``error``.

    Without a usable sandbox (no ``bwrap``, or a kernel that refuses user namespaces) constructing the tool
    raises ``RlzooError`` exactly as the ``code`` verifier does, naming ``isolation: process``, the weaker
    in-process guards, as the explicit opt-out; it never falls back silently (docs/security.md).
    Reference: verl's sandbox-fusion code tool; TRL's ``tools=`` functions. The sandbox: rlzoo-verifiers' ``code``.
    """

    reference = "verl SandboxFusionTool; rlzoo code verifier's sandbox"
    description = (
        "Run a Python 3 program in a sandbox and return what it prints (stdout, then stderr). Use print() to see "
        "results. Standard library only, no network, no files outside the current directory; each call starts "
        "a fresh process (nothing is kept between calls)."
    )
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "the Python program to run"}},
        "required": ["code"],
        "additionalProperties": False,
    }

    class Params(Params):
        timeout_s: float = Field(5.0, gt=0, le=600, description="wall-clock limit of one call (the sandbox is killed)")
        memory_mb: int = Field(256, ge=32, description="address-space limit of the code (RLIMIT_AS)")
        file_mb: int = Field(16, ge=1, description="largest file the code may write, its output included")
        max_output_chars: int = Field(4000, ge=100, description="characters of stdout and of stderr shown")
        python: str | None = Field(None, description="interpreter to run the code with; null: the current one")
        site_packages: bool = Field(False, description="let the code import installed packages (numpy, ...)")
        isolation: Literal["kernel", "process"] = Field(
            "kernel", description="kernel: the code verifier's bubblewrap sandbox; process: in-process guards only"
        )
        disk_mb: int = Field(64, ge=1, description="size of the writable scratch directory (isolation: kernel)")
        max_processes: int = Field(16, ge=1, description="RLIMIT_NPROC in the sandbox (isolation: kernel)")

    def __init__(self, params: Params | None = None) -> None:
        super().__init__(params)
        p = self.params
        # the verifier builds and probes the sandbox here: no bwrap, or namespaces refused, raise RlzooError
        self.sandbox = CodeVerifier(
            CodeVerifier.Params(
                timeout_s=p.timeout_s,
                memory_mb=p.memory_mb,
                file_mb=p.file_mb,
                python=p.python,
                site_packages=p.site_packages,
                isolation=p.isolation,
                disk_mb=p.disk_mb,
                max_processes=p.max_processes,
            )
        )

    @property
    def timeout_s(self) -> float:
        return self.params.timeout_s + _START_GRACE_S

    def call(self, arguments: dict[str, Any]) -> str:
        code = strip_code_fences(arguments["code"])
        outer = tempfile.mkdtemp(prefix="rlzoo-python-tool-")
        try:
            verdict = self.sandbox._run(outer, _PRELUDE, code)  # noqa: SLF001 - the verifier's sandboxed run
            stdout_path = os.path.join(outer, "stdout")
            if verdict.reward >= 1.0:  # the runner's last stdout line is its completion nonce, not the code's output
                _drop_nonce(stdout_path)
            stdout = _read(stdout_path, self.params.max_output_chars)
            stderr = _clean(_read(os.path.join(outer, "stderr"), self.params.max_output_chars))
        finally:
            _rmtree(outer)
        if verdict.reason == "timeout":
            printed = _join(stdout, stderr)
            killed = f"the code was killed after {self.params.timeout_s:g} s"
            raise ToolTimeout(killed + (f"; it printed:\n{printed}" if printed else ""))
        observation = _join(stdout, stderr)
        if verdict.reward < 1.0:
            observation = _join(observation, f"[exit: {verdict.reason}]")
        return observation or "(no output)"


def _drop_nonce(path: str) -> None:
    """Cut the runner's ``\\n<32 hex digits>\\n`` completion line off the end of its stdout file."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        f.seek(max(0, size - _NONCE_LINE))
        tail = f.read()
    if _NONCE.fullmatch(tail):
        os.truncate(path, size - _NONCE_LINE)


def _read(path: str, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(4 * limit + 4)  # utf-8: at most 4 bytes a character
            more = bool(f.read(1))
    except OSError:
        raise ToolError("the sandbox's output could not be read") from None
    text = data.decode("utf-8", "replace")
    if len(text) > limit or more:
        return text[:limit] + f"\n... (output truncated to {limit} characters)"
    return text


def _clean(stderr: str) -> str:
    """The sandbox runner's reports in the model's words: the code ran as the verifier's ``<tests>`` source."""
    lines: list[str] = []
    in_runner = False
    for line in stderr.splitlines():
        if line.startswith('  File "'):  # a traceback frame; the runner's own (it exec'd the code) is noise
            in_runner = line.startswith(_RUNNER_FRAMES)
        elif not line.startswith("    "):
            in_runner = False
        if in_runner:
            continue
        if line.startswith(_MARKER):
            line = line[len(_MARKER) :].strip().replace("tests does not compile", "the code does not compile")
        lines.append(line.replace('"<tests>"', '"<code>"').replace("<tests>", "<code>"))
    return "\n".join(lines).strip("\n")


def _join(*parts: str) -> str:
    return "\n".join(p.rstrip("\n") for p in parts if p.strip())
