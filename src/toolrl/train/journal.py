"""What a run writes as it goes, beside its checkpoints: one metrics line per step and per evaluation, the
trajectories of each step (samples.jsonl) and of each evaluation (evals.jsonl) as records a viewer reads
without a re-run, and status.json (running, finished, failed, stopped; the step reached). Plain files: `toolrl
ui`, `toolrl report` and a text editor read the same ones. A stop request is a file named STOP in the run
directory (the UI's stop button writes it): the run stops after the step it is in, with a checkpoint."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from toolrl.rollout import Trajectory
from toolrl.train import checkpointing, distributed
from toolrl.train.evaluate import summarize
from toolrl.train.rundir import EVALS, SAMPLES

if TYPE_CHECKING:
    from toolrl.train.trainer import Trainer

log = logging.getLogger(__name__)

STOP_FILE = "STOP"


def trajectory_records(trainer: Trainer, trajs: Sequence[Trajectory], limit: int | None) -> list[dict[str, Any]]:
    """The first `limit` (None: all) of `trajs` as written records."""
    bench = trainer.bench
    chosen = trajs if limit is None else trajs[:limit]
    return [traj.to_record(bench.tokenizer, bench.env.rubric.success) for traj in chosen]


IMAGES = "images"


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


def log_step(trainer: Trainer, step: int, metrics: dict[str, Any], trajs: list[Trajectory]) -> None:
    """The step's metrics line, its trajectories' records (every rank's, in order; train.samples_per_step of
    them, within train.samples_max_mb), the loggers and status.json. Every rank calls it (a collective under
    torchrun when records are written)."""
    t = trainer.config.train
    records: list[dict[str, Any]] = []
    room = trainer.run is not None and _has_room(trainer, SAMPLES)  # rank 0 writes, within the bound
    if t.samples_per_step != 0 and (trainer.run is not None or trainer.dist.on):  # records someone writes
        mine = trajectory_records(trainer, trajs, t.samples_per_step)
        if room:  # rank 0 keeps its trajectories' images beside the records
            write_images(trainer.run.path, f"step-{step:06d}", trajs, mine, t.sample_images_per_step)
        records = [r for part in distributed.gather(trainer.dist, mine) for r in part]
        if t.samples_per_step is not None:
            records = records[: t.samples_per_step]
        for i, record in enumerate(records):  # the step's order: rank 0's share first
            record["sample"], record["group"] = i, i // t.group_size
    run = trainer.run
    if run is None:
        return
    run.log_metrics(metrics)
    if records and room:
        run.log_samples(step, records, SAMPLES)
    for logger in trainer.loggers:
        logger.log(metrics, step)
    run.write_status(state="running", step=step)


def _has_room(trainer: Trainer, filename: str) -> bool:
    """Whether `filename` is still under train.samples_max_mb; the first time it is not, a warning says so."""
    if trainer.run.size_of(filename) < trainer.config.train.samples_max_mb * 1e6:
        return True
    if filename not in trainer.journal_full:
        trainer.journal_full.add(filename)
        log.warning(
            "%s reached train.samples_max_mb (%g MB): later trajectories are not written; raise it to keep more",
            filename,
            trainer.config.train.samples_max_mb,
        )
    return False


def evaluate(trainer: Trainer, when: str, step: int) -> dict[str, float]:
    """Evaluate on the test split (rank 0; the others wait), log the summary line and the trajectories
    (eval.samples_per_eval of them, in evals.jsonl)."""
    trainer.settle()
    trainer.refresh_generator()  # evaluate the current weights (on every rank: a collective under torchrun)
    if not trainer.dist.main:  # rank 0 evaluates on its full copy; the others wait
        distributed.barrier(trainer.dist)
        return {}
    started = time.perf_counter()
    bench = trainer.bench
    trajs = bench.evaluation()
    stats = summarize(trajs, bench.env.rubric.success)
    distributed.barrier(trainer.dist)
    stats["eval_s"] = time.perf_counter() - started
    log.info("eval at %s: %s", when, stats)
    run = trainer.run
    if run:
        run.log_metrics({"eval": when, "step": step, **stats})
        limit = trainer.config.eval.samples_per_eval
        if limit != 0 and _has_room(trainer, EVALS):
            records = trajectory_records(trainer, trajs, limit)
            folder = f"eval-{when.replace(' ', '-')}-{step:06d}"
            write_images(run.path, folder, trajs, records, trainer.config.train.sample_images_per_step)
            run.log_samples(step, records, EVALS, eval=when)
        for logger in trainer.loggers:
            logger.log({f"eval/{k}": v for k, v in stats.items()}, step)
    return stats


def evaluate_and_keep_best(trainer: Trainer, step: int) -> dict[str, float]:
    stats = evaluate(trainer, "end" if step == trainer.config.train.steps else f"step {step}", step)
    metric = "success" if "success" in stats else "reward"  # an environment without a success criterion
    score = stats.get(metric)
    if trainer.run and score is not None and (trainer.best is None or score > trainer.best):
        trainer.best = score
        checkpointing.save_best(trainer, step, metric)
    return stats


def stop_requested(trainer: Trainer) -> bool:
    """Whether RUN/STOP exists (rank 0 looks; every rank gets the answer). The file is removed: a resumed
    run goes on."""
    asked = False
    if trainer.run is not None:
        path = trainer.run.path / STOP_FILE
        asked = path.exists()
        path.unlink(missing_ok=True)
    return bool(distributed.broadcast(trainer.dist, asked))
