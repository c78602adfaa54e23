"""A self-contained HTML view of saved rollout trees (behind `trace-rl view TREES.jsonl --out tree.html`).

Input: one or more JSON-lines files of trees (`save_trees`), or trees in memory. A tree line may carry "method"
and "step" keys; without them the method comes from the file name (trees_<method>.jsonl, else the file's stem)
and the step is unknown. Steps are shown 1-based (step + 1), as the progress lines and the plots show them.

Output: one HTML file with inline CSS and JavaScript only; a Content-Security-Policy that names the hashes of
that style and script blocks every other script, style and network fetch, and every piece of text from the
trees is HTML-escaped, so model output cannot inject markup or script. Each prompt's tree is a collapsible
block; a bare rollout is a numbered chain of turns (thought / action / observation), and the continuations the
allocator started at a turn hang below that turn, nested. Every turn shows its origin, the predictor's value V~
at allocation time, its empirical success V^ over n leaves and whether its subtree is mixed; an anchor also
shows the flip probability q of one continuation and the number K of continuations it got; a leaf its reward.
A summary table per (method, step) comes from trace_rl.metrics. Filters (mixed trees only, method, step) hide
blocks in place; the URL fragment presets them, e.g. tree.html#mixed=1&method=trace&step=3&open=1 (open=1
expands the trees shown).

Limits: the whole file is rendered up front (no paging), so tens of thousands of turns make a slow page; token
ids and log-probs are not shown, only how many tokens a turn has. A trees file is read within
safe_read.BOUNDS["trees"] (256 MiB a tree, 4 GiB a file): past them, one line naming the file and the line.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .allocation import prefix_flip_prob
from .metrics import continuation_flips, contrast_groups, effective_ratio, mean_reward, tree_budget
from .safe_read import read_lines
from .tree import ROOT, RolloutTree, TurnNode


@dataclass
class TreeEntry:
    """A tree with the method and step it came from (None when the file does not say)."""

    tree: RolloutTree
    method: str = ""
    step: int | None = None


def _method_from_name(path: Path) -> str:
    stem = path.name.removesuffix(".jsonl")
    return stem.removeprefix("trees_") if stem.startswith("trees_") else stem


def load_entries(paths: Iterable[str | Path]) -> list[TreeEntry]:
    """Trees of every file, in order, with their method and step (see the module docstring)."""
    out = []
    for path in map(Path, paths):
        if not path.is_file():
            raise FileNotFoundError(f"no trees file {path}")
        default = _method_from_name(path)
        for lineno, line in read_lines(path, "trees"):  # bounded (safe_read.BOUNDS); outside the try: one line
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                tree = RolloutTree.from_dict(data)
            except (ValueError, KeyError, TypeError, AttributeError) as err:
                raise ValueError(f"{path}:{lineno}: not a serialised RolloutTree ({err})") from None
            except RecursionError:  # json's parser recurses once per nesting level
                raise ValueError(f"{path}:{lineno}: not a serialised RolloutTree (nested too deeply)") from None
            step = data.get("step")
            out.append(TreeEntry(tree, str(data.get("method") or default), step if isinstance(step, int) else None))
    return out


def _entries(source) -> list[TreeEntry]:
    if isinstance(source, (str, Path)):
        return load_entries([source])
    items = list(source)
    if all(isinstance(x, TreeEntry) for x in items):
        return items
    if all(isinstance(x, RolloutTree) for x in items):
        return [TreeEntry(t) for t in items]
    if all(isinstance(x, (str, Path)) for x in items):
        return load_entries(items)
    raise TypeError("expected a trees file, a list of files, RolloutTrees or TreeEntries")


def write_tree_html(
    source: str | Path | Sequence[str | Path] | Sequence[RolloutTree] | Sequence[TreeEntry],
    out_path: str | Path,
    title: str = "TRACE rollout trees",
) -> Path:
    """Write the HTML view of `source` (files, trees or entries) to `out_path`; returns the path."""
    entries = _entries(source)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(entries, title), encoding="utf-8")
    return out


# ---------------------------------------------------------------------------------------------------- rendering

SHORT = 100  # a turn whose fields are this short, on one line each, shows them on one line

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.2em; color: #222; }
h1 { font-size: 1.3em; margin: 0 0 .4em; }
table.summary { border-collapse: collapse; margin: .5em 0 1em; }
table.summary th, table.summary td { border: 1px solid #ccc; padding: 2px 8px; text-align: right; }
table.summary th:first-child, table.summary td:first-child { text-align: left; }
form { position: sticky; top: 0; background: #f4f4f4; padding: 6px 10px; border: 1px solid #ddd; z-index: 1; }
form label { margin-right: 1.2em; }
.legend { color: #555; font-size: 12px; margin: .5em 0 1em; }
details.tree { border: 1px solid #ccc; border-radius: 4px; margin: 6px 0; padding: 2px 8px; }
details.tree.mixed { border-left: 5px solid #c80; }
details > summary { cursor: pointer; }
ol.chain { margin: 4px 0; padding-left: 1em; list-style: none; }
.turn { border-left: 3px solid #ddd; padding: 1px 0 1px 8px; margin: 3px 0; }
.turn.mixed { border-left-color: #c80; }
.head { font-size: 12px; color: #444; }
.head b { color: #000; }
pre { margin: 2px 0; white-space: pre-wrap; word-break: break-word; background: #fafafa; padding: 2px 4px; }
pre .k { color: #888; user-select: none; }
.badge { display: inline-block; border-radius: 3px; padding: 0 4px; font-size: 11px; margin-left: 4px; }
.bare { background: #e4ecf7; } .branch { background: #efe4f7; } .mix { background: #fde9c8; }
.anchor { background: #e6f4e6; }
.ok { background: #cfeccf; } .bad { background: #f5d0d0; } .open { background: #eee; }
.branches { margin-left: 1.2em; border-left: 2px dashed #b9a; padding-left: 8px; }
.info { color: #888; font-size: 11px; }
.leaf { display: inline-block; min-width: 1.1em; text-align: center; font-size: 11px; margin-right: 1px; }
"""

