"""What the environments contain, replayed from outside (the figures of lab/notes/2026-12-02-env-containment.md):
kernel-memory floods in the strict sandbox with and without a memory cgroup (the machine's Slab and MemAvailable
sampled while they run), the POSIX timers and AIO contexts one call takes, callers killed at random moments
(sandbox processes left running, counted by process tree), the strict sandbox's per-call time, BFCL steps of
5,000 touch() calls as the episode's state grows, and a retriever server under slow-body connections.
Run: PYTHONPATH=src python bench/bench_containment.py [sandbox|callers|early|bfcl|server ...] (early: callers killed
0-10 and 0-40 ms into a call on the direct path, bwrap's first milliseconds); to measure old code's callers
with this counter, set BENCH_CALLER_SRC to the old checkout's src (`callers` alone)."""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time


def meminfo() -> dict[str, int]:
    """/proc/meminfo in MiB."""
    with open("/proc/meminfo") as fh:
        return {k: int(v.split()[0]) >> 10 for k, v in (line.split(":", 1) for line in fh)}


FLOODS = {
    "xattrs (8 x 64 KB per file)": "p = 'f%d' % n; open(p, 'w').close()\n"
    "    for k in range(8): os.setxattr(p, 'user.k%d' % k, b'v' * 65000)",
    "xattrs by setxattrat (463)": "p = b'f%d' % n; open(p, 'w').close(); v = ctypes.create_string_buffer(65000)\n"
    "    a = (ctypes.c_uint64 * 2)(ctypes.addressof(v), 65000)\n"
    "    for k in range(8):\n"
    "      if libc.syscall(463, -100, p, 0, b'user.k%d' % k, a, ctypes.c_size_t(16)):\n"
    "        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))",
    "empty files, 200-char names": "open('x' * 200 + str(n), 'w').close()",
    "folders, 200-char names": "os.mkdir('x' * 200 + str(n))",
}
COUNTS = (  # what one call takes from counts the host shares: POSIX timers and AIO contexts
    "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nev = (ctypes.c_int * 16)(0, 0, 0, 1)\n"
    "t = 0\nwhile t < 200000 and libc.syscall(222, 1, ev, ctypes.byref(ctypes.c_int())) == 0: t += 1\n"
    "a = 0\nwhile a < 70000 and libc.syscall(206, 1, ctypes.byref(ctypes.c_ulong(0))) == 0: a += 1\n"
    "print(t, 'timers,', a, 'AIO contexts')"
)
CALLER = (
    "import sys; from trace_rl.envs import sandbox\nfrom trace_rl.envs.sandbox_host import sweep_stale\n"
    "if sys.argv[1] == 'direct': sandbox.own_tmpfs = lambda: False\n"
    "sandbox.require('strict'); sweep_stale(); print('go', flush=True)\n"
    "sandbox.run_python('import time; time.sleep(600)', 600)\n"
)


def flood(label: str, body: str) -> str:
    from trace_rl.envs.sandbox import run_python

    code = "import ctypes, os, time\nlibc = ctypes.CDLL(None, use_errno=True)\nn = 0; t = time.time()\ntry:\n"
    code += f"  while time.time() - t < 4:\n    {body}\n    n += 1\n"
    code += "except OSError as e: print(n, 'made, then', e.strerror)\nelse: print(n, 'made')"
    base, low, done = meminfo(), {}, threading.Event()
    low.update(slab=base["Slab"], avail=base["MemAvailable"])

    def watch() -> None:
        while not done.is_set():
            m = meminfo()
            low.update(slab=max(low["slab"], m["Slab"]), avail=min(low["avail"], m["MemAvailable"]))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    res = run_python(code, timeout_s=5)
    done.set()
    watcher.join()
    return (
        f"{label}: {res.observation()[:60]!r}; Slab +{low['slab'] - base['Slab']} MiB, "
        f"MemAvailable -{base['MemAvailable'] - low['avail']} MiB (machine-wide, other jobs included)"
    )


