"""Per-pair weights are exact across minibatches: each batch is normalised by the dataset's mean
weight, not by its own sum (which would give a batch of 0.3-weight pairs full weight)."""

import math

import pytest
import torch

from outcome_flywheel.models.torch.losses import weighted_dpo_loss

ZERO = torch.zeros(2)


def _loss(weights, mean_weight=None):
    chosen = torch.tensor([0.2, -0.1])  # policy - reference log-ratios enter through the chosen side
    return weighted_dpo_loss(chosen, ZERO, ZERO, ZERO, torch.tensor(weights), beta=1.0, mean_weight=mean_weight)[
        0
    ].item()


def test_batch_of_low_weight_pairs_counts_less():
    per_pair = [-math.log(1 / (1 + math.exp(-0.2))), -math.log(1 / (1 + math.exp(0.1)))]
    dataset_mean = 0.65  # e.g. a dataset of half 1.0-weight and half 0.3-weight pairs
    low = _loss([0.3, 0.3], dataset_mean)
    high = _loss([1.0, 1.0], dataset_mean)
    # fp32 losses of ~10 operations against float64 or each other: <= 10-20 u ~ 1e-6 relative
    assert low == pytest.approx(0.3 * sum(per_pair) / (2 * dataset_mean), rel=1e-6)
    assert low / high == pytest.approx(0.3, rel=1e-6)
    # The batch-sum normalisation would have made them equal.
    assert _loss([0.3, 0.3]) == pytest.approx(_loss([1.0, 1.0]), rel=1e-6)


def test_full_batch_matches_the_weighted_mean():
    weights = [1.0, 0.3]
    assert _loss(weights, mean_weight=sum(weights) / 2) == pytest.approx(_loss(weights), rel=1e-6)


def test_mlx_matches_torch_with_dataset_mean_weight():
    mx = pytest.importorskip("mlx.core", reason="mlx is not installed")
    from outcome_flywheel.models.mlx.losses import weighted_dpo_loss as mlx_weighted_dpo_loss

    chosen = [0.2, -0.1]
    out = mlx_weighted_dpo_loss(
        mx.array(chosen), mx.zeros(2), mx.zeros(2), mx.zeros(2), mx.array([0.3, 1.0]), 1.0, 0.8
    )[0]
    # fp32 in both, ~10 operations on a loss of ~0.5: at most 2 x 10 u x 0.6 = 7e-7 apart (worst case)
    assert out.item() == pytest.approx(_loss([0.3, 1.0], 0.8), abs=1e-6)
