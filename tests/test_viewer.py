import base64
import hashlib
import json
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest

from trace_rl.metrics import effective_ratio
from trace_rl.tree import BRANCH, RolloutTree, save_trees
from trace_rl.viewer import TreeEntry, load_entries, render_html, write_tree_html

EVIL_ACTION = '</pre><script>alert("x")</script>'
EVIL_OBS = "<img src=x onerror=alert(1)>\nline two"


def mixed_tree() -> RolloutTree:
    """Two bare rollouts (success, failure); the failed one's first turn is an anchor with two continuations."""
    t = RolloutTree(7, prompt="Compute 2+3 <b>now</b>", predicted=0.6)
    t.add_turn("7", thought="I add", action="calc[2+3]", observation="5", predicted=0.7, token_ids=[1, 2, 3])
    t.add_turn("7.0", action="answer[5]", terminal=True, reward=1.0)
    t.add_turn("7", thought="hmm", action=EVIL_ACTION, observation=EVIL_OBS, predicted=0.4)
    t.add_turn("7.1", action="answer[6]", terminal=True, reward=0.0)
    t.add_turn("7.1", action="calc[2+3]", origin=BRANCH)
    t.add_turn("7.1.1", action="answer[5]", terminal=True, reward=1.0, origin=BRANCH)
    t.add_turn("7.1", action="answer[7]", terminal=True, reward=0.0, origin=BRANCH)
    t.compute_targets()
    return t


def failed_tree(root: int) -> RolloutTree:
    t = RolloutTree(root, prompt=root, predicted=0.2)
    for _ in range(2):
        first = t.add_turn(str(root), action="calc[1+1]", observation="2", predicted=0.2)
        t.add_turn(first.node_id, action="answer[3]", terminal=True, reward=0.0)
    t.compute_targets()
    return t


@pytest.fixture
def run_dir(tmp_path):
    lines = [dict(mixed_tree().to_dict(), method="trace", step=2), dict(failed_tree(8).to_dict(), step=2)]
    (tmp_path / "trees_trace.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    save_trees(tmp_path / "trees_grpo.jsonl", [failed_tree(9)])  # no method or step keys
    return tmp_path


class Page(HTMLParser):
    """Start tags with their attributes, text data, and the stack of open tags at each text."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.data: list[str] = []
        self.script = self.style = ""
        self._in = ""
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in = tag

    def handle_endtag(self, tag):
        self._in = ""

    def handle_data(self, data):
        if self._in == "script":
            self.script += data
        elif self._in == "style":
            self.style += data
        else:
            self.data.append(data)

    def find(self, tag: str, cls: str = "") -> list[dict]:
        return [a for t, a in self.tags if t == tag and cls in (a.get("class") or "").split() + [""]]


def _sha(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def test_untrusted_text_is_escaped_and_nothing_loads_from_outside(run_dir):
    page = Page(write_tree_html(sorted(run_dir.glob("trees_*.jsonl")), run_dir / "v.html").read_text())
    assert [t for t, _ in page.tags].count("script") == 1 and not page.find("img")
    assert not [a for _, a in page.tags if "src" in a or "href" in a or any(k.startswith("on") for k in a)]
    text = "".join(page.data)
    assert EVIL_ACTION in text and "<img src=x onerror=alert(1)>" in text and "<b>now</b>" in text
    csp = next(a["content"] for t, a in page.tags if t == "meta" and a.get("http-equiv"))
    assert "default-src 'none'" in csp and _sha(page.script) in csp and _sha(page.style) in csp


def test_trees_carry_method_step_and_mixed_and_every_turn_is_shown(run_dir):
    entries = load_entries([run_dir / "trees_trace.jsonl", run_dir / "trees_grpo.jsonl"])
    assert [(e.method, e.step) for e in entries] == [("trace", 2), ("trace", 2), ("grpo", None)]
    page = Page(render_html(entries))
    trees = page.find("details", "tree")
    assert [(a["data-method"], a["data-step"], a["data-mixed"]) for a in trees] == [
        ("trace", "3", "1"),
        ("trace", "3", "0"),
        ("grpo", "", "0"),
    ]
    turns = sum(len(list(e.tree.turns())) for e in entries)
    assert len(page.find("li", "turn")) == turns
    text = " ".join(page.data)
    assert "anchor: q 0.400, K=2, 1 flipped" in text  # failed rollout, V~ 0.4: q = V~; two continuations
    assert "anchor: q 0.300, K=0" in text  # succeeded rollout, V~ 0.7: q = 1 - V~
    assert text.count("continuation 7.1.") == 2 and "3 tokens" in text
    options = [a["value"] for t, a in page.tags if t == "option"]
    assert options == ["", "trace", "grpo", "", "3"]


def test_summary_rows_use_the_metrics(run_dir):
    entries = load_entries([run_dir / "trees_trace.jsonl"])
    page = Page(render_html(entries))
    rows = page.find("tr")
    assert [a.get("data-method") for a in rows] == [None, "trace"]
    assert f"{effective_ratio([e.tree for e in entries]):.3f}" == "0.500"
    cells = [d for d in page.data if d.strip()]
    i = cells.index("trace")
    # 2 trees, 1 mixed; contrast groups: the mixed tree's root and its anchor 7.1; 4 bare rollouts + 2
    # continuations, 1 of them flipped; 2 successes among 6 leaves
    assert cells[i : i + 10] == ["trace", "3", "2", "1", "0.500", "2", "6", "2", "1/2", "0.333"]


def test_trees_in_memory_and_bad_files(tmp_path):
    out = write_tree_html([mixed_tree()], tmp_path / "sub" / "m.html", title="<x>")
    page = Page(out.read_text())
    assert "<x>" in page.data and len(page.find("details", "tree")) == 1
    assert "disabled" in page.find("select")[1]  # no steps known: the step filter is off
    assert Page(render_html([TreeEntry(failed_tree(3), "m", 0)])).find("details", "tree")[0]["data-step"] == "1"
    bad = tmp_path / "trees_x.jsonl"
    bad.write_text(json.dumps(mixed_tree().to_dict()) + "\n{not json\n")
    with pytest.raises(ValueError, match="trees_x.jsonl:2"):
        load_entries([bad])
    with pytest.raises(FileNotFoundError):
        write_tree_html(tmp_path / "nope.jsonl", tmp_path / "n.html")


CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


@pytest.mark.skipif(CHROMIUM is None, reason="needs a headless Chromium")
def test_headless_chromium_runs_the_filters_and_renders(run_dir, tmp_path):
    page = write_tree_html(sorted(run_dir.glob("trees_*.jsonl")), run_dir / "v.html")
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}"]
    url = page.resolve().as_uri() + "#mixed=1&method=trace&open=1"
    dom = subprocess.run([*flags, "--dump-dom", url], check=True, capture_output=True, text=True, timeout=60).stdout
    parsed = Page(dom)
    shown = [a["data-mixed"] for a in parsed.find("details", "tree") if "hidden" not in a]
    assert shown == ["1"] and "1 of 3 trees shown" in "".join(parsed.data)
    assert all("open" in a for a in parsed.find("details", "tree") if "hidden" not in a)
    assert not parsed.find("img")  # the injected tag stayed text after the browser parsed the page
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*flags, "--window-size=1000,800", f"--screenshot={shot}", url], check=True, capture_output=True, timeout=60
    )
    import matplotlib.pyplot as plt

    img = plt.imread(shot)[..., :3]
    assert img.std() > 0.05  # not a blank page
    assert (np.abs(img - np.array([0xCC, 0x88, 0x00]) / 255).max(axis=-1) < 0.08).sum() > 100  # mixed-tree border
