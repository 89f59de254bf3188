"""Engines that die while the pool starts or loads them (issue 26.9), on a fake Ray.

On real Ray an engine actor killed in the first second of a step that had just
replaced an engine made `run_step` raise ``ActorDiedError``: the pool's push to the
fresh engine was a bare ``ray.get``. The fake below lets a test say which call of which
engine finds its actor dead, so the case runs the same every time and needs no Ray.
"""

from __future__ import annotations

import pytest

from trace_gym.distributed.engine import REPLACE_ROUNDS, EnginePool
from trace_gym.errors import EngineUnavailable
from trace_gym.testing import RandomCountdownPolicy


class _Exceptions:
    class RayError(Exception):
        pass

    class RayActorError(RayError):
        pass

    class ActorDiedError(RayActorError):
        pass

    class WorkerCrashedError(RayError):
        pass


class _Ref:
    def __init__(self, value=None, error=None):
        self.value, self.error = value, error


class _Method:
    def __init__(self, actor, name):
        self.actor, self.name = actor, name

    def remote(self, *args):
        a = self.actor
        a.calls.append(self.name)
        if a.dead or (a.index, self.name) in a.ray.deaths:
            a.dead = True
            return _Ref(error=_Exceptions.ActorDiedError(f"engine {a.index} died"))
        if self.name == "load":
            a.loaded = args[:2]  # (version, step)
        return _Ref(value=a.index)


class _Actor:
    def __init__(self, ray, index):
        self.ray, self.index = ray, index
        self.dead, self.loaded, self.calls = False, None, []

    def __getattr__(self, name):
        return _Method(self, name)


class _ActorClass:
    def __init__(self, ray):
        self.ray = ray

    def options(self, **kw):
        return self

    def remote(self, index, blob, **kw):
        actor = _Actor(self.ray, index)
        self.ray.actors[index] = actor
        return actor


class FakeRay:
    """The bits of the ray module `EnginePool` uses; `deaths` holds (engine, call) pairs
    at which that engine's actor dies."""

    exceptions = _Exceptions

    def __init__(self, deaths=()):
        self.deaths = set(deaths)
        self.actors: dict[int, _Actor] = {}

    def remote(self, cls):
        return _ActorClass(self)

    def get(self, refs, timeout=None):
        if isinstance(refs, list):
            return [self.get(r) for r in refs]
        if refs.error is not None:
            raise refs.error
        return refs.value

    def kill(self, actor):
        actor.dead = True


class Versioned(RandomCountdownPolicy):
    version = 0


def test_a_just_replaced_engine_dying_at_its_first_load_is_replaced_again():
    ray = FakeRay()
    pool = EnginePool(ray, Versioned(), 2)
    pool.begin_step(0, Versioned())
    ray.actors[1].dead = True  # killed between steps: step 1 replaces it with engine 2 ...
    ray.deaths.add((2, "load"))  # ... which dies in its first second, at its first load
    policy = Versioned()
    policy.version = 1
    assert pool.begin_step(1, policy) == 1
    live = [h.index for h in pool.handles]
    assert live == [0, 3] and pool.replaced == 2
    assert all(ray.actors[i].loaded == (1, 1) for i in live)  # both hold step 1's push


def test_an_engine_dying_during_the_push_is_replaced_and_gets_the_push():
    ray = FakeRay()
    pool = EnginePool(ray, Versioned(), 2)
    pool.begin_step(0, Versioned())
    ray.deaths.add((0, "load"))  # dies while the driver pushes step 1
    pool.begin_step(1, Versioned())
    assert [h.index for h in pool.handles] == [1, 2]
    assert all(ray.actors[i].loaded == (0, 1) for i in (1, 2))


def test_engines_that_keep_dying_at_start_up_are_engine_unavailable():
    ray = FakeRay(deaths={(i, "ping") for i in range(1, 10)})
    with pytest.raises(EngineUnavailable, match=f"died {REPLACE_ROUNDS} times"):
        EnginePool(ray, Versioned(), 2)
