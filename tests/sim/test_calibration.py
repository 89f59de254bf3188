"""The frozen presets still reproduce their calibration figures (docs/sim.md).

The v1 figures are checked on the luck presets (the v1 presets under their new names);
the fitted v2 families are checked in test_sim_v2.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from trace_gym.sim import PRESETS, pool_values
from trace_gym.sim.calibrate import (
    grpo_effective_ratio,
    grpo_effective_ratio_mc,
    main,
    random_branching_effective_ratio,
)

#: (figure, target, tolerance) per preset, as stated in docs/sim.md
GRPO8 = {"math-luck": (0.27, 0.03), "bfcl-luck": (0.30, 0.03)}


@pytest.mark.parametrize("preset", sorted(GRPO8))
def test_grpo8_effective_ratio_exact(preset):
    target, tol = GRPO8[preset]
    assert abs(grpo_effective_ratio(preset, 2000) - target) <= tol


@pytest.mark.parametrize("preset", sorted(set(PRESETS) - {"bfcl-r02"}))  # bfcl-r02: a failed fit
def test_prompt_success_rates_are_u_shaped(preset):
    z = pool_values(preset, 1000)
    hist = np.histogram(z, bins=10, range=(0, 1))[0]
    assert hist[0] + hist[-1] > 500, hist
    assert min(hist[0], hist[-1]) > max(hist[1:-1]), hist


def test_grpo_monte_carlo_agrees_with_the_exact_figure():
    n = 250
    z = pool_values("math", n)
    q = 1 - z**8 - (1 - z) ** 8
    se = np.sqrt(np.sum(q * (1 - q))) / n
    mc = grpo_effective_ratio_mc("math", n, mc_seed=3)
    assert abs(mc - q.mean()) <= 5 * se, (mc, q.mean(), se)
    z = pool_values("math-luck", n)
    q = 1 - z**8 - (1 - z) ** 8
    se = np.sqrt(np.sum(q * (1 - q))) / n
    mc = grpo_effective_ratio_mc("math-luck", n, mc_seed=3)
    assert abs(mc - q.mean()) <= 5 * se, (mc, q.mean(), se)


@pytest.mark.parametrize("preset", ["hotpotqa-luck", "hotpotqa"])
def test_hotpotqa_random_branching_is_near_43_percent(preset):
    # 160 prompts: a fixed-seed regression check (the 2000-prompt figure is in docs/sim.md)
    r = random_branching_effective_ratio(preset, 160, mc_seed=1)
    assert abs(r - 0.43) <= 0.08, r


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["hotpotqa-luck", "hotpotqa"])
def test_hotpotqa_random_branching_large_sample(preset):
    r = random_branching_effective_ratio(preset, 2000, mc_seed=1)
    assert abs(r - 0.43) <= 0.03, r


def test_calibration_cli_runs_and_writes_json(capsys, tmp_path):
    out = tmp_path / "cal.json"
    argv = ["--preset", "math", "--preset", "math-luck", "--tasks", "100", "--mc-prompts", "10"]
    assert main([*argv, "--json", str(out)]) == 0
    assert "math-luck" in capsys.readouterr().out
    import json

    data = json.loads(out.read_text())
    for name in ("math", "math-luck"):
        d = data[name]
        assert 0 <= d["resolved_share"] <= 1
        assert set(d["attainable_mse_by_depth"]) >= {"0", "1"}
        assert d["spread_by_depth"]["0"] == 0.0 and d["spread_by_depth"]["1"] > 0
    assert data["math"]["resolved_share"] > data["math-luck"]["resolved_share"]


def test_calibration_cli_errors_are_one_line_exit_2(capsys):
    assert main(["--preset", "math", "--tasks", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("trace-gym sim-calibrate:") and "\n" not in err
