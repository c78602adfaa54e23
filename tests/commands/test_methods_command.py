"""`trace-rl methods` and the README's method table: one set of entries, stable methods first."""

from pathlib import Path

from trace_rl.cli import main
from trace_rl.commands.methods import listed_methods, methods_markdown, methods_text
from trace_rl.trace_config import METHODS, Method, register_method

README = Path(__file__).resolve().parents[2] / "README.md"
BEGIN, END = "<!-- methods:begin -->\n", "<!-- methods:end -->\n"


def test_the_readme_table_is_the_one_rendered_from_the_registry():
    text = README.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "README.md lost its methods markers"
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert block == methods_markdown(), (
        "README.md's method table differs from the registry's: paste `trace-rl methods markdown=true` between "
        "its methods markers"
    )


def test_every_method_is_listed_once_stable_first_with_what_it_changes_and_when_to_use_it():
    listed = listed_methods()
    assert sorted(m.name for m in listed) == sorted(METHODS)
    statuses = [m.status for m in listed]
    assert statuses == sorted(statuses, key=["stable", "experimental"].index)
    stable = {m.name for m in listed if m.status == "stable"}
    assert stable == {
        "trace",
        "trace_uniform",
        "trace_root_only",
        "trace_prefix_only",
        "trace_oracle",
        "grpo",
        "pcl",
        "knapsack_rl",
        "vip",
        "treepo",
        "tree_grpo",
    }
    assert all(m.changes and m.use for m in listed)
    rows = [line for line in methods_markdown().splitlines() if line.startswith("| `")]
    named = [name for row in rows for name in row.split(" | ")[0].split("`")[1::2]]
    assert named == [m.name for m in listed]  # every method in the README's table once, in the listing's order


def test_the_command_prints_the_listing_and_a_registered_method_joins_it(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert out == methods_text()
    assert out.index("stable:") < out.index("trace ") < out.index("experimental:") < out.index("trace_cost")
    mine = register_method(Method("mine_flat", "uniform", "none", "grpo", changes="x | y", use="never"))
    try:
        assert main(["methods", "markdown=true"]) == 0
        out = capsys.readouterr().out
        assert "`trace_mix`, `mine_flat` | experimental |" in out
        assert main(["methods"]) == 0
        assert "mine_flat              x | y" in capsys.readouterr().out
    finally:
        METHODS.unregister(mine.name)
    assert "mine_flat" not in METHODS
