"""The program the ``code`` verifier runs in its child process (``python -I -B _sandbox_runner.py``).

It is never imported by the parent. Protocol: the first line of stdin is a JSON object with the paths of the
solution and the tests, the resource limits and a random ``nonce``. The runner reads both sources, applies the
limits, installs the in-process guards, executes solution then tests in one namespace, and on success prints
the nonce as the last line of stdout. The exit status tells the parent what happened (see ``EXIT_*``).

With ``isolation: kernel`` (the default) this program runs inside the bubblewrap sandbox of
``_kernel_sandbox``, which is the security boundary; it then also signals, on the ``started_fd`` pipe, that the
sandbox came up, and sets ``RLIMIT_NPROC``. The in-process guards below are a second layer, and the only one
with ``isolation: process``: they run in the same interpreter as the code they guard, so determined code can
undo them (e.g. by introspection); they stop accidents and the usual reward hacks of a policy, not an adversary.
An ``OSError`` that reaches the top is classified by its errno (a read-only filesystem is a write outside the
sandbox, a full disk or file-size limit a disk limit, an unsupported address family a network access).
This file must only use the standard library.
"""

import builtins
import errno
import io
import json
import os
import resource
import sys

EXIT_OK = 0
EXIT_TESTS_FAILED = 1
EXIT_ERROR = 2
EXIT_SYNTAX = 3
EXIT_MEMORY = 4
EXIT_EARLY_EXIT = 5
EXIT_DISK = 6
EXIT_WRITE = 10
EXIT_NETWORK = 11
EXIT_PROCESS = 12

MARKER = "rlzoo-sandbox:"
_ERRNO_EXITS = {
    errno.EROFS: EXIT_WRITE,
    errno.ENOSPC: EXIT_DISK,
    errno.EFBIG: EXIT_DISK,
    errno.EDQUOT: EXIT_DISK,
    errno.EAFNOSUPPORT: EXIT_NETWORK,
    errno.ENETUNREACH: EXIT_NETWORK,
}

_real_exit = os._exit
_real_write = os.write


def _report(code, message):
    try:
        _real_write(2, f"\n{MARKER} {message}\n".encode("utf-8", "replace"))
    finally:
        _real_exit(code)


