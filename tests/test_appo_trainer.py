"""The APPO optimisation pass guards its weights: a non-finite loss or gradient skips the step."""

import copy
import dataclasses
from pathlib import Path

import pytest
import torch

import fastrl.algo.adam as adam_module
import fastrl.algo.appo as appo
import fastrl.algo.policy_lag as policy_lag
from fastrl.algo.appo import APPOTrainer, scheduled_lr
from fastrl.bench.components import synthetic_batch
from fastrl.config import check_config, load_config
from fastrl.envs import resolve_env
from fastrl.models import ActorCritic
from helpers import TINY_FRAMES

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


def _trainer_and_batch(overrides):
    cfg = load_config(str(ROOT / "configs/cartpole.yaml"), overrides)
    spec = resolve_env(cfg.env)
    torch.manual_seed(0)
    model = ActorCritic(spec, cfg.model)
    return APPOTrainer(model, cfg.algo, cfg.sampler.max_policy_lag), synthetic_batch(cfg, spec), cfg


def test_sample_minibatches_take_the_same_step_as_trajectory_minibatches_over_one_whole_batch():
    """With one minibatch of the whole batch the two units see the same samples and the same V-trace
    targets (values from the same weights), so one optimizer step must land on the same weights."""
    results = []
    for unit in ("trajectories", "samples"):
        trainer, batch, _ = _trainer_and_batch(["algo.num_epochs=1", "algo.num_minibatches=1",
                                                f"algo.minibatch_unit={unit}"])
        batch["log_probs"] = torch.randn(batch["log_probs"].shape) * 0.1 - 0.7  # off-policy: ratios != 1
        batch["valid"][5, :3] = False
        stats = trainer.train(batch)
        results.append((stats, trainer.model.state_dict()))
    (s_traj, w_traj), (s_samp, w_samp) = results
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl"):
        assert abs(s_traj[key] - s_samp[key]) <= 1e-5 * max(1.0, abs(s_traj[key])), key
    for name in w_traj:
        assert torch.allclose(w_traj[name], w_samp[name], atol=2e-5), name


def test_chunked_no_grad_forward_gives_the_whole_batch_targets(monkeypatch):
    """The batch's V-trace forward runs in pieces when its observations are large (Pong); the
    targets must be those of one pass over the whole batch, whatever the piece size."""
    trainer, batch, _ = _trainer_and_batch(["algo.minibatch_unit=samples"])
    batch["log_probs"] = torch.randn(batch["log_probs"].shape) * 0.1 - 0.7
    batch = dict(batch, train_mask=batch["valid"].bool())
    whole = trainer._flat_samples_with_targets(batch)
    row_bytes = batch["obs"][0, 0].numel() * batch["obs"].element_size()
    T1, B = batch["obs"].shape[:2]
    for rows in (1, 7, T1 * B - 1):  # uneven pieces, and a last piece of one row
        monkeypatch.setattr(appo, "NO_GRAD_CHUNK_BYTES", rows * row_bytes)
        pieces = trainer._flat_samples_with_targets(batch)
        for key in ("vs", "pg_advantages"):
            assert torch.allclose(pieces[key], whole[key], atol=1e-5), (rows, key)


def test_behaviour_values_replace_the_batch_forward_but_its_bootstrap_row(monkeypatch):
    """algo.vtrace_values=behaviour: V-trace's values are the recorded ones with the learner's value of the
    last observations appended, its ratios 1 (the recorded log-probs unread), and the network sees only that
    last row; the default reads the network's values over the whole batch."""
    from test_vtrace import reference_lambda_returns

    # rho_bar and c_bar: the config check refuses them with behaviour; the trainer must not read them either
    trainer, batch, cfg = _trainer_and_batch(["algo.minibatch_unit=samples", "algo.vtrace_values=behaviour",
                                              "algo.rho_bar=0.5", "algo.c_bar=0.5"])
    batch = dict(batch, train_mask=batch["valid"].bool())
    batch["terminated"][4, 1] = batch["truncated"][9, 2] = True
    rows_seen = []
    forward = trainer.net.forward
    monkeypatch.setattr(trainer.net, "forward", lambda obs: rows_seen.append(obs.shape[0]) or forward(obs))
    got = trainer._flat_samples_with_targets(batch)
    T1, B = batch["obs"].shape[:2]
    assert rows_seen == [B]
    with torch.no_grad():
        _, bootstrap = forward(batch["obs"][-1])
    values = torch.cat([batch["values"], bootstrap[None]]).double()
    want = reference_lambda_returns(batch["rewards"].double(), values, batch["terminated"], batch["truncated"],
                                    cfg.algo.gamma, cfg.algo.vtrace_lambda)
    torch.testing.assert_close(got["vs"].double(), want.reshape(-1), rtol=1e-5, atol=1e-5)
    batch["log_probs"] = torch.randn(batch["log_probs"].shape) * 0.1 - 0.7  # ratios are not read
    torch.testing.assert_close(trainer._flat_samples_with_targets(batch)["vs"], got["vs"])

    trainer.cfg = dataclasses.replace(trainer.cfg, vtrace_values="learner")
    rows_seen.clear()
    learner = trainer._flat_samples_with_targets(batch)
    assert sum(rows_seen) == T1 * B and not torch.allclose(learner["vs"], got["vs"], atol=1e-3)


