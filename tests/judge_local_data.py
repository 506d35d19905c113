"""Small local data files for the judged tasks, in each task's own fields (the packaged data has prompts
and reference answers far longer than the 135M test model's context; these keep a judge prompt short)."""

from __future__ import annotations

import json
from pathlib import Path

ALPACA = [
    ("Name three primary colors.", "Red, blue and yellow."),
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Give a synonym for 'happy'.", "Joyful."),
    ("How many legs does a spider have?", "A spider has eight legs."),
]
ARENA = [
    ("Write one sentence about the sea.", "The sea is vast and blue."),
    ("What is 2 + 2?", "2 + 2 = 4."),
    ("Suggest a name for a cat.", "Whiskers."),
]
HEALTH = [
    (
        "I have a mild headache after working at a screen all day. What can I do?",
        [
            ("Suggests taking a break from the screen.", 5),
            ("Suggests drinking water.", 3),
            ("Recommends going to the emergency room immediately.", -4),
        ],
    ),
    (
        "Is it safe to exercise with a cold?",
        [
            ("Says light exercise is usually fine with mild symptoms.", 5),
            ("Mentions resting if feverish.", 4),
        ],
    ),
]
WRITING = [
    ("Write a two-line poem about rain.", ["Imagery", "Brevity"]),
    ("Write a short thank-you note to a teacher.", ["Warmth"]),
]


def _write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_judge_data(folder: Path) -> dict[str, Path]:
    """One small data file per judged task; returns task name -> path (for --data-path TASK=PATH)."""
    bands = {"1-2": "poor", "3-4": "weak", "5-6": "fair", "7-8": "good", "9-10": "excellent"}
    return {
        "alpaca_eval": _write(
            folder / "alpaca_eval.jsonl",
            [
                {"instruction": q, "output": a, "generator": "reference", "dataset": "local"}
                for q, a in ALPACA
            ],
        ),
        "arena_hard": _write(
            folder / "arena_hard.jsonl",
            [
                {"uid": f"q{i}", "prompt": q, "baseline_answer": a, "category": "hard_prompt"}
                for i, (q, a) in enumerate(ARENA)
            ],
        ),
        "healthbench": _write(
            folder / "healthbench.jsonl",
            [
                {
                    "prompt_id": f"h{i}",
                    "prompt": [{"role": "user", "content": q}],
                    "rubrics": [{"criterion": c, "points": p, "tags": []} for c, p in items],
                }
                for i, (q, items) in enumerate(HEALTH)
            ],
        ),
        "writingbench": _write(
            folder / "writingbench.jsonl",
            [
                {
                    "index": str(i),
                    "query": q,
                    "checklist": [
                        {"name": n, "criteria_description": f"How good the {n.lower()} is.", **bands}
                        for n in names
                    ],
                }
                for i, (q, names) in enumerate(WRITING)
            ],
        ),
    }
