"""The sandbox's seccomp filter: a classic BPF program assembled here, for bwrap's ``--seccomp FD``.

Why by hand: libseccomp's Python binding is not on PyPI and this program is about sixty compares;
assembling it here keeps the box's dependencies at bubblewrap alone. Only x86_64 has a table;
other architectures are refused (a wrong syscall number would deny the wrong call and allow the
dangerous one).

What it refuses, and why each answer is the one it is:

- calls that reach past the namespaces or hold memory no rlimit counts (memfd, SysV IPC,
  ptrace, keyctl, bpf, mount, io_uring, ...): EPERM, as the kernel answers an unprivileged caller;
- every socket family but ``AF_UNIX``, for ``socket`` and ``socketpair``: EAFNOSUPPORT, what a
  kernel built without that family answers, so libraries treat it as absent instead of broken
  (``socket.has_ipv6`` probes, ``getaddrinfo``). ``AF_VSOCK`` is the one that mattered: the
  network namespace does not cover it, and on a virtual machine a box could bind host ports and
  talk to the hypervisor. ``AF_UNIX`` stays because ``asyncio``'s event loop and
  ``multiprocessing.Pipe`` make a ``socketpair``; nothing of the service talks to the box through
  a socket (its protocol is the box's stdin and stdout);
- of ``AF_UNIX``, only stream sockets (ESOCKTNOSUPPORT for datagram and seqpacket ones), and no
  ``listen`` (EOPNOTSUPP): a socket's buffer is charged to the sender, and a sender that closes
  leaves what it sent queued at the receiver. A datagram receiver took ``net.unix.max_dgram_qlen``
  + 1 messages of up to ``wmem_default`` from as many closed senders (2.2 MiB per receiver, 111 MiB
  from 50), and a listening socket kept up to ``somaxconn`` unaccepted connections whose clients
  had filled them and closed (500 MiB from one listener in under a second, and not near its
  limit). A socket pair is all ``asyncio`` and ``multiprocessing.Pool`` need;
- ``setsockopt(SOL_SOCKET, SO_SNDBUF | SO_RCVBUF | SO_SNDBUFFORCE | SO_RCVBUFFORCE)``: EPERM.
  Socket buffers are kernel memory that neither RLIMIT_AS nor, for ``AF_UNIX``, a cgroup's
  ``memory.max`` counts; left at the host's default (``net.core.wmem_default``) one socket holds
  at most about twice that, where a raised buffer let it hold 4 x ``wmem_max`` (16 MiB on a host
  with the common 4 MiB);
- ``fcntl(F_SETPIPE_SZ)``: EPERM, so a pipe holds at most its default 16 pages; ``vmsplice``:
  EPERM, because a pipe that references a transparent huge page keeps all 2 MiB of it alive
  after the process unmaps it;
- the AIO calls (``io_setup`` ... ``io_pgetevents``): ENOSYS, what a kernel without AIO answers.
  Their context count is host-wide (``fs.aio-nr`` up to ``fs.aio-max-nr``): one box took all of it;
- ``splice``, ``tee`` and ``sendfile``: ENOSYS. Spliced into an ``AF_UNIX`` socket, a pipe's page
  stays referenced by the socket while only the bytes used of it are counted against the socket's
  buffer: one byte from each of 16 pages per call held about 17 MiB per socket, where 2 x
  ``wmem_default`` was stated (a box of one 64 MiB process held 619 MiB of host memory).
  ``shutil`` and ``socket.sendfile`` fall back to reads and writes when the first call fails;
- ``inotify_init``, ``inotify_init1`` and ``fanotify_init``: ENOSYS, as without those features.
  Each instance queues up to ``fs.inotify.max_queued_events`` events of up to 255-byte names in
  kernel memory: 60 instances of one process held 488 MiB;
- ``mq_open``: ENOSYS, as a kernel without POSIX message queues answers (SysV ``msgget`` is refused
  above). A queue's messages are kernel memory charged to the uid's RLIMIT_MSGQUEUE (800 KiB by
  default), which every box shares with every other (uid 65534) or with the service (its uid in a
  user namespace); the standard library does not use them;
- ``setxattr``, ``lsetxattr``, ``fsetxattr``, ``setxattrat``: EOPNOTSUPP, what a filesystem
  without extended attributes answers. The box's tmpfs keeps ``user.*`` attributes in kernel
  memory its size cap does not count: 400 MiB of values held 800 MiB in 4 s;
- ``clone`` with a namespace flag: EPERM; ``clone3``: ENOSYS, because its flags sit behind a
  pointer the filter cannot read, and glibc falls back to ``clone`` on ENOSYS;
- a call from another ABI (i386 ``int 0x80``, x32): the process is killed, since the numbers mean
  other calls there.

Arguments are compared by their low 32-bit word only (``seccomp_data.args[i]`` at offset
``16 + 8 i``, little-endian), because the kernel reads each of these arguments as an ``int``:
comparing the whole 64-bit register would let a caller set the high word to slip past a rule
while the kernel sees the same family or option.
"""

