"""Run model-written Python in a separate process, contained by the kernel (`strict`, the default) or, where
namespaces are unavailable and the user opts in by name, by an audit hook inside the child (`weak`).

strict (bubblewrap + a seccomp filter built with libseccomp, `envs.seccomp`) covers, for every call:
- processes: a new PID namespace whose pid 1 is the snippet itself (no host process is visible, so none can
  be signalled or traced; killing it ends the namespace), a new session, and nothing left behind by a caller
  killed at any instant: the launch chain (`envs.sandbox_chain`) runs bwrap as the init of a PID namespace of
  its own whose life hangs on the caller's by parent-death signals set before bwrap starts and checked against the
  caller's pid, and the kernel kills everything in a PID namespace whose init dies (bwrap's half-made sandbox
  included, which its own --die-with-parent covers only once set up); the snippet's watcher thread exits when
  the caller's pipe closes, on every path; and the next process's first call ends any sandbox process a dead
  caller stranded (found by process tree, `sandbox_host.stranded_processes`). The seccomp filter refuses
  every way to a second process (fork, vfork, clone without CLONE_THREAD, clone3), so the snippet stays the
  only one; threads work and are bounded by
  RLIMIT_NPROC (NPROC) when the caller is not root, and by a per-call pids cgroup when the caller is root and
  the host delegates one (`envs.sandbox_cgroup`);
- memory: RLIMIT_AS, plus the seccomp filter refusing what RLIMIT_AS does not count (SysV shared memory,
  message queues and semaphores, POSIX message queues, memfd files) and kernel objects no limit counts
  (extended attributes, inotify and fanotify), a new IPC namespace per call, an inode limit on /tmp
  (TMPFS_INODES: files and folders are kernel memory its byte size misses), and where the host delegates
  one, a per-call memory cgroup of RLIMIT_AS + TMPFS_MB + KERNEL_MB that counts kernel memory too;
- network: a new network namespace with loopback only, and socket()/socketpair() refused for every family
  but AF_UNIX: no connection and no DNS lookup leaves the sandbox;
- files: a new mount namespace holding only an allow-list, read-only: /usr and the /lib, /bin links, the
  dynamic loader's files from /etc, the interpreter's prefixes (venv and base) with every site-packages
  folder replaced by one that holds only TOOL_PACKAGES (numpy, sympy, mpmath and numpy's bundled libraries),
  a minimal /dev, the root and /dev remounted read-only, no /proc and no /sys at all, and a tmpfs capped in
  bytes and inodes at /tmp as the only writable place and working directory; so /etc/shadow, /root's
  contents, the trainer's packages and the rest of the host's files are absent, not merely refused.
  Visible, read-only: /usr (system Python packages under /usr/lib/python3 included when the interpreter is
  not the system one, since /usr is bound whole), the standard library, the interpreter's bin/include/share
  folders, pyvenv.cfg;
- identity and secrets: uid/gid 65534 inside a new user namespace, no capabilities, no_new_privs, an
  environment of a few fixed variables, and no /proc to read another process's environment from;
- limits: RLIMIT_AS (memory), RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_NPROC, RLIMIT_SIGPENDING (queued
  signals and POSIX timers, counted in the call's own user namespace), no core files, set before the snippet
  runs; AIO contexts refused (seccomp); a wall-clock limit enforced from outside by killing the sandbox;
- the host: stdout and stderr are read as they come and the host keeps at most 4 * `max_output` bytes of
  stdout's head and of stderr's head and tail (the rest is read and dropped), so 1 GiB of output costs the
  host no memory and an error after a flood of output still ends with its exception line; temp dirs a killed
  caller left behind are swept by the next process's first call.
Not covered: a kernel bug reachable through the syscalls that remain allowed (a VM or gVisor is the answer
to that); the wall-clock time and CPU the snippet may use up to its limits; host memory outside RLIMIT_AS
that stays small and capped: tmpfs pages (up to TMPFS_MB) and inodes (TMPFS_INODES), pipe and socket
buffers (NOFILE descriptors), kernel memory per thread, negative dentries (reclaimable) from lookups of
missing names; reads of the allow-listed files. Where util-linux's unshare and setpriv are missing or user
namespaces do not nest (`own_tmpfs()` False), bwrap runs directly under a warden process
(`envs.sandbox_warden`): bwrap caps its /tmp in bytes only, so the warden reads the snippet's /tmp from outside
every 5 ms and stops the snippet past TMPFS_INODES files and folders (a cap checked, not refused: it may overshoot
by one poll's worth, a few hundred empty files here, where 343,548 took 425 MiB of slab in 4 s without it); its
parent-death signal is set before bwrap starts and, as a child subreaper, it ends bwrap's half-made sandbox when
a caller dies in bwrap's first milliseconds (bwrap's own --die-with-parent comes too late for that).
When the caller is root, the uid inside maps to root outside: files of the allow-list that only root may read
are readable, and without a delegated pids cgroup the number of threads is bounded only by RLIMIT_AS (their
stacks) and the wall clock; /proc and /sys are left out because root-owned entries there (sysctls) would be
writable.

weak (`sandbox="weak"`, warns once per process) runs the child with the same rlimits, wall clock and
incremental output cap, and a PEP 578 audit hook that refuses writes outside a temporary directory, process
creation, sockets and foreign C libraries. Pure Python can defeat the hook (gc can reach its tables), ctypes
reaches libc, and the child sees the host's processes and files: a guard for careless code, not a jail.
"""