SCRIPT = """
(function () {
  const get = (id) => document.getElementById(id);
  const preset = new URLSearchParams(location.hash.slice(1));
  if (preset.get("mixed") === "1") get("f-mixed").checked = true;
  for (const k of ["method", "step"]) {
    if (preset.has(k)) get("f-" + k).value = preset.get(k);
  }
  function apply() {
    const mixed = get("f-mixed").checked, method = get("f-method").value, step = get("f-step").value;
    let shown = 0, total = 0;
    for (const el of document.querySelectorAll("[data-method]")) {
      const isTree = el.classList.contains("tree");
      const ok = (!method || el.dataset.method === method) && (!step || el.dataset.step === step)
        && (!mixed || !isTree || el.dataset.mixed === "1");
      el.hidden = !ok;
      if (isTree) { total += 1; shown += ok ? 1 : 0; }
    }
    get("f-count").textContent = shown + " of " + total + " trees shown";
  }
  for (const id of ["f-mixed", "f-method", "f-step"]) get(id).addEventListener("change", apply);
  function expand(open) {
    for (const el of document.querySelectorAll("details.tree")) if (!el.hidden) el.open = open;
  }
  get("f-expand").addEventListener("click", () => expand(true));
  get("f-collapse").addEventListener("click", () => expand(false));
  apply();
  if (preset.get("open") === "1") expand(true);
})();
"""

