"""Local task data: JSON arrays, JSON Lines under a .json name, and Parquet are read as rows, with nothing
printed; malformed files give one error naming the task and the file."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evaluators.data import load_rows
from evaluators.errors import DataError

ROWS = [{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "answer": "4"}]


def test_json_array_jsonl_named_json_and_parquet_give_the_same_rows_and_print_nothing(tmp_path, capfd):
    (tmp_path / "array.json").write_text(json.dumps(ROWS))
    (tmp_path / "lines.json").write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "table.parquet")
    for name in ("array.json", "lines.json", "table.parquet"):
        assert load_rows(str(tmp_path / name), "t", ("question", "answer")) == ROWS
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # no progress bar from a dataset cache


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"question": "1+1?"', "is not valid JSON (line 1"),
        ('{"rows": []}', "holds a JSON dict, not an array of records"),
        ("[]", "holds no rows"),
    ],
)
def test_malformed_json_names_the_task_and_the_file(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(DataError) as error:
        load_rows(str(path), "gsm8k", ("question",))
    assert (
        message in str(error.value) and "Task 'gsm8k'" in str(error.value) and str(path) in str(error.value)
    )


def test_a_row_lacking_a_field_is_named(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([ROWS[0], {"question": "3+3?"}]))
    with pytest.raises(DataError, match=r"row 2 of .* lacks the field\(s\) answer"):
        load_rows(str(path), "gsm8k", ("question", "answer"))
