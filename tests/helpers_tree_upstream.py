"""Random rollout trees for the Tree-GRPO and TreePO checks (tests/core/test_baselines.py), the rows upstream's
code sees for them, the trees as the recorded tables hold them, and upstream's own functions run on them.

Upstream's files are loaded unmodified (bench/upstream_code.py), in trace-rl's environment with torch (the `lm`
extra). What they import that trace-rl's dependencies do not include is provided while they load: each method's
other file in place of its package's module (Tree-GRPO's trainer imports `verl.trainer.ppo.core_algos`, TreePO's
core_algos `verl.utils.torch_functional`), and stand-ins that refuse to be called for the modules of the training
stack the checks never reach (verl's protocol, workers and sequence balancing, codetiming, search_r1's agents,
tensordict). verl's modules are always the provided ones, even where verl is installed: an installed verl is
another version than the one each upstream repository vendors. Inputs are float64 tensors (upstream trains in
float32); upstream still computes two steps in float32 (see test_baselines.TOL)."""

from types import ModuleType, SimpleNamespace

import numpy as np
from helpers_upstream import upstream_code

from trace_rl.tree import BARE, BRANCH, RolloutTree

TREE_GRPO, TREE_GRPO_TRAINER = "TRACE_RL_TREE_GRPO_REFERENCE", "TRACE_RL_TREE_GRPO_TRAINER_REFERENCE"
TREEPO, TREEPO_WHITEN = "TRACE_RL_TREEPO_REFERENCE", "TRACE_RL_TREEPO_WHITEN_REFERENCE"


# ---------------------------------------------------------------------------------------------------------
# random trees: bare rollouts of random length, continuations from random anchors (also on continuations)


def _chain(rng, tree, parent, origin, length, tokens):
    for i in range(length):
        last = i == length - 1
        reward = float(rng.choice([0.0, 1.0])) if rng.random() < 0.8 else float(np.round(rng.random(), 2))
        mask = [1] * int(rng.integers(0, 4)) + [0] * int(rng.integers(0, 2)) if tokens else []
        node = tree.add_turn(parent, origin=origin, terminal=last, reward=reward if last else None, loss_mask=mask)
        parent = node.node_id


def random_tree(rng, root_id, tokens=False):
    tree = RolloutTree(root_id)
    for _ in range(int(rng.integers(1, 5))):
        _chain(rng, tree, tree.root_id, BARE, int(rng.integers(1, 5)), tokens)
    for _ in range(int(rng.integers(0, 7))):
        anchors = [n for n in tree.turns() if not n.terminal]
        if not anchors:
            break
        _chain(rng, tree, anchors[int(rng.integers(len(anchors)))].node_id, BRANCH, int(rng.integers(1, 4)), tokens)
    return tree


def tree_grpo_trees(count, seed):
    rng = np.random.default_rng(seed)
    return [random_tree(rng, str(t)) for t in range(count)]


def treepo_batches(count, seed, tokens):
    rng = np.random.default_rng(seed)
    return [[random_tree(rng, str(t), tokens=tokens) for t in range(int(rng.integers(1, 6)))] for _ in range(count)]


def rows(trees):
    """Upstream's view: one row per leaf with its reward, prompt uid, tree uid, '#' path and response length (the
    policy tokens of its path; the turns where the trees carry no tokens, as trace-rl weighs them)."""
    out = []
    for tree in trees:
        has_tokens = any(n.loss_mask for n in tree.turns())
        for leaf in tree.leaves():
            path = tree.path(leaf.node_id)
            out.append(
                {
                    "id": leaf.node_id,
                    "r": float(leaf.reward),
                    "uid": tree.root_id,
                    "tree_uid": ".".join(leaf.node_id.split(".")[:2]),
                    "path": "#".join(n.node_id for n in path),
                    "length": sum(sum(n.loss_mask) for n in path[1:]) if has_tokens else len(path) - 1,
                }
            )
    return out


def tree_record(tree) -> dict:
    """A tree as the tables hold it: its turns in order as [id, origin, reward (leaves), loss_mask]."""
    turns = [[n.node_id, n.origin, n.reward, n.loss_mask] for n in tree.turns()]
    return {"root": tree.root_id, "turns": turns}


def tree_from_record(record) -> RolloutTree:
    tree = RolloutTree(record["root"])
    for node_id, origin, reward, mask in record["turns"]:
        parent = node_id.rsplit(".", 1)[0]
        node = tree.add_turn(parent, origin=origin, terminal=reward is not None, reward=reward, loss_mask=mask)
        assert node.node_id == node_id  # turns are recorded in the order they were added
    return tree


