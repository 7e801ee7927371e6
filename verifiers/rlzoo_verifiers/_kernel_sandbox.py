"""The code verifier's kernel sandbox: the bubblewrap command line that runs one response, and the check that
this machine's kernel allows it.

bubblewrap (``bwrap``, https://github.com/containers/bubblewrap, the sandbox under Flatpak) builds the sandbox
from kernel features, so it holds whatever the Python code inside does:

- new user, mount, PID, IPC, UTS, cgroup and network namespaces: the code runs as uid/gid 65534 with no
  capabilities, cannot create further user namespaces, sees only its own processes (it is PID 2; PID 1 is
  bwrap's reaper), and has no network device but a loopback that is down;
- a filesystem of its own: an empty root (read-only), a read-only view of the interpreter, its standard library
  and the system's shared libraries (plus site-packages and ``sys.path`` when ``site_packages`` is on), fresh
  ``/proc`` and ``/dev``, the response's sources read-only under ``/sandbox/src``, and ``/sandbox/work``, a
  private tmpfs of ``disk_mb`` that is the only writable place and vanishes with the sandbox;
- ``--die-with-parent`` and ``--new-session``: the sandbox dies with the trainer and cannot inject keystrokes;
- the seccomp filter of ``_seccomp`` (refused calls fail with EPERM).

The resource limits (``RLIMIT_AS``/``CPU``/``FSIZE``/``NPROC``/``CORE``) are set by the runner inside the
sandbox before the response's code is read; without ``CAP_SYS_RESOURCE`` in the initial namespace nothing
inside can raise them again. bwrap runs as the trainer's user, except that a root trainer runs it as ``UID``
when that user can read the interpreter: the kernel never applies ``RLIMIT_NPROC`` to uid 0, and the code is
then unprivileged outside its namespace too (``KernelSandbox.user``). The runner reaches the sandbox through a
pipe (``--ro-bind-data``), not a bind of rlzoo's own file, so where rlzoo is installed (a clone in a folder only
its owner may enter) does not matter. Where bwrap must stay root (the interpreter itself is unreadable to
``UID``), a warning says so, naming the path bwrap could not reach, and each response runs in a ``pids`` cgroup
capped at ``max_processes`` instead (``_pids_cgroup``), when the machine has a hierarchy the trainer may write;
without one the warning says that only the timeout bounds a fork bomb.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from rlzoo.errors import RlzooError
from rlzoo_verifiers._pids_cgroup import pids_root
from rlzoo_verifiers._seccomp import deny_filter

logger = logging.getLogger("rlzoo.verifiers.code")

UID = 65534  # "nobody" inside the sandbox
ROOT = "/sandbox"
WORK = f"{ROOT}/work"
SRC = f"{ROOT}/src"
RUNNER = f"{ROOT}/runner.py"
_SYSTEM_LIBS = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32", "/etc/ld.so.cache")
_NAMESPACES = ("--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup")
_HOW_TO_WEAKEN = (
    "set `isolation: process` in the code verifier's params to run responses with the weaker in-process guards "
    "only (not safe for untrusted code; see docs/security.md)"
)
_QUERY = (
    "import json, os, sys, sysconfig; p = sysconfig.get_paths(); print(json.dumps({"
    "'exe': os.path.realpath(sys.executable), 'prefix': sys.prefix, 'path': [x for x in sys.path if x], "
    "'lib': [p['stdlib'], p['platstdlib']], 'site': [p['purelib'], p['platlib']], "
    "'libdir': sysconfig.get_config_var('LIBDIR') or '', 'shared': bool(sysconfig.get_config_var('Py_ENABLE_SHARED'))"
    "}))"
)


class KernelSandbox:
    """Builds ``bwrap ... python -I -B [-S] /sandbox/runner.py`` for one response; raises if the kernel refuses.

    The constructor asks the interpreter where its files are, then starts one empty sandbox; if bwrap is
    missing or the kernel refuses the namespaces (some containers do), it raises ``RlzooError`` naming the
    ``isolation: process`` setting, so the verifier never silently runs untrusted code with less isolation.
    """

    def __init__(self, python: str, site_packages: bool, disk_mb: int, runner: str) -> None:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise RlzooError(
                "the code verifier's kernel sandbox (isolation: kernel, the default) needs bubblewrap, and `bwrap` "
                "is not on PATH: install it (`apt-get install bubblewrap`; scripts/install.sh does this), or "
                + _HOW_TO_WEAKEN
            )
        self.filter = deny_filter()
        info = _interpreter(python, site_packages)
        self.python = python if site_packages else info["exe"]  # a venv's python finds its site-packages
        binds = [info["exe"], *info["lib"]]
        if info["shared"] and info["libdir"]:
            binds.append(info["libdir"])
        if site_packages:
            binds += [info["prefix"], *info["path"], *_link_chain(os.path.abspath(python))]
        argv = [
            bwrap,
            *_NAMESPACES,
            "--disable-userns",
            "--uid",
            str(UID),
            "--gid",
            str(UID),
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--hostname",
            "sandbox",
        ]
        for path in _SYSTEM_LIBS:
            if os.path.islink(path):
                argv += ["--symlink", os.readlink(path), path]
            elif os.path.exists(path):
                argv += ["--ro-bind", path, path]
        for path in _outermost(p for p in binds if os.path.exists(p)):
            argv += ["--ro-bind", path, path]
        if not site_packages:  # hide the base interpreter's own site-packages (it sits inside the stdlib dir)
            for path in sorted(set(info["site"])):
                if os.path.isdir(path):
                    argv += ["--tmpfs", path, "--remount-ro", path]
        argv += [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--perms",
            "0700",
            "--size",
            str(disk_mb * 1024 * 1024),
            "--tmpfs",
            WORK,
        ]
        self._argv = argv
        self.runner = Path(runner).read_bytes()
        self.user: int | None = None
        """The uid bwrap runs as: ``None`` for the trainer's own; as root, ``UID`` when the interpreter is
        readable by it, so the code is an unprivileged user outside the sandbox too, and ``RLIMIT_NPROC``,
        from which the kernel exempts uid 0, binds."""
        error = self._probe(None)
        if error is not None:
            raise RlzooError(
                f"the code verifier's kernel sandbox (isolation: kernel, the default) cannot start here: {error}. "
                "The kernel must allow user namespaces (sysctl user.max_user_namespaces > 0; "
                "kernel.unprivileged_userns_clone=1 on some distributions; a container needs a seccomp/AppArmor "
                "profile that permits them). Or " + _HOW_TO_WEAKEN
            )
        refused = self._probe(UID) if os.geteuid() == 0 else None
        if os.geteuid() == 0 and refused is None:
            self.user = UID
        self.pids_root: str | None = pids_root() if os.geteuid() == 0 and self.user is None else None
        """Where :meth:`run` creates a ``pids`` group per response: only where bwrap runs as root, whom
        ``RLIMIT_NPROC`` does not bind (``None`` there too when the machine offers no writable hierarchy)."""
        if refused is not None:
            cap = (
                f"a pids cgroup ({self.pids_root}) caps each response at max_processes instead"
                if self.pids_root is not None
                else "no writable pids cgroup exists, so max_processes is not enforced: only the timeout bounds a "
                "fork bomb"
            )
            logger.warning(
                "the code verifier's sandbox runs bwrap as root, because uid %d cannot reach what it needs "
                "(%s). The code inside is still uid %d without capabilities in its own namespaces, but it is "
                "root outside them and RLIMIT_NPROC does not bind root: %s. To run it unprivileged, give the "
                "verifier an interpreter every user can read (its `python` param, e.g. /usr/bin/python3; now "
                "%s) or let others enter each folder above the path named (and above TMPDIR) (docs/security.md)",
                UID,
                refused,
                UID,
                cap,
                self.python,
            )

    def command(self, src_dir: str, interpreter_flags: list[str]) -> tuple[list[str], list[int]]:
        """The command that runs the runner on the sources in ``src_dir`` (mounted read-only at ``SRC``), and the
        pipes bwrap reads (the seccomp filter, the runner's source): pass them to the child, then close them."""
        fds = [_pipe(self.runner)]
        argv = [
            *self._argv,
            "--perms",
            "0444",
            "--ro-bind-data",
            str(fds[0]),
            RUNNER,
            "--ro-bind",
            src_dir,
            SRC,
            "--remount-ro",
            "/",
            "--chdir",
            WORK,
        ]
        if self.filter is not None:
            fds.append(_pipe(self.filter))
            argv += ["--seccomp", str(fds[-1])]
        return [*argv, self.python, *interpreter_flags, RUNNER], fds

    def _probe(self, user: int | None) -> str | None:
        """Start one empty sandbox as ``user``; bwrap's last error line if it fails."""
        with tempfile.TemporaryDirectory(prefix="rlzoo-probe-") as empty:
            os.chmod(empty, 0o755)
            argv, fds = self.command(empty, [])
            try:
                proc = subprocess.run(
                    argv[:-1] + ["-I", "-S", "-c", "pass"],
                    env={},
                    capture_output=True,
                    timeout=60,
                    cwd="/",
                    user=user,
                    group=user,
                    extra_groups=None if user is None else [],
                    pass_fds=fds,
                    stdin=subprocess.DEVNULL,
                )
            finally:
                for fd in fds:
                    os.close(fd)
        if proc.returncode == 0:
            return None
        message = proc.stderr.decode(errors="replace").strip().splitlines()
        return message[-1] if message else f"bwrap exited with status {proc.returncode}"


def _pipe(data: bytes) -> int:
    """The read end of a fresh pipe holding ``data`` (bwrap reads it to the end); both are far under the pipe's
    64 KiB buffer, so the write cannot block."""
    r, w = os.pipe()
    try:
        os.write(w, data)
    finally:
        os.close(w)
    return r


def _interpreter(python: str, site_packages: bool) -> dict:
    flags = ["-I"] if site_packages else ["-I", "-S"]
    try:
        out = subprocess.run([python, *flags, "-c", _QUERY], capture_output=True, check=True, timeout=60, env={}).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise RlzooError(f"the code verifier's python {python!r} cannot be run: {err}") from err
    return json.loads(out)


def _link_chain(path: str) -> list[str]:
    """``path`` and every symlink it goes through to the real file (a venv's python -> python3 -> python3.11)."""
    chain = [path]
    while os.path.islink(chain[-1]) and len(chain) < 40:
        chain.append(os.path.join(os.path.dirname(chain[-1]), os.readlink(chain[-1])))
    return chain


def _outermost(paths) -> list[str]:
    """The given paths without those inside another one (bound once, parents first)."""
    kept: list[str] = []
    for path in sorted({os.path.abspath(p) for p in paths}):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept
