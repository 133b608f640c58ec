"""The seccomp program, run on a classic BPF interpreter written here from the kernel's definition.

Each verdict is checked for the exact syscall and argument words the kernel hands the filter,
including a high word set on an argument the kernel reads as an ``int``: the filter must judge
what the kernel will do, not what the register holds. The same program is run in a real box in
test_sandbox_memory.py; this file needs no bubblewrap and runs on any machine.
"""

from __future__ import annotations

import struct

import pytest

from verifiers.sandbox import seccomp

X86_64 = seccomp.AUDIT_ARCH_X86_64
ALLOW = "allow"
KILL = "kill"


def run_filter(program: bytes, nr: int, *args: int, arch: int = X86_64) -> str | int:
    """The verdict for one call: "allow", "kill", or the errno returned."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    insns = [struct.unpack_from("<HBBI", program, off) for off in range(0, len(program), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            assert k % 4 == 0 and k + 4 <= len(data), f"load outside seccomp_data at {k}"
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code in (0x15, 0x35, 0x45):  # JEQ, JGE, JSET with a constant
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += 1 + (jt if taken else jf)
        elif code == 0x06:  # BPF_RET | BPF_K
            if k == 0x7FFF0000:
                return ALLOW
            if k == 0x80000000:
                return KILL
            assert k & 0xFFFF0000 == 0x00050000, hex(k)
            return k & 0xFFFF
        else:
            raise AssertionError(f"opcode {code:#x} this interpreter does not know")


@pytest.fixture(scope="module")
def prog() -> bytes:
    return seccomp.program("x86_64")


SOCKET, SOCKETPAIR, SETSOCKOPT, FCNTL, CLONE, CLONE3, READ, LISTEN = 41, 53, 54, 72, 56, 435, 0, 50
AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_VSOCK = 2, 10, 16, 17, 40


def test_only_unix_stream_sockets_are_made_and_none_listens(prog: bytes) -> None:
    for call in (SOCKET, SOCKETPAIR):
        assert run_filter(prog, call, seccomp.AF_UNIX, 1, 0) == ALLOW
        assert run_filter(prog, call, seccomp.AF_UNIX, 1 | 0x800 | 0x80000, 0) == ALLOW  # NONBLOCK, CLOEXEC
        assert run_filter(prog, call, seccomp.AF_UNIX, (2 << 32) | 1, 0) == ALLOW  # the kernel reads an int
        for kind in (0, 2, 3, 5, 2 | 0x80000, 15):  # none, DGRAM, RAW, SEQPACKET
            assert run_filter(prog, call, seccomp.AF_UNIX, kind, 0) == seccomp.ESOCKTNOSUPPORT, (call, kind)
        for family in (AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_VSOCK, 0, 38, 0xFFFF):
            assert run_filter(prog, call, family, 1, 0) == seccomp.EAFNOSUPPORT, (call, family)
    assert run_filter(prog, LISTEN, 3, 1) == seccomp.EOPNOTSUPP


def test_a_high_word_neither_hides_a_family_nor_blocks_one(prog: bytes) -> None:
    # the kernel reads the domain as an int: (1 << 32) | AF_VSOCK is AF_VSOCK to it
    assert run_filter(prog, SOCKET, (1 << 32) | AF_VSOCK, 1, 0) == seccomp.EAFNOSUPPORT
    assert run_filter(prog, SOCKET, (0xFFFFFFFF << 32) | AF_INET, 1, 0) == seccomp.EAFNOSUPPORT
    assert run_filter(prog, SOCKET, (1 << 32) | seccomp.AF_UNIX, 1, 0) == ALLOW


def test_socket_buffers_cannot_be_resized(prog: bytes) -> None:
    for option in (seccomp.SO_SNDBUF, seccomp.SO_RCVBUF, seccomp.SO_SNDBUFFORCE, seccomp.SO_RCVBUFFORCE):
        assert run_filter(prog, SETSOCKOPT, 3, seccomp.SOL_SOCKET, option, 0, 4) == seccomp.EPERM
        assert run_filter(prog, SETSOCKOPT, 3, (7 << 32) | seccomp.SOL_SOCKET, (9 << 32) | option) == seccomp.EPERM
    assert run_filter(prog, SETSOCKOPT, 3, seccomp.SOL_SOCKET, 16, 0, 4) == ALLOW  # SO_PASSCRED
    # option 7 at another level is another option (TCP_MAXSEG-like numbers collide)
    assert run_filter(prog, SETSOCKOPT, 3, 6, seccomp.SO_SNDBUF, 0, 4) == ALLOW


def test_pipes_cannot_grow(prog: bytes) -> None:
    assert run_filter(prog, FCNTL, 4, seccomp.F_SETPIPE_SZ, 1 << 20) == seccomp.EPERM
    assert run_filter(prog, FCNTL, 4, (1 << 32) | seccomp.F_SETPIPE_SZ, 1 << 20) == seccomp.EPERM
    for command in (1, 2, 3, 4, 1030, 1032):  # F_GETFD .. F_SETFL, F_DUPFD_CLOEXEC, F_GETPIPE_SZ
        assert run_filter(prog, FCNTL, 4, command, 0) == ALLOW


def test_aio_reports_enosys_and_the_listed_calls_eperm(prog: bytes) -> None:
    for name, nr in seccomp.AIO_X86_64.items():
        assert run_filter(prog, nr, 65536, 0) == seccomp.ENOSYS, name
    for name, nr in seccomp.DENIED_X86_64.items():
        assert run_filter(prog, nr, 0, 0) == seccomp.EPERM, name
    assert {"vmsplice", "memfd_create", "io_uring_setup"} <= set(seccomp.DENIED_X86_64)


def test_calls_that_pin_or_queue_uncounted_kernel_memory_are_answered_as_missing(prog: bytes) -> None:
    # splice/sendfile pin a whole page per byte in a socket; inotify queues events; tmpfs keeps xattrs
    for name, nr in seccomp.UNSUPPORTED_X86_64.items():
        assert run_filter(prog, nr, 3, 0, 4, 0, 16) == seccomp.ENOSYS, name
    for name, nr in seccomp.XATTR_WRITE_X86_64.items():
        assert run_filter(prog, nr, 0, 0, 0, 65536) == seccomp.EOPNOTSUPP, name
    assert {"splice", "tee", "sendfile", "inotify_init1", "fanotify_init", "mq_open"} <= set(seccomp.UNSUPPORTED_X86_64)
    for nr in (191, 192, 193, 326):  # getxattr, lgetxattr, fgetxattr, copy_file_range: still allowed
        assert run_filter(prog, nr, 0, 0, 0) == ALLOW


def test_clone_namespaces_and_foreign_abis(prog: bytes) -> None:
    assert run_filter(prog, CLONE, 17) == ALLOW  # SIGCHLD: a fork
    assert run_filter(prog, CLONE, 0x10000000 | 17) == seccomp.EPERM  # CLONE_NEWUSER
    assert run_filter(prog, CLONE3, 0, 88) == seccomp.ENOSYS
    assert run_filter(prog, READ, 0, 0, 10) == ALLOW
    assert run_filter(prog, READ, arch=0x40000003) == KILL  # i386
    assert run_filter(prog, 0x40000000 | SOCKET, AF_VSOCK) == KILL  # x32


def test_other_architectures_are_refused() -> None:
    with pytest.raises(seccomp.UnsupportedArchitectureError, match="aarch64"):
        seccomp.program("aarch64")