from __future__ import annotations

import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000
_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
EPERM, EAFNOSUPPORT, ENOSYS, EOPNOTSUPP, ESOCKTNOSUPPORT = 1, 97, 38, 95, 94

AF_UNIX = 1
SOCK_STREAM = 1
SOCK_TYPE_MASK = 0xF  # the type's bits; the rest are SOCK_NONBLOCK and SOCK_CLOEXEC
SOL_SOCKET = 1
SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE = 7, 8, 32, 33
F_SETPIPE_SZ = 1031  # F_LINUX_SPECIFIC_BASE + 7

# CLONE_NEWTIME | CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER
# | CLONE_NEWPID | CLONE_NEWNET
CLONE_NS_FLAGS = 0x00000080 | 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# x86_64 numbers (arch/x86/entry/syscalls/syscall_64.tbl)
DENIED_X86_64 = {
    "shmget": 29,
    "shmat": 30,
    "shmctl": 31,
    # SysV message queues and semaphores: kernel memory that RLIMIT_AS does not count
    "semget": 64,
    "msgget": 68,
    "msgsnd": 69,
    "ptrace": 101,
    "syslog": 103,
    "uselib": 134,
    "personality": 135,
    "vhangup": 153,
    "pivot_root": 155,
    "chroot": 161,
    "acct": 163,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "iopl": 172,
    "ioperm": 173,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "lookup_dcookie": 212,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "vmsplice": 278,
    "perf_event_open": 298,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "kcmp": 312,
    "finit_module": 313,
    "memfd_create": 319,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "pidfd_send_signal": 424,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "pidfd_open": 434,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
    "memfd_secret": 447,
}
AIO_X86_64 = {
    "io_setup": 206,
    "io_destroy": 207,
    "io_getevents": 208,
    "io_submit": 209,
    "io_cancel": 210,
    "io_pgetevents": 333,
}
# features answered as missing (ENOSYS); each held kernel memory no limit of the box counts
UNSUPPORTED_X86_64 = {
    "sendfile": 40,
    "inotify_init": 253,
    "splice": 275,
    "tee": 276,
    "inotify_init1": 294,
    "fanotify_init": 300,
    "mq_open": 240,
}
# writing extended attributes: EOPNOTSUPP (tmpfs keeps them in memory beyond its size cap)
XATTR_WRITE_X86_64 = {"setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "setxattrat": 463}
_CLONE, _CLONE3, _SOCKET, _SOCKETPAIR, _SETSOCKOPT, _FCNTL, _LISTEN = 56, 435, 41, 53, 54, 72, 50

# classic BPF opcodes
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06


def _arg_low_word(index: int) -> int:
    """Offset in ``struct seccomp_data`` of the low 32 bits of syscall argument ``index``."""
    return 16 + 8 * index


class _Assembler:
    """Instructions whose jump targets are labels, resolved to the relative offsets BPF wants."""

    def __init__(self) -> None:
        self.prog: list[tuple[int, str | int, str | int, int]] = []  # code, jump-true, jump-false, k
        self.labels: dict[str, int] = {}

    def op(self, code: int, k: int, jt: str | int = 0, jf: str | int = 0) -> None:
        self.prog.append((code, jt, jf, k))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.prog)

    def ret(self, k: int) -> None:
        self.op(_RET_K, k)

    def assemble(self) -> bytes:
        out = bytearray()
        for i, (code, jt, jf, k) in enumerate(self.prog):
            offsets = [self.labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf)]
            if not all(0 <= o <= 255 for o in offsets):
                raise ValueError("seccomp jump out of range")
            out += struct.pack("<HBBI", code, offsets[0], offsets[1], k)
        return bytes(out)


