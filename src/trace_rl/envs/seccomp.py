"""The strict sandbox's seccomp filter: which system calls the snippet may not make, and why.

The filter is built with libseccomp (through ctypes) and exported once as a BPF program that bubblewrap
installs (`--seccomp FD`) just before the snippet's interpreter starts. Every call outside the lists below is
allowed; a call of a foreign ABI (32-bit on x86_64) kills the process (libseccomp's default). Refused calls
fail with EPERM, so ordinary code sees an OSError it can report rather than a crash.

Refused, by what they would give the snippet:
- another process (the snippet must stay the only one, and pid 1 of its namespace): fork, vfork, clone
  without CLONE_THREAD (threads still work), clone3 (ENOSYS, so libc falls back to clone, whose flags a filter
  can read), and the ways to reach another process: ptrace, process_vm_readv/writev;
- a way out of the namespaces or a new view of the files: unshare, setns, mount and the new mount API,
  pivot_root, chroot, open_by_handle_at / name_to_handle_at;
- kernel attack surface no snippet needs: bpf, perf_event_open, userfaultfd, io_uring, keyrings, module
  loading, kexec, swap, reboot, acct, quotactl, syslog, lookup_dcookie;
- memory that RLIMIT_AS does not count: a SysV shared-memory segment outlives its mapping (shmget, shmat,
  shmdt; a loop of 512 MiB segments held 2 GB of host memory from one call), and so do SysV message queues
  and semaphores (the whole msg*/sem* family), POSIX message queues (mq_*), and memfd files (memfd_create,
  memfd_secret; 58 files of 16 MiB held 928 MiB beyond a 1 GiB limit). Each call also runs in its own IPC
  namespace (bubblewrap's --unshare-all), so even a segment made some other way would vanish with the call.
  What remains outside RLIMIT_AS is small and capped: the /tmp tmpfs (TMPFS_MB), pipe and AF_UNIX socket
  buffers (at most NOFILE descriptors of at most a few MiB each), and kernel memory per thread (bounded by
  the process limit);
- kernel memory that no limit counts and that lives as long as the files it hangs on: extended attributes
  (the setxattr family; the tmpfs's size does not count them) and inotify / fanotify instances and watches
  (inotify_init*, fanotify_init: watches come out of a per-user quota the host shares). Files and folders,
  whose inodes and dentries are kernel memory too, are capped by the tmpfs's inode limit (`envs.sandbox`);
- the network: socket() and socketpair() for every family but AF_UNIX.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import tempfile

PROCESSES = ("fork", "vfork", "ptrace", "process_vm_readv", "process_vm_writev")
NAMESPACES_AND_MOUNTS = (
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "open_by_handle_at",
    "name_to_handle_at",
)
KERNEL_SURFACE = (
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "syslog",
    "lookup_dcookie",
)
UNCOUNTED_MEMORY = (
    "shmget",
    "shmat",
    "shmdt",
    "shmctl",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "semget",
    "semop",
    "semtimedop",
    "semctl",
    "mq_open",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
    "mq_unlink",
    "memfd_create",
    "memfd_secret",
)
# kernel memory no limit on the snippet counts: extended attributes (tmpfs keeps each one's value, up to 64 KiB,
# in unreclaimable slab: 8 per file on files in /tmp held 1.5 GiB of host memory from one call) and inotify /
# fanotify watches (one call took the host's whole per-user inotify quota, so host processes got ENOSPC)
KERNEL_OBJECTS = (
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "setxattrat",
    "inotify_init",
    "inotify_init1",
    "inotify_add_watch",
    "fanotify_init",
    "fanotify_mark",
)
DENY = PROCESSES + NAMESPACES_AND_MOUNTS + KERNEL_SURFACE + UNCOUNTED_MEMORY + KERNEL_OBJECTS

_ALLOW = 0x7FFF0000  # SCMP_ACT_ALLOW; a syscall of a foreign ABI kills (libseccomp's default)
_CMP_NE, _CMP_MASKED_EQ = 1, 7  # enum scmp_compare
_CLONE_THREAD = 0x00010000
_AF_UNIX = 1


def _errno_action(code: int) -> int:
    return 0x00050000 | code  # SCMP_ACT_ERRNO(code)


class _Cmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]


@functools.cache
def program() -> bytes:
    """The BPF program, exported once per process by libseccomp. Raises OSError where libseccomp is unusable."""
    lib = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2")
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_Cmp),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(_ALLOW)
    if not ctx:
        raise OSError("seccomp_init failed")
    try:

        def rule(name: str, action: int, *cmps: _Cmp) -> None:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr == -1:  # not a syscall this libseccomp knows: nothing to refuse
                return
            arr = (_Cmp * len(cmps))(*cmps) if cmps else None
            if lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr) != 0:
                raise OSError(f"seccomp rule for {name} was rejected")

        for name in DENY:
            rule(name, _errno_action(errno.EPERM))
        # threads are clone(CLONE_THREAD | ...); anything else would be a new process
        rule("clone", _errno_action(errno.EPERM), _Cmp(0, _CMP_MASKED_EQ, _CLONE_THREAD, 0))
        # clone3 hides its flags in memory a filter cannot read; ENOSYS makes libc fall back to clone
        rule("clone3", _errno_action(errno.ENOSYS))
        for name in ("socket", "socketpair"):
            rule(name, _errno_action(errno.EPERM), _Cmp(0, _CMP_NE, _AF_UNIX, 0))
        with tempfile.TemporaryFile() as fh:
            if lib.seccomp_export_bpf(ctx, fh.fileno()) != 0:
                raise OSError("seccomp_export_bpf failed")
            fh.seek(0)
            return fh.read()
    finally:
        lib.seccomp_release(ctx)