def killed_callers(path: str, trials: int = 40, max_delay_s: float = 0.12) -> str:
    """Callers SIGKILLed 0 to `max_delay_s` into a call (after their warm-up); what each left 0.5 s and 5 s on,
    counted by process tree (`stranded_processes`: sandbox processes handed to init, and everything below them),
    then ended."""
    from trace_rl.envs.sandbox_host import stranded_processes

    env = {**os.environ, "PYTHONPATH": os.environ.get("BENCH_CALLER_SRC", os.pathsep.join(sys.path))}
    rng, hits, passing = random.Random(0), [], []
    for _ in range(trials):
        with open("/proc/uptime") as fh:
            start = int(float(fh.read().split()[0]) * os.sysconf("SC_CLK_TCK"))
        proc = subprocess.Popen([sys.executable, "-c", CALLER, path], stdout=subprocess.PIPE, env=env)
        proc.stdout.readline()
        delay = rng.uniform(0, max_delay_s)
        time.sleep(delay)
        proc.kill()
        proc.wait()
        proc.stdout.close()
        time.sleep(0.5)
        if stranded_processes(start):
            passing.append(round(1000 * delay))
        deadline = time.monotonic() + 5  # a process still starting (on a loaded machine) may end on its own
        while (left := stranded_processes(start)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if left:
            hits.append(round(1000 * delay))
        for pid in left:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
    return (
        f"{path}: {len(hits)} of {trials} killed callers left processes 5 s on (killed at {sorted(hits)} ms); "
        f"{len(passing)} had some 0.5 s on (at {sorted(passing)} ms)"
    )


def bench_early() -> None:
    """Callers killed in bwrap's first milliseconds on the direct path, where bwrap's own --die-with-parent comes
    too late for its child (the window the warden, `envs.sandbox_warden`, closes)."""
    for most in (0.01, 0.04):
        print(f"callers SIGKILLed 0-{most * 1000:.0f} ms into a call,", killed_callers("direct", 30, most))


def bench_sandbox() -> None:
    from trace_rl.envs import sandbox, sandbox_cgroup
    from trace_rl.envs.sandbox import run_python, strict_unavailable

    why = strict_unavailable()
    if why:
        print(f"strict sandbox unavailable: {why}")
        return
    cgroup_root, chain_here, make = sandbox_cgroup.memory_cgroup_root(), sandbox.own_tmpfs(), sandbox.CallCgroup.make
    for where in ("default", "fallback"):
        if where == "fallback":  # no cgroup, no util-linux launch chain: bwrap run directly, as docs/ describe
            sandbox.CallCgroup.make = lambda *a: None
            sandbox.own_tmpfs = lambda: False
        how = "memory cgroup" if cgroup_root and where == "default" else "no memory cgroup"
        chain = "launch chain" if where == "default" and sandbox.own_tmpfs() else "bwrap run directly"
        print(f"-- {where} ({how}, {chain})")
        for label, body in FLOODS.items():
            print(flood(label, body))
        print("shared counts:", run_python(COUNTS, timeout_s=20).observation())
    sandbox.CallCgroup.make, sandbox.own_tmpfs = make, lambda: chain_here
    bench_callers()


def bench_callers() -> None:
    from trace_rl.envs import sandbox
    from trace_rl.envs.sandbox import run_python

    for path in ("chain", "direct") if sandbox.own_tmpfs() else ("direct",):
        print("callers SIGKILLed 0-120 ms into a call,", killed_callers(path))
    times = []
    for i in range(30):
        start = time.perf_counter()
        run_python(f"print({i})")
        times.append(time.perf_counter() - start)
    print(f"strict per call: median {1000 * statistics.median(times):.1f} ms over 30 trivial snippets")


def bench_bfcl() -> None:
    from trace_rl.envs.bfcl_env import BFCLEnv, load_bfcl

    env = BFCLEnv(steps_per_turn=100)
    env.reset(load_bfcl("multi_turn_base", limit=1)[0])
    out = []
    for step in range(8):
        calls = ", ".join(f"touch(file_name='s{step}_{i:05d}')" for i in range(5000))
        start = time.perf_counter()
        obs = env.step(f"Action: call[{calls}]")[0]
        out.append(f"{time.perf_counter() - start:.2f}{'*' if 'state' in obs else ''}")
    print("BFCL steps of 5,000 touch() calls, seconds each (* refused by the state cap):", " ".join(out))


def bench_server() -> None:
    from trace_rl.envs.retrieval import BM25Retriever, Passage
    from trace_rl.envs.retrieval_server import serve

    passages = [Passage(str(i), f"River {i}", f"River {i} flows through town {i}.") for i in range(20)]
    srv = serve(BM25Retriever(passages), "127.0.0.1", 0)
    host, port = srv.server_address
    head = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 30\r\n\r\n"

    def slow(source: str) -> socket.socket:
        sock = socket.create_connection((host, port), timeout=5, source_address=(source, 0))
        sock.sendall(head + b'{"q')  # then nothing: a body that never completes
        return sock

    def client(source: str) -> int | str:
        try:
            conn = http.client.HTTPConnection(host, port, timeout=5, source_address=(source, 0))
            conn.request("POST", "/retrieve", json.dumps({"queries": ["river"]}), {"Content-Type": "application/json"})
            status = conn.getresponse().status
            conn.close()
            return status
        except OSError as err:
            return type(err).__name__

    for sources, new in ((("127.0.0.2", "127.0.0.3", "127.0.0.4"), "127.0.0.5"), (("127.0.0.1",) * 2, "127.0.0.1")):
        socks = [slow(src) for src in sources for _ in range(100)]
        time.sleep(1)
        got = [client(new) for _ in range(30)]
        print(
            f"{len(socks)} slow bodies from {sorted(set(sources))}; 30 requests from {new}:",
            {k: got.count(k) for k in sorted(set(got), key=str)},
        )
        for sock in socks:
            sock.close()
        time.sleep(1)
    srv.shutdown()


if __name__ == "__main__":
    parts = sys.argv[1:] or ["sandbox", "bfcl", "server"]
    for part in parts:
        parts = {"sandbox": bench_sandbox, "callers": bench_callers, "early": bench_early, "bfcl": bench_bfcl}
        {**parts, "server": bench_server}[part]()
