"""The environment registry: built-ins by name, a plug-in of one's own from `module:attr` or an entry point, one
line for a name that is not there, and the helpers a plug-in uses."""

import re
import sys
import textwrap
from pathlib import Path

import pytest

from trace_rl.envs import registry
from trace_rl.envs.registry import EnvPlugin, EnvSpec, env_plugin, get_env, register_env, resolve_env, sample_rows

PLUGIN_SOURCE = textwrap.dedent(
    """
    from dataclasses import dataclass

    from trace_rl.envs.base import ToolEnv
    from trace_rl.envs.registry import EnvSpec, env_plugin


    class Echo(ToolEnv):
        tools, system = ("answer",), "Repeat the word. Action: answer[word]"

        def act(self, parsed):
            self.done = True
            return "Done.", float(parsed.argument == self.task["answer"]), {"valid_action": True}


    @dataclass
    class EchoSettings:
        word: str = "hello"  # the word to repeat


    def tasks(count, seed, word):
        return [{"index": i, "question": f"Say {word} ({seed})", "answer": word} for i in range(count)]


    @env_plugin("echo", EchoSettings)
    def echo(settings):
        return EnvSpec(Echo, {"echo": lambda n: tasks(n or 4, 0, settings.word)},
                       lambda count, seed: tasks(count, seed, settings.word), max_new_tokens=8)


    class Shout(ToolEnv):
        tools, system = ("answer",), "Shout."

        @dataclass
        class Settings:
            loud: bool = True  # shout

        @classmethod
        def spec(cls, settings):
            return EnvSpec(cls, {"shout": lambda n: []}, lambda count, seed: [])


    def not_a_plugin():
        return 1
    """
)


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    """A module of one's own environments on sys.path, forgotten afterwards (module and resolved names)."""
    name = f"my_envs_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(PLUGIN_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_RESOLVED", {})
    yield name
    sys.modules.pop(name, None)


def test_the_built_ins_resolve_by_name_to_their_own_groups():
    for name in registry.BUILTINS:
        assert resolve_env(name).name == name
    assert resolve_env("calculator").settings.__name__ == "CalculatorSettings"
    assert resolve_env("bfcl").settings.__name__ == "BFCLSettings"


def test_an_unknown_name_is_one_line_listing_what_is_registered():
    with pytest.raises(ValueError) as info:
        resolve_env("chess")
    message = str(info.value)
    assert "\n" not in message and "'chess'" in message
    assert all(name in message for name in registry.BUILTINS) and "module:attr" in message


def test_a_plugin_of_ones_own_loads_from_module_attr_with_its_settings(plugin_module):
    plugin = resolve_env(f"{plugin_module}:echo")
    assert isinstance(plugin, EnvPlugin) and plugin.name == "echo"
    spec = get_env(f"{plugin_module}:echo", word="bye")
    assert spec.train(2, 7) == [{"index": i, "question": "Say bye (7)", "answer": "bye"} for i in range(2)]
    env = spec.make()
    assert env.reset(spec.held_out(1, 0)[0]) == "Say bye (0)"
    assert env.step("Action: answer[bye]")[1:3] == (1.0, True)
    with pytest.raises(ValueError, match="has no setting colour; its settings: word$"):
        get_env(f"{plugin_module}:echo", colour="red")  # not one of its settings


def test_a_class_with_a_spec_classmethod_is_a_plugin_named_after_it(plugin_module):
    plugin = resolve_env(f"{plugin_module}:Shout")
    assert plugin.name == "shout" and plugin.settings().loud is True
    assert isinstance(plugin.spec(), EnvSpec)


def test_a_wrong_module_attribute_or_target_is_one_line(plugin_module):
    cases = {
        "no_such_module_xyz:env": "no module 'no_such_module_xyz'",
        f"{plugin_module}:missing": "has no 'missing'",
        f"{plugin_module}:not_a_plugin": "not an environment",
        f"{plugin_module}:": "is not module:attr",
    }
    for name, said in cases.items():
        with pytest.raises(ValueError, match=said) as info:
            resolve_env(name)
        assert "\n" not in str(info.value)


