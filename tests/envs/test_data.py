import json

import pytest

from trace_rl.envs.data import MATH_FILES, QA_FILES, data_root, load_tasks, read_rows, row_to_task


def test_verl_rows_from_jsonl_and_plain_rows(tmp_path):
    rows = [
        {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "What is 2+2?"}],
         "data_source": "gsm8k", "reward_model": {"ground_truth": "4"}, "extra_info": {"split": "train"}},
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
    pq.write_table(pa.Table.from_pylist([{"prompt": [{"role": "user", "content": "q"}],
                                          "reward_model": {"ground_truth": "a"}}]), path)
    assert load_tasks(str(path))[0]["answer"] == "a"


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
    try:
        data_root()
    except FileNotFoundError:
        pytest.skip("shared/data is not here")
    sizes = {name: len(load_tasks(name)) for name in list(MATH_FILES) + list(QA_FILES)}
    assert sizes["aime24"] == 30 and sizes["math500"] == 500 and sizes["amc23"] == 40
    assert sizes["minerva"] == 272 and sizes["olympiadbench"] == 675 and sizes["bamboogle"] == 125
    assert sizes["math-train"] == 7472  # two upstream rows have no answer and are skipped
