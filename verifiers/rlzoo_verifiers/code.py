"""The ``code`` verifier: run a response's Python code against the sample's tests in a sandboxed subprocess."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import Field

from rlzoo.errors import DataError
from rlzoo.interfaces import Params, Sample, Verdict, Verifier

logger = logging.getLogger(__name__)

RUNNER = Path(__file__).with_name("_sandbox_runner.py")

# exit statuses of the runner (kept in sync with _sandbox_runner.EXIT_*)
_REASONS = {
    1: "tests failed",
    2: "runtime error",
    3: "syntax error",
    4: "memory limit",
    5: "exited before the tests finished",
    10: "write outside sandbox",
    11: "network access",
    12: "process control",
}
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = {"", "python", "py", "python3", "py3"}
_warned_root = False


def strip_code_fences(text: str) -> str:
    """The code inside markdown fences (every Python or untagged block, joined), else the text unchanged.

    An unterminated fence (a response cut off by the token limit) counts up to the end of the text.
    """
    if "```" not in text:
        return text
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(text)]
    python = [body for tag, body in blocks if tag in _PYTHON_TAGS]
    chosen = python or [body for _, body in blocks]
    return "\n".join(b.rstrip("\n") for b in chosen) + "\n" if chosen else text


def _tests_source(sample: Sample) -> str:
    tests = sample.meta.get("tests")
    if isinstance(tests, str) and tests.strip():
        return tests
    if isinstance(tests, (list, tuple)) and tests and all(isinstance(t, str) for t in tests):
        return "\n".join(tests) + "\n"
    raise DataError(
        "the code verifier needs meta['tests'] (Python source with asserts, or a list of such strings); "
        f"sample {sample.prompt[:60]!r} has {type(tests).__name__}"
    )


def _rmtree(path: str) -> None:
    def retry(func, p, _exc):  # the code may have removed permissions from its own files
        try:
            os.chmod(os.path.dirname(p), stat.S_IRWXU)
            os.chmod(p, stat.S_IRWXU)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)


class CodeVerifier(Verifier):
    """Reward 1 if the response's Python code passes the sample's tests in a sandboxed subprocess.

    ``meta["tests"]`` is Python source with ``assert`` statements (or a list of such strings); it runs after the
    response's code, in the same namespace. Markdown code fences are stripped from the response first. Reward
    is 1.0 only when the process exits normally after the tests ran; otherwise 0.0 with a ``reason``:
    ``timeout``, ``memory limit``, ``write outside sandbox``, ``network access``, ``process control``,
    ``tests failed`` (an assert failed), ``runtime error``, ``syntax error``, ``exited before the tests
    finished``, ``crashed (SIGSEGV)``, ...

    Sandbox. Enforced by the kernel: a wall-clock timeout (``timeout_s``; the whole process group is killed),
    ``RLIMIT_AS`` (``memory_mb``), ``RLIMIT_CPU``, ``RLIMIT_FSIZE`` (``file_mb``, also caps captured output),
    no core dumps. Set up by the parent: a fresh temporary working directory (deleted afterwards), an
    environment stripped to PATH/HOME/TMPDIR/locale, ``python -I -B`` (plus ``-S``: only the standard library is
importable, unless ``site_packages: true``), stdin from /dev/null, a new session.
    Best effort, in-process guards installed before the code runs: socket creation and name resolution are
    disabled; opening for write, creating, removing, renaming or chmod-ing a path outside the working directory
    is refused; fork/exec/subprocess, signals to other processes and ``resource.setrlimit`` are refused; ctypes
    and cffi cannot be imported. A guard that trips ends the process at once (reward 0). These guards run in the
    same interpreter as the code, so code that deliberately undoes them (introspection, reloading modules) can
    get past them, and reading files outside the directory is allowed. When the verifier runs as root the
    kernel enforces no file permissions either, so the filesystem protection is only these best-effort guards.
    For untrusted code, run the whole trainer in a container or use OS-level isolation (nsjail, gVisor).
    """

    name = "code"

    class Params(Params):
        timeout_s: float = Field(5.0, gt=0, le=600, description="wall-clock limit per response")
        memory_mb: int = Field(256, ge=32, description="address-space limit of the child (RLIMIT_AS)")
        file_mb: int = Field(16, ge=1, description="largest file the child may write, output included")
        workers: int = Field(2, ge=1, description="responses checked in parallel by verify_batch")
        python: str | None = Field(None, description="interpreter to run the code with; null: the current one")
        site_packages: bool = Field(False, description="let the code import installed packages (numpy, ...)")

    def verify(self, sample: Sample, response: str) -> Verdict:
        global _warned_root
        if not _warned_root and hasattr(os, "geteuid") and os.geteuid() == 0:
            _warned_root = True
            logger.warning(
                "the code verifier runs as root: its protection against writes outside the sandbox is a "
                "best-effort in-process guard only"
            )
        tests = _tests_source(sample)
        solution = strip_code_fences(response)
        outer = tempfile.mkdtemp(prefix="rlzoo-code-")
        try:
            return self._run(outer, solution, tests)
        finally:
            _rmtree(outer)

    def verify_batch(self, samples: list[Sample], responses: list[str]) -> list[Verdict]:
        if len(samples) != len(responses):
            raise ValueError(f"{len(samples)} samples but {len(responses)} responses")
        if self.params.workers == 1 or len(samples) <= 1:
            return super().verify_batch(samples, responses)
        with ThreadPoolExecutor(max_workers=self.params.workers) as pool:
            return list(pool.map(self.verify, samples, responses))

    def _run(self, outer: str, solution: str, tests: str) -> Verdict:
        p = self.params
        work = os.path.join(outer, "work")
        os.mkdir(work, 0o700)
        files = {name: os.path.join(outer, name) for name in ("solution.py", "tests.py", "stdout", "stderr")}
        Path(files["solution.py"]).write_text(solution, encoding="utf-8")
        Path(files["tests.py"]).write_text(tests, encoding="utf-8")
        nonce = secrets.token_hex(16)
        config = {
            "nonce": nonce,
            "solution": files["solution.py"],
            "tests": files["tests.py"],
            "memory_mb": p.memory_mb,
            "cpu_s": max(1, math.ceil(p.timeout_s)) + 1,
            "file_mb": p.file_mb,
        }
        env = {
            "PATH": os.defpath,
            "HOME": work,
            "TMPDIR": work,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        with open(files["stdout"], "wb") as out, open(files["stderr"], "wb") as err:
            proc = subprocess.Popen(
                [p.python or sys.executable, "-I", "-B", *([] if p.site_packages else ["-S"]), str(RUNNER)],
                cwd=work,
                env=env,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                start_new_session=True,
                close_fds=True,
            )
            timed_out = False
            try:
                proc.communicate((json.dumps(config) + "\n").encode(), timeout=p.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc.pid)  # also reaps anything the code left running in its session
                proc.wait()
        if timed_out:
            return Verdict(reward=0.0, reason="timeout")
        code = proc.returncode
        if code < 0:
            sig = -code
            if sig in (signal.SIGXCPU, signal.SIGKILL):
                return Verdict(reward=0.0, reason="timeout")
            return Verdict(reward=0.0, reason=f"crashed ({signal.Signals(sig).name})")
        if code == 0:
            if _last_line(files["stdout"]) == nonce:
                return Verdict(reward=1.0)
            return Verdict(reward=0.0, reason=_REASONS[5])
        return Verdict(reward=0.0, reason=_REASONS.get(code, f"exit status {code}"))


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _last_line(path: str, tail: int = 4096) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - tail))
        lines = f.read().decode("utf-8", "replace").strip().splitlines()
    return lines[-1].strip() if lines else ""
