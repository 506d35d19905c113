from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_gsm8k() -> Path:
    path = SHARED / "data" / "gsm8k" / "test.jsonl"
    assert path.is_file(), (
        f"the tests need ../shared/data/gsm8k/test.jsonl beside the checkout (looked at {path})"
    )
    return path
