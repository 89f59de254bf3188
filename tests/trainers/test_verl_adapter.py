"""The verl adapter against verl's own classes (verl 0.9.1, in the venv of scripts/setup_verl_venv.sh).

What runs here, on CPU: verl's hydra trainer config (``verl/trainer/config/ppo_trainer``),
``AgentLoopBase`` / ``AgentLoopOutput`` / the agent-loop registry, ``AgentLoopWorker``
(the loop instantiated by ``hydra.utils.instantiate`` from the registry, padding,
position ids, ``rm_scores``, ``DataProto``), verl's GRPO advantage
(``core_algos.compute_grpo_outcome_advantage``) and, in the slow test, verl's
``LLMServerClient`` and ``GlobalRequestLoadBalancer`` on Ray. Generation is the tiny
local HF model behind `HFTokenServer`, not vLLM/SGLang (docs/verl.md says what is left).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import pickle

import gymnasium as gym
import numpy as np
import pytest

pytestmark = pytest.mark.verl
if (
    importlib.util.find_spec("verl") is None
):  # the main venv: verl has its own (TRACE_GYM_REQUIRE=verl there)
    pytest.skip(
        "verl is not installed here (see scripts/setup_verl_venv.sh)", allow_module_level=True
    )

import trace_gym.trainers.verl_adapter as va  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from trace_gym.agents.context import ChatTokens, obs_role  # noqa: E402
from trace_gym.agents.hf import model_formats  # noqa: E402
from trace_gym.agents.verl_server import HFTokenServer  # noqa: E402
from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopOutput,
    AgentLoopWorker,
    DictConfigWrap,
    _agent_loop_registry,
)
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # noqa: E402

import trace_gym  # noqa: F401, E402 - registers the env ids
from trace_gym.alloc import ALLOCATORS  # noqa: E402
from trace_gym.errors import ConfigError  # noqa: E402
from trace_gym.runner import RunnerConfig  # noqa: E402

ENV = "trace/Sim-v0"
TASK = "sim-math_r06-0-0"


@pytest.fixture(scope="module")
def model_dir():
    from trace_gym.agents.tiny import default_test_config, tiny_model_dir

    return str(tiny_model_dir(default_test_config(envs=(ENV,))))


@pytest.fixture(scope="module")
def verl_config(model_dir):
    """verl's own PPO trainer config, composed by hydra, pointed at the tiny model."""
    import verl

    cdir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=cdir, version_base=None):
        return compose(
            "ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_dir}",
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.prompt_length=512",
                "actor_rollout_ref.rollout.response_length=400",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
                f"actor_rollout_ref.rollout.agent.default_agent_loop={va.AGENT_NAME}",
            ],
        )


@pytest.fixture(scope="module")
def server(verl_config):
    return HFTokenServer.from_config(verl_config)


@pytest.fixture(scope="module")
def worker(verl_config, server):
    return AgentLoopWorker(verl_config, server)


def _loop(verl_config, server, worker):
    """The agent loop built exactly as AgentLoopWorker._run_agent_loop builds it."""
    import hydra

    return hydra.utils.instantiate(
        config=_agent_loop_registry[va.AGENT_NAME],
        trainer_config=DictConfigWrap(config=verl_config),
        server_manager=server,
        tokenizer=worker.tokenizer,
        processor=None,
        hf_model_type=worker.hf_model_type,
        dataset_cls=worker.dataset_cls,
        data_config=DictConfigWrap(verl_config.data),
        tools=None,
    )


def _params():
    return {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "repetition_penalty": 1.0,
        "logprobs": True,
    }


def _run(loop, request, **params):
    sampling = {**_params(), **params}
    return asyncio.run(
        loop.run(sampling, raw_prompt=[{"role": "user", "content": "x"}], trace_gym=request)
    )


def test_registered_with_verl():
    assert _agent_loop_registry[va.AGENT_NAME] == {
        "_target_": "trace_gym.trainers.verl_adapter.TraceEnvAgentLoop"
    }


