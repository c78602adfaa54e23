import numpy as np
import pytest

from trace_rl.methods import (
    METHODS,
    BudgetPlan,
    allocate_method_prefixes,
    allocate_method_roots,
    get_method,
    uniform_split,
)


@pytest.fixture
def plan():
    return BudgetPlan(prompts=4, rollouts_per_prompt=8, branch_factor=1, pool_factor=3, max_per_prompt=8)


def test_equal_cost_in_rollouts(plan):
    v = np.linspace(0.01, 0.99, plan.pool)
    for method in METHODS.values():
        m = allocate_method_roots(method, v, plan, seed=1)
        roots = int(m.sum())
        prefix = roots * plan.branch_factor if method.branches else 0
        assert roots + prefix == plan.total, method.name
        assert not np.any(m == 1)


def test_uniform_and_pcl_and_active(plan):
    v = np.array([0.0, 1.0, 0.5, 0.45, 0.9, 0.1, 0.55, 1.0, 0.0, 0.6, 0.3, 0.0])
    m = allocate_method_roots(get_method("grpo"), v, plan)
    assert m[:4].tolist() == [8, 8, 8, 8] and m[4:].sum() == 0
    m = allocate_method_roots(get_method("pcl"), v, plan)
    assert sorted(np.flatnonzero(m).tolist()) == [2, 3, 6, 9]
    # PCL's prompts under TRACE's prefix stage: half the budget as bare rollouts (N = 1), spread evenly
    m = allocate_method_roots(get_method("trace_pcl_root"), v, plan)
    assert np.flatnonzero(m).tolist() == [2, 3, 6, 9] and m[[2, 3, 6, 9]].tolist() == [4, 4, 4, 4]
    m = allocate_method_roots(get_method("trace"), v, plan)
    assert m[[0, 1, 7, 8, 11]].sum() == 0  # hopeless and trivial prompts are skipped
    # a root objective weighted by what a group teaches fills the prompts nearest 1/2 (0.45 and 0.55 tie) to m_max
    for name in ("trace_rows", "trace_grad", "trace_grad_unscaled"):
        m = allocate_method_roots(get_method(name), v, plan, seed=1)
        assert m[2] == 8 and sorted(m[[3, 6]].tolist()) == [0, 8] and m.sum() == 16, name
    m = allocate_method_roots(get_method("knapsack_rl"), v, plan)
    assert m[:4].min() >= 2 and m[4:].sum() == 0 and m.sum() == 32
    # as upstream: 24 above the minimums; costs 3 (p = 0.5) + 3 (p = 0.45) = 6 < 24, so 18 go to the p = 0
    # prompt and the DP places 6 (3 each)
    assert m[:4].tolist() == [20, 2, 5, 5]
    m = allocate_method_roots(get_method("knapsack_rl_repaired"), v, plan)
    assert m[:4].tolist() == [2, 2, 14, 14] and m[4:].sum() == 0
    # VIP on the first P, p = [0, 1, 0.5, 0.45] clipped to [1e-6, 1 - 1e-6]: its log term 7e-4 log p is -0.0097
    # for the p = 0 prompt, which outweighs the others' variance, so the optimum is [18.56, 1.01, 6.22, 6.21];
    # the p = 1 prompt's floor (1) is dropped and its rollout goes to the p = 0.5 and 0.45 ones (upstream: the same)
    m = allocate_method_roots(get_method("vip"), v, plan)
    assert m[:4].tolist() == [18, 0, 7, 7] and m[4:].sum() == 0


def test_prefix_strategies():
    rng = np.random.default_rng(0)
    q = np.array([0.0, 0.9, 0.1])
    assert allocate_method_prefixes(get_method("grpo"), q, 4, rng).sum() == 0
    k = allocate_method_prefixes(get_method("trace"), q, 4, rng)
    assert k.sum() == 4 and k[0] == 0 and k[1] >= 2
    k = allocate_method_prefixes(get_method("treepo"), q, 400, rng)
    assert k.sum() == 400 and k.min() > 80  # random branch points ignore q


def test_uniform_split_and_errors():
    assert uniform_split(3, 8).tolist() == [3, 3, 2]
    with pytest.raises(ValueError, match="unknown method"):
        get_method("ppo")
    with pytest.raises(ValueError, match="prompts"):
        BudgetPlan(prompts=0)
    with pytest.raises(ValueError, match="max_per_prompt"):
        BudgetPlan(max_per_prompt=1)


def test_the_pooled_stage2_is_not_a_per_prompt_allocation():
    from trace_rl.methods import allocate_method_prefixes

    with pytest.raises(ValueError, match="trace_mix pools stage 2 over a step's prompts.*executor=local"):
        allocate_method_prefixes(get_method("trace_mix"), np.array([0.3, 0.2]), 2, np.random.default_rng(0))


def test_cost_budget_stage2_buys_what_its_rollouts_would_cost():
    rng = np.random.default_rng(0)
    method = get_method("trace_cost")
    q = np.array([0.5, 0.3])
    # 2 rollouts of 10 tokens buy 20 tokens: one shallow continuation (8 tokens) and three deep ones (4 tokens),
    # 0.5 + 1 - 0.7^3 = 1.16 expected flips, where counting rollouts buys one of each (0.8)
    k = allocate_method_prefixes(method, q, 2, rng, cost=[8, 4], rollout_cost=10.0)
    assert k.tolist() == [1, 3]
    assert allocate_method_prefixes(get_method("trace"), q, 2, rng).tolist() == [1, 1]  # counted: one each
    with pytest.raises(ValueError, match="trace_cost prices continuations"):
        allocate_method_prefixes(method, q, 2, rng)
