"""bench/upstream_code.py: the upstream file an environment variable names is loaded, or refused in one line that
names the variable; an unset variable loads nothing (the checks then skip or say so)."""

import sys
from types import ModuleType

import pytest
from helpers_upstream import upstream_code

VAR = "TRACE_RL_VIP_GP_REFERENCE"


def test_unset_or_empty_loads_nothing_and_the_line_says_what_to_set(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    assert upstream_code.load(VAR) is None
    monkeypatch.setenv(VAR, "  ")
    assert upstream_code.load(VAR) is None
    line = upstream_code.unset_line(VAR)
    assert f"{VAR}=/path/to/gaussian_process.py" in line and "dc365c3" in line and "\n" not in line


def test_a_file_with_the_names_loads(tmp_path, monkeypatch):
    path = tmp_path / "gaussian_process.py"
    path.write_text("class GPR:\n    pass\n")
    monkeypatch.setenv(VAR, str(path))
    assert upstream_code.load(VAR).GPR.__name__ == "GPR"


def test_provided_modules_are_importable_while_the_file_loads_and_gone_after(tmp_path, monkeypatch):
    """An upstream file's `import pkg.sub.mod as x` and `from pkg.sub import mod` resolve to what the caller
    provides (parent packages made up), and nothing of it stays in sys.modules, even when the import fails."""
    path = tmp_path / "gaussian_process.py"
    path.write_text(
        "import fake_verl.utils.torch_functional as verl_F\n"
        "from fake_verl.utils import torch_functional\n"
        "from fake_verl import Proto\n"
        "class GPR:\n    value = verl_F.VALUE\n    same = torch_functional is verl_F\n"
    )
    monkeypatch.setenv(VAR, str(path))
    leaf = ModuleType("fake_verl.utils.torch_functional")
    leaf.VALUE = 7
    provide = {"fake_verl.utils.torch_functional": leaf, "fake_verl": upstream_code.stub("fake_verl", "Proto")}
    module = upstream_code.load(VAR, provide)
    assert module.GPR.value == 7 and module.GPR.same
    assert not [name for name in sys.modules if name.startswith("fake_verl")]
    with pytest.raises(RuntimeError, match="fake_verl.Proto is a stand-in"):
        module.Proto()
    path.write_text("import fake_verl.utils.torch_functional\nimport no_such_module_here\n")
    with pytest.raises(ValueError, match="importing it failed"):
        upstream_code.load(VAR, provide)
    assert not [name for name in sys.modules if name.startswith("fake_verl")]


@pytest.mark.parametrize(
    "text,message",
    [
        (None, "no such file"),
        ("def allocate_rollout():\n    pass\n", "defines no GPR; want src/vip/success_rate_prediction"),
        ("import no_such_module_here\n", "importing it failed: ModuleNotFoundError"),
    ],
)
def test_a_wrong_file_is_one_line_naming_the_variable(tmp_path, monkeypatch, text, message):
    path = tmp_path / "x.py"
    if text is not None:
        path.write_text(text)
    monkeypatch.setenv(VAR, str(path))
    with pytest.raises(ValueError, match=message) as err:
        upstream_code.load(VAR)
    assert str(err.value).startswith(f"{VAR}={path}: ") and "\n" not in str(err.value)


def test_every_variable_names_a_pinned_commit_and_what_the_checks_call():
    assert set(upstream_code.REFERENCES) == {
        "TRACE_RL_VIP_REFERENCE",
        "TRACE_RL_VIP_GP_REFERENCE",
        "TRACE_RL_KNAPSACK_REFERENCE",
        "TRACE_RL_TREE_GRPO_REFERENCE",
        "TRACE_RL_TREE_GRPO_TRAINER_REFERENCE",
        "TRACE_RL_TREEPO_REFERENCE",
        "TRACE_RL_TREEPO_WHITEN_REFERENCE",
    }
    for ref in upstream_code.REFERENCES.values():
        assert len(ref.commit) == 40 and ref.names and ref.path.endswith(".py")
