"""The Ray cluster verl's main_ppo starts from examples/verl/run_trace_qwen3.sh listens on 127.0.0.1 only (issue 50,
item 7). verl passes `ray_kwargs.ray_init` to `ray.init` whole (verl/trainer/main_ppo.py, run_ppo), so the test
reads the script's ray_init overrides and its environment, and starts Ray with exactly those (no verl needed;
skipped without Ray). Without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, Ray replaces a node address of 127.0.0.1 by the
machine's network address (ray._private.services.resolve_ip_for_localhost), so both are checked."""

import json
import os
import subprocess
import sys

import pytest
from verl_launch import SCRIPT, launch_overrides

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def ray_init_kwargs() -> dict:
    """`ray_kwargs.ray_init.*` of the script's overrides, typed as Hydra types them (True/False, numbers)."""
    out = {}
    for item in launch_overrides(num_cpus="2"):
        key, _, value = item.lstrip("+").partition("=")
        if key.startswith("ray_kwargs.ray_init."):
            out[key.removeprefix("ray_kwargs.ray_init.")] = {"True": True, "False": False}.get(value, value)
    out["num_cpus"] = int(out["num_cpus"])
    return out


def script_environment() -> dict:
    """What the script exports for Ray, as bash sets it (an empty environment: the script's default)."""
    lines = [ln for ln in SCRIPT.read_text().splitlines() if ln.startswith(f"export {LOOPBACK_ENV}=")]
    assert len(lines) == 1, "the script exports the loopback switch once"
    body = SCRIPT.read_text()
    assert body.index(lines[0]) < body.index("python -m verl.trainer.main_ppo"), "exported before verl starts Ray"
    out = subprocess.run(["bash", "-c", f'{lines[0]}\necho "${LOOPBACK_ENV}"'], capture_output=True, text=True, env={})
    return {LOOPBACK_ENV: out.stdout.strip()}


def test_the_script_asks_ray_for_loopback_and_no_dashboard():
    kwargs = ray_init_kwargs()
    assert kwargs["_node_ip_address"] == "127.0.0.1" and kwargs["include_dashboard"] is False
    assert script_environment() == {LOOPBACK_ENV: "0"}


def test_ray_started_as_the_script_starts_it_listens_on_loopback():
    pytest.importorskip("ray")
    code = (
        "import json, sys, ray\n"
        "ray.init(**json.loads(sys.argv[1]), log_to_driver=False)\n"
        "print(ray.nodes()[0]['NodeManagerAddress'], ray.get_runtime_context().gcs_address)\n"
        "ray.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(script_environment())
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(ray_init_kwargs())],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    node, gcs = proc.stdout.split()[-2:]
    assert node == "127.0.0.1" and gcs.startswith("127.0.0.1:")
