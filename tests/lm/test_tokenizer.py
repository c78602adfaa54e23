import pytest

pytest.importorskip("transformers")

from trace_rl.envs.calculator import SYSTEM, make_tasks, solve  # noqa: E402
from trace_rl.lm.tokenizer import word_tokenizer  # noqa: E402


def test_word_tokenizer_keeps_words_whole_and_digits_single():
    tok = word_tokenizer()
    pieces = [tok.decode([i]) for i in tok("Action: calc[142*3]", add_special_tokens=False).input_ids]
    assert pieces == ["Action", ":", " ", "calc", "[", "1", "4", "2", "*", "3", "]"]
    assert len(tok) < 200  # ten digit tokens, not one per number: a tiny model learns one copying circuit
    for task in make_tasks(20, seed=0):
        for text in [SYSTEM, task["question"], *solve(task)]:
            ids = tok(text, add_special_tokens=False).input_ids
            assert tok.unk_token_id not in ids and tok.decode(ids) == text


def test_word_tokenizer_has_a_chat_template():
    tok = word_tokenizer()
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Compute 1 +2 left to right."}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n")
