import json
import os

import pytest
from helpers_data import shared_data_or_skip

from trace_rl.envs.data import MATH_FILES, QA_FILES, load_tasks, read_rows, row_to_task


def test_verl_rows_from_jsonl_and_plain_rows(tmp_path):
    rows = [
        {
            "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "What is 2+2?"}],
            "data_source": "gsm8k",
            "reward_model": {"ground_truth": "4"},
            "extra_info": {"split": "train"},
        },
        {"question": "Capital of France?", "golden_answers": ["Paris", "paris"]},
        {"problem": "x?", "answer": 142.0},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    tasks = load_tasks(str(path))
    assert tasks[0]["question"] == "What is 2+2?" and tasks[0]["answer"] == "4" and tasks[0]["data_source"] == "gsm8k"
    assert tasks[1]["answer"] == ["Paris", "paris"] and tasks[2]["answer"] == "142"


def test_parquet_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"prompt": [{"role": "user", "content": "q"}], "reward_model": {"ground_truth": "a"}}]),
        path,
    )
    assert load_tasks(str(path))[0]["answer"] == "a"


def test_parquet_task_files_are_bounded_on_disk_and_decompressed(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from trace_rl import safe_read
    from trace_rl.errors import UserError

    path = tmp_path / "rows.parquet"  # 20 rows of one 100 KB answer: stored once, compressed to almost nothing
    rows = [{"question": f"q{i}", "answer": "7" * 100_000} for i in range(20)]
    pq.write_table(pa.Table.from_pylist(rows), path, compression="zstd")
    size = path.stat().st_size
    assert size < 50_000
    monkeypatch.setitem(safe_read.BOUNDS, "tasks", safe_read.Bound("a task row", 1 << 20, 4 * size))
    with pytest.raises(UserError, match=r"rows.parquet: 100,\d\d\d bytes of rows once decompressed .*bound on a task"):
        read_rows(path)  # a small file over the bound once decompressed, as its metadata declares
    monkeypatch.setitem(safe_read.BOUNDS, "tasks", safe_read.Bound("a task row", 1 << 20, 500_000))
    with pytest.raises(UserError, match=r"rows.parquet: over the 500,000-byte bound on a task file once decoded"):
        read_rows(path)  # the answer, stored once in a dictionary, is 2 MB once decoded for each row
    monkeypatch.setitem(safe_read.BOUNDS, "tasks", safe_read.Bound("a task row", 1 << 20, size - 1))
    with pytest.raises(UserError, match=rf"rows.parquet: {size:,} bytes, over the {size - 1:,}-byte bound"):
        read_rows(path)
    monkeypatch.setitem(safe_read.BOUNDS, "tasks", safe_read.Bound("a task row", 1 << 20, 3 << 20))
    assert len(read_rows(path)) == 20  # within the bound: read as before
    fifo = tmp_path / "fifo.parquet"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="FIFO"):
        read_rows(fifo)  # refused at once, never opened for reading