class UnsupportedArchitectureError(OSError):
    """There is no syscall table here for this machine's architecture."""


def program(machine: str | None = None) -> bytes:
    """The filter as ``struct sock_filter[]`` bytes."""
    machine = machine or platform.machine()
    if machine not in ("x86_64", "amd64"):
        raise UnsupportedArchitectureError(f"no seccomp syscall table for architecture {machine!r} (only x86_64)")
    a = _Assembler()
    a.op(_LD_W_ABS, 4)  # seccomp_data.arch
    a.op(_JEQ_K, AUDIT_ARCH_X86_64, 0, "kill")
    a.op(_LD_W_ABS, 0)  # seccomp_data.nr
    a.op(_JGE_K, _X32_SYSCALL_BIT, "kill")
    a.op(_JEQ_K, _CLONE, "clone")
    a.op(_JEQ_K, _CLONE3, "enosys")
    a.op(_JEQ_K, _SOCKET, "family")
    a.op(_JEQ_K, _SOCKETPAIR, "family")
    a.op(_JEQ_K, _SETSOCKOPT, "sockopt")
    a.op(_JEQ_K, _FCNTL, "fcntl")
    a.op(_JEQ_K, _LISTEN, "eopnotsupp")
    for nr in sorted([*AIO_X86_64.values(), *UNSUPPORTED_X86_64.values()]):
        a.op(_JEQ_K, nr, "enosys")
    for nr in sorted(XATTR_WRITE_X86_64.values()):
        a.op(_JEQ_K, nr, "eopnotsupp")
    for nr in sorted(DENIED_X86_64.values()):
        a.op(_JEQ_K, nr, "deny")
    a.ret(_RET_ALLOW)

    a.label("clone")
    a.op(_LD_W_ABS, _arg_low_word(0))  # the flags
    a.op(_JSET_K, CLONE_NS_FLAGS, "deny", "allow")

    a.label("family")
    a.op(_LD_W_ABS, _arg_low_word(0))  # the domain
    a.op(_JEQ_K, AF_UNIX, 0, "eafnosupport")
    a.op(_LD_W_ABS, _arg_low_word(1))  # the type: its low four bits are SOCK_STREAM, and only that
    a.op(_JSET_K, SOCK_TYPE_MASK & ~SOCK_STREAM, "esocktnosupport")
    a.op(_JSET_K, SOCK_STREAM, "allow", "esocktnosupport")

    a.label("sockopt")
    a.op(_LD_W_ABS, _arg_low_word(1))  # the level
    a.op(_JEQ_K, SOL_SOCKET, 0, "allow")
    a.op(_LD_W_ABS, _arg_low_word(2))  # the option
    for option in (SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE):
        a.op(_JEQ_K, option, "deny")
    a.ret(_RET_ALLOW)

    a.label("fcntl")
    a.op(_LD_W_ABS, _arg_low_word(1))  # the command
    a.op(_JEQ_K, F_SETPIPE_SZ, "deny", "allow")

    # BPF jumps only forward: every verdict sits at the end
    a.label("allow")
    a.ret(_RET_ALLOW)
    a.label("deny")
    a.ret(_RET_ERRNO | EPERM)
    a.label("enosys")
    a.ret(_RET_ERRNO | ENOSYS)
    a.label("eafnosupport")
    a.ret(_RET_ERRNO | EAFNOSUPPORT)
    a.label("eopnotsupp")
    a.ret(_RET_ERRNO | EOPNOTSUPP)
    a.label("esocktnosupport")
    a.ret(_RET_ERRNO | ESOCKTNOSUPPORT)
    a.label("kill")
    a.ret(_RET_KILL_PROCESS)
    return a.assemble()
