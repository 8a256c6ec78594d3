"""`toolrl env build`: FTRL's five-stage environment builder (scenario decomposition -> document generation ->
function integration -> complexity scaling -> local deployment), each stage a resumable step over a folder."""

from toolrl.build.pipeline import ORDER, STAGES, build, run_stage
from toolrl.build.spec import SCENARIOS, BuildSpec, load_spec

__all__ = ["ORDER", "SCENARIOS", "STAGES", "BuildSpec", "build", "load_spec", "run_stage"]