def test_minibatch_observations_are_the_drawn_samples_in_every_step():
    """Minibatch observations are gathered into one reused buffer; each step must still see
    exactly the samples its indices name."""
    for unit, dim in (("samples", 0), ("trajectories", 1)):
        trainer, batch, _ = _trainer_and_batch(["algo.num_epochs=2", "algo.num_minibatches=4",
                                                f"algo.minibatch_unit={unit}"])
        T, B = batch["rewards"].shape
        obs = batch["obs"]
        # tag each sample's observation with its position, and carry the position in the log-prob
        obs[:] = torch.arange(obs.shape[0] * B, dtype=obs.dtype).reshape(obs.shape[0], B, *[1] * (obs.dim() - 2))
        batch["log_probs"] = torch.arange(T * B, dtype=torch.float32).reshape(T, B)
        batch = dict(batch, train_mask=batch["valid"].bool())
        for mb, _ in trainer._minibatches(batch):
            if unit == "samples":
                assert torch.equal(mb["obs"][:, 0], mb["log_probs"])
            else:  # [T+1, b]: column j is trajectory b_j, its first T rows the steps of the log-probs
                assert torch.equal(mb["obs"][:-1, :, 0], mb["log_probs"])


def test_sample_minibatches_cover_every_sample_once_per_epoch_across_many_trajectories():
    trainer, batch, cfg = _trainer_and_batch(["algo.num_epochs=2", "algo.num_minibatches=8",
                                              "algo.minibatch_unit=samples"])
    T, B = batch["rewards"].shape
    # tag each sample with its (t, b) position through the behaviour log-prob, which is passed through as is
    batch["log_probs"] = torch.arange(T * B, dtype=torch.float32).reshape(T, B)
    batch = dict(batch, train_mask=batch["valid"].bool())
    seen = []
    for mb, _ in trainer._minibatches(batch):
        assert mb["actions"].shape[0] == T * B // 8
        seen.append(mb["log_probs"].long())
    assert len(seen) == 2 * 8
    for epoch in (seen[:8], seen[8:]):
        assert torch.equal(torch.sort(torch.cat(epoch)).values, torch.arange(T * B))
    trajectories_in_first = torch.unique(seen[0] % B).numel()
    assert trajectories_in_first > B // 8  # a trajectory minibatch would hold exactly B // 8


def test_scheduled_lr_is_constant_or_linear_to_zero_at_its_own_horizon():
    algo = load_config(None, ["algo.lr=1e-3"]).algo
    assert scheduled_lr(algo, 10**9, 100) == 1e-3
    algo = load_config(None, ["algo.lr=1e-3", "algo.lr_schedule=linear"]).algo
    assert [scheduled_lr(algo, s, 100) for s in (0, 25, 100, 150)] == [1e-3, 0.75e-3, 0.0, 0.0]
    # a longer recipe's horizon: a run stopped at 4M still has 60% of the lr there
    algo = load_config(None, ["algo.lr=1e-3", "algo.lr_schedule=linear", "algo.lr_decay_env_steps=10000000"]).algo
    assert abs(scheduled_lr(algo, 4_000_000, 4_000_000) - 0.6e-3) < 1e-12


def test_lr_decay_env_steps_without_a_linear_schedule_is_rejected():
    problems = check_config(load_config(None, ["algo.lr_decay_env_steps=5"]))
    assert any("lr_decay_env_steps=5 only applies to algo.lr_schedule=linear" in p for p in problems)
    problems = check_config(load_config(None, ["algo.lr_schedule=linear", "algo.lr_decay_env_steps=0"]))
    assert any("algo.lr_decay_env_steps must be >= 1" in p for p in problems)


def test_the_trainers_adam_takes_the_textbook_adam_step():
    """Whichever Adam kernel the trainer picked (fused where torch has it), four optimizer steps
    land where torch's reference single-tensor Adam lands from the same weights and batch."""
    trainer, batch, cfg = _trainer_and_batch(["algo.num_epochs=2", "algo.num_minibatches=2"])
    reference = copy.deepcopy(trainer)
    reference.optimizer = torch.optim.Adam(reference.model.parameters(), lr=cfg.algo.lr, eps=cfg.algo.adam_eps,
                                           foreach=False)
    for t in (trainer, reference):
        torch.manual_seed(0)  # the same minibatch order
        t.train(copy.deepcopy(batch))
    moved = 0.0
    for (name, w), w_ref, w0 in zip(trainer.model.state_dict().items(), reference.model.state_dict().values(),
                                    _trainer_and_batch([])[0].model.state_dict().values()):
        assert torch.allclose(w, w_ref, atol=1e-6, rtol=1e-5), name
        moved = max(moved, float((w_ref - w0).abs().max()))
    assert moved > 1e-4  # the steps did move the weights