def test_agent_loop_output_follows_the_token_contract(verl_config, server, worker, model_dir):
    loop = _loop(verl_config, server, worker)
    out = _run(loop, va.trace_request(ENV, TASK, env_seed=3, child=1))
    assert isinstance(out, AgentLoopOutput)
    r = out.extra_fields["trace_gym_result"]
    turns = r["turns"]
    assert turns and r["error"] is None
    n = len(out.response_ids)
    assert len(out.response_mask) == len(out.response_logprobs) == n
    assert out.num_turns == 1 + 2 * len(turns)
    chat = ChatTokens(worker.tokenizer, model_formats(model_dir))
    fmt = chat.format(ENV)
    for t in turns:  # generated tokens are mask 1, env tokens mask 0, nothing else in between
        gen = out.response_ids[t["start"] : t["end"]]
        assert out.response_mask[t["start"] : t["end"]] == [1] * len(gen)
        assert worker.tokenizer.decode(gen, skip_special_tokens=True) == t["action"]
        assert out.response_mask[t["end"] : t["obs_end"]] == [0] * (t["obs_end"] - t["end"])
        if t["obs_end"] > t["end"]:
            assert out.response_ids[t["end"] : t["obs_end"]] == chat.obs_ids(
                t["observation"], fmt, gen, obs_role(t["info"])
            )
    assert turns[-1]["obs_end"] == n and sum(out.response_mask) == sum(
        t["end"] - t["start"] for t in turns
    )
    # the env outcome is the env's own: replaying the actions on a fresh env gives it back
    env = gym.make(ENV)
    obs, _ = env.reset(seed=3, options={"task": TASK})
    for t in turns:
        obs, reward, term, trunc, _ = env.step(t["action"])
        assert obs == t["observation"]
    assert term or trunc
    assert out.reward_score == reward == r["reward"]
    assert len(r["checkpoints"]) == len(turns) - 1  # one per boundary strictly inside the episode


def test_restore_request_continues_from_the_exact_prefix(verl_config, server, worker):
    loop = _loop(verl_config, server, worker)
    first = _run(loop, va.trace_request(ENV, TASK, env_seed=5))
    r = first.extra_fields["trace_gym_result"]
    cut = r["turns"][0]["obs_end"]
    req = {
        "checkpoint": r["checkpoints"][0],
        "prompt_ids": first.prompt_ids,
        "turns": 1,
        "response_ids": first.response_ids[:cut],
        "response_logprobs": first.response_logprobs[:cut],
    }
    out = _run(loop, va.trace_request(ENV, TASK, env_seed=77, anchor=1, child=1, restore=req))
    res = out.extra_fields["trace_gym_result"]
    assert res["error"] is None and res["prefix_turns"] == 1
    assert out.prompt_ids == first.prompt_ids
    assert out.response_ids[:cut] == first.response_ids[:cut]  # byte for byte
    assert out.response_mask[:cut] == [0] * cut  # the prefix is trained in its own rollout
    assert res["turns"][0]["start"] == cut and res["turns"][0]["observation"].startswith("[turn 2/")
    assert out.num_turns == 1 + 2 * (1 + len(res["turns"]))
    # the same continuation on an env restored by hand agrees with the loop's
    env = gym.make(ENV)
    trace_gym.restore(env, pickle.loads(r["checkpoints"][0]))
    env.unwrapped.np_random = np.random.Generator(np.random.PCG64(77))
    for t in res["turns"]:
        obs, reward, *_ = env.step(t["action"])
        assert obs == t["observation"]
    assert out.reward_score == reward


def test_missing_trace_gym_field_is_a_clear_error(verl_config, server, worker):
    loop = _loop(verl_config, server, worker)
    with pytest.raises(ConfigError, match="trace_gym"):
        asyncio.run(loop.run(_params(), raw_prompt=[]))


def test_prompt_over_prompt_length_fails_the_branch_not_the_batch(verl_config, server, worker):
    from omegaconf import OmegaConf

    small = OmegaConf.merge(verl_config, {"actor_rollout_ref": {"rollout": {"prompt_length": 16}}})
    out = _run(_loop(small, server, worker), va.trace_request(ENV, TASK))
    r = out.extra_fields["trace_gym_result"]
    assert r["error"]["kind"] == "overflow" and "prompt_length=16" in r["error"]["message"]
    assert (
        r["reward"] is None
        and not r["turns"]
        and len(out.prompt_ids) == 16
        and sum(out.response_mask) == 0
    )


