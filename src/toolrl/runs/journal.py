"""What a run writes as it goes, beside its checkpoints: one metrics line per step and per evaluation, the
trajectories of each step (samples.jsonl) and of each evaluation (evals.jsonl) as records a viewer reads
without a re-run, the loggers (TensorBoard, W&B) and status.json (running, finished, failed, stopped; the step
reached). Plain files: `toolrl ui`, `toolrl report` and a text editor read the same ones. A stop request is a
file named STOP in the run directory (the UI's stop button writes it): the run stops after the step it is in,
with a checkpoint.

The journal is given values (metrics, trajectories, the update's per-token values); it never reads a trainer."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolrl import distributed
from toolrl.distributed import Dist
from toolrl.rollout import Trajectory
from toolrl.rollout.trajectory import UpdateValues
from toolrl.runs.loggers import open_loggers
from toolrl.runs.rundir import EVALS, SAMPLES, STOP_FILE, RunDir

log = logging.getLogger(__name__)

IMAGES = "images"


def trajectory_records(
    trajs: Sequence[Trajectory],
    tokenizer,
    success: str | None,
    limit: int | None,
    values: Sequence[UpdateValues | None] | None = None,
) -> list[dict[str, Any]]:
    """The first `limit` (None: all) of `trajs` as written records, with the update's values where given."""
    chosen = trajs if limit is None else trajs[:limit]
    given = list(values) if values is not None else [None] * len(chosen)
    return [traj.to_record(tokenizer, success, given[i]) for i, traj in enumerate(chosen)]


def write_images(run_path, folder: str, trajs: Sequence[Trajectory], records: list[dict[str, Any]], limit: int) -> None:
    """The images of the trajectories behind `records` as PNG files under RUN/images/FOLDER/ (at most
    `limit`), each record's image entry given its "file" (relative to the run directory)."""
    from toolrl.rollout.trajectory import image_png

    written = 0
    for i, (traj, record) in enumerate(zip(trajs, records, strict=False)):
        for k, (image, entry) in enumerate(zip(traj.images, record.get("images", []), strict=True)):
            if written >= limit:
                return
            path = run_path / IMAGES / folder / f"{i}-{k}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(image_png(image.source))
            entry["file"] = str(path.relative_to(run_path))
            written += 1


class Journal:
    """A run's journal. `run`: rank 0's run directory (None on the other ranks of a torchrun job, and for a
    trainer without one); `train`, `eval`: the config's sections; `success`: the rubric's success criterion."""

    def __init__(self, run: RunDir | None, dist: Dist, config, tokenizer, success: str | None) -> None:
        self.run, self.dist, self.tokenizer, self.success = run, dist, tokenizer, success
        self.train, self.eval = config.train, config.eval
        self.full: set[str] = set()  # journal files that reached train.samples_max_mb
        self.loggers = open_loggers(self.train.report_to, run.path, config) if run else []

    def _records(self, trajs, limit, values=None) -> list[dict[str, Any]]:
        return trajectory_records(trajs, self.tokenizer, self.success, limit, values)

    def step(
        self,
        step: int,
        metrics: dict[str, Any],
        trajs: list[Trajectory],
        values: Sequence[UpdateValues | None] | None = None,
    ) -> None:
        """The step's metrics line, its trajectories' records (every rank's, in order; train.samples_per_step of
        them, within train.samples_max_mb), the loggers and status.json. Every rank calls it (a collective under
        torchrun when records are written)."""
        t = self.train
        records: list[dict[str, Any]] = []
        room = self.run is not None and self._has_room(SAMPLES)  # rank 0 writes, within the bound
        if t.samples_per_step != 0 and (self.run is not None or self.dist.on):  # records someone writes
            mine = self._records(trajs, t.samples_per_step, values)
            if room:  # rank 0 keeps its trajectories' images beside the records
                write_images(self.run.path, f"step-{step:06d}", trajs, mine, t.sample_images_per_step)
            records = [r for part in distributed.gather(self.dist, mine) for r in part]
            if t.samples_per_step is not None:
                records = records[: t.samples_per_step]
            for i, record in enumerate(records):  # the step's order: rank 0's share first
                record["sample"], record["group"] = i, i // t.group_size
        if self.run is None:
            return
        self.run.log_metrics(metrics)
        if records and room:
            self.run.log_samples(step, records, SAMPLES)
        for logger in self.loggers:
            logger.log(metrics, step)
        self.run.write_status(state="running", step=step)

    def evaluation(self, when: str, step: int, stats: dict[str, float], trajs: list[Trajectory]) -> None:
        """An evaluation's summary line and its trajectories (eval.samples_per_eval of them, in evals.jsonl)."""
        log.info("eval at %s: %s", when, stats)
        if self.run is None:
            return
        self.run.log_metrics({"eval": when, "step": step, **stats})
        limit = self.eval.samples_per_eval
        if limit != 0 and self._has_room(EVALS):
            records = self._records(trajs, limit)
            folder = f"eval-{when.replace(' ', '-')}-{step:06d}"
            write_images(self.run.path, folder, trajs, records, self.train.sample_images_per_step)
            self.run.log_samples(step, records, EVALS, eval=when)
        for logger in self.loggers:
            logger.log({f"eval/{k}": v for k, v in stats.items()}, step)

    def _has_room(self, filename: str) -> bool:
        """Whether `filename` is still under train.samples_max_mb; the first time it is not, a warning says so."""
        if self.run.size_of(filename) < self.train.samples_max_mb * 1e6:
            return True
        if filename not in self.full:
            self.full.add(filename)
            log.warning(
                "%s reached train.samples_max_mb (%g MB): later trajectories are not written; raise it to keep more",
                filename,
                self.train.samples_max_mb,
            )
        return False

    def stop_requested(self) -> bool:
        """Whether RUN/STOP exists (rank 0 looks; every rank gets the answer). The file is removed: a resumed
        run goes on."""
        asked = False
        if self.run is not None:
            path: Path = self.run.path / STOP_FILE
            asked = path.exists()
            path.unlink(missing_ok=True)
        return bool(distributed.broadcast(self.dist, asked))

    def status(self, **fields: Any) -> None:
        if self.run is not None:
            self.run.write_status(**fields)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()
