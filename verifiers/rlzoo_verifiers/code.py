"""The ``code`` verifier: run a response's Python code against the sample's tests in a sandbox."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from pydantic import Field

import rlzoo
from rlzoo.errors import DataError, RlzooError
from rlzoo.interfaces import Params, Sample, Verdict, Verifier
from rlzoo_verifiers._kernel_sandbox import SRC, WORK, KernelSandbox
from rlzoo_verifiers._pids_cgroup import PidsGroup

logger = logging.getLogger(__name__)

RUNNER = Path(__file__).with_name("_sandbox_runner.py")

# exit statuses of the runner (kept in sync with _sandbox_runner.EXIT_*)
_REASONS = {
    1: "tests failed",
    2: "runtime error",
    3: "syntax error",
    4: "memory limit",
    5: "exited before the tests finished",
    6: "disk limit",
    10: "write outside sandbox",
    11: "network access",
    12: "process control",
}
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = {"", "python", "py", "python3", "py3"}
_warned_root = False
_REAP_S = 5.0  # how long to wait for a killed sandbox's processes to be gone


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


@rlzoo.register("verifier", "code")
class CodeVerifier(Verifier):
    """Reward 1 if the response's Python code passes the sample's tests in a sandbox.

    ``meta["tests"]`` is Python source with ``assert`` statements (or a list of such strings); it runs after the
    response's code, in the same namespace. Markdown code fences are stripped from the response first. Reward
    is 1.0 only when the process exits normally after the tests ran; otherwise 0.0 with a ``reason``:
    ``timeout``, ``memory limit``, ``disk limit``, ``write outside sandbox``, ``network access``,
    ``process control``, ``tests failed`` (an assert failed), ``runtime error``, ``syntax error``, ``exited
    before the tests finished``, ``crashed (SIGSEGV)``, ...

    Isolation (``isolation``). ``kernel`` (the default): each response runs in its own bubblewrap sandbox
    (``_kernel_sandbox``: user/mount/PID/IPC/network namespaces, uid 65534 without capabilities, a read-only
    view of the interpreter and libraries, a private ``disk_mb`` tmpfs as the only writable directory, a seccomp
    filter). If bwrap is missing or the kernel refuses namespaces, constructing the verifier raises
    ``RlzooError``; it never falls back silently. ``process``: a plain subprocess with the in-process guards
    only, which code that sets out to undo them can get past (see docs/security.md). In both modes the kernel
    enforces a wall-clock timeout (``timeout_s``; the sandbox is killed), ``RLIMIT_AS`` (``memory_mb``),
    ``RLIMIT_CPU``, ``RLIMIT_FSIZE`` (``file_mb``, also caps captured output) and no core dumps; the kernel mode
    adds ``RLIMIT_NPROC`` (``max_processes``; where bwrap itself must run as root, whom the kernel exempts from
    it, a ``pids`` cgroup enforces the same cap when the machine lets the trainer create one).
    The child gets an environment stripped to PATH/HOME/TMPDIR/locale, ``python -I -B`` (plus ``-S``: only the
    standard library is importable, unless ``site_packages: true``) and stdin from /dev/null, and the
    in-process guards (``_sandbox_runner``) as a second layer. Code and tests share one interpreter, so the
    reward of code written to forge a pass is not trustworthy in either mode; the sandbox protects the machine.
    """

    class Params(Params):
        timeout_s: float = Field(5.0, gt=0, le=600, description="wall-clock limit per response")
        memory_mb: int = Field(256, ge=32, description="address-space limit of the child (RLIMIT_AS)")
        file_mb: int = Field(16, ge=1, description="largest file the child may write, output included")
        workers: int = Field(2, ge=1, description="responses checked in parallel by verify_batch")
        python: str | None = Field(None, description="interpreter to run the code with; null: the current one")
        site_packages: bool = Field(False, description="let the code import installed packages (numpy, ...)")
        isolation: Literal["kernel", "process"] = Field(
            "kernel", description="kernel: a bubblewrap sandbox per response; process: in-process guards only"
        )
        disk_mb: int = Field(64, ge=1, description="size of the writable work directory (isolation: kernel)")
        max_processes: int = Field(
            16, ge=1, description="RLIMIT_NPROC inside the sandbox, threads included (isolation: kernel)"
        )

    def __init__(self, params: Params | None = None) -> None:
        super().__init__(params)
        p = self.params
        self.sandbox: KernelSandbox | None = (
            KernelSandbox(p.python or sys.executable, p.site_packages, p.disk_mb, str(RUNNER))
            if p.isolation == "kernel"
            else None
        )

    def verify(self, sample: Sample, response: str) -> Verdict:
        global _warned_root
        if self.sandbox is None and not _warned_root and os.geteuid() == 0:
            _warned_root = True
            logger.warning(
                "the code verifier runs as root with isolation: process: its protection against writes outside "
                "the sandbox is a best-effort in-process guard only"
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
        src = os.path.join(outer, "src")
        os.mkdir(src, 0o755)
        Path(src, "solution.py").write_text(solution, encoding="utf-8")
        Path(src, "tests.py").write_text(tests, encoding="utf-8")
        flags = ["-I", "-B", *([] if p.site_packages else ["-S"])]
        nonce = secrets.token_hex(16)
        config = {
            "nonce": nonce,
            "memory_mb": p.memory_mb,
            "cpu_s": max(1, math.ceil(p.timeout_s)) + 1,
            "file_mb": p.file_mb,
        }
        fds: list[int] = []
        group: PidsGroup | None = None
        if self.sandbox is not None:
            work = WORK
            started, started_w = os.pipe()
            os.set_blocking(started, False)
            if self.sandbox.user is not None:  # bwrap runs as that user: it must reach the sources, whatever the umask
                modes = {outer: 0o711, src: 0o755, f"{src}/solution.py": 0o644, f"{src}/tests.py": 0o644}
                for path, mode in modes.items():
                    os.chmod(path, mode)
            fds = [started_w]
            argv, sandbox_fds = self.sandbox.command(src, flags)
            fds += sandbox_fds
            if self.sandbox.pids_root is not None:
                group = PidsGroup(self.sandbox.pids_root, p.max_processes)
                argv = group.wrap(argv)
            config.update(
                solution=f"{SRC}/solution.py", tests=f"{SRC}/tests.py", started_fd=started_w, nproc=p.max_processes
            )
            cwd = outer
        else:
            work = cwd = os.path.join(outer, "work")
            os.mkdir(work, 0o700)
            argv = [p.python or sys.executable, *flags, str(RUNNER)]
            config.update(solution=os.path.join(src, "solution.py"), tests=os.path.join(src, "tests.py"))
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
        stdout, stderr = os.path.join(outer, "stdout"), os.path.join(outer, "stderr")
        timed_out = False
        try:
            with open(stdout, "wb") as out, open(stderr, "wb") as err:
                proc = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=fds,
                    user=self.sandbox.user if self.sandbox else None,
                    group=self.sandbox.user if self.sandbox else None,
                    extra_groups=[] if self.sandbox and self.sandbox.user is not None else None,
                )
                for fd in fds:  # the child holds its copies
                    os.close(fd)
                fds = []
                try:
                    proc.communicate((json.dumps(config) + "\n").encode(), timeout=p.timeout_s)
                except subprocess.TimeoutExpired:
                    timed_out = True
                finally:
                    # kills bwrap (and with it the whole PID namespace) or the process group of the child
                    _kill_group(proc.pid)
                    proc.wait()
            if self.sandbox is not None:  # every process of the sandbox holds the pipe: wait until all are gone
                came_up = _read_until_closed(started, time.monotonic() + _REAP_S)
            if timed_out:
                return Verdict(reward=0.0, reason="timeout")
            code = proc.returncode
            if self.sandbox is not None:
                if not came_up:
                    raise RlzooError(f"the code verifier's kernel sandbox failed to start: {_last_line(stderr)}")
                if code > 128:  # bwrap reports a child killed by signal N as 128 + N
                    code = 128 - code
        finally:
            for fd in fds:
                os.close(fd)
            if self.sandbox is not None:
                os.close(started)
            if group is not None:
                group.remove()
        if code < 0:
            sig = -code
            if sig in (signal.SIGXCPU, signal.SIGKILL):
                return Verdict(reward=0.0, reason="timeout")
            return Verdict(reward=0.0, reason=f"crashed ({signal.Signals(sig).name})")
        if code == 0:
            if _last_line(stdout) == nonce:
                return Verdict(reward=1.0)
            return Verdict(reward=0.0, reason=_REASONS[5])
        return Verdict(reward=0.0, reason=_REASONS.get(code, f"exit status {code}"))


def _read_until_closed(fd: int, deadline: float) -> bytes:
    """What was written to the pipe ``fd``, once every process holding its write end has exited (or at the
    deadline: a process that closed its copy is not waited for; the PID namespace's teardown still kills it)."""
    data = b""
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([fd], [], [], left)[0]:
            break
        try:
            chunk = os.read(fd, 64)
        except BlockingIOError:
            continue
        if not chunk:
            break
        data = (data + chunk)[:64]  # the code may write to the pipe too; keep what matters, bounded
    return data


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