from __future__ import annotations

import functools
import json
import os
import selectors
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
import warnings

from . import sandbox_warden, seccomp
from .sandbox_cgroup import CallCgroup
from .sandbox_chain import launch
from .sandbox_host import (
    ENV,
    FSIZE_MB,
    NOFILE,
    TMP_PREFIX,
    SandboxResult,
    finish,
    signal_meaning,
    sweep_stale,
    write_code,
)

__all__ = [
    "MODES",
    "SandboxResult",
    "SandboxUnavailable",
    "check_mode",
    "own_tmpfs",
    "require",
    "run_python",
    "signal_meaning",
    "strict_unavailable",
]

MODES = ("strict", "weak")
TMPFS_MB = 64  # the only writable place inside; its pages are host memory
TMPFS_INODES = 4096  # files and folders in it: each costs the host about 1 KiB of kernel memory the size misses
KERNEL_MB = 64  # a memory cgroup's room beyond RLIMIT_AS and the tmpfs: page tables, pipes, slab
NPROC = 64
SIGPENDING = 64  # queued signals and POSIX timers (RLIMIT_SIGPENDING); Python itself needs none
# What a math snippet may import beyond the standard library; every other installed package stays invisible.
TOOL_PACKAGES = ("numpy", "sympy", "mpmath")
UID = 65534  # nobody
CODE_PATH = "/code/main.py"


class SandboxUnavailable(RuntimeError):
    """The strict sandbox cannot run here; the message says why and how to opt into the weak mode."""


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"sandbox must be one of {', '.join(map(repr, MODES))}; got {mode!r}")
    return mode


# -- strict: the bubblewrap command -------------------------------------------------------------------------------
def _python_dirs() -> list[str]:
    """The interpreter's prefixes (venv and base), as given and resolved, minus those already under /usr."""
    dirs = set()
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable)):
        dirs.update({os.path.abspath(p), os.path.realpath(p)})
    out: list[str] = []
    for d in sorted(dirs, key=len):
        if d in ("/", "") or not os.path.isdir(d):
            continue
        if any(d == o or d.startswith(o.rstrip("/") + "/") for o in ["/usr", *out]):
            continue
        out.append(d)
    return out


