"""The seccomp filter of the code verifier's kernel sandbox, as the raw classic-BPF program bubblewrap loads.

``bwrap --seccomp FD`` reads an array of ``struct sock_filter`` (``linux/filter.h``) from FD and installs it
in the sandbox (with ``no_new_privs``), after its own setup and before the response's interpreter starts.
The filter is a deny list layered on top of the namespaces, in the spirit of Docker's and Flatpak's default
profiles: it refuses the calls a sandboxed Python program never needs and that widen the kernel's attack
surface or escape the sandbox's view: ``ptrace``/``process_vm_*``, mounts and namespaces (``mount``,
``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*`` flag, the new mount API), keyrings, ``bpf``,
``perf_event_open``, ``userfaultfd``, ``io_uring``, module/kexec/reboot/swap/clock/hostname administration,
``TIOCSTI`` keystroke injection, and sockets of any family but ``AF_UNIX``. Refused calls fail with ``EPERM``
(``EAFNOSUPPORT`` for sockets, ``ENOSYS`` for ``clone3``, whose flags a classic filter cannot read, so libc
falls back to ``clone``). A system call made through another ABI (``int 0x80``, x32) kills the process.
Syscall numbers are from the kernel's ``asm/unistd_64.h`` (x86-64) and ``asm-generic/unistd.h`` (arm64).
"""

from __future__ import annotations

import errno
import platform
import socket
import struct

# classic BPF opcodes (linux/bpf_common.h) and seccomp return values (linux/seccomp.h)
_LD_W_ABS = 0x20
_JEQ = 0x15
_JGE = 0x35
_JSET = 0x45
_RET = 0x06
_KILL_PROCESS = 0x80000000
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
# offsets in struct seccomp_data: nr (u32), arch (u32), ip (u64), args[6] (u64, low half first on LE)
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24

_CLONE_NEW_FLAGS = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C
_X32_BIT = 0x40000000

_DENIED = (
    "ptrace process_vm_readv process_vm_writev mount umount2 pivot_root chroot swapon swapoff reboot "
    "sethostname setdomainname iopl ioperm init_module finit_module delete_module kexec_load kexec_file_load "
    "acct quotactl unshare setns keyctl add_key request_key bpf perf_event_open userfaultfd personality syslog "
    "open_by_handle_at name_to_handle_at lookup_dcookie fanotify_init io_uring_setup io_uring_enter "
    "io_uring_register open_tree move_mount fsopen fsconfig fsmount fspick mount_setattr clock_settime "
    "settimeofday adjtimex clock_adjtime vhangup"
).split()

# (audit arch, syscall numbers); names absent from an architecture (iopl on arm64) are simply not listed
_ARCHES = {
    "x86_64": (
        0xC000003E,
        dict(
            ptrace=101,
            process_vm_readv=310,
            process_vm_writev=311,
            mount=165,
            umount2=166,
            pivot_root=155,
            chroot=161,
            swapon=167,
            swapoff=168,
            reboot=169,
            sethostname=170,
            setdomainname=171,
            iopl=172,
            ioperm=173,
            init_module=175,
            finit_module=313,
            delete_module=176,
            kexec_load=246,
            kexec_file_load=320,
            acct=163,
            quotactl=179,
            unshare=272,
            setns=308,
            keyctl=250,
            add_key=248,
            request_key=249,
            bpf=321,
            perf_event_open=298,
            userfaultfd=323,
            personality=135,
            syslog=103,
            open_by_handle_at=304,
            name_to_handle_at=303,
            lookup_dcookie=212,
            fanotify_init=300,
            io_uring_setup=425,
            io_uring_enter=426,
            io_uring_register=427,
            open_tree=428,
            move_mount=429,
            fsopen=430,
            fsconfig=431,
            fsmount=432,
            fspick=433,
            mount_setattr=442,
            clock_settime=227,
            settimeofday=164,
            adjtimex=159,
            clock_adjtime=305,
            vhangup=153,
            socket=41,
            clone=56,
            clone3=435,
            ioctl=16,
        ),
    ),
    "aarch64": (
        0xC00000B7,
        dict(
            ptrace=117,
            process_vm_readv=270,
            process_vm_writev=271,
            mount=40,
            umount2=39,
            pivot_root=41,
            chroot=51,
            swapon=224,
            swapoff=225,
            reboot=142,
            sethostname=161,
            setdomainname=162,
            init_module=105,
            finit_module=273,
            delete_module=106,
            kexec_load=104,
            kexec_file_load=294,
            acct=89,
            quotactl=60,
            unshare=97,
            setns=268,
            keyctl=219,
            add_key=217,
            request_key=218,
            bpf=280,
            perf_event_open=241,
            userfaultfd=282,
            personality=92,
            syslog=116,
            open_by_handle_at=265,
            name_to_handle_at=264,
            lookup_dcookie=18,
            fanotify_init=262,
            io_uring_setup=425,
            io_uring_enter=426,
            io_uring_register=427,
            open_tree=428,
            move_mount=429,
            fsopen=430,
            fsconfig=431,
            fsmount=432,
            fspick=433,
            mount_setattr=442,
            clock_settime=112,
            settimeofday=170,
            adjtimex=171,
            clock_adjtime=266,
            vhangup=58,
            socket=198,
            clone=220,
            clone3=435,
            ioctl=29,
        ),
    ),
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def deny_filter(machine: str | None = None) -> bytes | None:
    """The filter program for ``machine`` (default: this one's), or ``None`` where no table exists for it."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, nr = arch
    prog = [_op(_LD_W_ABS, _ARCH), _op(_JEQ, audit_arch, jt=1), _op(_RET, _KILL_PROCESS), _op(_LD_W_ABS, _NR)]
    if audit_arch == _ARCHES["x86_64"][0]:
        prog += [_op(_JGE, _X32_BIT, jf=1), _op(_RET, _KILL_PROCESS)]
    for name in _DENIED:
        if name in nr:
            prog += [_op(_JEQ, nr[name], jf=1), _op(_RET, _ERRNO | errno.EPERM)]
    prog += [_op(_JEQ, nr["clone3"], jf=1), _op(_RET, _ERRNO | errno.ENOSYS)]
    # each block below loads an argument over A, so it ends in a return on every path
    prog += [
        _op(_JEQ, nr["clone"], jf=4),
        _op(_LD_W_ABS, _ARG0),
        _op(_JSET, _CLONE_NEW_FLAGS, jf=1),
        _op(_RET, _ERRNO | errno.EPERM),
        _op(_RET, _ALLOW),
        _op(_JEQ, nr["socket"], jf=4),
        _op(_LD_W_ABS, _ARG0),
        _op(_JEQ, socket.AF_UNIX, jf=1),
        _op(_RET, _ALLOW),
        _op(_RET, _ERRNO | errno.EAFNOSUPPORT),
        _op(_JEQ, nr["ioctl"], jf=5),
        _op(_LD_W_ABS, _ARG1),
        _op(_JEQ, _TIOCSTI, jt=1),
        _op(_JEQ, _TIOCLINUX, jf=1),
        _op(_RET, _ERRNO | errno.EPERM),
        _op(_RET, _ALLOW),
        _op(_RET, _ALLOW),
    ]
    return b"".join(prog)