def tree_grpo_provides(stub, core_algos: ModuleType) -> dict[str, ModuleType]:
    """What ray_trainer_ts.py imports: its own core_algos.py, and stand-ins for the training stack."""
    return {
        "codetiming": stub("codetiming", "Timer"),
        "verl": stub("verl", "DataProto"),
        "verl.protocol": stub("verl.protocol", "pad_dataproto_to_divisor", "unpad_dataproto"),
        "verl.single_controller.base": stub("verl.single_controller.base", "Worker"),
        "verl.single_controller.ray": stub(
            "verl.single_controller.ray", "RayResourcePool", "RayWorkerGroup", "RayClassWithInitArgs"
        ),
        "verl.single_controller.ray.base": stub("verl.single_controller.ray.base", "create_colocated_worker_cls"),
        "verl.trainer.ppo.core_algos": core_algos,
        "verl.utils.seqlen_balancing": stub(
            "verl.utils.seqlen_balancing", "get_seqlen_balanced_partitions", "log_seqlen_unbalance"
        ),
        "verl.utils.torch_functional": stub("verl.utils.torch_functional", "masked_mean"),
        "search_r1.llm_agent.generation_ts": stub(
            "search_r1.llm_agent.generation_ts", "LLMGenerationTreeSearchManager", "GenerationTreeSearchConfig"
        ),
        "search_r1.llm_agent.generation": stub(
            "search_r1.llm_agent.generation", "LLMGenerationManager", "GenerationConfig"
        ),
    }


def load_tree_grpo(load) -> ModuleType | None:
    """Upstream's ray_trainer_ts module, its `core_algos` upstream's core_algos.py; None if a variable is unset.
    `load(var, provide)`: upstream_code.load, or upstream_or_skip in the tests."""
    stub = upstream_code.stub
    # core_algos.py imports verl.utils.torch_functional at its top; the functions the checks call never use it
    core_algos = load(TREE_GRPO, {"verl.utils.torch_functional": stub("verl.utils.torch_functional")})
    return core_algos and load(TREE_GRPO_TRAINER, tree_grpo_provides(stub, core_algos))


def load_treepo(load) -> ModuleType | None:
    """Upstream's core_algos module, its `verl_F` upstream's torch_functional.py; None if a variable is unset."""
    stub = upstream_code.stub
    # torch_functional.py's top imports tensordict (not a trace-rl dependency) and transformers (the `lm` extra,
    # installed with torch); masked_whiten needs torch alone
    whiten = load(TREEPO_WHITEN, {"tensordict": stub("tensordict", "TensorDict")})
    return whiten and load(TREEPO, {"verl.utils.torch_functional": whiten})


def upstream_tree_grpo(trainer, tree) -> dict[str, float]:
    """compute_advantage(data, "tree") on one row per leaf: its reward on its single response token."""
    import torch

    rs = rows([tree])
    n = len(rs)
    data = SimpleNamespace(
        batch={
            "token_level_rewards": torch.tensor([[r["r"]] for r in rs], dtype=torch.float64),
            "responses": torch.zeros(n, 1, dtype=torch.long),
            "attention_mask": torch.ones(n, 1, dtype=torch.long),
        },
        non_tensor_batch={
            "uid": np.array([r["uid"] for r in rs], dtype=object),
            "tree_uid": np.array([r["tree_uid"] for r in rs], dtype=object),
        },
    )
    trainer.compute_advantage(data, "tree")
    return {r["id"]: float(a) for r, a in zip(rs, data.batch["advantages"][:, 0])}


def upstream_treepo(core, trees, weighting) -> dict:
    """Upstream's function on one row per leaf of the batch, twice: each row with as many response tokens as
    `rows` gives it and its reward on the last (the whitened values: None for a row of no token, all None where
    upstream raises), and every row with 2 tokens to read the values it whitens as they enter masked_whiten."""
    import torch

    rs = rows(trees)
    index = np.array([r["path"] for r in rs], dtype=object)

    def call(lengths):
        width = max(max(lengths), 1)
        mask = torch.tensor([[1 if j < n else 0 for j in range(width)] for n in lengths], dtype=torch.long)
        rewards = torch.zeros(len(rs), width, dtype=torch.float64)
        for i, (r, n) in enumerate(zip(rs, lengths)):
            rewards[i, max(n - 1, 0)] = r["r"]
        adv, _ = core.compute_tree_reinforce_plus_plus_baseline_outcome_advantage(
            rewards, mask, index, remove_no_std_subgroup=False, adv_weight_strategy=weighting
        )
        return adv

    real, seen = core.verl_F, []

    def spy(values, mask, *args, **kwargs):
        seen.append(values[:, 0].clone())
        return real.masked_whiten(values, mask, *args, **kwargs)

    core.verl_F = SimpleNamespace(masked_whiten=spy)
    try:
        call([2] * len(rs))
    finally:
        core.verl_F = real
    out = {"weighting": weighting, "trees": [tree_record(t) for t in trees]}
    out["raw"] = {r["id"]: float(v) for r, v in zip(rs, seen[0])}
    try:
        adv = call([r["length"] for r in rs])
    except ValueError as exc:
        return out | {"whitened": None, "raised": f"ValueError: {exc}"}
    whitened = {}
    for r, row in zip(rs, adv):
        if r["length"]:
            assert torch.all(row[: r["length"]] == row[0])  # every token of a row carries its leaf's value
        whitened[r["id"]] = float(row[0]) if r["length"] else None
    return out | {"whitened": whitened, "raised": None}