def _set_limits(cfg):
    mem = int(cfg["memory_mb"]) * 1024 * 1024
    cpu = int(cfg["cpu_s"])
    fsize = int(cfg["file_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cfg.get("nproc"):
        resource.setrlimit(resource.RLIMIT_NPROC, (int(cfg["nproc"]), int(cfg["nproc"])))


def _install_guards(work):
    import _io
    import posix
    import socket

    work = os.path.realpath(work)

    def resolve(path, dir_fd=None):
        if isinstance(path, int):
            return os.path.realpath(f"/proc/self/fd/{path}")
        path = os.fsdecode(os.fspath(path))
        if dir_fd is not None and not os.path.isabs(path):
            path = os.path.join(os.path.realpath(f"/proc/self/fd/{dir_fd}"), path)
        return os.path.realpath(path)

    def check(path, dir_fd=None):
        try:
            real = resolve(path, dir_fd)
        except Exception:
            real = None
        if real is None or not (real == work or real.startswith(work + os.sep)):
            _report(EXIT_WRITE, f"write outside the sandbox blocked: {path!r}")

    def replace(name, wrapper_factory, *modules):
        for module in modules:
            original = getattr(module, name, None)
            if original is not None:
                setattr(module, name, wrapper_factory(original))

    # -- filesystem writes ---------------------------------------------------------------------------------------
    def open_factory(original):
        def guarded_open(file, mode="r", *args, **kwargs):
            if not isinstance(file, int) and any(c in mode for c in "wax+"):
                check(file)
            return original(file, mode, *args, **kwargs)

        return guarded_open

    for module in (builtins, io, _io):
        replace("open", open_factory, module)

    class GuardedFileIO(_io.FileIO):
        def __init__(self, file, mode="r", *args, **kwargs):
            if not isinstance(file, int) and any(c in mode for c in "wax+"):
                check(file)
            super().__init__(file, mode, *args, **kwargs)

    io.FileIO = _io.FileIO = GuardedFileIO

    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def os_open_factory(original):
        def guarded(path, flags, *args, dir_fd=None, **kwargs):
            if flags & write_flags:
                check(path, dir_fd)
            return original(path, flags, *args, dir_fd=dir_fd, **kwargs)

        return guarded

    replace("open", os_open_factory, os, posix)

    def one_path_factory(original):
        def guarded(path, *args, dir_fd=None, **kwargs):
            check(path, dir_fd)
            if dir_fd is not None:
                kwargs["dir_fd"] = dir_fd
            return original(path, *args, **kwargs)

        return guarded

    for name in (
        "mkdir",
        "rmdir",
        "remove",
        "unlink",
        "chmod",
        "chown",
        "lchown",
        "lchmod",
        "truncate",
        "utime",
        "mkfifo",
        "mknod",
        "setxattr",
        "removexattr",
        "chflags",
        "lchflags",
    ):
        replace(name, one_path_factory, os, posix)

    def two_path_factory(original):
        def guarded(src, dst, *args, src_dir_fd=None, dst_dir_fd=None, **kwargs):
            check(src, src_dir_fd)
            check(dst, dst_dir_fd)
            if src_dir_fd is not None:
                kwargs["src_dir_fd"] = src_dir_fd
            if dst_dir_fd is not None:
                kwargs["dst_dir_fd"] = dst_dir_fd
            return original(src, dst, *args, **kwargs)

        return guarded

    for name in ("rename", "replace", "link"):
        replace(name, two_path_factory, os, posix)

    def symlink_factory(original):
        def guarded(src, dst, *args, dir_fd=None, **kwargs):
            check(dst, dir_fd)  # the link itself; writing through it is checked on the resolved target
            if dir_fd is not None:
                kwargs["dir_fd"] = dir_fd
            return original(src, dst, *args, **kwargs)

        return guarded

    replace("symlink", symlink_factory, os, posix)

    # -- network ---------------------------------------------------------------------------------------------------
    def deny_network(*args, **kwargs):
        _report(EXIT_NETWORK, "network access blocked (socket creation is disabled)")

    import _socket

    # classes stay classes (ssl and others subclass socket.socket at import time); creating one is refused
    class DeniedSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            deny_network()

    class DeniedRawSocket(_socket.socket):
        def __init__(self, *args, **kwargs):
            deny_network()

    socket.socket = socket.SocketType = DeniedSocket
    _socket.socket = _socket.SocketType = DeniedRawSocket
    for name in (
        "create_connection",
        "create_server",
        "socketpair",
        "fromfd",
        "getaddrinfo",
        "gethostbyname",
        "gethostbyname_ex",
        "gethostbyaddr",
    ):
        for module in (socket, _socket):
            if hasattr(module, name):
                setattr(module, name, deny_network)

    # -- processes, signals, limits ------------------------------------------------------------------------------------
    def deny_process(*args, **kwargs):
        _report(EXIT_PROCESS, "process creation or control blocked")

    for name in (
        "fork",
        "forkpty",
        "vfork",
        "system",
        "popen",
        "posix_spawn",
        "posix_spawnp",
        "execv",
        "execve",
        "execl",
        "execle",
        "execlp",
        "execlpe",
        "execvp",
        "execvpe",
        "spawnv",
        "spawnve",
        "spawnl",
        "spawnle",
        "spawnlp",
        "spawnlpe",
        "spawnvp",
        "spawnvpe",
        "killpg",
        "setsid",
        "setpgid",
        "setpgrp",
        "pidfd_open",
    ):
        for module in (os, posix):
            if hasattr(module, name):
                setattr(module, name, deny_process)

    own_pid = os.getpid()

    def kill_factory(original):
        def guarded(pid, sig):
            if pid != own_pid:
                deny_process()
            return original(pid, sig)

        return guarded

    replace("kill", kill_factory, os, posix)
    try:
        import _posixsubprocess

        _posixsubprocess.fork_exec = deny_process
    except ImportError:
        pass
    resource.setrlimit = deny_process
    resource.prlimit = deny_process

    # modules that reach past every guard above
    for name in ("ctypes", "_ctypes", "cffi", "_cffi_backend"):
        sys.modules[name] = None


def main():
    cfg = json.loads(sys.stdin.buffer.readline())
    nonce = cfg.pop("nonce")
    if cfg.get("started_fd") is not None:
        _real_write(cfg["started_fd"], b"1")  # kept open: the parent waits for every holder to exit
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))

    sources = []
    for key in ("solution", "tests"):
        with open(cfg[key], encoding="utf-8") as f:
            text = f.read()
        try:
            sources.append(compile(text, f"<{key}>", "exec"))
        except (SyntaxError, ValueError) as err:
            _report(EXIT_SYNTAX, f"{key} does not compile: {err}")

    _set_limits(cfg)
    _install_guards(os.getcwd())

    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        for code in sources:
            exec(code, namespace)  # noqa: S102 - this process is the sandbox
    except SystemExit:
        _report(EXIT_EARLY_EXIT, "the code exited before the tests finished")
    except MemoryError:
        _report(EXIT_MEMORY, "memory limit reached")
    except AssertionError:
        _print_traceback()
        _real_exit(EXIT_TESTS_FAILED)
    except OSError as err:
        _print_traceback()
        _real_exit(_ERRNO_EXITS.get(err.errno, EXIT_ERROR))
    except BaseException:
        _print_traceback()
        _real_exit(EXIT_ERROR)
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    _real_write(1, f"\n{nonce}\n".encode())
    _real_exit(EXIT_OK)


def _print_traceback():
    try:
        import traceback

        text = traceback.format_exc(limit=-5)
        _real_write(2, text[-4000:].encode("utf-8", "replace"))
    except BaseException:
        pass


if __name__ == "__main__":
    main()