def test_unsupported_sampling_params_are_refused(server):
    with pytest.raises(ConfigError, match="top-k"):
        asyncio.run(server.generate("r", prompt_ids=[1, 2], sampling_params={"top_k": 5}))
    with pytest.raises(ConfigError, match="beam"):
        asyncio.run(server.generate("r", prompt_ids=[1, 2], sampling_params={"beam": 2}))


def _root_batch(n: int) -> DataProto:
    reqs = [va.trace_request(ENV, TASK, env_seed=i, child=i, episode=i) for i in range(n)]
    return DataProto.from_dict(
        non_tensors={
            "trace_gym": va.object_array(reqs),
            "uid": va.object_array([TASK] * n),
            "raw_prompt": va.object_array([[{"role": "user", "content": "x"}]] * n),
            "agent_name": va.object_array([va.AGENT_NAME] * n),
        }
    )


def test_verl_worker_batch_feeds_verl_grpo(verl_config, worker):
    out = asyncio.run(worker.generate_sequences(_root_batch(3)))
    b = out.batch
    P, R = (
        verl_config.actor_rollout_ref.rollout.prompt_length,
        verl_config.actor_rollout_ref.rollout.response_length,
    )
    assert (
        b["prompts"].shape == (3, P)
        and b["responses"].shape == (3, R)
        and b["input_ids"].shape == (3, P + R)
    )
    results = out.non_tensor_batch["trace_gym_result"]
    for i, r in enumerate(results):
        n = int(b["attention_mask"][i, P:].sum())
        assert (
            float(b["rm_scores"][i, n - 1]) == r["reward"]
            and float(b["rm_scores"][i].sum()) == r["reward"]
        )
        assert int(b["response_mask"][i].sum()) == sum(t["end"] - t["start"] for t in r["turns"])
        assert out.non_tensor_batch["__num_turns__"][i] == 1 + 2 * len(r["turns"])
    adv, _ = compute_grpo_outcome_advantage(
        b["rm_scores"], b["response_mask"], out.non_tensor_batch["uid"]
    )
    assert (adv[b["response_mask"] == 0] == 0).all()
    rewards = np.array([r["reward"] for r in results])
    if rewards.std() > 0:  # a mixed group: the best rollout gets a positive advantage
        best = int(rewards.argmax())
        assert float(adv[best][b["response_mask"][best] == 1][0]) > 0


def test_trace_runner_branches_from_checkpoints_through_verl(worker):
    runner = va.VerlTraceRunner(
        worker.generate_sequences,
        ENV,
        ALLOCATORS["trace"](m_max=4),
        None,
        RunnerConfig(root_budget=4, replays_per_root=1.0, m_max=4, seed=1),
    )
    tasks = gym.make(ENV).unwrapped.task_ids[:2]
    trees, report = runner.run_step(0, tasks)
    batch = runner.last_batch
    roots = sum(len(t.root.children) for t in trees)
    replays = [
        n
        for t in trees
        for n in t.nodes
        if n.origin == "replay" and t.nodes[n.parent].origin != "replay"
    ]
    assert roots == report.roots == 4 and replays and len(batch) == roots + len(replays)
    results = batch.non_tensor_batch["trace_gym_result"]
    P = batch.batch["prompts"].shape[1]
    for t in trees:
        assert t.prompt_token_ids and all(n.info.get("verl_checkpoint") is None for n in t.nodes)
        for leaf in t.leaves():
            assert leaf.reward is not None and leaf.failure is None
        t.to_dict()  # still serialisable
    # every replay's verl row starts with exactly its prefix's tokens, masked out
    replay_rows = [i for i, r in enumerate(results) if r["prefix_turns"] > 0]
    assert len(replay_rows) == len(replays)
    for i in replay_rows:
        r = results[i]
        tree = next(t for t in trees if t.prompt_id == r["task"])
        cut = (
            r["turns"][0]["start"]
            if r["turns"]
            else int(batch.batch["attention_mask"][i, P:].sum())
        )
        prefix = batch.batch["responses"][i, :cut].tolist()
        assert batch.batch["response_mask"][i, :cut].sum() == 0
        assert any(
            va._prefix_tokens(tree, n.parent)[0] == prefix
            for n in tree.nodes
            if n.origin == "replay" and tree.nodes[n.parent].origin != "replay"
        )
    assert set(batch.non_tensor_batch["uid"]) == {f"0:{t}" for t in (t.prompt_id for t in trees)}


