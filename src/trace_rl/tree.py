"""Rollout trees: one tree per prompt, one node per ReAct turn <thought, action, observation>.

The root is the prompt itself (depth 0); a bare rollout is a chain of turns below the root; a branch is a
continuation grown from a turn node of a bare rollout (an anchor) after the environment was forked there.
Node ids are path strings without underscores ("3.0.2": prompt 3, its first turn-1 node, that node's third
child), so an id alone says where a node sits and trees serialise to JSON-lines without an index.

Token ids, loss masks and log-probabilities live on the node that produced them, turn by turn, so a trainer
never re-tokenises a history: the tokens of a prefix are the concatenation of its path.

A path alone (`path_dict`) is serialised in the same schema, and `from_paths` / `merge_path` put paths back
into a tree: the verl bridge sends each leaf's path with its training row and rebuilds the trees from them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from .safe_read import read_lines
from .strict_json import dumps

BARE, BRANCH, ROOT = "bare", "branch", "root"


@dataclass
class TurnNode:
    """One turn (or the prompt, at depth 0) with what a trainer and a predictor need from it."""

    node_id: str
    thought: str = ""
    action: str = ""
    observation: str = ""
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)  # 1 for policy tokens, 0 for observation/template
    logprobs: list[float] = field(default_factory=list)  # sampling log-probs of the policy tokens
    terminal: bool = False
    reward: float | None = None  # set on terminal nodes only
    origin: str = BARE  # root | bare | branch
    predicted: float | None = None  # V~(history up to this node) when the allocator looked at it
    flip_predicted: float | None = None  # anchors: the flip probability q stage 2 allocated on (from V~ or calibrated)
    target: float | None = None  # V^: mean terminal reward of the leaves below
    leaves: int = 0  # n_y: number of leaves below (1 for a leaf)
    children: list[str] = field(default_factory=list)
    info: dict = field(default_factory=dict)  # environment-specific state (e.g. the testbed's turn features)

    @property
    def depth(self) -> int:
        return self.node_id.count(".")

    @property
    def parent_id(self) -> str | None:
        return self.node_id.rsplit(".", 1)[0] if "." in self.node_id else None


class RolloutTree:
    """The tree of all rollouts of one prompt."""

    def __init__(self, root_id: str | int, prompt: object = None, predicted: float | None = None):
        root_id = str(root_id)
        if not root_id or "." in root_id or "_" in root_id:
            raise ValueError(f"root_id must be a non-empty id without '.' or '_', got {root_id!r}")
        self.prompt = prompt
        self.root_id = root_id
        self.nodes: dict[str, TurnNode] = {root_id: TurnNode(root_id, origin=ROOT, predicted=predicted)}

    @property
    def root(self) -> TurnNode:
        return self.nodes[self.root_id]

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, node_id: str) -> TurnNode:
        return self.nodes[node_id]

    def add_turn(self, parent_id: str, **fields) -> TurnNode:
        """Append a child turn under `parent_id`; its id is the parent's id plus the child's index."""
        parent = self.nodes.get(parent_id)
        if parent is None:
            raise KeyError(f"no node {parent_id!r} in tree {self.root_id!r}")
        if parent.terminal:
            raise ValueError(f"node {parent_id!r} is terminal; a turn cannot follow it")
        node = TurnNode(f"{parent_id}.{len(parent.children)}", **fields)
        parent.children.append(node.node_id)
        self.nodes[node.node_id] = node
        return node

    def children(self, node_id: str) -> list[TurnNode]:
        return [self.nodes[c] for c in self.nodes[node_id].children]

    def path(self, node_id: str) -> list[TurnNode]:
        """Nodes from the root down to `node_id`, both included."""
        parts = node_id.split(".")
        return [self.nodes[".".join(parts[: i + 1])] for i in range(len(parts))]

    def leaves(self) -> list[TurnNode]:
        return [n for n in self.nodes.values() if not n.children and n.origin != ROOT]

    def turns(self) -> Iterator[TurnNode]:
        return (n for n in self.nodes.values() if n.origin != ROOT)

    def rewards(self) -> list[float]:
        return [float(n.reward) for n in self.leaves() if n.reward is not None]

    def is_mixed(self) -> bool:
        """True when the tree holds a success leaf and a failure leaf (reward above / at most 0.5)."""
        r = self.rewards()
        return any(x > 0.5 for x in r) and any(x <= 0.5 for x in r)

    def anchors(self) -> list[tuple[TurnNode, float]]:
        """Stage-2 candidates: non-terminal turn nodes of bare rollouts, each with its rollout's reward r_ij."""
        return [(node, float(chain[-1].reward)) for chain in self._finished_bare_chains() for node in chain[:-1]]

    def _finished_bare_chains(self) -> list[list[TurnNode]]:
        """The bare rollouts that ended with a reward, each as its chain of turns; an unfinished rollout has no
        observed outcome to flip, so stage 2 neither branches from it nor prices with it."""
        chains = [self._rollout_chain(first) for first in self.children(self.root_id)]
        return [c for c in chains if c[-1].terminal and c[-1].reward is not None]

    def anchor_costs(self) -> tuple[list[int], float]:
        """What a continuation from each of `anchors()` (same order) costs, and a whole bare rollout on average.

        The cost of an anchor is what its own rollout generated after it: policy tokens (log-probs) where the
        tree's turns record them, else turns (the testbed); at least 1. Stage 2 under a cost budget prices its
        continuations with it, an estimate: a continuation is a new sample and may run longer or shorter.
        """
        chains = self._finished_bare_chains()
        tokens = any(node.logprobs for chain in chains for node in chain)
        costs, whole = [], []
        for chain in chains:
            turn_cost = [len(node.logprobs) if tokens else 1 for node in chain]
            whole.append(sum(turn_cost))
            costs.extend(max(1, sum(turn_cost[t + 1 :])) for t in range(len(chain) - 1))
        return costs, (sum(whole) / len(whole) if whole else 0.0)

    def started_rewards(self, node_id: str) -> list[float]:
        """Final rewards of the rollouts that started at `node_id`: the bare rollouts for the root, the
        continuations for an anchor. How many started there was fixed before any of them ran, so their mean
        is an unbiased estimate of the node's success probability; the leaf mean V^ is not, because stage 2
        adds leaves below the prefixes whose observed outcome looked surprising."""
        node = self.nodes[node_id]
        out = []
        for first in self.children(node_id):
            if first.origin == node.origin:
                continue  # the rollout that passed through this node started above it
            end = self._rollout_chain(first)[-1]
            if end.terminal and end.reward is not None:
                out.append(float(end.reward))
        return out

    def _rollout_chain(self, first: TurnNode) -> list[TurnNode]:
        """The turns of the rollout whose first turn is `first`: each next turn is the child of the same
        origin (a bare rollout's turns are bare, a continuation's are branch; later branches hang off them)."""
        chain = [first]
        while chain[-1].children:
            same = [c for c in self.children(chain[-1].node_id) if c.origin == first.origin]
            if not same:
                break
            chain.append(same[0])
        return chain

    def compute_targets(self) -> None:
        """Recursive targets: a leaf has V^ = r and n = 1; an inner node the leaf-weighted mean of its children."""
        for node in sorted(self.nodes.values(), key=lambda n: -n.depth):
            if not node.children:
                if node.origin == ROOT:
                    node.target, node.leaves = None, 0
                    continue
                if node.reward is None:
                    raise ValueError(f"leaf {node.node_id!r} has no reward; finish the rollout before targets")
                node.target, node.leaves = float(node.reward), 1
            else:
                kids = self.children(node.node_id)
                node.leaves = sum(k.leaves for k in kids)
                node.target = sum(k.leaves * k.target for k in kids) / node.leaves

    def to_dict(self) -> dict:
        return {"root_id": self.root_id, "prompt": self.prompt, "nodes": [asdict(n) for n in self.nodes.values()]}

    def path_dict(self, node_id: str) -> dict:
        """`to_dict` of the path from the root to `node_id` alone: the same keys and node schema (a node's
        `children` still name all its children). `from_paths` and `merge_path` put such paths back together."""
        return {"root_id": self.root_id, "prompt": self.prompt, "nodes": [asdict(n) for n in self.path(node_id)]}

    @classmethod
    def from_paths(cls, paths: Iterable[dict]) -> "RolloutTree":
        """The tree holding exactly the nodes of `paths` (`path_dict`s of one tree), checked as `merge_path`."""
        paths = list(paths)
        if not paths:
            raise ValueError("from_paths needs at least one path")
        tree = cls(paths[0]["root_id"], paths[0].get("prompt"))
        tree.nodes = {}  # the first path brings the root as it was serialised
        for data in paths:
            tree.merge_path(data)
        return tree

    def merge_path(self, data: dict) -> TurnNode:
        """Add a `path_dict` of this tree and return the path's last node. Nodes the tree lacks are added; a node
        it holds must equal the path's in every field but `children`, which list the nodes present, in index
        order (a path names children it does not carry). ValueError, one line, on a path of another tree or
        prompt, one that is not a chain from the root, a turn after a terminal node, or a node that differs."""
        root = str(data["root_id"])
        if root != self.root_id:
            raise ValueError(f"a path of tree {root!r} cannot merge into tree {self.root_id!r}")
        if self.nodes and data.get("prompt") != self.prompt:
            raise ValueError(f"tree {root!r}: paths disagree on the prompt")
        try:
            path = [TurnNode(**raw) for raw in data["nodes"]]
        except TypeError as err:
            raise ValueError(f"tree {root!r}: a path node is not a TurnNode ({err})") from None
        if not path:
            raise ValueError(f"tree {root!r}: a path without nodes")
        if path[0].node_id != root or path[0].origin != ROOT:
            raise ValueError(f"tree {root!r}: a path must start at the root node {root!r}")
        for prev, node in zip(path, path[1:]):
            if node.parent_id != prev.node_id or not node.node_id.rsplit(".", 1)[1].isdigit():
                raise ValueError(f"tree {root!r}: path node {node.node_id!r} is not a child of {prev.node_id!r}")
            if prev.terminal:
                raise ValueError(f"tree {root!r}: node {node.node_id!r} follows the terminal node {prev.node_id!r}")
        for node in path:  # every check before the first change: a refused path leaves the tree as it was
            held = self.nodes.get(node.node_id)
            if held is not None and not _same_but_children(held, node):
                raise ValueError(f"tree {root!r}: paths disagree on node {node.node_id!r}")
        for node in path:
            if node.node_id in self.nodes:
                continue
            node.children = []
            self.nodes[node.node_id] = node
            if node.parent_id is not None:
                parent = self.nodes[node.parent_id]  # the path's previous node, held or merged just before
                parent.children = sorted([*parent.children, node.node_id], key=_child_index)
        return self.nodes[path[-1].node_id]

    @classmethod
    def from_dict(cls, data: dict) -> "RolloutTree":
        tree = cls(data["root_id"], data.get("prompt"))
        tree.nodes = {}
        for raw in data["nodes"]:
            node = TurnNode(**raw)
            tree.nodes[node.node_id] = node
        if tree.root_id not in tree.nodes:
            raise ValueError(f"tree {tree.root_id!r} has no root node")
        return tree


