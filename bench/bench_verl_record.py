"""Size of the tree record a verl row carries (`integrations.verl.advantage.leaf_record`). Prints, asserts nothing.

    python bench/bench_verl_record.py                      # 8 bare rollouts + 8 continuations, 4 turns of 300 tokens
    python bench/bench_verl_record.py --turn-tokens 1000 --policy-tokens 800

A synthetic tree of one prompt (random token ids below a Qwen-sized vocabulary, ~3.5 characters of text per
token, log-probs on the policy tokens) as the worker holds it after V^; per row, the mean size of its record as
JSON, pickled (Ray) and as msgpack (TransferQueue, when msgspec is installed), next to the record without
log-probs, the counts-only record the bridge carried before it sent tree.py's format, and the row's own
response ids, mask and log-probs as int64, int64 and float32 tensors.
"""

from __future__ import annotations

import argparse
import json
import pickle
import string

import numpy as np

from trace_rl.integrations.verl.advantage import leaf_record
from trace_rl.tree import BARE, BRANCH, RolloutTree


def synthetic_tree(bare: int, branches: int, turns: int, turn_tokens: int, policy: int, seed: int) -> RolloutTree:
    rng = np.random.default_rng(seed)
    letters = list(string.ascii_letters + " ")

    def text(tokens: int) -> str:
        return "".join(rng.choice(letters, int(tokens * 3.5)))

    def turn(parent: str, origin: str, last: bool):
        obs = 0 if last else turn_tokens - policy  # the last turn is the answer, with no tool reply after it
        return tree.add_turn(
            parent,
            origin=origin,
            action=text(policy),
            observation=text(obs),
            token_ids=[int(t) for t in rng.integers(0, 151_000, policy + obs)],
            loss_mask=[1] * policy + [0] * obs,
            logprobs=[float(-x) for x in rng.exponential(0.3, policy)],
            predicted=float(rng.random()),
            terminal=last,
            reward=float(rng.integers(0, 2)) if last else None,
            info={"session": int(rng.integers(100))},
        )

    tree = RolloutTree("u-0", prompt={"question": text(60)}, predicted=0.4)
    inner = []
    for _ in range(bare):
        parent = tree.root_id
        for depth in range(turns):
            node = turn(parent, BARE, depth == turns - 1)
            inner += [] if node.terminal else [node]
            parent = node.node_id
    for _ in range(branches):
        anchor = inner[int(rng.integers(len(inner)))]
        parent = anchor.node_id
        for depth in range(anchor.depth, turns):
            parent = turn(parent, BRANCH, depth == turns - 1).node_id
    tree.compute_targets()
    return tree


def counts_only_record(tree: RolloutTree, leaf_id: str) -> dict:
    """The record the bridge carried before: per turn its id, origin, token and policy-token counts, V~, text."""
    turns = [
        {
            "id": n.node_id,
            "origin": n.origin,
            "tokens": len(n.token_ids),
            "policy": int(sum(n.loss_mask)),
            "predicted": n.predicted,
            "action": n.action,
            "observation": n.observation,
        }
        for n in tree.path(leaf_id)[1:]
    ]
    return {
        "tree": tree.root_id,
        "leaf": leaf_id,
        "prompt": tree.prompt,
        "root_predicted": tree.root.predicted,
        "turns": turns,
    }


def without_logprobs(tree: RolloutTree, leaf_id: str) -> dict:
    record = leaf_record(tree, leaf_id)
    for node in record["nodes"]:
        node["logprobs"] = []
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bare", type=int, default=8)
    ap.add_argument("--branches", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--turn-tokens", type=int, default=300)
    ap.add_argument("--policy-tokens", type=int, default=220)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not 0 < args.policy_tokens <= args.turn_tokens:
        raise SystemExit("--policy-tokens must be in (0, --turn-tokens]")
    tree = synthetic_tree(args.bare, args.branches, args.turns, args.turn_tokens, args.policy_tokens, args.seed)
    leaves = [leaf.node_id for leaf in tree.leaves()]
    try:
        from msgspec import msgpack

        encoders = {"json": lambda r: json.dumps(r).encode(), "pickle": pickle.dumps, "msgpack": msgpack.encode}
    except ImportError:
        encoders = {"json": lambda r: json.dumps(r).encode(), "pickle": pickle.dumps}
    response = np.mean([sum(len(n.token_ids) for n in tree.path(leaf)[1:]) for leaf in leaves])
    print(f"{len(leaves)} rows, {response:.0f} response tokens a row; KiB per row:")
    print(f"{'record':34s}" + "".join(f"{name:>10s}" for name in encoders))
    for name, build in (
        ("leaf_record (tree.py path)", leaf_record),
        ("leaf_record without log-probs", without_logprobs),
        ("counts-only record (before)", counts_only_record),
    ):
        sizes = [np.mean([len(enc(build(tree, leaf))) for leaf in leaves]) / 1024 for enc in encoders.values()]
        print(f"{name:34s}" + "".join(f"{s:10.1f}" for s in sizes))
    print(f"{'row tensors (ids, mask, log-probs)':34s}{response * (8 + 8 + 4) / 1024:10.1f}")


if __name__ == "__main__":
    main()
