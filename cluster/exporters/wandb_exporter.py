"""`--log-to wandb[:PROJECT]`: each record is one W&B run (its id made from the name, so a sweep's steps and a
resumed watch add to it), in PROJECT (default WANDB_PROJECT, else "rayeval"). WANDB_MODE=offline logs without
a network into ./wandb (`wandb sync` uploads it later)."""

from __future__ import annotations

import hashlib
import os

from cluster.exporters.base import RunRecord, exporter


class WandbExporter:
    target = "PROJECT"  # what may follow the kind in --log-to

    def __init__(self, project: str | None) -> None:
        self.project = project or os.environ.get("WANDB_PROJECT", "rayeval")

    def log(self, record: RunRecord, step: int | None) -> None:
        import wandb

        run_id = hashlib.sha256(f"{self.project}/{record.name}".encode()).hexdigest()[:16]
        run = wandb.init(project=self.project, id=run_id, name=record.name, resume="allow", config=record.params,
                         reinit="create_new")  # fmt: skip
        try:
            run.log(record.metrics, step=step or 0)
            for path in record.files:
                run.save(str(path), base_path=str(path.parent), policy="now")
        finally:
            run.finish()


exporter("wandb")(WandbExporter)
