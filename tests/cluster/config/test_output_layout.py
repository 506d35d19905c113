"""The OpenCompass layout's settings: given only with the layout, pass@k only where a question has k samples,
and a run's test_range checked when the config is read."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cluster.config import OutputLayout, RunConfig


def test_layout_settings_need_the_layout():
    with pytest.raises(ValidationError, match="--work-dir, --pass-k set\\(s\\) the OpenCompass layout"):
        RunConfig(work_dir="/tmp/x", pass_k=[1])
    config = RunConfig(output_layout="opencompass", work_dir="/tmp/x", num_samples=4, pass_k=[1, 4])
    assert config.output_layout is OutputLayout.OPENCOMPASS and config.pass_k == [1, 4]


def test_pass_at_k_needs_k_samples_a_question():
    with pytest.raises(ValidationError, match="--pass-k 5 needs at least 5 samples a question"):
        RunConfig(output_layout="opencompass", num_samples=4, pass_k=[1, 5])


def test_a_bad_test_range_is_refused_when_the_config_is_read():
    with pytest.raises(ValidationError, match="test_range '\\[:n\\]'"):
        RunConfig(test_range="[:n]")
    with pytest.raises(ValidationError, match="tasks.0.test_range"):
        RunConfig(tasks=[{"name": "gsm8k", "test_range": "[::0"}])
