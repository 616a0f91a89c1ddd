"""The APPO optimisation pass guards its weights: a non-finite loss or gradient skips the step."""

import copy
from pathlib import Path

import torch

from fastrl.algo.appo import APPOTrainer
from fastrl.bench.components import synthetic_batch
from fastrl.config import load_config
from fastrl.envs import resolve_env
from fastrl.models import ActorCritic

ROOT = Path(__file__).resolve().parents[1]


def test_nonfinite_steps_are_skipped_counted_and_reset_by_a_good_one():
    cfg = load_config(str(ROOT / "configs/cartpole.yaml"))
    spec = resolve_env(cfg.env)
    model = ActorCritic(spec, cfg.model)
    trainer = APPOTrainer(model, cfg.algo, cfg.sampler.max_policy_lag)
    good = synthetic_batch(cfg, spec)
    bad = copy.deepcopy(good)
    bad["rewards"][3, :] = float("nan")  # valid samples: the loss itself becomes NaN
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stats = trainer.train(bad)
    steps = cfg.algo.num_epochs * cfg.algo.num_minibatches
    assert stats["skipped_steps"] == steps and stats["sgd_steps"] == 0
    assert trainer.skipped_in_row == steps and trainer.skipped_total == steps and trainer.policy_version == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # weights untouched
    trainer.train(good)
    assert trainer.skipped_in_row == 0 and trainer.skipped_total == steps and trainer.policy_version == steps
