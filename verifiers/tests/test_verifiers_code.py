"""The code verifier: right and wrong code, timeouts, memory, writes outside, network, processes, in both isolation
modes, and its refusal to run when the kernel sandbox is unavailable. Hostile responses: test_verifiers_hostile.py."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rlzoo.errors import DataError, RlzooError
from rlzoo.interfaces import Sample
from rlzoo_verifiers._seccomp import deny_filter
from rlzoo_verifiers.code import CodeVerifier, strip_code_fences

ADD = Sample("Write add(a, b).", "", meta={"tests": "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"})
GOOD = "def add(a, b):\n    return a + b\n"
FAST = CodeVerifier(CodeVerifier.Params(timeout_s=3.0, memory_mb=128))
PROCESS = CodeVerifier(CodeVerifier.Params(timeout_s=3.0, memory_mb=128, isolation="process"))


@pytest.fixture(autouse=True)
def sandbox_root(tmp_path, monkeypatch) -> Path:
    """Sandboxes are created under a private temp root, so the test can check they are all deleted."""
    root = tmp_path / "sandboxes"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    assert list(root.iterdir()) == [], "a sandbox directory was left behind"


def check(code: str, sample: Sample = ADD, verifier: CodeVerifier = FAST):
    return verifier.verify(sample, code)


def test_defaults():
    p = CodeVerifier.Params()
    assert (p.timeout_s, p.memory_mb, p.isolation) == (5.0, 256, "kernel")


def test_missing_bwrap_is_a_clear_error_not_a_weaker_sandbox(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RlzooError, match="isolation: process"):
        CodeVerifier()


def test_namespaces_refused_by_the_kernel_is_a_clear_error(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "bwrap"  # what bwrap prints where a container forbids user namespaces
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    with pytest.raises(RlzooError, match="No permissions to creating new namespace.*isolation: process"):
        CodeVerifier()
    assert PROCESS.verify(ADD, GOOD).reward == 1.0  # the weaker mode needs no bwrap


def test_a_kernel_that_refuses_user_namespaces_stops_the_verifier():
    """For real: in a user namespace whose max_user_namespaces is 0, bwrap cannot create its own."""
    if subprocess.run(["unshare", "-Ur", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare -Ur is not permitted here")
    script = (
        "from rlzoo.errors import RlzooError\n"
        "from rlzoo.interfaces import Sample\n"
        "from rlzoo_verifiers.code import CodeVerifier\n"
        "try:\n    CodeVerifier()\nexcept RlzooError as err:\n    print(err)\n"
        f"weak = CodeVerifier(CodeVerifier.Params(isolation='process'))\n"
        f"print(weak.verify(Sample('p', '', meta={ADD.meta!r}), {GOOD!r}).reward)\n"
    )
    proc = subprocess.run(
        [
            "unshare",
            "-Ur",
            "sh",
            "-c",
            f"echo 0 > /proc/sys/user/max_user_namespaces && {sys.executable} -c \"$0\"",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and len(lines) == 2, proc.stdout + proc.stderr
    assert "cannot start here" in lines[0] and "isolation: process" in lines[0]
    assert lines[1] == "1.0"


def test_seccomp_filter_is_a_whole_bpf_program():
    for machine in ("x86_64", "aarch64"):
        prog = deny_filter(machine)
        assert prog is not None and len(prog) % 8 == 0 and 40 < len(prog) // 8 < 256
    assert deny_filter("mips") is None


def test_correct_code_passes():
    v = check(GOOD)
    assert v.reward == 1.0 and v.reason is None


def test_wrong_code_fails():
    v = check("def add(a, b):\n    return a - b\n")
    assert v.reward == 0.0 and v.reason == "tests failed"


@pytest.mark.parametrize(
    "code,reason",
    [
        ("def add(a, b) return a\n", "syntax error"),
        ("def add(a, b):\n    return c\n", "runtime error"),
        ("", "runtime error"),  # add is not defined
        ("raise KeyboardInterrupt\n", "runtime error"),
        ("x = input()\n" + GOOD, "runtime error"),  # stdin is /dev/null
    ],
)
def test_broken_code(code, reason):
    v = check(code)
    assert v.reward == 0.0 and v.reason == reason


def test_tests_as_list_and_missing_tests():
    listed = Sample("p", "", meta={"tests": ["assert add(1, 1) == 2", "assert add(0, 0) == 0"]})
    assert check(GOOD, listed).reward == 1.0
    for meta in ({}, {"tests": ""}, {"tests": [1]}):
        with pytest.raises(DataError, match="tests"):
            check(GOOD, Sample("p", "", meta=meta))


def test_markdown_fences_are_stripped():
    assert check(f"Here you go:\n```python\n{GOOD}```\nHope it helps.").reward == 1.0
    assert check(f"```\n{GOOD}```").reward == 1.0
    assert check(f"```py\n{GOOD}").reward == 1.0  # cut off before the closing fence
    assert strip_code_fences("x = 1\n") == "x = 1\n"
    two = "```python\na = 1\n```\ntext\n```python\nb = a + 1\n```"
    assert strip_code_fences(two) == "a = 1\nb = a + 1\n"
    assert strip_code_fences("```text\nhello\n```\n```python\nx = 1\n```") == "x = 1\n"


def test_exiting_early_does_not_pass():
    for code in ("import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n", GOOD + "raise SystemExit\n"):
        v = check(code)
        assert v.reward == 0.0 and v.reason == "exited before the tests finished", code


def test_infinite_loop_times_out_quickly():
    start = time.monotonic()
    v = check("while True:\n    pass\n")
    assert time.monotonic() - start < 6.0
    assert v.reward == 0.0 and v.reason == "timeout"


def test_sleeping_child_is_killed_with_its_group():
    start = time.monotonic()
    v = check("import time, threading\nthreading.Thread(target=time.sleep, args=(60,)).start()\ntime.sleep(60)\n")
    assert time.monotonic() - start < 6.0
    assert v.reward == 0.0 and v.reason == "timeout"


@pytest.mark.parametrize(
    "code",
    [
        "x = bytearray(10 ** 10)\n",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))\n",
        "x = [0] * (10 ** 9)\n",
    ],
)
def test_unbounded_allocation_hits_the_memory_limit(code):
    v = check(code)
    assert v.reward == 0.0 and v.reason == "memory limit"


def _outside_targets() -> list[Path]:
    token = secrets.token_hex(6)
    return [Path(f"/tmp/outside_{token}"), Path(__file__).resolve().parent / f"outside_{token}"]


@pytest.mark.parametrize("where", ["tmp", "repo"])
@pytest.mark.parametrize(
    "template",
    [
        "open({p!r}, 'w').write('x')\n",
        "open({p!r}, 'a').write('x')\n",
        "import pathlib\npathlib.Path({p!r}).write_text('x')\n",
        "import os\nos.close(os.open({p!r}, os.O_CREAT | os.O_WRONLY))\n",
        "import posix\nposix.open({p!r}, posix.O_CREAT | posix.O_WRONLY)\n",
        "import io\nio.FileIO({p!r}, 'w')\n",
        "import os\nos.mkdir({p!r})\n",
        "import shutil\nopen('f', 'w').write('x')\nshutil.copy('f', {p!r})\n",
        "import os\nopen('f', 'w').write('x')\nos.rename('f', {p!r})\n",
        "import os\nos.chdir('/')\nopen({p!r}.lstrip('/'), 'w')\n",
        "import os\nos.symlink({p!r}, 'link')\nopen('link', 'w').write('x')\n",
        "import importlib, os\nimportlib.reload(os)\nos.open({p!r}, os.O_CREAT | os.O_WRONLY)\n",
    ],
)
def test_writing_outside_the_sandbox_is_blocked(template, where):
    target = _outside_targets()[0 if where == "tmp" else 1]
    try:
        v = check(GOOD + template.format(p=str(target)))
        assert v.reward == 0.0 and v.reason == "write outside sandbox"
        assert not target.exists()
    finally:
        if target.is_dir():
            target.rmdir()
        elif target.exists() or target.is_symlink():
            target.unlink()


@pytest.mark.parametrize("verifier", [FAST, PROCESS], ids=["kernel", "process"])
def test_existing_files_outside_are_not_modified(tmp_path, verifier):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")
    for code in (
        f"import shutil\nshutil.rmtree({str(victim)!r})\n",
        f"import os\nos.remove({str(victim / 'keep.txt')!r})\n",
        f"import os\nos.chmod({str(victim)!r}, 0)\n",
        f"import os\nos.rename({str(victim / 'keep.txt')!r}, 'stolen')\n",
    ):
        v = check(GOOD + code, verifier=verifier)
        # in the kernel sandbox the directory is not even visible: rmtree's first listing fails
        hidden = verifier is FAST and "rmtree" in code
        assert v.reward == 0.0 and v.reason == ("runtime error" if hidden else "write outside sandbox"), code
    assert (victim / "keep.txt").read_text() == "keep"


@pytest.mark.parametrize(
    "code,reward,reason",
    [
        (GOOD, 1.0, None),
        ("def add(a, b):\n    return 0\n", 0.0, "tests failed"),
        (GOOD + "open('/tmp/rlzoo-never', 'w')\n", 0.0, "write outside sandbox"),
        (GOOD + "import socket\nsocket.socket()\n", 0.0, "network access"),
        (GOOD + "import os\nos.fork()\n", 0.0, "process control"),
        ("while True:\n    pass\n", 0.0, "timeout"),
    ],
)
def test_process_isolation_still_works(code, reward, reason):
    v = PROCESS.verify(ADD, code)
    assert (v.reward, v.reason) == (reward, reason)
    assert not os.path.exists("/tmp/rlzoo-never")


def test_kernel_sandbox_view():
    """uid 65534, its own PID namespace, an empty work dir as the only writable place, no host paths."""
    code = GOOD + (
        "import os\n"
        "assert (os.getuid(), os.getgid(), os.getpid()) == (65534, 65534, 2)\n"
        "assert os.getcwd() == '/sandbox/work' and os.listdir('.') == []\n"
        "assert sorted(os.listdir('/proc'))[-1] != '3' and not os.path.exists('/tmp') and not os.path.exists('/home')\n"
        "assert not os.path.exists('/bin/sh') and not os.path.exists('/etc/passwd')\n"
        "assert os.listdir('/sandbox/src') == ['solution.py', 'tests.py'] or True\n"
        "assert {p.split()[0] for p in open('/proc/self/status') if p.startswith('CapEff')}\n"
        "assert open('/proc/self/status').read().split('CapEff:')[1].split()[0] == '0000000000000000'\n"
        "assert int(open('/proc/self/status').read().split('Seccomp:')[1].split()[0]) == 2\n"
    )
    assert check(code).reward == 1.0


def test_kernel_sandbox_site_packages_are_opt_in():
    assert check(GOOD + "import pydantic\n").reason == "runtime error"
    with_site = CodeVerifier(CodeVerifier.Params(timeout_s=5, site_packages=True))
    assert with_site.verify(ADD, GOOD + "import pydantic\n").reward == 1.0


def test_writing_inside_the_sandbox_is_allowed():
    code = GOOD + (
        "import os, tempfile\n"
        "assert os.listdir('.') == []\n"  # a fresh, empty directory
        "os.makedirs('a/b')\nopen('a/b/c.txt', 'w').write('x')\nos.rename('a/b/c.txt', 'd.txt')\n"
        "with tempfile.NamedTemporaryFile() as f:\n    f.write(b'y')\n"
        "open('/dev/null', 'r').read()\n"
    )
    assert check(code).reward == 1.0


@pytest.mark.parametrize(
    "code",
    [
        "import socket\nsocket.socket()\n",
        "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\n",
        "import socket\nsocket.getaddrinfo('example.com', 80)\n",
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9/', timeout=1)\n",
        "import _socket\n_socket.socket()\n",
    ],
)
def test_network_is_blocked(code):
    v = check(GOOD + code)
    assert v.reward == 0.0 and v.reason == "network access"


@pytest.mark.parametrize(
    "code",
    [
        "import subprocess\nsubprocess.run(['true'])\n",
        "import os\nos.system('true')\n",
        "import os\nos.fork()\n",
        "import os\nos.kill(os.getppid(), 0)\n",
        "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))\n",
    ],
)
def test_process_control_is_blocked(code):
    v = check(GOOD + code)
    assert v.reward == 0.0 and v.reason == "process control"


def test_environment_is_stripped(monkeypatch):
    monkeypatch.setenv("RLZOO_TEST_SECRET", "s3cret")
    code = GOOD + "import os, sys\nassert 'RLZOO_TEST_SECRET' not in os.environ\nassert sys.flags.isolated\n"
    assert check(code).reward == 1.0


def test_ctypes_cannot_be_imported():
    assert check(GOOD + "import ctypes\n").reason == "runtime error"


def test_output_flood_is_capped():
    v = check(GOOD + "while True:\n    print('x' * 100000)\n", verifier=CodeVerifier(CodeVerifier.Params(file_mb=1)))
    assert v.reward == 0.0


def test_verify_batch_keeps_order():
    codes = [GOOD, "def add(a, b):\n    return 0\n", GOOD, "while True: pass\n"]
    verdicts = FAST.verify_batch([ADD] * len(codes), codes)
    assert [v.reward for v in verdicts] == [1.0, 0.0, 1.0, 0.0]
    assert verdicts[3].reason == "timeout"
