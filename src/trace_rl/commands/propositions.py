"""`trace-rl propositions`: the paper's Propositions 1 and 2 checked on the testbed (`testbed.propositions`); a
failed check fails the command (exit code 1), so CI and `make evidence` see it."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import check_count


@dataclass
class PropositionsConfig:
    """`trace-rl propositions`: check the paper's Propositions 1 and 2 on the testbed."""

    tasks: int = 64  # testbed tasks to check exactly
    episodes: int = 4000  # Monte Carlo episodes
    seed: int = 0  # one seed reproduces the Monte Carlo figures

    def __post_init__(self):
        # about 2 ms a task and 0.2 ms an episode on one core: the bounds are minutes, not days
        check_count("tasks", self.tasks, 100_000, why="about 3 minutes")
        check_count("episodes", self.episodes, 1_000_000, why="about 4 minutes")


def run(cfg: PropositionsConfig, yaml_text: str = "") -> dict:
    """Print the report; a failed check raises SystemExit(1), so a return means {'passed': True}."""
    from ..testbed.propositions import check_propositions, report_lines, verdicts

    r = check_propositions(tasks=cfg.tasks, episodes=cfg.episodes, seed=cfg.seed)
    print("\n".join(report_lines(r)))
    if not all(v.passed for v in verdicts(r)):
        raise SystemExit(1)  # a failed check is a failed command (CI and `make evidence` must see it)
    return {"passed": True}