def test_an_import_error_inside_a_plugin_module_is_not_hidden(tmp_path, monkeypatch):
    (tmp_path / "broken_env_mod.py").write_text("import a_package_that_is_not_installed_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="a_package_that_is_not_installed_xyz"):
        resolve_env("broken_env_mod:env")
    sys.modules.pop("broken_env_mod", None)


def test_an_installed_entry_point_names_an_environment(plugin_module, tmp_path):
    """A distribution's entry point of the group trace_rl.envs, found as pip would install it (a dist-info folder on
    sys.path), without importing its module until the name is chosen."""
    dist = tmp_path / "my_envs_dist-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-envs-dist\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[trace_rl.envs]\nechoed = {plugin_module}:echo\n")
    assert "echoed" in registry.registered_envs()
    assert plugin_module not in sys.modules  # listing the names imports nothing
    assert resolve_env("echoed").name == "echo"
    assert get_env("echoed").train(1, 0)[0]["answer"] == "hello"


def test_a_registered_plugin_wins_over_a_built_in_of_its_name(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTERED", {})
    monkeypatch.setattr(registry, "_RESOLVED", {})
    mine = register_env(EnvPlugin("calculator", lambda: EnvSpec(object, {}, lambda c, s: [])))
    assert resolve_env("calculator") is mine
    assert registry.registered_envs()[0] == "calculator"


def test_a_plugin_is_checked_when_made_and_when_built():
    for bad in ("name", "two words", "class", ""):
        with pytest.raises(ValueError, match="identifier"):
            EnvPlugin(bad, lambda: None)
    with pytest.raises(ValueError, match="dataclass"):
        EnvPlugin("x", lambda s: None, settings=dict)
    with pytest.raises(TypeError, match="not an EnvSpec"):
        env_plugin("x")(lambda: {"make": object}).spec()
    with pytest.raises(ValueError, match="^env bfcl has no setting sandbox; its settings: call_timeout_s, steps_per"):
        get_env("bfcl", sandbox="weak")
    register_env(EnvPlugin("plain", lambda: EnvSpec(object, {}, lambda c, s: [])))
    try:
        with pytest.raises(ValueError, match="^env plain has no settings, got size$"):
            get_env("plain", size=3)
    finally:
        registry._REGISTERED.pop("plain")
        registry._RESOLVED.pop("plain", None)


def test_sample_rows_draws_a_seeded_reindexed_order_repeating_when_short():
    rows = [{"index": 10 + i, "question": str(i)} for i in range(3)]
    draw = sample_rows(lambda: rows)
    got = draw(7, seed=1)
    assert [r["index"] for r in got] == list(range(7))
    assert sorted(r["question"] for r in got[:3]) == ["0", "1", "2"]  # each row once before any repeats
    assert got == draw(7, seed=1) and got != draw(7, seed=2)
    with pytest.raises(ValueError, match="empty"):
        sample_rows(list)(1, 0)


def test_the_example_on_the_docs_page_is_an_environment(tmp_path, monkeypatch):
    """docs/environments.md's "Your own environment" example, run as written: tasks at its setting, a right answer
    rewarded, a fork that leaves its parent alone."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "environments.md").read_text()
    code = re.search(r"```python\n(.*?)```", page.split("## Your own environment", 1)[1], re.S).group(1)
    (tmp_path / "my_envs_doc.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_RESOLVED", {})
    try:
        spec = get_env("my_envs_doc:parity", largest=9)
        tasks = spec.train(20, 1)
        assert tasks == spec.train(20, 1) and {int(t["question"].split()[1]) for t in tasks} <= set(range(10))
        env = spec.make()
        assert env.reset(tasks[0]) == tasks[0]["question"]
        fork = env.fork()
        assert fork.step(f"Action: answer[{tasks[0]['answer']}]")[1:3] == (1.0, True)
        assert not env.done  # the fork's answer ended the fork, not its parent
        assert env.step("Action: answer[neither]")[1:3] == (0.0, True)
        assert len(spec.benchmarks["parity"](None)) == 200
    finally:
        sys.modules.pop("my_envs_doc", None)
