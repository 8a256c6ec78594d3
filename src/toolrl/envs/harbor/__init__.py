"""Harbor-format tasks in a sandbox provider's boxes (env.py, task.py; the fixture tasks in tasks/)."""

from toolrl.envs.harbor.env import HarborEnv, HarborOptions

__all__ = ["HarborEnv", "HarborOptions"]
