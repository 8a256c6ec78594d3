"""mini-swe-agent's default agent and its `mini` configuration (a bash tool, run in a local shell), on its litellm
model pointed at an OpenAI-compatible server (its local-model setup: cost tracking off for a model litellm does
not price)."""

import os
from pathlib import Path

import yaml
from common import finish, question
from minisweagent import package_dir
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments.local import LocalEnvironment
from minisweagent.models.litellm_model import LitellmModel

server = {"api_base": os.environ["OPENAI_BASE_URL"], "api_key": os.environ["OPENAI_API_KEY"]}
model = LitellmModel(model_name="openai/policy", cost_tracking="ignore_errors", model_kwargs=server)
config = yaml.safe_load(Path(package_dir / "config" / "mini.yaml").read_text())["agent"]
result = DefaultAgent(model, LocalEnvironment(), **config).run(question())
finish(result.get("submission", "").strip())
