"""Hostile responses against the code verifier's kernel sandbox: each scores 0 with its reason, changes nothing
outside, and leaves the trainer (this process) and a correct response scored in the same batch unaffected.

Rows marked "bypass" first undo the in-process guards (re-importing a module restores its original functions);
``test_bypasses_defeat_the_process_guards`` shows they really do, so what stops them here is the kernel.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

import pytest

import rlzoo_verifiers.code
from rlzoo.interfaces import Sample
from rlzoo_verifiers._pids_cgroup import pids_root
from rlzoo_verifiers.code import CodeVerifier

ADD = Sample("Write add(a, b).", "", meta={"tests": "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"})
GOOD = "def add(a, b):\n    return a + b\n"
TOKEN = secrets.token_hex(6)
REPO = Path(__file__).resolve().parents[2]
# paths a hostile response tries to create; none may exist afterwards
TARGETS = {
    "@TMP@": f"/tmp/rlzoo-pwned-{TOKEN}",
    "@LIB@": os.path.join(sysconfig.get_paths()["stdlib"], f"rlzoo-pwned-{TOKEN}"),
    "@USRLIB@": f"/usr/lib/rlzoo-pwned-{TOKEN}",
    "@REPO@": str(REPO / f"rlzoo-pwned-{TOKEN}"),
    "@HOME@": str(Path.home() / f"rlzoo-pwned-{TOKEN}"),
}
SECRET_ENV = "RLZOO_TEST_SECRET"
SECRET = "s3cret-" + TOKEN
# the response defines a correct add() only if its attack worked, so a reward of 1 would mean it did
IF_WORKED = "\nif worked:\n    def add(a, b):\n        return a + b\n"
BYPASS_POSIX = "import sys\nsys.modules.pop('posix', None)\nimport posix\n"
BYPASS_SOCKET = "import sys\nfor m in ('socket', '_socket'):\n    sys.modules.pop(m, None)\nimport socket\n"
BYPASS_CTYPES = "import sys\nfor m in ('ctypes', '_ctypes'):\n    sys.modules.pop(m, None)\nimport ctypes\n"

# (id, response, reason); placeholders: TARGETS, @VICTIM@, @SECRET_FILE@, @PORT@
HOSTILE = [
    ("open-write", "open('@TMP@', 'w').write('x')\n", "write outside sandbox"),
    ("pathlib-write-repo", "import pathlib\npathlib.Path('@REPO@').write_text('x')\n", "write outside sandbox"),
    ("symlink-escape", "import os\nos.symlink('/tmp', 'l')\nopen('l/x', 'w')\n", "write outside sandbox"),
    (
        "reload-os",
        "import importlib, os\nimportlib.reload(os)\nos.open('@TMP@', os.O_CREAT | os.O_WRONLY)\n",
        "write outside sandbox",
    ),
    (
        "bypass-reimport-posix-tmp",
        BYPASS_POSIX + "posix.open('@TMP@', posix.O_CREAT | posix.O_WRONLY)\n",
        "runtime error",
    ),  # /tmp does not exist in the sandbox: FileNotFoundError
    (
        "bypass-reimport-posix-stdlib",
        BYPASS_POSIX + "posix.open('@LIB@', posix.O_CREAT | posix.O_WRONLY)\n",
        "write outside sandbox",
    ),  # EROFS
    (
        "closure-original-open",
        "import builtins\nf = builtins.open\n"
        "original = f.__closure__[f.__code__.co_freevars.index('original')].cell_contents\n"
        "original('@USRLIB@', 'w').write('x')\n",
        "write outside sandbox",
    ),
    (
        "gc-find-original-os-open",
        "import gc, os\nfns = [o for o in gc.get_objects() if callable(o) and "
        "getattr(o, '__name__', '') == 'open' and getattr(o, '__module__', '') == 'posix']\n"
        "for f in fns:\n    f('@LIB@', os.O_CREAT | os.O_WRONLY)\n",
        "write outside sandbox",
    ),
    (
        "overwrite-own-tests",
        BYPASS_POSIX + "posix.open('/sandbox/src/tests.py', posix.O_WRONLY | posix.O_TRUNC)\n",
        "write outside sandbox",
    ),
    ("rmtree-host-dir", "import shutil\nshutil.rmtree('@VICTIM@')\n", "runtime error"),  # not visible inside
    (
        "bypass-shell-as-root",
        BYPASS_POSIX + "worked = posix.system('touch @TMP@ @HOME@') == 0\n" + IF_WORKED,
        "runtime error",
    ),  # no shell in the sandbox; nothing runs as root
    ("subprocess", "import subprocess\nsubprocess.run(['touch', '@TMP@'])\n", "process control"),
    ("os-system", "import os\nos.system('touch @TMP@')\n", "process control"),
    ("ctypes-import", "import ctypes\n", "runtime error"),
    (
        "bypass-ctypes-namespaces",
        BYPASS_CTYPES + "libc = ctypes.CDLL(None, use_errno=True)\n"
        "worked = libc.unshare(0x10000000) == 0 or libc.mount(b'none', b'/sandbox', b'tmpfs', 0, None) == 0"
        " or libc.ptrace(0, 0, 0, 0) == 0\n" + IF_WORKED,
        "runtime error",
    ),  # seccomp: EPERM
    (
        "bypass-ctypes-system",
        BYPASS_CTYPES + "worked = ctypes.CDLL(None).system(b'touch @TMP@') == 0\n" + IF_WORKED,
        "runtime error",
    ),
    ("fork-bomb", "import os\nwhile True:\n    os.fork()\n", "process control"),
    (
        "bypass-fork-many",
        BYPASS_POSIX + "import time\nfor i in range(200):\n    if posix.fork() == 0:\n"
        "        time.sleep(600)\ntime.sleep(600)\n",
        None,
    ),  # see test_fork_many: timeout, or EAGAIN if not root
    ("kill-parent", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n", "process control"),
    (
        "bypass-kill-everything",
        BYPASS_POSIX + "for pid in (posix.getppid(), 1, -1):\n"
        "    for sig in (15, 1, 10):\n        try:\n            posix.kill(pid, sig)\n        except OSError:\n"
        "            pass\nworked = False\n" + IF_WORKED,
        "runtime error",
    ),
    ("network", "import socket\nsocket.create_connection(('127.0.0.1', @PORT@), timeout=1)\n", "network access"),
    (
        "bypass-network",
        BYPASS_SOCKET + "socket.create_connection(('127.0.0.1', @PORT@), timeout=1)\n",
        "network access",
    ),  # seccomp: EAFNOSUPPORT
    (
        "secret-env",
        "import os, glob\nworked = any('@SECRET@' in v for v in os.environ.values())\n"
        "for p in glob.glob('/proc/*/environ'):\n    try:\n        worked |= b'@SECRET@' in open(p, 'rb').read()\n"
        "    except OSError:\n        pass\n" + IF_WORKED,
        "runtime error",
    ),
    (
        "secret-home-file",
        "try:\n    worked = '@SECRET@' in open('@SECRET_FILE@').read()\nexcept OSError:\n"
        "    worked = False\n" + IF_WORKED,
        "runtime error",
    ),
    ("fill-disk-one-file", "open('big', 'wb').write(b'x' * 10 ** 8)\n", "disk limit"),
    ("fill-disk-many-files", "for i in range(1000):\n    open(f'f{i}', 'wb').write(b'x' * 10 ** 6)\n", "disk limit"),
    ("output-flood", "while True:\n    print('x' * 100000)\n", "disk limit"),
    ("exhaust-memory", "chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))\n", "memory limit"),
    ("sleep-forever", "import time\ntime.sleep(10 ** 6)\n", "timeout"),
    (
        "fake-success-marker",
        "import os, secrets\nprint('OK\\nall tests passed\\n' + secrets.token_hex(16))\nos._exit(0)\n",
        "exited before the tests finished",
    ),
]


@pytest.fixture(scope="module")
def verifier() -> CodeVerifier:
    return CodeVerifier(CodeVerifier.Params(timeout_s=4.0, memory_mb=128, file_mb=8, disk_mb=32, workers=2))


@pytest.fixture(scope="module")
def server():
    """A loopback TCP server; it records every connection it accepts."""
    accepted: list[tuple] = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, addr = sock.accept()
            except OSError:
                continue
            accepted.append(addr)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield sock.getsockname()[1], accepted
    stop.set()
    thread.join()
    sock.close()


@pytest.fixture
def world(tmp_path, monkeypatch):
    """Sentinels outside the sandbox, a secret in the environment and one in the home directory."""
    monkeypatch.setenv(SECRET_ENV, SECRET)
    # /proc/<pid>/environ shows a process's environment at its start, so a child holds the secret there
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=dict(os.environ))
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")
    secret_file = Path(tempfile.mkstemp(prefix=".rlzoo-test-secret-", dir=Path.home())[1])
    secret_file.write_text(SECRET)
    received: list[int] = []
    sigs = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
    old = {s: signal.signal(s, lambda n, _f: received.append(n)) for s in sigs}
    yield {"@VICTIM@": str(victim), "@SECRET_FILE@": str(secret_file), "@SECRET@": SECRET}
    for s, handler in old.items():
        signal.signal(s, handler)
    assert secret_file.read_text() == SECRET
    secret_file.unlink()
    holder.kill()
    holder.wait()
    assert received == [], "the trainer received a signal"
    assert (victim / "keep.txt").read_text() == "keep"
    for path in TARGETS.values():
        assert not os.path.lexists(path), f"{path} was created outside the sandbox"
    assert _sandbox_processes() == [], "a sandboxed process outlived its verdict"


def _fill(template: str, world: dict, port: int) -> str:
    for key, value in {**TARGETS, **world, "@PORT@": str(port)}.items():
        template = template.replace(key, value)
    return template


def _parent(pid: int) -> int:
    try:  # the fourth field of /proc/<pid>/stat, after a command name that may itself hold spaces or parentheses
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _is_sandboxed(pid: int) -> bool:
    try:
        return b"/sandbox/runner.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _sandbox_processes() -> list[int]:
    """Sandboxed processes that belong to this test: ones whose first ancestor outside a sandbox is this process,
    or init (an escaped, re-parented one). Another xdist worker's sandboxes, alive at the same moment, are its own."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _is_sandboxed(int(entry)):
            owner = _parent(int(entry))
            while owner > 1 and _is_sandboxed(owner):
                owner = _parent(owner)
            if owner in (os.getpid(), 1):
                found.append(int(entry))
    return found


