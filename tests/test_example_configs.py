"""The example configuration files load as the settings they say, from the repository root (where their paths
point), through the command line's own loader."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_calibrated_trace_recipe_loads_with_both_layers(monkeypatch):
    pytest.importorskip("torch")  # the train command's config imports torch (train.update)
    from trace_rl.config import load_config
    from trace_rl.train.trainer import TrainConfig

    monkeypatch.chdir(ROOT)  # its prior path is relative to the repository root
    cfg, _ = load_config(TrainConfig, ["--config", "examples/configs/trace_calibrated.yaml", "steps=3"])
    assert cfg.method == "trace" and cfg.steps == 3
    assert (cfg.predictor.flip_model, cfg.predictor.root_model) == ("calibrated", "calibrated")
    assert (ROOT / cfg.predictor.flip_prior).is_file()