LEGEND = (
    "V~: the predictor's value when the allocator looked at the node. V^: mean leaf reward below it (n leaves). "
    "q: chance that one continuation from an anchor flips its bare rollout's outcome (1 - V~ if that rollout "
    "succeeded, V~ if it failed). K: continuations the allocator gave the anchor, with how many flipped. "
    "mixed: success and failure leaves below (success = reward > 0.5)."
)


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _num(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _success(r: float) -> bool:
    return r > 0.5  # the threshold RolloutTree.is_mixed uses


class _TreeView:
    """Per-node facts of one tree that the HTML shows: mixed subtrees, anchors' (r, q, K, flips)."""

    def __init__(self, tree: RolloutTree):
        self.tree = tree
        self.outcomes: dict[str, set[bool]] = {}
        for node in sorted(tree.nodes.values(), key=lambda n: -n.depth):
            seen = {_success(node.reward)} if not node.children and node.reward is not None else set()
            for c in node.children:
                seen |= self.outcomes[c]
            self.outcomes[node.node_id] = seen
        self.anchor_reward = {node.node_id: r for node, r in tree.anchors()}

    def mixed(self, node_id: str) -> bool:
        return len(self.outcomes[node_id]) == 2

    def chain(self, first: TurnNode) -> list[TurnNode]:
        """The turns of the rollout starting at `first`: each next turn is the first child of the same origin."""
        out = [first]
        while True:
            same = [c for c in self.tree.children(out[-1].node_id) if c.origin == first.origin]
            if not same:
                return out
            out.append(same[0])

    def started(self, node: TurnNode) -> list[TurnNode]:
        """First turns of the rollouts that start at `node` (for a chain's turn: its continuations)."""
        kids = self.tree.children(node.node_id)
        if node.origin == ROOT:
            return kids
        nxt = [c for c in kids if c.origin == node.origin][:1]
        return [c for c in kids if c not in nxt]

    def reward_of(self, first: TurnNode) -> float | None:
        return self.chain(first)[-1].reward


def _turn_html(view: _TreeView, node: TurnNode, index: int) -> str:
    tree = view.tree
    origin = "continuation" if node.origin == "branch" else node.origin
    head = [
        f"<b>turn {index}</b> <span class='info'>{_e(node.node_id)}</span>",
        f"<span class='badge {_e(node.origin)}'>{_e(origin)}</span>",
        f"V~ {_num(node.predicted)}" if node.predicted is not None else "",  # only scored nodes have one
        f"V^ {_num(node.target)} (n={node.leaves})",
    ]
    if node.node_id in view.anchor_reward and node.predicted is not None:
        r = view.anchor_reward[node.node_id]
        # the q stage 2 allocated on (trees from before it was recorded: q of V~, what stage 2 then read)
        q = node.flip_predicted if node.flip_predicted is not None else float(prefix_flip_prob(r, node.predicted))
        conts = [c for c in tree.children(node.node_id) if c.origin != node.origin]
        flips = sum(1 for c in conts if (x := view.reward_of(c)) is not None and _success(x) != _success(r))
        k_text = f"K={len(conts)}" + (f", {flips} flipped" if conts else "")
        head.append(f"<span class='badge anchor'>anchor: q {_num(q)}, {k_text}</span>")
    if view.mixed(node.node_id):
        head.append("<span class='badge mix'>mixed below</span>")
    if node.terminal or not node.children:
        head.append(_reward_badge(node.reward))
    if node.token_ids:
        head.append(f"<span class='info'>{len(node.token_ids)} tokens</span>")
    if node.info:
        head.append(f"<span class='info'>info {_e(json.dumps(node.info, default=str))}</span>")
    fields = [
        (k, v) for k, v in (("thought", node.thought), ("action", node.action), ("observation", node.observation)) if v
    ]
    if sum(len(v) for _, v in fields) <= SHORT and not any("\n" in v for _, v in fields):
        body = (
            "<pre>" + "   ".join(f"<span class='k'>{k}: </span>{_e(v)}" for k, v in fields) + "</pre>" if fields else ""
        )
    else:
        body = "".join(f"<pre><span class='k'>{k}: </span>{_e(v)}</pre>" for k, v in fields)
    branches = "".join(_rollout_html(view, c) for c in view.started(node))
    if branches:
        branches = f"<div class='branches'>{branches}</div>"
    cls = "turn mixed" if view.mixed(node.node_id) else "turn"
    return f"<li class='{cls}'><div class='head'>{' '.join(h for h in head if h)}</div>{body}{branches}</li>"


def _reward_badge(reward: float | None) -> str:
    if reward is None:
        return "<span class='badge open'>unfinished</span>"
    return f"<span class='badge {'ok' if _success(reward) else 'bad'}'>reward {reward:g}</span>"


def _rollout_html(view: _TreeView, first: TurnNode) -> str:
    chain = view.chain(first)
    what = "continuation" if first.origin == "branch" else "bare rollout"
    start = f"from {_e(first.parent_id)}, " if first.origin == "branch" else ""
    summary = f"{what} {_e(first.node_id)} ({start}{len(chain)} turns) {_reward_badge(chain[-1].reward)}"
    if view.mixed(first.node_id):
        summary += "<span class='badge mix'>mixed</span>"
    items = "".join(_turn_html(view, node, first.depth + i) for i, node in enumerate(chain))
    return f"<details open><summary>{summary}</summary><ol class='chain'>{items}</ol></details>"


def _prompt_html(prompt: object, root_id: str) -> str:
    if prompt is None or str(prompt) == root_id:
        return ""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, indent=1, ensure_ascii=False, default=str)
    return f"<details><summary>prompt</summary><pre>{_e(text)}</pre></details>"


