"""Checkpoint files that run no code (issue 26.8): a DCP ``.metadata`` that builds anything
but DCP's metadata, and TRL's old ``trace_runner.pkl``, are refused unless trusted.

(The trainer-level cases - an old pickle checkpoint, a folder with rows and no
checkpoint, a torn row, Ctrl-C - are in test_loop.py.)
"""

from __future__ import annotations

import json
import pickle

import pytest

pytest.importorskip("torch")

from trace_gym.trainers.checkpoint import CHECKSUMS, sha256_file  # noqa: E402
from trace_gym.trainers.state_io import check_dcp_metadata, load_state, save_state  # noqa: E402

from trace_gym.errors import ConfigError  # noqa: E402


class Marker:
    """A pickle that writes a file when it is loaded (what a hostile checkpoint would do)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (_touch, (self.path,))


def _touch(path):
    with open(path, "w") as f:
        f.write("ran")
    return {}


def test_dcp_metadata_that_is_not_dcp_metadata_is_refused(tmp_path):
    import torch
    import torch.distributed.checkpoint as dcp

    model = torch.nn.Linear(3, 2)
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(tmp_path / "good"))
    check_dcp_metadata(tmp_path / "good" / ".metadata")  # what DCP writes passes

    marker = tmp_path / "marker"
    bad = tmp_path / "bad.metadata"
    bad.write_bytes(pickle.dumps(Marker(marker)))
    with pytest.raises(pickle.UnpicklingError, match="is not DCP metadata"):
        check_dcp_metadata(bad)
    assert not marker.exists()


def test_a_sharded_checkpoint_with_a_hostile_metadata_is_refused(tmp_path):
    from trace_gym.trainers.dist_ckpt import check

    ckpt = tmp_path / "step_000001"
    (ckpt / "dcp").mkdir(parents=True)
    marker = tmp_path / "marker"
    (ckpt / "dcp" / ".metadata").write_bytes(pickle.dumps(Marker(marker)))
    files = ["dcp/.metadata", *save_state(ckpt, "state", {"step": 1})]
    (ckpt / CHECKSUMS).write_text(json.dumps({n: sha256_file(ckpt / n) for n in files}))
    with pytest.raises(ConfigError, match="holds pickles"):
        check(ckpt)
    assert not marker.exists()
    assert check(ckpt, trusted=True) is None  # trusted: left to DCP


def test_an_old_trl_runner_state_pickle_is_refused(tmp_path):
    from trace_gym.trainers.trl_adapter import _load_runner_state

    marker = tmp_path / "marker"
    (tmp_path / "trace_runner.pkl").write_bytes(pickle.dumps(Marker(marker)))
    with pytest.raises(ConfigError, match="holds pickles"):
        _load_runner_state(tmp_path, trusted=False)
    assert not marker.exists()


def test_state_files_round_trip_nested_state(tmp_path):
    import numpy as np
    import torch

    from trace_gym.alloc.base import VisitHistory

    state = {
        "rng": (np.random.get_state(), torch.get_rng_state()),
        "history": {"p": VisitHistory(((1.0, 0.0),), 1, 0)},
        "prefixes": {("p", 1): (0.5, 1.0)},
        "x": float("nan"),
        "__odd": 1,
    }
    back = load_state(tmp_path, "s") if save_state(tmp_path, "s", state) else None
    assert back["history"] == state["history"] and back["prefixes"] == state["prefixes"]
    assert np.array_equal(back["rng"][0][1], state["rng"][0][1])
    assert torch.equal(back["rng"][1], state["rng"][1]) and back["__odd"] == 1
    assert back["x"] != back["x"]  # nan, written as strict JSON (no bare NaN)
    json.loads((tmp_path / "s.json").read_text(), parse_constant=lambda c: 1 / 0)
    with pytest.raises(TypeError, match="cannot be saved without pickle"):
        save_state(tmp_path, "t", {"f": object()})
