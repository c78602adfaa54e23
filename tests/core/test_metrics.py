from trace_rl.metrics import continuation_flips, contrast_groups, effective_ratio, mean_reward, tree_budget
from trace_rl.tree import BRANCH, RolloutTree


def test_metrics_on_small_tree(small_tree):
    small_tree.compute_targets()
    idle = RolloutTree(7)  # a skipped prompt: not active, not counted
    pure = RolloutTree(8)
    pure.add_turn("8", terminal=True, reward=1.0)
    pure.add_turn("8", terminal=True, reward=1.0)
    pure.compute_targets()
    assert effective_ratio([small_tree, idle, pure]) == 0.5
    b = tree_budget([small_tree, pure])
    assert (b.bare_rollouts, b.continuations, b.rollouts) == (4, 1, 5)
    assert b.turns == 7 and b.prefix_turns == 1
    assert contrast_groups([small_tree, pure]) == 2  # root (1 vs 0.5) and node 0.1 (0 vs 1)
    assert mean_reward([small_tree]) == 2 / 3
    assert effective_ratio([]) == 0.0


def test_continuation_flips_count_outcomes_unlike_the_anchor_rollout(small_tree):
    assert continuation_flips([small_tree]) == (1, 1)  # 0.1.1 succeeded where its rollout failed
    small_tree.add_turn("0.0", terminal=True, reward=1.0, origin=BRANCH)  # same outcome as rollout 0.0
    small_tree.add_turn("0.0", terminal=True, reward=0.0, origin=BRANCH)  # flipped
    assert continuation_flips([small_tree]) == (2, 3)
    assert continuation_flips([RolloutTree(5)]) == (0, 0)
