"""IS correction (every level x mode), its config guards and mismatch metrics, by hand.

Per-token ratios u = pi_old / pi_rollout used throughout:
row 0: u = [1.0, 1.5, 0.9]   (3 action tokens)
row 1: u = [0.4, 1.2, -]     (2 action tokens, last position masked)
"""

import logging
import math

import pytest
import torch

from molt_train.algorithms import is_correction, mismatch_metrics, parse_threshold

T, F = True, False
MASK = torch.tensor([[T, T, T], [T, T, F]])
LOGP_ROLLOUT = torch.zeros(2, 3)
LOGP_OLD = torch.log(torch.tensor([[1.0, 1.5, 0.9], [0.4, 1.2, 1.0]]))
LOGP_OLD[1, 2] = float("nan")  # garbage outside the mask


def weights(level, mode, threshold):
    return is_correction(LOGP_OLD, LOGP_ROLLOUT, MASK, level=level, mode=mode, threshold=threshold)


@pytest.mark.parametrize(
    ("mode", "expected", "filtered"),
    [
        # IcePop, band [0.8, 1.25]: 1.5 and 0.4 are outside -> 0; kept tokens keep u
        ("mask", [[1.0, 0.0, 0.9], [0.0, 1.2, 0.0]], 2 / 5),
        # clamp(u, 0.8, 1.25): 1.5 -> 1.25, 0.4 -> 0.8
        ("clip", [[1.0, 1.25, 0.9], [0.8, 1.2, 0.0]], 2 / 5),
        # TIS, min(u, 1.25): only the upper tail moves; 0.4 stays
        ("trunc", [[1.0, 1.25, 0.9], [0.4, 1.2, 0.0]], 1 / 5),
    ],
)
def test_token_level_modes(mode, expected, filtered):
    w, m = weights("token", mode, (0.8, 1.25))
    torch.testing.assert_close(w, torch.tensor(expected))
    assert m["is_filter_ratio"].item() == pytest.approx(filtered)


def test_seq_mask_product_ratio():
    # row 0: U = 1.0 * 1.5 * 0.9 = 1.35 in [0.5, 1.4] -> kept with per-token u
    # row 1: U = 0.4 * 1.2 = 0.48 < 0.5 -> dropped
    w, m = weights("seq", "mask", (0.5, 1.4))
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.5, 0.9], [0.0, 0.0, 0.0]]))
    assert m["is_filter_ratio"].item() == pytest.approx(1 / 2)
    assert m["is_seq_ratio_mean"].item() == pytest.approx((1.35 + 0.48) / 2)


def test_geo_mask_seq_mask_tis():
    # row 0: U = 1.35 ** (1/3) = 1.1052 in [0.8, 1.25] -> kept; row 1: 0.48 ** (1/2) = 0.6928 -> dropped
    w, m = weights("geo", "mask", (0.8, 1.25))
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.5, 0.9], [0.0, 0.0, 0.0]]))
    assert m["is_filter_ratio"].item() == pytest.approx(1 / 2)
    # a single threshold is an upper bound only: 0.6928 <= 1.2 -> row 1 kept too
    w, m = weights("geo", "mask", 1.2)
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.5, 0.9], [0.4, 1.2, 0.0]]))
    assert m["is_filter_ratio"].item() == 0.0


def test_off_gives_unit_weights_on_action_tokens():
    w, m = weights("off", "mask", (0.8, 1.25))
    torch.testing.assert_close(w, MASK.float())
    assert m["is_filter_ratio"].item() == 0.0


def test_weights_are_detached_and_warn_when_everything_is_dropped(caplog):
    logp_old = LOGP_OLD.clone().requires_grad_(True)
    with caplog.at_level(logging.WARNING):
        w, m = is_correction(logp_old, LOGP_ROLLOUT, MASK, level="token", mode="mask", threshold=(2.0, 3.0))
    assert not w.requires_grad
    assert m["is_filter_ratio"].item() == 1.0
    assert "dropped 100.0% of units" in caplog.text


def test_seq_level_rejects_clip_and_trunc():
    for mode in ("clip", "trunc"):
        with pytest.raises(ValueError, match="needs mode 'mask'"):
            weights("seq", mode, (0.8, 1.25))


def test_parse_threshold():
    assert parse_threshold(5.0) == (0.0, 5.0)
    assert parse_threshold([0.99, 1.01]) == (0.99, 1.01)
    for bad in ([1.01, 0.99], [-1.0, 2.0], [1.0, 2.0, 3.0]):
        with pytest.raises(ValueError, match="LOW HIGH"):
            parse_threshold(bad)


def test_mismatch_metrics_by_hand():
    train = torch.tensor([[-1.0, -2.0, -0.5]])
    rollout = torch.tensor([[-1.0, -2.5, 7.0]])
    mask = torch.tensor([[T, T, F]])
    m = mismatch_metrics(train, rollout, mask)
    assert m["mismatch/bitwise_frac"].item() == pytest.approx(1 / 2)  # token 1 differs
    assert m["mismatch/abs_diff_mean"].item() == pytest.approx((0 + 0.5) / 2)
    assert m["vllm_kl"].item() == pytest.approx((0 - 0.5) / 2)
    # k3 of KL(rollout || train): delta = rollout - train = [0, -0.5]; exp(0.5) - 1 - 0.5
    assert m["mismatch/k3_kl"].item() == pytest.approx((math.exp(0.5) - 1.5) / 2)


def test_bitwise_frac_sees_last_bit_differences():
    train = torch.tensor([[-1.0, -1.0]])
    rollout = train.clone()
    rollout[0, 1] = torch.nextafter(rollout[0, 1], torch.tensor(0.0))  # last mantissa bit
    m = mismatch_metrics(train, rollout, torch.ones(1, 2, dtype=torch.bool))
    assert m["mismatch/bitwise_frac"].item() == pytest.approx(1 / 2)
    assert 0 < m["mismatch/abs_diff_mean"].item() < 1e-6