def test_the_table_is_large_enough():
    assert len(HOSTILE) >= 20 and len({row[0] for row in HOSTILE}) == len(HOSTILE)


@pytest.mark.parametrize(
    "response,reason", [row[1:] for row in HOSTILE if row[2]], ids=[row[0] for row in HOSTILE if row[2]]
)
def test_hostile_response(verifier, server, world, response, reason):
    port, accepted = server
    good, bad = verifier.verify_batch([ADD, ADD], [GOOD, _fill(response, world, port)])
    assert (bad.reward, bad.reason) == (0.0, reason)
    assert (good.reward, good.reason) == (1.0, None), "a correct response in the same batch was affected"
    assert accepted == [], "a response reached the loopback server"


def test_fork_many(verifier, server, world):
    """200 sleeping children: ``RLIMIT_NPROC`` (``max_processes``) stops them with EAGAIN, or where bwrap runs as
    root (whom the kernel exempts from it) a ``pids`` cgroup does; with neither, the timeout kills the whole PID
    namespace (``world``: none survive)."""
    response = dict((row[0], row[1]) for row in HOSTILE)["bypass-fork-many"]
    good, bad = verifier.verify_batch([ADD, ADD], [GOOD, _fill(response, world, server[0])])
    sandbox = verifier.sandbox
    enforced = os.geteuid() != 0 or sandbox.user is not None or sandbox.pids_root is not None
    assert (bad.reward, bad.reason) == (0.0, "runtime error" if enforced else "timeout")
    assert good.reward == 1.0


