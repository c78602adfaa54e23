"""The strict sandbox's seccomp filter: which system calls the snippet may not make, and why.

The filter is built with libseccomp (through ctypes) and exported once as a BPF program that bubblewrap
installs (`--seccomp FD`) just before the snippet's interpreter starts. Every call outside the lists below is
allowed; a call of a foreign ABI (32-bit or x32 on x86_64) kills the whole process, not only the thread that
made it (libseccomp's default), as the sandbox's prologue runs a watcher thread of its own. Refused calls
fail with EPERM, so ordinary code sees an OSError it can report rather than a crash.

Refused, by what they would give the snippet:
- another process (the snippet must stay the only one, and pid 1 of its namespace): fork, vfork, clone
  without CLONE_THREAD (threads still work), clone3 (ENOSYS, so libc falls back to clone, whose flags a filter
  can read), and the ways to reach another process: ptrace, process_vm_readv/writev;
- a way out of the namespaces or a new view of the files: unshare, setns, mount and the new mount API,
  pivot_root, chroot, open_by_handle_at / name_to_handle_at;
- kernel attack surface no snippet needs: bpf, perf_event_open, userfaultfd, io_uring, keyrings, module
  loading, kexec, swap, reboot, acct, quotactl, syslog, lookup_dcookie;
- counts the host shares: AIO contexts (io_setup; the machine holds fs.aio-max-nr of them, 65,536 by default,
  and one call took them all, so the host's own io_setup got EAGAIN; no rlimit bounds them, and Python does not
  use them). POSIX timers, the other such count, are bounded by RLIMIT_SIGPENDING in the sandbox instead;
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

A name libseccomp cannot resolve (setxattrat and its siblings are newer than libseccomp 2.5.4) is refused by its
number from NUMBERS, kept for the architectures where every system call from 424 on has one number (x86_64,
aarch64 and the others of the unified table); a name neither resolves nor has a number on file fails the build
(SeccompError, an OSError: the strict sandbox then reports itself unavailable) rather than leaving a hole.
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
SHARED_COUNTS = ("io_setup",)
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
DENY = PROCESSES + NAMESPACES_AND_MOUNTS + KERNEL_SURFACE + SHARED_COUNTS + UNCOUNTED_MEMORY + KERNEL_OBJECTS

# Numbers from the kernel's unified table (include/uapi/asm-generic/unistd.h and arch/x86/entry/syscalls/
# syscall_64.tbl agree from 424 on), for the names in DENY an older libseccomp may not know.
NUMBERS = {
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "mount_setattr": 442,
    "memfd_secret": 447,
    "setxattrat": 463,  # its siblings getxattrat, listxattrat, removexattrat (464-466) hold nothing: allowed
}
# AUDIT_ARCH_* of the architectures whose table NUMBERS follows (x86_64, aarch64, riscv64, loongarch64, ppc64le,
# s390x): mips and alpha number differently, and i386/arm are not this interpreter's usual home
UNIFIED_ARCHES = {0xC000003E, 0xC00000B7, 0xC00000F3, 0xC0000102, 0xC0000015, 0x80000016}


class SeccompError(OSError):
    """The filter cannot be built as written: a name it should refuse is unknown, or a rule was rejected."""


def syscall_number(name: str, resolve, arch: int) -> int:
    """`name`'s number for the filter: libseccomp's (`resolve`, negative for a call this architecture lacks,
    which libseccomp then skips), else NUMBERS' where `arch` follows the unified table; SeccompError if neither."""
    nr = resolve(name.encode())
    if nr != -1:  # __NR_SCMP_ERROR: a name libseccomp does not know
        return nr
    if name in NUMBERS and arch in UNIFIED_ARCHES:
        return NUMBERS[name]
    raise SeccompError(
        f"the seccomp filter cannot refuse {name!r}: this libseccomp does not know it and no number is on file "
        f"for architecture {arch:#x}; update libseccomp"
    )


_ALLOW = 0x7FFF0000  # SCMP_ACT_ALLOW
_KILL_PROCESS = 0x80000000  # SCMP_ACT_KILL_PROCESS: for a syscall of a foreign ABI
_ATTR_ACT_BADARCH = 2  # SCMP_FLTATR_ACT_BADARCH
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
    lib.seccomp_arch_native.restype = ctypes.c_uint32
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_Cmp),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    ctx = lib.seccomp_init(_ALLOW)
    if not ctx:
        raise OSError("seccomp_init failed")
    try:
        if lib.seccomp_attr_set(ctx, _ATTR_ACT_BADARCH, ctypes.c_uint32(_KILL_PROCESS)) != 0:
            raise SeccompError("libseccomp refused to kill the process on a foreign ABI (SCMP_ACT_KILL_PROCESS)")
        arch = lib.seccomp_arch_native()

        def rule(name: str, action: int, *cmps: _Cmp) -> None:
            nr = syscall_number(name, lib.seccomp_syscall_resolve_name, arch)
            arr = (_Cmp * len(cmps))(*cmps) if cmps else None
            if lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr) != 0:
                raise SeccompError(f"seccomp rule for {name} ({nr}) was rejected")

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
                raise SeccompError("seccomp_export_bpf failed")
            fh.seek(0)
            return fh.read()
    finally:
        lib.seccomp_release(ctx)
