"""verl's own `main_ppo` with the trace plugin, as far as a machine without a GPU lets it go (skipped unless verl
0.9.1 is installed; runs in .venv-verl).

The launch script's overrides, scaled to the project's tiny random Llama and a two-row parquet, go through
main_ppo in a subprocess: verl's config validation, `ray.init` (a local cluster on 127.0.0.1, no dashboard),
TransferQueue, the trainer `trace` resolved through the plugin inside the Ray task runner, verl's tokenizer and
dataloader on our files; then verl's resource-pool check stops it because there is no GPU. The test asserts
that exact stop, so any earlier failure (an override verl rejects, the plugin not found in a Ray process, the
data or tokenizer not loading) fails it.
"""

import os
import subprocess
import sys

import pytest

verl = pytest.importorskip("verl")
if verl.__version__ != "0.9.1":
    pytest.skip(f"written against verl 0.9.1, found {verl.__version__}", allow_module_level=True)

import pandas as pd  # noqa: E402
from verl_launch import SCRIPT, launch_overrides, with_overrides  # noqa: E402

from trace_rl.lm.models import create_tiny_model  # noqa: E402

GPU_STOP = "Total available GPUs 0 is less than total desired GPUs 1"


def test_main_ppo_with_the_plugin_runs_up_to_verls_gpu_check(tmp_path):
    model, tok = create_tiny_model(seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    rows = [
        {
            "prompt": [{"role": "user", "content": f"What is {a} + {b}? Answer in \\boxed{{}}."}],
            "data_source": "inline",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"index": i},
        }
        for i, (a, b) in enumerate([(2, 3), (4, 5)])
    ]
    pd.DataFrame(rows).to_parquet(tmp_path / "train.parquet")
    pd.DataFrame(rows).to_parquet(tmp_path / "val.parquet")
    overrides = launch_overrides(
        train=str(tmp_path / "train.parquet"),
        val=str(tmp_path / "val.parquet"),
        model=str(tmp_path / "tiny"),
        here=str(SCRIPT.parent),
    )
    overrides = with_overrides(
        overrides,
        **{
            "data.train_batch_size": "2",
            "data.max_prompt_length": "256",
            "data.max_response_length": "64",
            "actor_rollout_ref.actor.ppo_mini_batch_size": "2",
            "actor_rollout_ref.rollout.n": "2",
            "+trace_rl.budget.max_per_prompt": "4",
            "trainer.n_gpus_per_node": "1",
            "trainer.logger": "[console]",
            "trainer.default_local_dir": str(tmp_path / "ckpt"),
        },
    )
    # the script's own Ray settings (node on 127.0.0.1, no dashboard: test_verl_ray_loopback.py), and its export
    assert "+ray_kwargs.ray_init._node_ip_address=127.0.0.1" in overrides
    env = {**os.environ, "TRACE_SANDBOX": "weak", "RAY_DEDUP_LOGS": "0", "HF_HUB_OFFLINE": "1"}
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    proc = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", *overrides],
        capture_output=True,
        text=True,
        timeout=420,
        env=env,
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, "main_ppo cannot finish without a GPU"
    assert GPU_STOP in out, out[-4000:]