def _child_index(node_id: str) -> int:
    return int(node_id.rsplit(".", 1)[1])


def _same_but_children(a: TurnNode, b: TurnNode) -> bool:
    a_fields, b_fields = asdict(a), asdict(b)
    a_fields.pop("children"), b_fields.pop("children")
    # repr as the fallback: a NaN V~ that crossed a process boundary is a new object, and nan != nan
    return a_fields == b_fields or repr(a_fields) == repr(b_fields)


def save_trees(path: str | Path, trees: Iterable[RolloutTree], append: bool = False, extra: dict | None = None) -> None:
    """Write one tree per line (strict JSON-lines: a NaN V~ or reward is null, as an unset one); `extra` keys
    (e.g. method, step) go into every line."""
    with open(path, "a" if append else "w", encoding="utf-8") as fh:
        for tree in trees:
            fh.write(dumps({**(extra or {}), **tree.to_dict()}) + "\n")


def load_trees(path: str | Path) -> list[RolloutTree]:
    """The trees of a JSON-lines file (`save_trees`); each line and the file within safe_read.BOUNDS["trees"]
    (256 MiB a tree, 4 GiB in all: safe_read.TooLarge past them)."""
    trees = []
    for lineno, line in read_lines(path, "trees"):  # outside the try: its TooLarge stays one
        if not line.strip():
            continue
        try:
            trees.append(RolloutTree.from_dict(json.loads(line)))
        except (ValueError, KeyError, TypeError, AttributeError) as err:  # JSONDecodeError is a ValueError
            raise ValueError(f"{path}:{lineno}: not a serialised RolloutTree ({err})") from None
        except RecursionError:  # json's parser recurses once per nesting level
            raise ValueError(f"{path}:{lineno}: not a serialised RolloutTree (nested too deeply)") from None
    return trees
