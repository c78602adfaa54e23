"""The strict sandbox against counts the host shares and system calls newer than libseccomp: POSIX timers stop at
RLIMIT_SIGPENDING, AIO contexts are refused, setxattrat is refused by number on every path (the bwrap-run-directly
path without a cgroup included), and a name the filter can neither resolve nor number fails its build loudly."""

import ctypes
import ctypes.util

import pytest

from trace_rl.envs import sandbox, seccomp
from trace_rl.envs.sandbox import run_python

WHY = sandbox.strict_unavailable()
needs_strict = pytest.mark.skipif(WHY is not None, reason=f"strict sandbox unavailable here: {WHY}")

_LIBC = "import ctypes, errno, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"


@needs_strict
def test_posix_timers_stop_at_the_bound_and_aio_contexts_are_refused():
    res = run_python(
        _LIBC + "ev = (ctypes.c_int * 16)(0, 0, 0, 1)  # SIGEV_NONE: no signal, still a timer\n"
        "n = 0\nwhile n < 5000 and libc.syscall(222, 1, ev, ctypes.byref(ctypes.c_int())) == 0: n += 1\n"
        "print('timers', n, errno.errorcode[ctypes.get_errno()])\n"
        "r = libc.syscall(206, 1, ctypes.byref(ctypes.c_ulong(0)))\n"
        "print('io_setup', r, errno.errorcode[ctypes.get_errno()])",
        timeout_s=20,
    )
    timers, aio = res.stdout.splitlines()
    assert timers == f"timers {sandbox.SIGPENDING} EAGAIN", res  # 5,000 were there no bound
    assert aio == "io_setup -1 EPERM", res


_SETXATTRAT = _LIBC + (
    "open('f', 'w').close()\nv = ctypes.create_string_buffer(b'v' * 100)\n"
    "args = (ctypes.c_uint64 * 2)(ctypes.addressof(v), 100)  # struct xattr_args: value, size, flags\n"
    "r = libc.syscall(463, -100, b'f', ctypes.c_uint(0), b'user.k', args, ctypes.c_size_t(16))\n"
    "print(r, errno.errorcode.get(ctypes.get_errno()))"
)


@needs_strict
@pytest.mark.parametrize("path", ["default", "direct, no cgroup"])
def test_setxattrat_is_refused_by_number_on_every_path(path, monkeypatch):
    if path != "default":
        monkeypatch.setattr(sandbox, "own_tmpfs", lambda: False)
        monkeypatch.setattr(sandbox.CallCgroup, "make", classmethod(lambda cls, *a: None))
    res = run_python(_SETXATTRAT)
    if res.stdout.strip() == "-1 ENOSYS":
        pytest.skip("this kernel has no setxattrat (Linux 6.13 added it)")
    assert res.stdout.strip() == "-1 EPERM", res  # 0 (or ENOSPC on an inode-capped tmpfs) were it allowed


def test_every_refused_name_resolves_or_has_a_number():
    lib = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2")
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    x86_64 = 0xC000003E
    for name in seccomp.DENY:
        assert seccomp.syscall_number(name, lib.seccomp_syscall_resolve_name, x86_64) != -1, name
    assert seccomp.syscall_number("setxattrat", lambda name: -1, x86_64) == 463
    assert seccomp.syscall_number("setxattrat", lambda name: -1, 0xC00000B7) == 463  # aarch64: the unified table


def test_a_name_the_filter_cannot_resolve_fails_the_build_loudly(monkeypatch):
    with pytest.raises(seccomp.SeccompError, match="cannot refuse 'no_such_call'"):
        seccomp.syscall_number("no_such_call", lambda name: -1, 0xC000003E)
    with pytest.raises(seccomp.SeccompError, match="architecture 0x40000008"):  # mips: numbers differ there
        seccomp.syscall_number("setxattrat", lambda name: -1, 0x40000008)
    monkeypatch.setattr(seccomp, "DENY", (*seccomp.DENY, "no_such_call"))
    seccomp.program.cache_clear()
    try:
        with pytest.raises(seccomp.SeccompError, match="no_such_call"):
            seccomp.program()
    finally:
        seccomp.program.cache_clear()