@pytest.mark.slow
def test_verl_llm_server_client_on_ray(verl_config, model_dir):
    """verl's LLMServerClient and load balancer (Ray actors) in front of HFTokenServer."""
    import ray
    from trace_gym.agents.verl_server import ray_server_client

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        client, _ = ray_server_client(verl_config, model_dir)
        w = AgentLoopWorker(verl_config, client)
        out = asyncio.run(w.generate_sequences(_root_batch(2)))
        results = out.non_tensor_batch["trace_gym_result"]
        assert all(r["error"] is None and r["turns"] for r in results)
        assert out.batch["rm_scores"].sum(-1).tolist() == [r["reward"] for r in results]
        assert list(out.non_tensor_batch["min_global_steps"]) == [
            None,
            None,
        ]  # set by verl's client
    finally:
        if started:
            ray.shutdown()


def test_agent_loop_config_yaml_registers_the_loop_in_a_fresh_worker(verl_config, server):
    """configs/verl_agent_loop.yaml through verl's own agent_loop_config_path loading."""
    from omegaconf import OmegaConf

    path = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "verl_agent_loop.yaml")
    cfg = OmegaConf.merge(
        verl_config,
        {
            "actor_rollout_ref": {
                "rollout": {"agent": {"agent_loop_config_path": os.path.abspath(path)}}
            }
        },
    )
    saved = _agent_loop_registry.pop(va.AGENT_NAME)
    try:
        w = AgentLoopWorker(cfg, server)
        entry = _agent_loop_registry[va.AGENT_NAME]
        assert entry["_target_"] == saved["_target_"] and entry["name"] == va.AGENT_NAME
        out = asyncio.run(w.generate_sequences(_root_batch(1)))
        assert out.non_tensor_batch["trace_gym_result"][0]["turns"]
    finally:
        _agent_loop_registry[va.AGENT_NAME] = saved


def test_math_env_checkpoints_restore_in_the_loop(verl_config, server, worker):
    """trace/Math-v0 (persistent interpreter state) through the loop: restore continues it."""
    loop = _loop(verl_config, server, worker)
    task = gym.make("trace/Math-v0").unwrapped.task_ids[0]
    first = _run(
        loop, va.trace_request("trace/Math-v0", task, env_seed=0), max_tokens=40
    )  # a per-turn cap
    r = first.extra_fields["trace_gym_result"]
    assert (
        r["error"] is None and r["turns"] and all(t["end"] - t["start"] <= 40 for t in r["turns"])
    )
    if not r["checkpoints"]:
        pytest.fail(f"the episode ended after {len(r['turns'])} turn(s): {r}")
    cut = r["turns"][0]["obs_end"]
    req = {
        "checkpoint": r["checkpoints"][0],
        "prompt_ids": first.prompt_ids,
        "turns": 1,
        "response_ids": first.response_ids[:cut],
        "response_logprobs": first.response_logprobs[:cut],
    }
    out = _run(
        loop,
        va.trace_request("trace/Math-v0", task, env_seed=9, anchor=1, restore=req),
        max_tokens=40,
    )
    res = out.extra_fields["trace_gym_result"]
    assert (
        res["error"] is None
        and res["prefix_turns"] == 1
        and out.response_ids[:cut] == first.response_ids[:cut]
    )
    env = gym.make("trace/Math-v0")
    trace_gym.restore(env, pickle.loads(r["checkpoints"][0]))
    env.unwrapped.np_random = np.random.Generator(np.random.PCG64(9))
    for t in res["turns"]:
        assert env.step(t["action"])[0] == t["observation"]