def test_a_stop_request_ends_the_pass_between_optimizer_steps():
    trainer, batch, cfg = _trainer_and_batch(["algo.num_epochs=2", "algo.num_minibatches=4"])
    published = []
    stats = trainer.train(batch, publish=lambda: published.append(trainer.policy_version),
                          should_stop=lambda: len(published) >= 3)
    assert stats["sgd_steps"] == 3 and trainer.policy_version == 3 and published == [1, 2, 3]
    stats = trainer.train(batch, should_stop=lambda: False)
    assert stats["sgd_steps"] == cfg.algo.num_epochs * cfg.algo.num_minibatches == 8


def test_weights_are_published_after_every_publish_every_steps_optimizer_steps():
    """algo.publish_every_steps=3: versions 3 and 6 of a batch's 8 steps, then 9, 12 and 15 of the next (the
    count runs on across batches, so the gap between publications stays 3)."""
    trainer, batch, cfg = _trainer_and_batch(["algo.num_epochs=2", "algo.num_minibatches=4", "algo.publish_every_steps=3"])
    published = []
    for _ in range(2):
        trainer.train(copy.deepcopy(batch), publish=lambda: published.append(trainer.policy_version))
    assert trainer.policy_version == 16 and published == [3, 6, 9, 12, 15]


def test_lag_statistics_count_only_valid_samples():
    """train()'s policy-lag statistics against a direct reading of one small batch: invalid samples
    (padding after a worker's error) are left out, lags past the histogram share its last bin."""
    lag = torch.tensor([[0, 3, 3, 400], [7, 1, 0, 2]])
    valid = torch.tensor([[True, True, False, True], [True, False, True, True]])
    fresh = lag <= 5
    stats = policy_lag.lag_stats(lag, valid, fresh)
    taken = [0, 3, 400, 7, 0, 2]
    assert (stats["lag_min"], stats["lag_max"]) == (0.0, 400.0)
    assert stats["lag_mean"] == sum(taken) / len(taken)
    expected_hist = [0] * policy_lag.LAG_HIST_BINS
    for value in taken:
        expected_hist[min(value, policy_lag.LAG_HIST_BINS - 1)] += 1
    assert stats["lag_hist"] == expected_hist
    assert (stats["valid_samples"], stats["dropped_for_lag"], stats["samples"]) == (6, 2, 8)
    empty = policy_lag.lag_stats(lag, torch.zeros_like(valid), fresh)
    assert (empty["lag_mean"], sum(empty["lag_hist"]), empty["valid_samples"]) == (0.0, 0, 0)


def test_fp32_cnn_clips_and_steps_natively_to_torchs_weights(monkeypatch):
    """A fp32 CNN (channels-last, no flat buffer, no bf16 copy) takes its clip norm from fastrl_ext._optim's
    sum of squares and its step from _optim.adam_step with the clip's scale folded in: the weights must land
    where torch's clip and fused Adam put them, to rounding, on steps where the clip acts."""
    spec = TINY_FRAMES
    cfg = load_config(str(ROOT / "configs/atari_pong.yaml"),
                      ["model.precision=fp32", "algo.batch_size=256", "algo.num_minibatches=4", "algo.num_epochs=2"])
    calls = {"adam_step": 0, "sum_squares": 0}
    real = adam_module._optim

    def counted(name):
        def call(*args):
            calls[name] += 1
            return getattr(real, name)(*args)
        return call
    monkeypatch.setattr(adam_module, "_optim", type("Counted", (), {k: staticmethod(counted(k)) for k in calls}))
    real_jobs = adam_module._NativeViews.jobs
    made = []
    monkeypatch.setattr(adam_module._NativeViews, "jobs", lambda self, *a: made.append(1) or real_jobs(self, *a))
    results = []
    for native in (False, True):
        torch.manual_seed(3)
        model = ActorCritic(spec, cfg.model).to(memory_format=torch.channels_last)
        algo = dataclasses.replace(cfg.algo, native_optimizer=native)  # algo.native_optimizer
        trainer = APPOTrainer(model, algo, cfg.sampler.max_policy_lag)
        start = [p.detach().clone() for p in trainer.trained_params]
        stats = trainer.train(synthetic_batch(cfg, spec, seed=5))  # minibatch order: the trainer's own seed
        results.append((stats, [p.detach().clone() for p in trainer.trained_params]))
    steps = cfg.algo.num_epochs * cfg.algo.num_minibatches
    assert calls == {"adam_step": steps * len(start), "sum_squares": steps * len(start)}  # the native run's only
    assert len(made) == steps  # the step reuses the views its clip's sum was taken through
    (s_torch, w_torch), (s_native, w_native) = results
    assert s_torch["sgd_steps"] == s_native["sgd_steps"] == steps
    assert s_torch["grad_norm"] > cfg.algo.max_grad_norm  # the clip acted
    assert s_native["grad_norm"] == pytest.approx(s_torch["grad_norm"], rel=1e-5)
    for a, b, p0 in zip(w_torch, w_native, start):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    assert max(float((a - p0).abs().max()) for a, p0 in zip(w_torch, start)) > 1e-4
