"""Each gateway process keeps a log of the registry changes it heard, with when it heard them:
the propagation delay of a change is measured, not assumed."""

from __future__ import annotations

from gateway.proxy.routing import HEARD_KEPT, BackendView


def test_a_change_is_logged_once_with_the_time_it_was_heard() -> None:
    view = BackendView(1, "m", "http://b", "active", 0, 0)
    view.hear("active", 0, 0)  # the first read is logged
    view.hear("active", 0, 0)  # a re-read without change is not
    view.hear("draining", 0, 0)
    view.hear("paused", 0, 1)
    view.hear("active", 1, 1)
    assert [(h.state, h.served_version, h.swap_epoch) for h in view.heard] == [
        ("active", 0, 0),
        ("draining", 0, 0),
        ("paused", 0, 1),
        ("active", 1, 1),
    ]
    times = [h.at for h in view.heard]
    assert times == sorted(times)
    assert (view.state, view.served_version, view.swap_epoch) == ("active", 1, 1)


def test_the_log_is_bounded() -> None:
    view = BackendView(1, "m", "http://b", "active", 0, 0)
    for epoch in range(HEARD_KEPT * 3):
        view.hear("paused" if epoch % 2 else "active", 0, epoch)
    assert len(view.heard) == HEARD_KEPT and view.heard[-1].swap_epoch == HEARD_KEPT * 3 - 1
