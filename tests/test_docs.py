"""The README and docs/ point at things that exist, and the README's commands name settings that exist.

Links: every relative Markdown link or image in README.md and docs/**/*.md resolves to a file or folder of
the repository, and a `#fragment` to a heading of the target (GitHub's anchor spelling: lower case, spaces to
hyphens, punctuation dropped). External links (http, mailto) are not fetched.

Commands: every `trace-rl CMD ...` line in a code block of the README or docs/usage.md names a command and only
keys that the command's config declares (the same parser as the command line), so a renamed key shows up here.
The values are not checked: they name paths and models that exist only where the README's reader runs them.
"""

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "results" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PAGES += sorted((ROOT / "lab").rglob("*.md"))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _anchors(page: Path) -> set[str]:
    out = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    text = re.sub(r"`[^`\n]*`", "", text)
    return LINK.findall(text)


def broken_links(page: Path) -> list[str]:
    bad = []
    for target in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
            bad.append(f"{target} (no heading #{fragment} in {dest.name})")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_the_link_check_catches_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "b.md").write_text("# Real heading, with `code`\n")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md) [ok](b.md#real-heading-with-code) [web](https://example.org/x) `[not](a-link.md)`\n"
        "[gone](c.md) [bad](b.md#nowhere)\n"
    )
    assert broken_links(page) == ["c.md (no such file)", "b.md#nowhere (no heading #nowhere in b.md)"]


def readme_commands(page: Path = ROOT / "README.md") -> list[str]:
    """Each `trace-rl ...` command of a code block of `page`, continuation lines joined, comments dropped."""
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", page.read_text(), flags=re.S)
    text = "\n".join(blocks).replace("\\\n", " ")
    return [line.split("#")[0].strip() for line in text.splitlines() if line.strip().startswith("trace-rl ")]


def test_readme_commands_name_known_commands_and_keys():
    pytest.importorskip("torch")  # the LM commands' configs import the training layer
    from trace_rl.cli import COMMANDS
    from trace_rl.config import _overrides

    commands = COMMANDS
    found = readme_commands()
    assert len(found) >= 10, "the README's command block was not found"
    reference = readme_commands(ROOT / "docs" / "usage.md")
    assert len(reference) >= 20, "docs/usage.md's command block was not found"
    found += reference
    for line in found:
        name, *args = shlex.split(line)[1:]
        assert name in commands, f"{line}: no command {name!r}"
        positional = commands[name].positional
        if positional:  # `trace-rl view FILE ...`: what the command line does with a bare argument
            args = [a if "=" in a or a.startswith("--") else f"{positional}={a}" for a in args]
        _overrides(commands[name].config_class(), args)  # raises ConfigError naming an unknown key


def test_the_readme_is_a_front_door():
    """At most 180 lines, results at most 45 of them, and its commands are `trace-rl` and `make` only."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 180
    results = text.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    assert len(results.splitlines()) <= 45
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", text, flags=re.S)
    for line in filter(str.strip, "\n".join(blocks).splitlines()):
        assert line.startswith(("trace-rl ", "make ")), f"README command that is not trace-rl or make: {line}"


@pytest.mark.parametrize("page", ["README.md", "results/README.md"])
def test_each_published_table_is_what_report_prints_from_the_stored_runs(page):
    """Every `<!-- report:NAME -->` block of the page equals `trace-rl report`'s rendering of NAME from results/."""
    pytest.importorskip("torch")  # the tables read runs through trace_rl.train.compare
    from trace_rl.commands.report import blocks, render

    shown = blocks((ROOT / page).read_text())
    assert shown, f"{page} shows no report block"
    rendered, missing = render(ROOT / "results", list(shown))
    assert missing == {}
    for name, table in shown.items():
        assert table == rendered[name], f"{page}: the {name} table differs from `trace-rl report tables={name}`"


def test_the_repository_stays_a_library():
    """Tracked files, shipped warm starts included, total at most 12 MB: run data lives in the compact store."""
    import subprocess

    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = [ROOT / f for f in listed.decode().split("\0") if f]
    total = sum(f.stat().st_size for f in files if f.is_file())
    assert total <= 12_000_000, f"tracked files total {total / 1e6:.1f} MB"
