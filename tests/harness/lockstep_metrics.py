"""A short lock-step training run's metrics file, with what measures time or memory left out: run against two
revisions of toolrl (PYTHONPATH), equal output means the run trained and logged the same. tests/train/test_async.py
runs it against the commit before `train.async_steps` went past one step, with `async_steps: 0` (the default).

    PYTHONPATH=src:. python tests/harness/lockstep_metrics.py MODEL_DIR WORK_DIR OUT.json
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

MEASURED = re.compile(r"(_s$|^time/|per_s|memory|_gb$|_mb$|rss)")
"""Keys whose values are seconds, rates or memory: a machine's, not the run's."""


def main(model_dir: str, work: str, out: str) -> None:
    import tests.fixtures.even_env  # noqa: F401  (registers even-tokens)
    from toolrl.config import load_config
    from toolrl.train import RunDir, Trainer, Workbench

    overrides = [f"model.name={model_dir}", "env.name=even-tokens", "device=cpu", "rollout.max_turns=1",
                 "rollout.max_new_tokens=6", "train.prompts_per_step=2", "train.group_size=4", "train.lr=0.01",
                 "train.steps=3", "train.kl.coef=0.05", f"output_dir={work}", "run_name=lockstep", "eval.num_tasks=4",
                 "eval.at_start=false", "eval.at_end=false", "seed=5"]  # fmt: skip
    config = load_config(overrides=overrides)
    run = RunDir.create(config)
    Trainer(Workbench.load(config), run).train()
    rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    kept = [{k: v for k, v in row.items() if not MEASURED.search(k)} for row in rows]
    Path(out).write_text(json.dumps(kept, indent=1, sort_keys=True))


if __name__ == "__main__":
    main(*sys.argv[1:4])