def test_generate_ids_is_the_policy_sampler(server):
    """HFTokenServer's sampler (HFPolicy.generate_ids) gives what HFPolicy.generate gives."""
    from trace_gym.policy import Conversation

    policy = server.policy
    prompt, info = gym.make(ENV).reset(seed=0, options={"task": TASK})
    conv = Conversation(ENV, TASK, prompt, (), seed=1234, reset_info=info)
    want = policy.generate([conv])[0]
    fmt = policy.chat.format(ENV)
    ids, lps, reason = policy.generate_ids(
        [policy.context(conv).ids], [1234], max_new_tokens=fmt.max_new_tokens, stop=fmt.stop
    )[0]
    assert ids == want.token_ids and reason == want.finish_reason
    assert np.allclose(lps, want.logprobs, atol=1e-6)
    assert policy.generate_ids([[1] * policy.max_context], [0], max_new_tokens=4)[0] == (
        [],
        [],
        "overflow",
    )


# ---------------------------------------------------------------- verl's trainer loop
class _WeightSync:
    """Stands in for verl's CheckpointEngineManager (weight sync into vLLM replicas: GPU)."""

    def __init__(self):
        self.calls = []

    def update_weights(self, step):
        self.calls.append(("update_weights", step))

    def sleep_replicas(self):
        self.calls.append(("sleep_replicas",))


class _ActorGroup:
    """Stands in for verl's actor worker group (FSDP engine workers: a CUDA device mesh).

    It takes exactly what verl's ``_update_actor`` / ``_save_checkpoint`` send and
    answers in the shape they read back; it trains nothing (docs/verl.md)."""

    def __init__(self):
        self.updates, self.saves = [], []

    def update_actor(self, batch_td):
        from verl.utils import tensordict_utils as tu

        self.updates.append(batch_td)
        return tu.get_tensordict({}, non_tensor_dict={"metrics": {"mfu": 0.0, "pg_loss": 0.0}})

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)
        self.saves.append((local_path, global_step))


class _Pools:
    def get_n_gpus(self):
        return 1


def _trainer_config(verl_config, tmp_path, data, **trace):
    from omegaconf import OmegaConf

    cfg = OmegaConf.merge(
        verl_config,
        {
            "data": {
                "train_files": [data],
                "val_files": [data],
                "train_batch_size": 8,
                "dataloader_num_workers": 0,
                "shuffle": False,
            },
            "trainer": {
                "use_v1": False,
                "total_epochs": 1,
                "val_before_train": False,
                "test_freq": -1,
                "save_freq": 1,
                "default_local_dir": str(tmp_path / "ckpt"),
                "logger": ["console"],
                "resume_mode": "disable",
                "balance_batch": False,
            },
            "algorithm": {"adv_estimator": "grpo", "rollout_correction": {"bypass_mode": True}},
        },
    )
    OmegaConf.set_struct(cfg, False)
    cfg.trace_gym = {"env_id": ENV, "root_budget": 4, "replays_per_root": 1.0, "m_max": 4, **trace}
    return cfg


def test_trace_config_limits_that_fit_imposes(verl_config):
    from omegaconf import OmegaConf
    from trace_gym.trainers.verl_trainer import VerlTraceConfig, check_config

    trace = VerlTraceConfig(env_id=ENV, root_budget=4, replays_per_root=1.0)
    assert trace.max_rows() == 8
    ok = OmegaConf.merge(verl_config, {"data": {"train_batch_size": 8}})
    check_config(ok, trace)
    with pytest.raises(ConfigError, match="train_batch_size=7"):
        check_config(OmegaConf.merge(ok, {"data": {"train_batch_size": 7}}), trace)
    with pytest.raises(ConfigError, match="rollout.n must be 1"):
        check_config(OmegaConf.merge(ok, {"actor_rollout_ref": {"rollout": {"n": 2}}}), trace)
    with pytest.raises(ConfigError, match="extra_info"):
        from trace_gym.trainers.verl_trainer import batch_tasks

        batch_tasks(DataProto.from_dict(non_tensors={"x": va.object_array([1])}))