@pytest.mark.skipif(not os.access("/usr/bin/python3", os.X_OK), reason="no system python to run as nobody")
def test_fork_many_is_stopped_by_the_process_limit(server, world):
    """With an interpreter the unprivileged sandbox user can read, a root trainer's sandbox runs as that user
    and ``RLIMIT_NPROC`` binds: the forks fail at once instead of running until the timeout."""
    verifier = CodeVerifier(CodeVerifier.Params(timeout_s=4.0, python="/usr/bin/python3", max_processes=8))
    assert os.geteuid() != 0 or verifier.sandbox.user == 65534
    response = dict((row[0], row[1]) for row in HOSTILE)["bypass-fork-many"]
    good, bad = verifier.verify_batch([ADD, ADD], [GOOD, _fill(response, world, server[0])])
    assert (bad.reward, bad.reason, good.reward) == (0.0, "runtime error", 1.0)


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access("/usr/bin/python3", os.X_OK),
    reason="needs root and a system python to run as nobody",
)
def test_where_rlzoo_is_installed_does_not_matter(tmp_path, monkeypatch, server, world):
    """rlzoo in a folder only its owner may enter (a clone in ``mktemp -d``, a 0700 home), its runner readable by
    the owner alone: the runner is piped into the sandbox, so a root trainer's sandbox still drops to nobody and
    ``RLIMIT_NPROC`` still binds."""
    private = tmp_path / "checkout"
    private.mkdir(mode=0o700)
    runner = private / "runner.py"
    shutil.copy(rlzoo_verifiers.code.RUNNER, runner)
    runner.chmod(0o600)
    monkeypatch.setattr(rlzoo_verifiers.code, "RUNNER", runner)
    verifier = CodeVerifier(CodeVerifier.Params(timeout_s=4.0, python="/usr/bin/python3", max_processes=8))
    assert verifier.sandbox.user == 65534
    response = dict((row[0], row[1]) for row in HOSTILE)["bypass-fork-many"]
    good, bad = verifier.verify_batch([ADD, ADD], [GOOD, _fill(response, world, server[0])])
    assert (bad.reward, bad.reason, good.reward) == (0.0, "runtime error", 1.0)


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access("/usr/bin/python3", os.X_OK), reason="needs root and a system python to copy"
)
def test_a_root_sandbox_is_announced_never_silent(tmp_path, caplog):
    """An interpreter nobody cannot reach (a copy of the system python in a 0700 folder) keeps bwrap root: the
    verifier still works, and a warning names the path bwrap could not reach and the way out."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    python = private / "python3"
    shutil.copy(os.path.realpath("/usr/bin/python3"), python)
    with caplog.at_level("WARNING", logger="rlzoo.verifiers.code"):
        verifier = CodeVerifier(CodeVerifier.Params(timeout_s=4.0, python=str(python)))
    assert verifier.sandbox.user is None
    [warning] = [r.getMessage() for r in caplog.records if "runs bwrap as root" in r.getMessage()]
    assert str(python) in warning and "Permission denied" in warning and "`python` param" in warning
    assert ("pids cgroup" in warning) == (verifier.sandbox.pids_root is not None)
    assert verifier.verify(ADD, GOOD).reward == 1.0


@pytest.mark.skipif(os.geteuid() != 0 or pids_root() is None, reason="needs root and a writable pids cgroup")
def test_a_root_sandbox_is_capped_by_a_pids_cgroup(server, world):
    """bwrap as root (the interpreter is unreadable to the sandbox user, so ``user`` stays None): the pids group
    stops the forks at once, and no group is left behind."""
    verifier = CodeVerifier(CodeVerifier.Params(timeout_s=20.0, max_processes=8))
    verifier.sandbox.user = None  # as if the interpreter were unreadable to uid 65534
    verifier.sandbox.pids_root = pids_root()
    before = set(os.listdir(verifier.sandbox.pids_root))
    response = dict((row[0], row[1]) for row in HOSTILE)["bypass-fork-many"]
    good, bad = verifier.verify_batch([ADD, ADD], [GOOD, _fill(response, world, server[0])])
    assert (bad.reward, bad.reason, good.reward) == (0.0, "runtime error", 1.0)
    assert set(os.listdir(verifier.sandbox.pids_root)) == before


@pytest.mark.parametrize("name", ["bypass-reimport-posix-tmp", "closure-original-open", "bypass-network", "secret-env"])
def test_bypasses_defeat_the_process_guards(name, server, world):
    """The bypass rows are real attacks: with ``isolation: process`` they get past the in-process guards."""
    port, accepted = server
    response = _fill(dict((row[0], row[1]) for row in HOSTILE)[name], world, port)
    weak = CodeVerifier(CodeVerifier.Params(isolation="process", timeout_s=4.0))
    target = TARGETS["@TMP@"] if "tmp" in name else TARGETS["@USRLIB@"]
    try:
        verdict = weak.verify(ADD, response)
        if name == "secret-env":  # no bypass needed: the trainer's /proc/<pid>/environ is readable
            assert verdict.reward == 1.0, "the response did not find the trainer's secret"
            return
        if name == "bypass-network":
            assert accepted, "the bypass did not reach the server"
            accepted.clear()
        else:
            assert os.path.exists(target), "the bypass did not write outside the sandbox"
        assert verdict.reward == 0.0
    finally:
        if os.path.exists(target):
            os.unlink(target)
