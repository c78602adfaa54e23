import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trace_rl.lm.tokenizer import byte_tokenizer  # noqa: E402
from trace_rl.predictors.lm_critic import LMCritic  # noqa: E402
from trace_rl.tree import RolloutTree  # noqa: E402


def grown_tree(idx=0, question="Compute 3 +4 left to right."):
    tree = RolloutTree(idx, prompt={"question": question})
    for j in range(3):
        a = tree.add_turn(str(idx), action=f"Action: calc[3+{j}]", observation=f"{3 + j}. Next: answer")
        b = tree.add_turn(
            a.node_id,
            action=f"Action: answer[{3 + j}]",
            observation="Correct." if j == 1 else "Wrong.",
            terminal=True,
            reward=float(j == 1),
        )
        assert b
    tree.compute_targets()
    return tree


def causal_critic(**kw):
    from transformers import LlamaConfig, LlamaModel

    tok = byte_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    critic = LMCritic(LlamaModel(cfg), tok, **kw)
    torch.nn.init.normal_(critic.head.weight, std=1.0)  # a non-constant head, so scores differ by prefix
    return critic


def test_shared_prefix_scores_equal_scoring_each_prefix_alone():
    critic = causal_critic()
    trees = [grown_tree(0), grown_tree(1, "Compute 9 *2 left to right.")]
    prefixes = [(t, n) for t in trees for n in t.nodes]
    shared = critic.predict(prefixes)
    alone = np.array([critic.predict([p])[0] for p in prefixes])
    assert np.allclose(shared, alone, atol=1e-5)
    assert np.all((shared > 0) & (shared < 1)) and np.ptp(shared) > 1e-4
    critic.stats.update(tokens_encoded=0, tokens_naive=0)
    critic.predict(prefixes)
    assert critic.stats["tokens_encoded"] < 0.6 * critic.stats["tokens_naive"]  # the prompt is not recomputed


def test_shared_prefix_scores_equal_encoding_each_path_whole_without_a_cache():
    # scoring "alone" above shares the cache path too; a dropped cache (transformers < 5.24 ignores `cache=`)
    # shows only against a plain forward over each prefix's whole text
    from trace_rl.predictors.lm_critic import _segments

    critic = causal_critic()
    tree = grown_tree(0)
    prefixes = [(tree, n) for n in tree.nodes]
    shared = critic.predict(prefixes)
    with torch.no_grad():
        whole = []
        for _, n in prefixes:
            ids, _ = critic._ids(_segments(tree, n))
            h, _ = critic._hidden([ids])
            whole.append(float(critic._score_hidden(h)[0, len(ids) - 1]))
    assert np.allclose(shared, whole, atol=1e-5)


def test_left_truncation_keeps_the_end_of_the_history():
    critic = causal_critic(max_length=24)
    tree = grown_tree(0, "x" * 200)
    ids, ends = critic._ids(["x" * 200 + "\n", "Action: answer[4]\n"])
    assert len(ids) == 24 and critic.tok.decode(ids).endswith("Action: answer[4]\n")
    s = critic.predict([(tree, "0.1.0"), (tree, "0")])
    assert np.all(np.isfinite(s))


def test_training_moves_scores_toward_targets():
    critic = causal_critic(lr=3e-3, epochs=3, train_backbone=True)
    torch.nn.init.zeros_(critic.head.weight)  # start at 0.5 everywhere
    tree = grown_tree(0)
    prefixes = [(tree, n.node_id) for n in tree.leaves()]
    y = np.array([tree[n].target for _, n in prefixes])
    before = np.abs(critic.predict(prefixes) - y).mean()
    for _ in range(5):
        critic.update(prefixes, y)
    assert np.abs(critic.predict(prefixes) - y).mean() < before


def test_encoder_backbone_and_save_load(tmp_path):
    from transformers import BertConfig, BertModel

    tok = byte_tokenizer()
    cfg = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        pad_token_id=tok.pad_token_id,
    )
    critic = LMCritic(BertModel(cfg), tok, lr=0.05)
    assert not critic.causal
    tree = grown_tree(0)
    prefixes = [(tree, n) for n in tree.nodes]
    critic.update(prefixes, np.array([tree[n].target for _, n in prefixes]))
    s = critic.predict(prefixes)
    critic.save(tmp_path / "c")
    other = LMCritic(BertModel(cfg), tok)
    other.model.load_state_dict(critic.model.state_dict())
    other.load(tmp_path / "c")
    assert np.allclose(other.predict(prefixes), s, atol=1e-6)


def test_missing_backbone_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="cannot load critic backbone"):
        LMCritic("./no/such/critic")