@pytest.mark.slow
def test_verl_fit_runs_trace_rollouts_then_verl_grpo_update_and_checkpoint(
    verl_config, worker, tmp_path
):
    """verl's own RayPPOTrainer.fit, two steps, TRACE's rollout stage; workers stood in."""
    from trace_gym.trainers.verl_trainer import TraceRayPPOTrainer, write_task_parquet
    from verl.trainer.ppo.utils import Role
    from verl.utils.dataset.rl_dataset import collate_fn

    ids = gym.make(ENV).unwrapped.task_ids
    # 0, 10, 17 and 23 gave the tiny model mixed outcomes (most sim tasks give it all-0 or
    # all-1 groups, whose GRPO advantages are 0); each step's 8 candidates start with two
    tasks = [ids[i] for i in (0, 10, 1, 2, 3, 4, 5, 6, 17, 23, 7, 8, 9, 11, 12, 13)]
    data = str(tmp_path / "train.parquet")
    assert write_task_parquet(ENV, data, tasks) == 16
    cfg = _trainer_config(verl_config, tmp_path, data, seed=3)
    trainer = TraceRayPPOTrainer(
        cfg,
        tokenizer=worker.tokenizer,
        role_worker_mapping={Role.ActorRollout: object},
        resource_pool_manager=_Pools(),
        collate_fn=collate_fn,
    )
    # what init_workers builds needs GPUs; the agent loop runs in the worker fixture instead
    trainer.actor_rollout_wg, trainer.checkpoint_manager = _ActorGroup(), _WeightSync()
    rollout = trainer.use_trace_rollout(worker)
    seen, steps = [], []
    update = trainer._update_actor

    def spy(batch):  # the batch verl's fit hands to its actor update, after compute_advantage
        seen.append(batch)
        steps.append(rollout.last_step)
        return update(batch)

    trainer._update_actor = spy
    trainer.fit()

    assert len(seen) == 2 == len(trainer.actor_rollout_wg.updates)  # 16 prompts / 8 per step
    for step, (batch, (trees, report)) in enumerate(zip(seen, steps, strict=True), start=1):
        b, nt = batch.batch, batch.non_tensor_batch
        results = nt["trace_gym_result"]
        roots = sum(len(t.root.children) for t in trees)
        assert report.roots == roots == 4 and len(batch) == roots + report.replays > roots
        assert sum(r["prefix_turns"] > 0 for r in results) == report.replays
        # fit's own rows were lined up with TRACE's: each row's dataset fields are its task's
        assert [e["task"] for e in nt["extra_info"]] == [r["task"] for r in results]
        assert set(nt["uid"]) == {f"{step}:{t.prompt_id}" for t in trees}
        # verl's GRPO over TRACE's uid groups (a prompt's roots and replays together)
        assert torch_equal(b["token_level_rewards"], b["rm_scores"])
        want, _ = compute_grpo_outcome_advantage(b["rm_scores"], b["response_mask"], nt["uid"])
        assert torch_equal(b["advantages"], want)
        assert (b["advantages"][b["response_mask"] == 0] == 0).all()
        assert torch_equal(b["old_log_probs"], b["rollout_log_probs"])  # bypass mode
        assert len(trainer.actor_rollout_wg.updates[step - 1]) == len(batch)
        # every step has groups of mixed outcome (seed 3), so the advantages checked are not 0:
        # each trained token of a row takes the sign of its reward against its group's mean,
        # a replay's own turns included, its copied prefix (mask 0) at 0
        scores = b["rm_scores"].sum(-1)
        mixed = 0
        for u in set(nt["uid"]):
            rows = [i for i, v in enumerate(nt["uid"]) if v == u]
            mean = float(scores[rows].mean())
            for i in rows:
                adv = b["advantages"][i][b["response_mask"][i] == 1]
                if float(scores[rows].std()) > 0:
                    assert adv.numel() and bool(((adv > 0) == (float(scores[i]) > mean)).all())
                    mixed += int(results[i]["prefix_turns"] > 0)
        assert mixed, "no replay in a group of mixed outcome: the advantage checks were empty"
    # verl's _save_checkpoint: the actor's folder per step, the dataloader state, the tracker
    ckpt = tmp_path / "ckpt"
    assert trainer.actor_rollout_wg.saves == [
        (str(ckpt / f"global_step_{s}" / "actor"), s) for s in (1, 2)
    ]
    assert (ckpt / "global_step_2" / "data.pt").is_file()
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert ("update_weights", 2) in trainer.checkpoint_manager.calls


