import numpy as np
import pytest

from trace_rl.testbed import propositions
from trace_rl.testbed.propositions import _max_z, check_propositions, report_lines, verdicts


@pytest.fixture(scope="module")
def result():
    return check_propositions(tasks=16, episodes=400, seed=1)


def test_the_propositions_pass_on_the_testbed(result):
    checks = verdicts(result)
    assert len(checks) == 4 and all(v.passed for v in checks)
    lines = report_lines(result)
    assert sum(line.lstrip().startswith("PASS") for line in lines) == 4 and lines[-1] == "all checks passed"


def test_each_threshold_fails_a_result_just_past_it(result):
    bad = dict(result, prop1_max_rise_exact=1e-6, prop2_max_abs_gap_exact=2e-9, prop1_mc_max_z=4.5)
    bad["prop2_mc_qv"] = bad["prop2_v0_1_minus_v0"] + 3.2 * bad["prop2_mc_stderr"]
    checks = verdicts(bad)
    assert not any(v.passed for v in checks)
    assert report_lines(bad)[-1] == "4 of 4 checks FAILED"
    assert sum(line.lstrip().startswith("FAIL") for line in report_lines(bad)) == 4


def test_a_value_function_that_is_not_a_martingale_fails(monkeypatch):
    values = propositions._values

    def off(policy, task):  # V shifted towards 1/2 at every inner turn: no longer E[V_{t+1} | H_t]
        V = values(policy, task)
        V[:-1] = 0.9 * V[:-1] + 0.05
        return V

    monkeypatch.setattr(propositions, "_values", off)
    failed = {v.name.split(":")[0] for v in verdicts(check_propositions(tasks=8, episodes=300, seed=0)) if not v.passed}
    assert "Proposition 2, exact" in failed and "Proposition 1, Monte Carlo" in failed


def test_max_z_counts_standard_errors_and_needs_exact_agreement_without_spread():
    assert _max_z(np.array([0.3, -0.2]), np.array([0.1, 0.1])) == pytest.approx(3.0)
    assert _max_z(np.array([0.0, 0.0]), np.array([0.1, 0.0])) == 0.0
    assert _max_z(np.array([0.0, 1e-6]), np.array([0.1, 0.0])) == np.inf


def test_the_command_exits_non_zero_when_a_check_fails(monkeypatch, capsys):
    from trace_rl.cli import main

    assert main(["propositions", "tasks=8", "episodes=300"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("all checks passed")
    values = propositions._values
    monkeypatch.setattr(propositions, "_values", lambda p, t: 0.9 * values(p, t) + 0.05)  # not a martingale
    with pytest.raises(SystemExit) as exc:
        main(["propositions", "tasks=8", "episodes=300"])
    assert exc.value.code == 1
    assert "checks FAILED" in capsys.readouterr().out