def _site_dirs() -> list[str]:
    """The interpreter's site-packages folders (venv, base and distribution ones) that exist here."""
    base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})
    dirs = [*site.getsitepackages(), base["purelib"], base["platlib"]]
    dirs += [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    out: list[str] = []
    for d in dirs:
        d = os.path.realpath(d)
        if os.path.isdir(d) and d not in out:
            out.append(d)
    return out


def _tool_package_paths(site_dir: str) -> list[str]:
    """The folders of TOOL_PACKAGES (and their bundled shared libraries, `numpy.libs`) inside `site_dir`."""
    names = [n for pkg in TOOL_PACKAGES for n in (pkg, f"{pkg}.libs")]
    return [os.path.join(site_dir, n) for n in names if os.path.isdir(os.path.join(site_dir, n))]


@functools.cache
def _bwrap_base() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """bwrap's arguments before the call's /tmp and after it (the call's /tmp goes between: see below)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed")
    head = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--uid",
        str(UID),
        "--gid",
        str(UID),
        "--hostname",
        "sandbox",
        "--die-with-parent",
        "--as-pid-1",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--clearenv",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):  # merged /usr: keep the link
            head += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            head += ["--ro-bind", top, top]
    for etc in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime"):
        head += ["--ro-bind-try", etc, etc]
    head += ["--dev", "/dev"]
    # the call's /tmp comes first: a mount made later covers what lies under it, and the interpreter may live
    # under /tmp (a venv in a temporary checkout), which must stay visible, read-only, inside the writable /tmp
    tail: list[str] = []
    for d in _python_dirs():
        tail += ["--ro-bind", d, d]
    # every site-packages folder is replaced by an empty tmpfs holding only the tool's packages, then made
    # read-only: the snippet imports numpy/sympy/mpmath, not the trainer's stack (torch, transformers, this
    # project's own source through its editable install)
    for site_dir in _site_dirs():
        tail += ["--tmpfs", site_dir]
        for path in _tool_package_paths(site_dir):
            tail += ["--ro-bind", path, path]
        tail += ["--remount-ro", site_dir]
    tail += ["--chdir", "/tmp"]
    for key, value in ENV.items():
        tail += ["--setenv", key, value]
    return tuple(head), tuple(tail)


# Runs inside before the snippet: the limits first, then a watcher thread, then the snippet as __main__. The
# snippet cannot undo a hard rlimit (raising one needs CAP_SYS_RESOURCE in the initial user namespace).
# RLIMIT_SIGPENDING bounds queued signals and POSIX timers (the kernel charges each timer to it, whatever its
# notification) in the call's own user namespace; without it one call took 96,367 timers from a count the
# host's processes share. The watcher blocks on a pipe whose only write end the caller holds: the caller's
# death, at any instant, ends the snippet even where nothing else would (bwrap run directly, its
# --die-with-parent set too late); it exits rather than signals, as the snippet is its namespace's init.
_PROLOGUE = textwrap.dedent(
    """
    # trace-rl sandbox prologue
    import resource as _r, runpy as _p, sys as _s, os as _o, _thread as _t
    _m, _c, _f = int(_s.argv[1]), int(_s.argv[2]), int(_s.argv[3])
    for _k, _v in ((_r.RLIMIT_AS, _m), (_r.RLIMIT_CPU, _c), (_r.RLIMIT_FSIZE, %d), (_r.RLIMIT_NOFILE, %d),
                   (_r.RLIMIT_NPROC, %d), (_r.RLIMIT_SIGPENDING, %d), (_r.RLIMIT_CORE, 0)):
        _r.setrlimit(_k, (_v, _v + 1) if _k == _r.RLIMIT_CPU else (_v, _v))
    def _watch(fd, read=_o.read, end=_o._exit):
        try:
            read(fd, 1)
        finally:
            end(137)
    _t.stack_size(1 << 18)
    _t.start_new_thread(_watch, (_f,))
    _t.stack_size(0)
    _s.argv = ["main.py"]
    del _r, _m, _c, _f, _k, _v, _o, _t, _watch
    _p.run_path("%s", run_name="__main__")
    """
) % (FSIZE_MB << 20, NOFILE, NPROC, SIGPENDING, CODE_PATH)


def _strict_command(
    code_file: str, fds: tuple[int, int | None, int], timeout_s: float, memory_mb: int, own_tmp: str | None
) -> list[str]:
    """bwrap's command; `fds` are the seccomp program's, bwrap's --info-fd (None: not asked for) and the
    caller's alive pipe's read end; /tmp is `own_tmp` (a tmpfs the launch chain mounts there, `envs.sandbox_chain`) or,
    without one, bwrap's own tmpfs (size-capped, but with the kernel's default inode limit: half the machine's
    pages)."""
    seccomp_fd, info_fd, alive_fd = fds
    head, tail = _bwrap_base()
    tmp = ["--bind", own_tmp, "/tmp"] if own_tmp else ["--size", str(TMPFS_MB << 20), "--tmpfs", "/tmp"]
    info = ["--info-fd", str(info_fd)] if info_fd is not None else []
    # the root and /dev are tmpfs mounts bwrap makes; read-only once everything is mounted on them
    return [
        *head,
        *tmp,
        *tail,
        *info,
        "--ro-bind",
        code_file,
        CODE_PATH,
        "--remount-ro",
        "/dev",
        "--remount-ro",
        "/",
        "--seccomp",
        str(seccomp_fd),
        "--",
        sys.executable,
        "-I",
        "-B",
        "-X",
        "utf8",
        "-c",
        _PROLOGUE,
        str(memory_mb << 20),
        str(int(timeout_s) + 1),
        str(alive_fd),
        os.path.basename(os.path.dirname(code_file)),  # the call's mark (TMP_PREFIX + the caller's pid): unread
    ]


@functools.cache
def own_tmpfs() -> bool:
    """Whether calls run through the launch chain (`envs.sandbox_chain`: a kernel-capped /tmp, inodes included,
    and a PID namespace that dies with the caller); else bwrap runs directly under the warden
    (`envs.sandbox_warden`: /tmp's inodes checked from outside, bwrap's half-made sandbox ended when the caller
    dies). Checked once per process by a trial run."""
    if not (shutil.which("unshare") and shutil.which("setpriv")):
        return False
    return _run_strict("print('ok')", 20.0, 256, 400, own=True).stdout.strip() == "ok"


@functools.cache
def strict_unavailable() -> str | None:
    """Why the strict sandbox cannot run here, or None when it can (checked once per process by a trial run)."""
    if not sys.platform.startswith("linux"):
        return "it needs Linux namespaces"
    try:
        _bwrap_base()
        seccomp.program()
    except SandboxUnavailable as err:
        return str(err)
    except (OSError, AttributeError) as err:
        return f"libseccomp is not usable ({err})"
    if own_tmpfs():
        return None
    res = _run_strict("print('ok')", 20.0, 256, 400, own=False)
    if res.stdout.strip() != "ok":
        why = (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]
        return f"bwrap could not set up the namespaces ({why})"
    return None


_warned_weak = False


def require(mode: str) -> str:
    """Validate `mode`; raise SandboxUnavailable for strict where it cannot run; warn once for weak."""
    global _warned_weak
    check_mode(mode)
    if mode == "strict":
        why = strict_unavailable()
        if why is not None:
            raise SandboxUnavailable(
                f"the strict sandbox cannot run here: {why}. Install bubblewrap and libseccomp (scripts/install.sh "
                "does where apt is available), or opt into the weaker in-process mode with sandbox='weak'"
            )
    elif not _warned_weak:
        _warned_weak = True
        warnings.warn(
            "sandbox='weak': model code runs under an audit hook only, which hostile code can defeat; "
            "see trace_rl.envs.sandbox",
            RuntimeWarning,
            stacklevel=3,
        )
    return mode


# -- running and reading ------------------------------------------------------------------------------------------
def _read_child_pid(info_fd: int, deadline: float) -> int | None:
    """The host pid whose death ends the call: the launch chain's shell writes its own (then execs bwrap as
    its PID namespace's init); bwrap run directly writes its child's, the snippet's, in --info-fd JSON right
    after making the namespaces."""
    data = b""
    with selectors.DefaultSelector() as sel:
        sel.register(info_fd, selectors.EVENT_READ)
        while sel.select(max(0.0, deadline - time.monotonic())):
            chunk = os.read(info_fd, 4096)
            data += chunk
            if not chunk or b"}" in data or (not data.startswith(b"{") and b"\n" in data):
                break
    try:
        return int(json.loads(data)["child-pid"]) if data.startswith(b"{") else int(data.split(b"\n")[0])
    except (ValueError, KeyError, TypeError):
        return None


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _spawn(cmd: list[str], work: str, fds: tuple[int, ...], cgroup: CallCgroup | None) -> subprocess.Popen:
    try:
        return subprocess.Popen(
            cmd,
            env=dict(ENV),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=fds,
            cwd=work,
        )
    except BaseException:
        if cgroup is not None:
            cgroup.remove()
        raise


def _run_strict(code: str, timeout_s: float, memory_mb: int, max_output: int, own: bool | None = None) -> SandboxResult:
    program = seccomp.program()
    own = own_tmpfs() if own is None else own
    with tempfile.TemporaryDirectory(prefix=f"{TMP_PREFIX}{os.getpid()}-") as work:
        os.chmod(work, 0o755)
        script = write_code(work, code)
        own_tmp = os.path.join(work, "tmp") if own else None
        if own_tmp:
            os.mkdir(own_tmp)  # the mount point; the tmpfs on it lives in the chain's mount namespace only
        seccomp_r, seccomp_w = os.pipe()
        info_r, info_w = os.pipe()
        # the caller's death closes alive_w, its only copy (pipes are close-on-exec, and Popen passes only
        # pass_fds): the snippet's watcher sees the end of the pipe and exits (see _PROLOGUE)
        alive_r, alive_w = os.pipe()
        try:
            os.write(seccomp_w, program)  # a few hundred bytes: fits the pipe buffer, so no reader is needed yet
            os.close(seccomp_w)
            fds = (seccomp_r, None if own_tmp else info_w, alive_r)
            cmd = _strict_command(script, fds, timeout_s, memory_mb, own_tmp)
            # the chain mounts an inode-capped /tmp and ties bwrap to the caller; without it, the warden does both
            cmd = (
                launch(cmd, own_tmp, info_w, TMPFS_MB, TMPFS_INODES)
                if own_tmp
                else sandbox_warden.command(cmd, TMPFS_INODES)
            )
            # what the call may hold in all: its address space, its tmpfs, and what the kernel keeps for it
            cgroup = CallCgroup.make(NPROC, (memory_mb + TMPFS_MB + KERNEL_MB) << 20)
            if cgroup is not None:
                cmd = cgroup.wrap(cmd)
            start = time.monotonic()
            proc = _spawn(cmd, work, (seccomp_r, info_w, alive_r), cgroup)
        except BaseException:
            os.close(alive_w)
            raise
        finally:
            for fd in (seccomp_r, info_w, alive_r):
                os.close(fd)
        try:
            child = _read_child_pid(info_r, start + timeout_s)
            pidfd = os.pidfd_open(child) if child is not None and hasattr(os, "pidfd_open") else None
            if pidfd is not None and own_tmp and _parent_of(child) != proc.pid:  # not the chain's: leave it be
                os.close(pidfd)
                child = pidfd = None
        except OSError:  # the child has already gone
            child = pidfd = None
        finally:
            os.close(info_r)

        def kill() -> None:
            # Through the launch chain, `child` is its PID namespace's init (bwrap): killing it makes the kernel
            # kill everything in the namespace, and unshare reaps it. Without the chain, `child` is the snippet,
            # pid 1 of bwrap's namespace: killing it ends the namespace, bwrap reaps it and the warden then ends.
            # Killing bwrap or unshare first would leave a zombie for the host's init to reap (or not).
            try:
                if proc.poll() is None and pidfd is not None:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                elif proc.poll() is None and child is not None and not own_tmp:
                    os.kill(child, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()  # the parent-death signals take the rest down with it

        try:
            return finish(proc, start + timeout_s, max_output, kill)
        finally:
            os.close(alive_w)
            if pidfd is not None:
                os.close(pidfd)
            if cgroup is not None:
                cgroup.remove()


def run_python(
    code: str, timeout_s: float = 5.0, memory_mb: int = 1024, max_output: int = 2000, mode: str = "strict"
) -> SandboxResult:
    """Run `code` contained as the module docstring says; never raises for anything the code does.

    Raises ValueError for an unknown `mode` and SandboxUnavailable when `mode="strict"` cannot run here.
    """
    require(mode)
    sweep_stale()
    if mode == "weak":
        from .sandbox_weak import run_weak

        return run_weak(code, timeout_s, memory_mb, max_output)
    return _run_strict(code, timeout_s, memory_mb, max_output)