def test_bad_files_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "a"}\n{oops\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        read_rows(bad)
    with pytest.raises(FileNotFoundError, match="neither a known benchmark"):
        load_tasks("no-such-bench")
    with pytest.raises(ValueError, match="needs a question"):
        row_to_task({"text": "x"})


def test_shared_data_loaders_if_present():
    shared_data_or_skip(*MATH_FILES.values(), *QA_FILES.values())
    sizes = {name: len(load_tasks(name)) for name in list(MATH_FILES) + list(QA_FILES)}
    assert sizes["aime24"] == 30 and sizes["math500"] == 500 and sizes["amc23"] == 40
    assert sizes["minerva"] == 272 and sizes["olympiadbench"] == 675 and sizes["bamboogle"] == 125
    assert sizes["math-train"] == 7470  # two upstream rows have no answer and two an empty one: skipped


# Rows as the upstream preprocessing scripts write them. Each builder copies the script's field layout and
# prompt template; the comment names the script.
GSM8K_Q = "Natalia sold clips to 48 of her friends in April. How many clips did she sell altogether?"
NQ_Q = "who sang i'm gonna be 500 miles?"


def verl_gsm8k_row():  # verl examples/data_preprocess/gsm8k.py
    return {
        "data_source": "openai/gsm8k",
        "prompt": [
            {
                "role": "user",
                "content": GSM8K_Q + " " + 'Let\'s think step by step and output the final answer after "####".',
            }
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "72"},
        "extra_info": {"split": "train", "index": 0, "answer": "48/2 = 24\n#### 72", "question": GSM8K_Q},
    }


def verl_math_row():  # verl examples/data_preprocess/math_dataset.py (no extra_info.question)
    problem = "Find the domain of $\\sqrt{81 - x^2}$."
    return {
        "data_source": "DigitalLearningGmbH/MATH-lighteval",
        "prompt": [
            {
                "role": "user",
                "content": problem + " " + "Let's think step by step and output the final answer within \\boxed{}.",
            }
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "[-9, 9]"},
        "extra_info": {"split": "train", "index": 0},
    }


def skyrl_gsm8k_row():  # SkyRL examples/train/gsm8k/gsm8k_dataset.py
    row = verl_gsm8k_row()
    row["env_class"], row["reward_spec"] = "gsm8k", {"method": "rule", "ground_truth": "72"}
    del row["reward_model"], row["ability"]
    return row


SEARCH_R1_TEMPLATE = (  # Search-R1 scripts/data_process/nq_search.py, make_prefix (template_type 'base')
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: {question}\n"
)


def search_r1_row():  # Search-R1 scripts/data_process/nq_search.py; FlashRAG's own columns left out
    return {
        "data_source": "nq",
        "prompt": [{"role": "user", "content": SEARCH_R1_TEMPLATE.format(question=NQ_Q)}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": ["The Proclaimers", "Proclaimers"]}},
        "extra_info": {"split": "train", "index": 0},
    }


def verl_search_r1_row(spec_key="reward_model"):
    """verl examples/data_preprocess/preprocess_search_r1_dataset.py (spec_key reward_model) and SkyRL
    examples/train/search/searchr1_dataset.py (reward_spec, env_class): both rewrite Search-R1's rows."""
    call, result = ("tool_call", "tool_response") if spec_key == "reward_model" else ("search", "information")
    prefix = (  # DEFAULT_USER_CONTENT_PREFIX of each script
        "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
        "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
        f"engine by <{call}> query </{call}> and it will return the top searched results between <{result}> and "
        f"</{result}>. You can search as many times as you want. If you find no further external knowledge "
        "needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
        "illustrations. For example, <answer> Beijing </answer>. Question: "
    )
    truth = {"target": ["The Proclaimers"]}
    row = {
        "data_source": "searchR1_nq",
        "prompt": [
            {"role": "system", "content": "You are a helpful and harmless assistant."},
            {"role": "user", "content": prefix.rstrip("\n") + NQ_Q},
        ],
        "ability": "fact-reasoning",
        spec_key: {"style": "rule", "ground_truth": truth},
        "extra_info": {
            "index": 0,
            "need_tools_kwargs": True,
            "question": NQ_Q,
            "split": "train",
            "tools_kwargs": {
                "search": {"create_kwargs": {"ground_truth": truth, "question": NQ_Q, "data_source": "searchR1_nq"}}
            },
        },
        "metadata": None,
    }
    if spec_key == "reward_spec":
        row["env_class"] = "search"
    return row


def test_upstream_rows_give_the_bare_question_and_the_answer():
    cases = [
        (verl_gsm8k_row(), GSM8K_Q, "72"),
        (skyrl_gsm8k_row(), GSM8K_Q, "72"),
        (verl_math_row(), "Find the domain of $\\sqrt{81 - x^2}$.", "[-9, 9]"),
        (search_r1_row(), NQ_Q, ["The Proclaimers", "Proclaimers"]),
        (verl_search_r1_row("reward_model"), NQ_Q, "The Proclaimers"),
        (verl_search_r1_row("reward_spec"), NQ_Q, "The Proclaimers"),
    ]
    for row, question, answer in cases:
        task = row_to_task(row, "f")
        assert (task["question"], task["answer"]) == (question, answer), row["data_source"]
    assert row_to_task(verl_search_r1_row())["system"] == "You are a helpful and harmless assistant."
    assert "system" not in row_to_task(verl_gsm8k_row())
    unknown = {"prompt": [{"role": "user", "content": "Please answer: 2+2? Use <calc> tags."}], "answer": "4"}
    assert row_to_task(unknown)["question"] == "Please answer: 2+2? Use <calc> tags."  # unknown template: kept


def test_upstream_files_as_written_parquet_pandas_and_to_json(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pd = pytest.importorskip("pandas")
    import pyarrow.parquet as pq

    files = {
        "gsm8k": (verl_gsm8k_row, "72", GSM8K_Q),
        "skyrl_gsm8k": (skyrl_gsm8k_row, "72", GSM8K_Q),
        "nq": (search_r1_row, ["The Proclaimers", "Proclaimers"], NQ_Q),
        "math": (verl_math_row, "[-9, 9]", "Find the domain of $\\sqrt{81 - x^2}$."),
        "skyrl_search": (lambda: verl_search_r1_row("reward_spec"), "The Proclaimers", NQ_Q),
    }
    for name, (build, answer, question) in files.items():
        rows = [build(), build()]
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / f"{name}.parquet")  # datasets.to_parquet
        pd.DataFrame(rows).to_parquet(tmp_path / f"{name}_pd.parquet", index=False)  # preprocess_search_r1's
        (tmp_path / f"{name}.json").write_text("\n".join(json.dumps(r) for r in rows))  # datasets.to_json: lines
        pd.DataFrame(rows).to_json(tmp_path / f"{name}_pd.json")  # pandas' default {column: {row: value}}
        for suffix in (".parquet", "_pd.parquet", ".json", "_pd.json"):
            tasks = load_tasks(str(tmp_path / f"{name}{suffix}"))
            assert [(t["question"], t["answer"]) for t in tasks] == [(question, answer)] * 2, name + suffix
        # rows that went through pandas hold numpy arrays and numpy scalars
        records = pd.read_parquet(tmp_path / f"{name}.parquet").to_dict("records")
        assert row_to_task(records[0])["answer"] == answer, name


def test_intervals_are_one_answer_and_only_real_lists_are_alternatives():
    assert row_to_task({"problem": "p", "answer": "[-9, 9]"})["answer"] == "[-9, 9]"
    assert row_to_task({"problem": "p", "answer": "(1, 2)"})["answer"] == "(1, 2)"
    assert row_to_task({"problem": "p", "answer": "[a +b, b]"})["answer"] == "[a +b, b]"
    assert row_to_task({"problem": "p", "answer": ["1/2", "0.5"]})["answer"] == ["1/2", "0.5"]
    # a list column flattened to text by str(): an apostrophe inside an alias broke the old quote swap
    text = str(["Shaquille O'Neal", "Shaq"])
    assert row_to_task({"question": "q", "golden_answers": text})["answer"] == ["Shaquille O'Neal", "Shaq"]
    assert row_to_task({"question": "q", "golden_answers": '["Paris", "paris"]'})["answer"] == ["Paris", "paris"]
    with pytest.raises(ValueError, match="answer is empty"):
        row_to_task({"question": "q", "answer": []})


def test_interval_answer_scores_whole_not_per_endpoint():
    pytest.importorskip("math_verify")
    from trace_rl.envs.math_env import math_reward

    truth = row_to_task(verl_math_row())["answer"]
    assert math_reward("[-9, 9]", truth) == 1.0
    assert math_reward("9", truth) == 0.0 and math_reward("-9", truth) == 0.0
