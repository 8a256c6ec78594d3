"""Off-policy corrections (algos/corrections.py), each against hand-computed values: three tokens whose ratios
pi_trainer / pi_behaviour are 0.25, 1 and 3, the first two one sequence (R = 0.25), the third another (R = 3)."""

import math

import pytest
import torch

from toolrl.algos import CORRECTIONS
from toolrl.algos.corrections import CorrectionInputs, CorrectionStats
from toolrl.algos.registries import register_correction
from toolrl.config.resolve import NoOptions

RATIOS = [0.25, 1.0, 3.0]
COUNTS = [2, 1]


def inputs() -> CorrectionInputs:
    behaviour = torch.tensor([-1.0, -2.0, -0.5])
    trainer = (behaviour + torch.tensor([math.log(r) for r in RATIOS])).requires_grad_()
    return CorrectionInputs(trainer, behaviour, COUNTS)


def corrected(name: str, **options):
    model = CORRECTIONS.options_model(name) or NoOptions
    return CORRECTIONS[name](inputs(), model(**options))


def values(tensor) -> list[float]:
    return [round(float(v), 5) for v in tensor]


@pytest.mark.parametrize(
    ("name", "options", "weights", "masked", "against"),
    [
        ("token_tis", {"cap": 2.0}, [0.25, 1.0, 2.0], None, "trainer"),
        ("seq_tis", {"cap": 2.0}, [0.25, 0.25, 2.0], None, "trainer"),
        ("mis", {"cap": 2.0}, [0.25, 1.0, 0.0], [False, False, True], "trainer"),
        ("mis", {"cap": 2.0, "level": "sequence"}, [0.25, 0.25, 0.0], [False, False, True], "trainer"),
        ("mis", {"cap": 0.5, "level": "sequence"}, [0.25, 0.25, 0.0], [False, False, True], "trainer"),
        ("icepop", {"low": 0.5, "high": 2.0}, [0.0, 1.0, 0.0], [True, False, True], "trainer"),
        ("decoupled_ppo", {}, [0.25, 1.0, 3.0], None, "trainer"),
        ("decoupled_ppo", {"cap": 2.0}, [0.25, 1.0, 2.0], None, "trainer"),
    ],
)
def test_each_correction_weighs_and_masks_as_computed_by_hand(name, options, weights, masked, against):
    out = corrected(name, **options)
    assert values(out.weights) == weights and not out.weights.requires_grad
    assert (values(out.masked) if out.masked is not None else None) == (
        [float(m) for m in masked] if masked is not None else None
    )
    assert out.against == against


def test_none_changes_nothing_and_leaves_the_ratio_to_the_run():
    out = corrected("none")
    assert out.weights is None and out.masked is None and out.against is None


def test_the_step_metrics_are_the_share_masked_the_mean_weight_of_the_rest_and_the_share_capped():
    stats = CorrectionStats()
    stats.add(corrected("icepop"), 3)  # masked 2 of 3; the third's weight 1
    stats.add(corrected("token_tis", cap=2.0), 3)  # none masked; 0.25 + 1 + 2; one capped
    assert stats.metrics() == pytest.approx(
        {
            "correction/masked_fraction": 2 / 6,
            "correction/mean_weight": (1 + 3.25) / 4,
            "correction/capped_fraction": 1 / 6,
        }
    )
    assert CorrectionStats().metrics() == {}


def test_a_correction_of_ones_own_registers_with_its_options_and_a_config_names_it():
    """From outside the package: a correction that masks every token of a sequence longer than `longest`."""
    from pydantic import BaseModel

    from toolrl.algos.corrections import Corrected
    from toolrl.config import resolve_config
    from toolrl.config.resolve import plugin_options

    class LengthOptions(BaseModel):
        longest: int = 1

    @register_correction("short_only", options=LengthOptions, replace=True)
    def short_only(x: CorrectionInputs, options: LengthOptions) -> Corrected:
        long = x.per_sequence(torch.tensor([n > options.longest for n in x.counts]))
        return Corrected(torch.where(long, 0.0, 1.0), masked=long)

    config = resolve_config(None, ["train.correction=short_only", "train.correction_options.longest=1"])
    options = plugin_options(config)["correction"]
    out = CORRECTIONS["short_only"](inputs(), options)
    assert values(out.weights) == [0.0, 0.0, 1.0]


def test_tis_cap_is_token_tis_and_a_conflicting_correction_is_one_line():
    from toolrl.config import resolve_config
    from toolrl.config.resolve import correction_name
    from toolrl.errors import ConfigError

    config = resolve_config(None, ["train.tis_cap=3"])
    assert correction_name(config.train) == "token_tis"
    with pytest.raises(ConfigError, match=r"^train.tis_cap is train.correction: token_tis; it cannot go with"):
        resolve_config(None, ["train.tis_cap=3", "train.correction=icepop"])
