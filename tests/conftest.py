import os

import pytest

from trace_rl.tree import BRANCH, RolloutTree

# Every Ray cluster a test starts (in this process or a child) registers its node on 127.0.0.1 and listens there:
# Ray reads the switch when it is imported, so it is set before any test module can import it (issue 50, item 7).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(autouse=True, scope="session")
def _own_model_cache(tmp_path_factory):
    """The suite never reads or writes the user's model cache (warm starts, converted models): a test that needed
    the real warm start would find none here, rather than a stale one there."""
    import os

    old = os.environ.get("TRACE_RL_CACHE")
    os.environ["TRACE_RL_CACHE"] = str(tmp_path_factory.mktemp("trace-rl-cache"))
    yield
    if old is None:
        os.environ.pop("TRACE_RL_CACHE", None)
    else:
        os.environ["TRACE_RL_CACHE"] = old


@pytest.fixture
def env_module(tmp_path, monkeypatch):
    """Writes an environment plug-in module of one's own (`env_module(name, source)`) where `env.name=name:attr`
    finds it, with the registry's caches emptied; the module is forgotten after the test."""
    import sys

    from trace_rl.envs import registry
    from trace_rl.stack import env_config

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_RESOLVED", {})
    monkeypatch.setattr(env_config, "_CLASSES", {})
    written = []

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(source)
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


@pytest.fixture
def small_tree() -> RolloutTree:
    """Two bare rollouts (success, failure) and one branch from the failure's first turn that succeeds.

    0 ── 0.0 ── 0.0.0 (r=1)
     └── 0.1 ── 0.1.0 (r=0)
              └ 0.1.1 (r=1, branch)
    """
    tree = RolloutTree(0, prompt="p0")
    a = tree.add_turn("0", action="a", token_ids=[1, 2], loss_mask=[1, 1])
    tree.add_turn(a.node_id, action="b", terminal=True, reward=1.0)
    c = tree.add_turn("0", action="c")
    tree.add_turn(c.node_id, action="d", terminal=True, reward=0.0)
    tree.add_turn(c.node_id, action="e", terminal=True, reward=1.0, origin=BRANCH)
    return tree
