"""Group advantages against hand-computed values and a per-group loop reference."""

import math

import pytest
import torch

from vespo.advantages import group_advantages


def test_hand_computed_mean_centering_and_std():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])  # two groups of 3
    torch.testing.assert_close(group_advantages(r, 3, norm_by_std=False), torch.tensor([2, -1, -1, 0, 0, 0]) / 3)
    # group 1: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3); group 2 is constant -> 0
    s = math.sqrt(1 / 3)
    expected = torch.tensor([(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s, 0.0, 0.0, 0.0])
    torch.testing.assert_close(group_advantages(r, 3, eps=0.0 + 1e-12), expected)


def test_matches_loop_reference():
    g = torch.Generator().manual_seed(0)
    r = torch.randint(0, 2, (40,), generator=g).float()
    out = group_advantages(r, 8)
    for i in range(5):
        grp = r[i * 8 : i * 8 + 8].tolist()
        mean = sum(grp) / 8
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / 7)
        for j in range(8):
            assert out[i * 8 + j].item() == pytest.approx((grp[j] - mean) / (std + 1e-6), rel=1e-5, abs=1e-6)


def test_group_of_one_and_bad_shapes():
    assert group_advantages(torch.tensor([1.0, 0.0]), 1).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="divisible"):
        group_advantages(torch.ones(5), 2)
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.ones(2, 2), 2)
