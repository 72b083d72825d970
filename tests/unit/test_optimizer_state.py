"""The AdamW moments on disk: two slots written in place in turn, an index replaced atomically,
the state before the latest kept, a torn slot never loaded, an earlier release's file still read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.loop import optimizer_state as store
from trainer.loop.optimizer_state import (
    NAME,
    load_state,
    previous_path,
    save_state,
    saved_states,
    slot_path,
    state_path,
)


def stepped_optimizer(seed: int) -> torch.optim.AdamW:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3, bias=False))
    model[1].weight.data = model[1].weight.data.to(torch.bfloat16).float()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    for _ in range(2):
        model(torch.randn(4, 6)).square().mean().backward()
        optimizer.step()
    return optimizer


def assert_same(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def test_a_saved_state_loads_back_bitwise_with_its_groups(tmp_path: Path) -> None:
    path = state_path(tmp_path, "m")
    state = stepped_optimizer(0).state_dict()
    save_state(state, path, 7)
    loaded, message = load_state(path, 7)
    assert loaded is not None and "restored" in message
    assert_same(loaded, state)  # moments, step counts, betas tuple and lr alike
    fresh = stepped_optimizer(1)
    fresh.load_state_dict(loaded)  # torch takes it back
    assert_same(fresh.state_dict()["state"], state["state"])


def test_slots_alternate_and_the_state_before_the_latest_is_kept(tmp_path: Path) -> None:
    path = state_path(tmp_path, "m")
    states = [stepped_optimizer(seed).state_dict() for seed in range(3)]
    for version, state in enumerate(states, start=1):
        save_state(state, path, version)
    assert [s["version"] for s in saved_states(path)] == [3, 2]  # latest first, one before it
    assert_same(load_state(path, 2)[0], states[1])
    assert_same(load_state(path, 3)[0], states[2])
    assert load_state(path, 1)[0] is None
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "optimizer.0.bin",
        "optimizer.1.bin",
        "optimizer.pt",
    ]


def test_a_stop_while_a_slot_is_written_leaves_the_latest_loadable(
    tmp_path: Path, monkeypatch
) -> None:
    path = state_path(tmp_path, "m")
    first, second = stepped_optimizer(0).state_dict(), stepped_optimizer(1).state_dict()
    save_state(first, path, 1)

    def torn(slot: Path, tensors):
        slot.write_bytes(b"\0" * 10)  # half written when the process stopped
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "_write_slot", torn)
    with pytest.raises(KeyboardInterrupt):
        save_state(second, path, 2)
    assert [s["version"] for s in saved_states(path)] == [1]  # the torn slot is not named
    assert_same(load_state(path, 1)[0], first)
    state, message = load_state(path, 2)
    assert state is None and "of version 1, not 2" in message and "start at zero" in message


def test_a_slot_shorter_than_its_index_is_refused(tmp_path: Path) -> None:
    path = state_path(tmp_path, "m")
    save_state(stepped_optimizer(0).state_dict(), path, 1)
    slot = slot_path(path, 0)
    slot.write_bytes(slot.read_bytes()[:-8])
    state, message = load_state(path, 1)
    assert state is None and "unreadable" in message and "start at zero" in message


def test_another_layout_is_not_loaded(tmp_path: Path) -> None:
    path = state_path(tmp_path, "m")
    save_state(stepped_optimizer(0).state_dict(), path, 4, keyed_by=NAME)
    state, message = load_state(path, 4)
    assert state is None and "keyed by parameter name" in message


def test_no_file_starts_fresh(tmp_path: Path) -> None:
    state, message = load_state(state_path(tmp_path, "m"), 0)
    assert state is None and message.startswith("no saved optimizer state")


def test_an_earlier_releases_files_are_read_then_replaced(tmp_path: Path) -> None:
    path = state_path(tmp_path, "m")
    path.parent.mkdir(parents=True)
    old, older = stepped_optimizer(0).state_dict(), stepped_optimizer(1).state_dict()
    torch.save({"version": 5, "keyed_by": "index", "state": old}, path)
    torch.save({"version": 4, "keyed_by": "index", "state": older}, previous_path(path))
    assert_same(load_state(path, 5)[0], old)
    assert_same(load_state(path, 4)[0], older)
    new = stepped_optimizer(2).state_dict()
    save_state(new, path, 6)
    assert not previous_path(path).exists()
    assert [s["version"] for s in saved_states(path)] == [6]
    assert_same(load_state(path, 6)[0], new)