def _tree_html(entry: TreeEntry) -> str:
    tree, view = entry.tree, _TreeView(entry.tree)
    root, b = tree.root, tree_budget([tree])
    step = "" if entry.step is None else str(entry.step + 1)
    leaves = "".join(f"<span class='leaf {'ok' if _success(r) else 'bad'}'>{r:g}</span>" for r in tree.rewards())
    mixed = tree.is_mixed()
    parts = [
        f"<b>prompt {_e(tree.root_id)}</b>",
        _e(entry.method),
        f"step {step}" if step else "",
        f"V~ {_num(root.predicted)}",
        f"{b.bare_rollouts} rollouts + {b.continuations} continuations",
        f"contrast groups {contrast_groups([tree])}",
        f"leaves {leaves}",
    ]
    summary = " · ".join(p for p in parts if p) + (" <span class='badge mix'>mixed</span>" if mixed else "")
    body = _prompt_html(tree.prompt, tree.root_id) + "".join(_rollout_html(view, c) for c in view.started(root))
    attrs = f"data-method='{_e(entry.method)}' data-step='{_e(step)}' data-mixed='{int(mixed)}'"
    return f"<details class='tree{' mixed' if mixed else ''}' {attrs}><summary>{summary}</summary>{body}</details>"


def _summary_html(entries: list[TreeEntry]) -> str:
    groups: dict[tuple[str, int | None], list[RolloutTree]] = {}
    for e in entries:
        groups.setdefault((e.method, e.step), []).append(e.tree)
    head = [
        "method",
        "step",
        "trees",
        "mixed",
        "effective ratio",
        "contrast groups",
        "rollouts",
        "continuations",
        "flips",
        "mean reward",
    ]
    rows = []
    for (method, step), trees in groups.items():
        b = tree_budget(trees)
        flips, conts = continuation_flips(trees)
        label = "" if step is None else str(step + 1)
        cells = [
            _e(method) or "?",
            _e(label) or "?",
            len(trees),
            sum(t.is_mixed() for t in trees),
            f"{effective_ratio(trees):.3f}",
            contrast_groups(trees),
            b.rollouts,
            b.continuations,
            f"{flips}/{conts}",
            f"{mean_reward(trees):.3f}",
        ]
        tds = "".join(f"<td>{c}</td>" for c in cells)
        rows.append(f"<tr data-method='{_e(method)}' data-step='{_e(label)}'>{tds}</tr>")
    ths = "".join(f"<th>{h}</th>" for h in head)
    return f"<table class='summary'><thead><tr>{ths}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _select(name: str, values: list[str]) -> str:
    opts = "".join(f"<option value='{_e(v)}'>{_e(v)}</option>" for v in values)
    disabled = "" if values else " disabled"
    return f"<label>{name} <select id='f-{name}'{disabled}><option value=''>all</option>{opts}</select></label>"


def render_html(entries: list[TreeEntry], title: str = "TRACE rollout trees") -> str:
    """The whole page as a string (see the module docstring for what it shows)."""
    methods = list(dict.fromkeys(e.method for e in entries if e.method))
    steps = [str(s + 1) for s in sorted({e.step for e in entries if e.step is not None})]
    csp = f"default-src 'none'; style-src {_csp_hash(CSS)}; script-src {_csp_hash(SCRIPT)}"
    form = (
        "<form id='filters'><label><input type='checkbox' id='f-mixed'> mixed trees only</label>"
        f"{_select('method', methods)}{_select('step', steps)}"
        "<button type='button' id='f-expand'>expand shown</button> <button type='button' id='f-collapse'>collapse all"
        "</button> <span id='f-count'></span></form>"
    )
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{csp}\">"
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{_e(title)}</h1>{_summary_html(entries)}<p class='legend'>{_e(LEGEND)}</p>{form}"
        + "".join(_tree_html(e) for e in entries)
        + f"<script>{SCRIPT}</script></body></html>\n"
    )
