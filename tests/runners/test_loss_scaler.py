"""Dynamic loss scaling (runners/loss_scaler.py), by hand: growth, backoff, skipped steps."""

from runners.loss_scaler import LossScaler


def test_loss_scaler_grows_and_backs_off():
    s = LossScaler(True, scale=8.0, growth_interval=2)
    s.update(True), s.update(True)
    assert s.scale == 16.0
    s.update(False)
    assert s.scale == 8.0 and s.skipped == 1
    assert LossScaler(False).scale == 1.0


def test_non_finite_steps_are_counted_for_every_dtype():
    for enabled in (False, True):
        s = LossScaler(enabled, scale=8.0)
        s.update(False), s.update(False)
        assert (s.skipped, s.skipped_in_a_row) == (2, 2)
        s.update(True)
        assert (s.skipped, s.skipped_in_a_row) == (2, 0)
        assert s.scale == (2.0 if enabled else 1.0)