def torch_equal(a, b):
    return bool((a == b).all())


def test_validation_batches_take_verl_plain_agent_loop(worker):
    """fit's _validate batches (meta_info validate) skip TRACE: one plain rollout per row."""
    from trace_gym.trainers.verl_trainer import TraceRolloutManager, VerlTraceConfig, task_rows

    manager = TraceRolloutManager(worker, VerlTraceConfig(env_id=ENV, root_budget=2))
    tasks = gym.make(ENV).unwrapped.task_ids[:3]
    rows = task_rows(ENV, tasks)
    batch = DataProto.from_dict(
        non_tensors={
            "extra_info": va.object_array([r["extra_info"] for r in rows]),
            "raw_prompt": va.object_array([r["prompt"] for r in rows]),
            "uid": va.object_array(["a", "b", "c"]),
        },
        meta_info={"validate": True, "global_steps": 0},
    )
    out = asyncio.run(manager.generate_sequences(batch))
    results = out.non_tensor_batch["trace_gym_result"]
    assert [r["task"] for r in results] == list(tasks) and manager.last_step is None
    assert all(r["prefix_turns"] == 0 and r["error"] is None for r in results)
    assert list(out.non_tensor_batch["uid"]) == ["a", "b", "c"]  # verl's own uids kept


def test_launcher_config_and_one_line_errors(capsys):
    from trace_gym.trainers.verl_trainer import AGENT_LOOP_YAML, compose_config, main

    cfg = compose_config(["+trace_gym.root_budget=4", "+trace_gym.replays_per_root=1"])
    agent = cfg.actor_rollout_ref.rollout.agent
    assert cfg.trainer.use_v1 is False and agent.default_agent_loop == va.AGENT_NAME
    assert agent.agent_loop_config_path == str(AGENT_LOOP_YAML) and AGENT_LOOP_YAML.is_file()
    for bad, said in [
        ("+trace_gym.nope=1", "unknown keys ['nope']"),
        ("data.train_batch_size=4", "train_batch_size=4"),
        ("actor_rollout_ref.rollout.n=2", "rollout.n must be 1"),
        ("trainer.use_v1=true", "legacy trainer"),
    ]:
        assert main([bad]) == 2
        err = capsys.readouterr().err.strip()
        assert said in err and "\n" not in err


@pytest.mark.slow
def test_one_command_launch_reaches_verl_gpu_workers(model_dir, tmp_path):
    """`python -m trace_gym.trainers.verl_trainer ...` on CPU: Ray, the TraceTaskRunner
    actor, verl's TaskRunner.run (RLHFDataset on our parquet, TraceRayPPOTrainer built),
    then init_workers, where verl asks Ray for GPUs - the boundary of what a CPU runs."""
    import subprocess
    import sys

    import torch
    from trace_gym.trainers.verl_trainer import write_task_parquet

    if torch.cuda.is_available():
        pytest.skip("with a GPU the launch goes on into verl's FSDP and vLLM workers")
    data = str(tmp_path / "train.parquet")
    write_task_parquet(ENV, data)
    cmd = [
        sys.executable,
        "-m",
        "trace_gym.trainers.verl_trainer",
        f"data.train_files={data}",
        f"data.val_files={data}",
        "data.train_batch_size=64",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "trainer.n_gpus_per_node=1",
        "trainer.logger=[console]",
        "ray_kwargs.ray_init.num_cpus=2",
        f"+trace_gym.env_id={ENV}",
        "+trace_gym.root_budget=16",
        "+trace_gym.replays_per_root=1",
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "TraceTaskRunner" in out, out[-3000:]
    assert "Size of train dataloader: 8" in out  # 512 tasks / 64 per step
    assert "Total available GPUs 0 is less than total desired GPUs 1" in out, out[-3000:]
