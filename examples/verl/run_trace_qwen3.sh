#!/usr/bin/env bash
# TRACE on verl 0.9.1: Qwen3 on math with a python tool (the paper's math setting), one node of 8 GPUs.
# Needs a GPU environment with verl's own stack plus the reward's grader (pip install "verl[vllm]==0.9.1"
# "math-verify>=0.7") and trace-rl with its `verl.plugins` entry point installed WITHOUT its requirements
# (pip install --no-deps -e . in this repository: a plain install lifts omegaconf past the <2.4 that verl's
# hydra-core pins; the integration reads no trace-rl config), so that `import verl` registers the trace
# trainer, the trace_tool_agent loop and the trace estimator in every process.
#   TRAIN_FILES / VAL_FILES  parquet in verl's RL format: `prompt` (chat messages), `data_source`,
#                            `reward_model.ground_truth`; the system prompt should ask for \boxed{} answers.
#                            `trace-rl verl-data out=data/verl` writes both from the
#                            project's math data (trace-rl fetch-data): data/verl/train.parquet, val.parquet
#   MODEL                    a local model folder (config.json and weights), or a hub id already in the
#                            Hugging Face cache or reachable (default Qwen/Qwen3-4B); checked before any GPU work
#   RAY_NUM_CPUS             CPUs the local Ray cluster counts (default: the machine's, at least 32). verl's
#                            TransferQueue storage actors each hold a CPU: with Ray counting the 2 CPUs of a small
#                            machine they are never scheduled and the launch waits silently for ever
#   TQ_STORAGE_UNITS         TransferQueue storage units (default 8, or 1 on a machine with fewer than 16 CPUs)
#   RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER  0 (default): the local Ray cluster verl starts registers its node on
#                            127.0.0.1 and binds its listeners there (without it Ray replaces a node address of
#                            127.0.0.1 by the machine's network address); with the dashboard off
#                            (ray_kwargs.ray_init below). For a cluster of several machines set it to 1 and drop
#                            the ray_init._node_ip_address override
#   TRACE_SANDBOX            how the python tool contains model code: strict (default; bubblewrap + seccomp,
#                            refused at start-up where it cannot run) or weak (an in-process audit hook, chosen
#                            explicitly; every step's metrics then carry trace/sandbox_weak=1)
# Budget: 64 prompts x n 8 = 512 rollouts a step. TRACE spends 256 on bare rollouts, allocated across the 64
# prompts by the predictor (0 skips a prompt), and 256 on continuations branched from allocated prefixes.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
MODEL=${MODEL:-Qwen/Qwen3-4B}
NCPU=$(nproc)
RAY_NUM_CPUS=${RAY_NUM_CPUS:-$(( NCPU < 32 ? 32 : NCPU ))}
TQ_STORAGE_UNITS=${TQ_STORAGE_UNITS:-$(( NCPU < 16 ? 1 : 8 ))}
export MODEL
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=${RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER:-0}  # read when ray is imported
export TRACE_SANDBOX=${TRACE_SANDBOX:-strict}  # exported: Ray's local workers inherit it (tool and trainer)
TRAIN_FILES=${TRAIN_FILES:?parquet of training prompts}
VAL_FILES=${VAL_FILES:?parquet of validation prompts}

# Before any GPU work, one line for each thing that would fail later inside a Ray worker: verl loads plugins
# from entry points only (in every Ray process), it loads the reward file lazily (at the first finished
# rollout), the tool's sandbox mode must be able to run here, and the model must be a local folder or a hub id
# that can load (an uncached id with HF_HUB_OFFLINE set is refused here, not in a worker).
python - <<'PY' || exit 1
import os, sys
from importlib.metadata import entry_points
def refuse(msg):
    sys.exit(f"run_trace_qwen3.sh: {msg}")
if not any(e.value == "trace_rl.integrations.verl.plugin" for e in entry_points(group="verl.plugins")):
    refuse("trace-rl is installed without its verl.plugins entry point (pip install --no-deps -e . from the repository)")
try:
    import math_verify  # noqa: F401  (examples/verl/reward.py grades with it)
except ImportError:
    refuse("the reward needs math-verify: pip install 'math-verify>=0.7'")
from trace_rl.envs.sandbox import SandboxUnavailable, require
try:
    require(os.environ["TRACE_SANDBOX"])
except (SandboxUnavailable, ValueError) as err:
    refuse(f"TRACE_SANDBOX={os.environ['TRACE_SANDBOX']}: {err}")
from trace_rl.lm.models import check_model
try:
    check_model(os.environ["MODEL"])
except ValueError as err:
    refuse(f"MODEL={os.environ['MODEL']}: {err}")
import verl  # noqa: F401  (loads the plugin)
from trace_rl.integrations.verl.plugin import REGISTERED
print("trace plugin:", REGISTERED, "| sandbox:", os.environ["TRACE_SANDBOX"])
PY

python -m verl.trainer.main_ppo \
  trainer.use_v1=True \
  trainer.v1.trainer_mode=trace \
  +actor_rollout_ref.rollout.agent.agent_loop_manager_class=trace_rl.integrations.verl.manager.TraceAgentLoopManager \
  actor_rollout_ref.rollout.agent.default_agent_loop=trace_tool_agent \
  +trace_rl.method=trace \
  +trace_rl.budget.branch_factor=1 \
  +trace_rl.budget.max_per_prompt=16 \
  +trace_rl.predictor.kind=light \
  +trace_rl.weighting=split \
  algorithm.adv_estimator=grpo \
  algorithm.use_kl_in_reward=False \
  data.train_files="$TRAIN_FILES" \
  data.val_files="$VAL_FILES" \
  data.train_batch_size=64 \
  data.max_prompt_length=1024 \
  data.max_response_length=8192 \
  data.return_raw_chat=True \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=16 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.actor.loss_agg_mode=token-mean \
  actor_rollout_ref.actor.use_kl_loss=False \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.temperature=1.0 \
  actor_rollout_ref.rollout.calculate_log_probs=True \
  actor_rollout_ref.rollout.multi_turn.enable=True \
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=8 \
  actor_rollout_ref.rollout.multi_turn.format=hermes \
  actor_rollout_ref.rollout.multi_turn.function_tool_path="$HERE/python_tool.py" \
  reward.custom_reward_function.path="$HERE/reward.py" \
  reward.custom_reward_function.name=compute_score \
  trainer.n_gpus_per_node=8 \
  trainer.nnodes=1 \
  trainer.total_epochs=1 \
  trainer.test_freq=10 \
  trainer.save_freq=50 \
  trainer.logger='["console","wandb"]' \
  trainer.project_name=trace-rl \
  trainer.experiment_name="trace-$(basename "$MODEL")-math" \
  ray_kwargs.ray_init.num_cpus="$RAY_NUM_CPUS" \
  +ray_kwargs.ray_init._node_ip_address=127.0.0.1 \
  +ray_kwargs.ray_init.include_dashboard=False \
  transfer_queue.backend.SimpleStorage.num_data_storage_units="$TQ_STORAGE_UNITS" \
  "$@"
