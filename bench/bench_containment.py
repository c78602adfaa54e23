"""What the environments contain, replayed from outside (the figures of docs/results/2026-12-02-env-containment.md):
kernel-memory floods in the strict sandbox (the machine's Slab and MemAvailable sampled while they run), callers
killed at random moments (sandbox processes left running), the strict sandbox's per-call time, BFCL steps of
5,000 touch() calls as the episode's state grows, and a retriever server under slow-body connections.
Run: PYTHONPATH=src python bench/bench_containment.py [sandbox|bfcl|server ...]; run it on old code too to compare."""

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


def sandbox_processes() -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"trace-rl-sandbox-" in fh.read():
                    out.append(int(pid))
        except OSError:
            pass
    return out


FLOODS = {
    "xattrs (8 x 64 KB per file)": "p = 'f%d' % n; open(p, 'w').close()\n"
    "    for k in range(8): os.setxattr(p, 'user.k%d' % k, b'v' * 65000)",
    "empty files, 200-char names": "open('x' * 200 + str(n), 'w').close()",
    "folders, 200-char names": "os.mkdir('x' * 200 + str(n))",
}


def bench_sandbox() -> None:
    from trace_rl.envs.sandbox import run_python, strict_unavailable

    why = strict_unavailable()
    if why:
        print(f"strict sandbox unavailable: {why}")
        return
    for label, body in FLOODS.items():
        code = f"import os, time\nn = 0; t = time.time()\ntry:\n  while time.time() - t < 4:\n    {body}; n += 1\n"
        code += "except OSError as e: print(n, 'made, then', e.strerror)\nelse: print(n, 'made')"
        base, low, done = meminfo(), {}, threading.Event()
        low.update(slab=base["Slab"], avail=base["MemAvailable"])

        def watch(low: dict = low, done: threading.Event = done) -> None:
            while not done.is_set():
                m = meminfo()
                low.update(slab=max(low["slab"], m["Slab"]), avail=min(low["avail"], m["MemAvailable"]))
                time.sleep(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        res = run_python(code, timeout_s=5)
        done.set()
        watcher.join()
        print(
            f"{label}: {res.observation()[:60]!r}; Slab +{low['slab'] - base['Slab']} MiB, "
            f"MemAvailable -{base['MemAvailable'] - low['avail']} MiB (machine-wide, other jobs included)"
        )
    caller = (
        "from trace_rl.envs.sandbox import run_python\nprint('go', flush=True)\n"
        "run_python('import time; time.sleep(600)', 600)"
    )
    before, rng = set(sandbox_processes()), random.Random(0)
    for _ in range(12):
        proc = subprocess.Popen([sys.executable, "-c", caller], stdout=subprocess.PIPE)
        proc.stdout.readline()
        time.sleep(rng.uniform(0, 0.15))
        proc.kill()
        proc.wait()
        proc.stdout.close()
    time.sleep(3)
    left = [p for p in sandbox_processes() if p not in before]
    print(f"callers SIGKILLed 0-150 ms after starting: {len(left)} of 12 left a sandbox running (killed now)")
    for pid in left:
        os.kill(pid, 9)
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
        {"sandbox": bench_sandbox, "bfcl": bench_bfcl, "server": bench_server}[part]()
