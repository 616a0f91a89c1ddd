"""fastrl.algo.minibatches: what each optimizer step is handed, checked without a network."""

import torch

from fastrl.algo.minibatches import epoch_minibatches, minibatch_major


def _tagged(T: int, B: int) -> dict:
    """[T(+1), B] tensors whose values name their (t, b) position, obs with a trailing feature axis."""
    pos = torch.arange((T + 1) * B, dtype=torch.float32).reshape(T + 1, B)
    return {"obs": pos.unsqueeze(-1).repeat(1, 1, 3), "log_probs": pos[:-1].clone(), "actions": pos[:-1].long()}


def test_trajectory_minibatches_hold_whole_columns_once_per_epoch():
    T, B = 5, 12
    seen = []
    for mb in epoch_minibatches(_tagged(T, B), 1, num_epochs=3, num_minibatches=4,
                                generator=torch.Generator().manual_seed(0)):
        assert mb["obs"].shape == (T + 1, 3, 3) and mb["log_probs"].shape == (T, 3)
        columns = mb["log_probs"][0].long() % B
        # every key, and every step of it, is the same trajectories in the same order
        assert torch.equal(mb["obs"][:, :, 0], torch.arange(T + 1).unsqueeze(1) * B + columns)
        assert torch.equal(mb["actions"], mb["log_probs"].long())
        seen.append(columns)
    assert len(seen) == 12
    for epoch in range(3):
        assert torch.equal(torch.sort(torch.cat(seen[epoch * 4:epoch * 4 + 4])).values, torch.arange(B))


def test_sample_minibatches_leave_the_remainder_out_and_reshuffle_each_epoch():
    n = 22  # 4 minibatches of 5: two samples sit each epoch out
    tensors = {"obs": torch.arange(n, dtype=torch.float32).unsqueeze(1), "vs": torch.arange(n, dtype=torch.float32)}
    epochs = [[], []]
    for i, mb in enumerate(epoch_minibatches(tensors, 0, num_epochs=2, num_minibatches=4,
                                             generator=torch.Generator().manual_seed(3), buffers=8)):
        assert torch.equal(mb["obs"][:, 0], mb["vs"])
        epochs[i // 4].append(mb["vs"].long())
    for drawn in epochs:
        drawn = torch.cat(drawn)
        assert drawn.numel() == 20 and torch.unique(drawn).numel() == 20
    assert not torch.equal(torch.cat(epochs[0]), torch.cat(epochs[1]))


def test_observation_buffers_are_reused_after_buffers_minibatches():
    """The caller may hold the last `buffers` minibatches' observations; the one before is refilled."""
    tensors = {"obs": torch.arange(16, dtype=torch.float32).unsqueeze(1), "vs": torch.arange(16.0)}
    held = []
    for mb in epoch_minibatches(tensors, 0, num_epochs=1, num_minibatches=4,
                                generator=torch.Generator().manual_seed(1), buffers=2):
        held.append((mb["obs"], mb["vs"].clone()))
        for obs, vs in held[-2:]:
            assert torch.equal(obs[:, 0], vs)  # still the samples it was handed
    assert held[0][0].data_ptr() == held[2][0].data_ptr() != held[1][0].data_ptr()


def test_minibatch_major_groups_each_minibatch_contiguously():
    t = torch.arange(2 * 6).reshape(2, 6)  # [T, M * b] with M = 3, b = 2
    out = minibatch_major(t, 1, 3, 2)
    assert out.shape == (3, 2, 2) and out.is_contiguous()
    assert torch.equal(out[1], t[:, 2:4])
    flat = torch.arange(6)
    assert minibatch_major(flat, 0, 3, 2).data_ptr() == flat.data_ptr()  # samples: a view, no copy
