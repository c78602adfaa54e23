"""The launch chain of a strict sandbox call (`envs.sandbox`), where util-linux's unshare and setpriv are installed
and user namespaces nest (`sandbox.own_tmpfs()`); elsewhere bwrap runs directly, under `envs.sandbox_warden`.

setpriv sets the parent-death signal, so the chain's top dies with the caller; unshare makes a user and mount
namespace of its own (root inside, mapped to the caller) and a PID namespace, and forks the rest into it with a
parent-death signal of its own (--kill-child); the rest is the namespace's init (a shell, then bwrap by exec), and
when the init of a PID namespace dies the kernel kills every process in it, nested namespaces included: so bwrap's
child, still setting up the sandbox before its own --die-with-parent (the window a killed caller used to leave
open), and the snippet go with it, whoever dies first. The shell then checks, from the host's /proc, that its
parent's parent is still the caller (a caller or unshare gone before the signals were set would otherwise leave
the chain running), writes its host pid on the info pipe (the caller ends the call by killing it), mounts /tmp's
tmpfs with a size and an inode limit (bwrap can set the former only) and execs bwrap.
"""

from __future__ import annotations

import os
import shutil

__all__ = ["LAUNCHER_FAILED", "LAUNCH_SH", "launch"]

LAUNCH_SH = (
    'f() { set -- ${1##*) }; r=$2; }; read -r s < /proc/self/stat || exit 97; me=${s%% *}; f "$s"; '
    'read -r s < "/proc/$r/stat" || exit 97; f "$s"; [ "$r" = "$1" ] || exit 97; '
    'echo "$me" >&"$2" || exit 97; eval "exec $2>&-"; '
    'mount -t tmpfs -o "$3" tmpfs "$4" || exit 97; shift 4; exec "$@"'
)
LAUNCHER_FAILED = 97  # the chain's own exit status: the caller was gone, or the tmpfs could not be mounted


def launch(cmd: list[str], own_tmp: str, info_fd: int, tmpfs_mb: int, tmpfs_inodes: int) -> list[str]:
    """`cmd` (bwrap's) started by the chain, with a tmpfs of `tmpfs_mb` MiB and `tmpfs_inodes` inodes on
    `own_tmp`; the chain's shell writes its host pid on `info_fd`."""
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    options = f"size={tmpfs_mb}m,nr_inodes={tmpfs_inodes},mode=0755,nosuid,nodev"
    return [
        *(setpriv, "--pdeathsig", "KILL", "--"),
        *(unshare, "--user", "--map-root-user", "--mount", "--pid", "--fork", "--kill-child=SIGKILL", "--"),
        *("/bin/sh", "-c", LAUNCH_SH, "sh", str(os.getpid()), str(info_fd), options, own_tmp),
        *cmd,
    ]
