"""verl's PPO trainer whose rollout stage is TRACE's: roots, then prefix replays, then verl.

`TraceRayPPOTrainer` subclasses verl 0.9.1's ``RayPPOTrainer`` (the ``trainer.use_v1=false``
trainer, ``verl/trainer/ppo/ray_trainer.py``) and leaves ``fit`` as verl wrote it: verl's
reward extraction, old log-probs, ``compute_advantage`` (GRPO groups by ``uid``), actor
update, ``_save_checkpoint`` and weight sync all run unchanged on the batch TRACE made.
Two methods are overridden:

- ``init_workers``: after verl has built its ``AgentLoopManager``, ``async_rollout_manager``
  becomes a `TraceRolloutManager` around it. ``fit`` calls
  ``async_rollout_manager.generate_sequences(gen_batch)`` once per step; the wrapper reads
  the step's candidate tasks from the batch (``extra_info["task"]``), runs
  `VerlTraceRunner.run_step` (TRACE's roots as one call of verl's manager, then the
  replays TRACE placed as a second), and returns the runner's ``last_batch``.
- ``_get_gen_batch``: also hands the wrapper ``fit``'s own batch (what is left of the
  dataloader's rows), because ``fit`` then does ``batch.repeat(n).union(output)`` and the
  TRACE batch has its own rows (a prompt's roots and replays, ``uid`` = ``"{step}:{task}"``).
  The wrapper rewrites that batch in place to one row per output row (the row's task's
  dataset fields, the output's ``uid``), so the union lines up.

Two limits follow from ``fit`` (checked at construction): ``actor_rollout_ref.rollout.n``
must be 1 (TRACE decides how many rollouts each prompt gets), and ``data.train_batch_size``
must be at least TRACE's most rows per step, M + round(N * M), because ``fit`` keeps
``output[:len(gen_batch)]``. TRACE's settings come from the config's ``trace_gym`` node
(`VerlTraceConfig`). Launch: ``python -m trace_gym.trainers.verl_trainer <hydra overrides>``
(docs/verl.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_gym.trainers.config import FLAT_RUNNER_KEYS, runner_table, takes_flat_runner_keys
from trace_gym.trainers.verl_adapter import AGENT_NAME, VerlTraceRunner, object_array, trace_request

from trace_gym.errors import ConfigError, DependencyNotInstalled
from trace_gym.optional import EXTRAS
from trace_gym.runner import RunnerConfig

try:
    from verl.protocol import DataProto
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
except ImportError as e:  # pragma: no cover - exercised only without the verl extra
    raise DependencyNotInstalled("verl (the verl trainer)", EXTRAS["verl"]) from e

__all__ = [
    "TraceRayPPOTrainer",
    "TraceRolloutManager",
    "VerlTraceConfig",
    "check_config",
    "main",
    "task_rows",
    "write_task_parquet",
]


#: the agent-loop registry entry verl's workers load (``agent_loop_config_path``)
AGENT_LOOP_YAML = Path(__file__).resolve().parent.parent / "configs" / "verl_agent_loop.yaml"

#: the runner settings the ``trace_gym`` node takes as keys of its own (the rest: ``runner``)
VERL_FLAT_KEYS = (*FLAT_RUNNER_KEYS, "seed")


@takes_flat_runner_keys(VERL_FLAT_KEYS, "trace_gym")
@dataclass
class VerlTraceConfig:
    """TRACE's settings in a verl run: the config's ``trace_gym`` node (``+trace_gym.KEY=...``)."""

    #: the env the agent loop plays (``gym.make`` id), in the driver and in verl's workers
    env_id: str = "trace/Sim-v0"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    #: the runner's settings (`trace_gym.runner.RunnerConfig`): M = root_budget, N = replays_per_root
    runner: RunnerConfig = field(
        default_factory=lambda: runner_table({}, "trace_gym", VERL_FLAT_KEYS)
    )
    allocator: str = "trace"
    allocator_kwargs: dict[str, Any] = field(default_factory=dict)
    #: predictor name or "module:Class" ("" = none: every value 0.5)
    predictor: str = "empirical"
    predictor_kwargs: dict[str, Any] = field(default_factory=dict)
    #: whether a replay's copy of its prefix is trained again (default: once, in its root)
    train_prefix: bool = False

    def __post_init__(self) -> None:
        from trace_gym.alloc import allocator_class

        self.runner = runner_table(self.runner, "trace_gym", VERL_FLAT_KEYS)
        allocator_class(self.allocator)

    @classmethod
    def from_verl(cls, config: Any) -> VerlTraceConfig:
        """The ``trace_gym`` node of a verl config (absent: every default)."""
        from dataclasses import fields

        from omegaconf import OmegaConf

        node = config.get("trace_gym")
        values = {} if node is None else OmegaConf.to_container(node, resolve=True)
        if not isinstance(values, dict):
            raise ConfigError(f"trace_gym must be a mapping, got {type(values).__name__}")
        known = {f.name for f in fields(cls)} | set(VERL_FLAT_KEYS)
        unknown_keys = sorted(set(values) - known)
        if unknown_keys:
            raise ConfigError(f"trace_gym: unknown keys {unknown_keys}; known: {sorted(known)}")
        return cls(**values)

    def max_rows(self) -> int:
        """The most rows one step can return: M roots + round(N * M) replays."""
        m = self.runner.root_budget
        return m + round(self.runner.replays_per_root * m)


def batch_tasks(batch: Any) -> list[str]:
    """Each row's task id, from ``extra_info["task"]`` (the rows of `task_rows`)."""
    infos = batch.non_tensor_batch.get("extra_info")
    infos = [] if infos is None else list(infos)
    tasks = [info.get("task") if isinstance(info, dict) else None for info in infos]
    if not tasks or any(t is None for t in tasks):
        raise ConfigError(
            "TraceRolloutManager needs each dataset row's task id in extra_info['task'] "
            "(write the data with trace_gym.trainers.verl_trainer.write_task_parquet)"
        )
    return [str(t) for t in tasks]


class TraceRolloutManager:
    """``async_rollout_manager`` for `TraceRayPPOTrainer`: a training step's rollout is TRACE's.

    `manager` is verl's ``AgentLoopManager`` (or ``AgentLoopWorker``, or anything with its
    ``generate_sequences``); validation batches (``meta_info["validate"]``) go straight to
    it, each row given a plain ``trace_gym`` request for its task. `fit_batch` is set by
    the trainer before each call (module docstring).
    """

    def __init__(self, manager: Any, config: VerlTraceConfig, *, predictor: Any = None):
        from trace_gym.alloc import make_allocator
        from trace_gym.predict import make_predictor

        self.manager, self.config = manager, config
        if predictor is None and config.predictor:
            predictor = make_predictor(config.predictor, **config.predictor_kwargs)
        self.runner = VerlTraceRunner(
            manager.generate_sequences,
            config.env_id,
            make_allocator(config.allocator, **config.allocator_kwargs),
            predictor,
            config.runner,
            env_kwargs=config.env_kwargs,
            train_prefix=config.train_prefix,
        )
        #: fit's batch of the step in progress (rewritten in place to the output's rows)
        self.fit_batch: Any = None
        #: the last step's trees and report (`trace_gym.runner.StepResult`)
        self.last_step: Any = None

    def generate_sequences(self, gen_batch: Any) -> Any:
        """TRACE's rollout of the batch's prompts (validation: verl's plain agent loop)."""
        tasks = batch_tasks(gen_batch)
        if gen_batch.meta_info.get("validate"):
            return self.manager.generate_sequences(self._plain(gen_batch, tasks))
        step = int(gen_batch.meta_info.get("global_steps", 0))
        self.last_step = self.runner.run_step(step, list(dict.fromkeys(tasks)))
        out = self.runner.last_batch
        if len(out) > len(gen_batch):  # fit keeps output[:len(gen_batch)]
            raise ConfigError(
                f"TRACE returned {len(out)} rows for a batch of {len(gen_batch)} prompts; set "
                f"data.train_batch_size >= {self.config.max_rows()} (M + round(N * M))"
            )
        if self.fit_batch is not None:
            _align(self.fit_batch, out, tasks)
            self.fit_batch = None
        out.meta_info["timing"] = {
            f"trace/{stage}/{k}": v
            for stage, t in self.runner.last_timing.items()
            for k, v in t.items()
        }
        return out

    def _plain(self, gen_batch: Any, tasks: Sequence[str]) -> Any:
        reqs = [
            trace_request(
                self.config.env_id, t, env_kwargs=self.config.env_kwargs, env_seed=i, episode=i
            )
            for i, t in enumerate(tasks)
        ]
        gen_batch.non_tensor_batch["trace_gym"] = object_array(reqs)
        gen_batch.non_tensor_batch["agent_name"] = object_array([AGENT_NAME] * len(tasks))
        return gen_batch


def _align(fit_batch: Any, out: Any, tasks: Sequence[str]) -> None:
    """Rewrite `fit_batch` in place to `out`'s rows: each its task's dataset row, `out`'s uid."""
    first = {t: i for i, t in reversed(list(enumerate(tasks)))}
    rows = [first[r["task"]] for r in out.non_tensor_batch["trace_gym_result"]]
    picked = fit_batch[rows]
    for key in set(picked.non_tensor_batch) & set(out.non_tensor_batch):
        picked.non_tensor_batch.pop(key)  # the output's own (uid among them) win
    if picked.batch is not None:
        for key in set(picked.batch.keys()) & set(out.batch.keys()):
            picked.batch.pop(key)
    fit_batch.batch, fit_batch.non_tensor_batch = picked.batch, picked.non_tensor_batch


def check_config(config: Any, trace: VerlTraceConfig) -> None:
    """The two limits ``fit`` puts on a TRACE rollout (module docstring), as `ConfigError`s."""
    n = int(config.actor_rollout_ref.rollout.n)
    if n != 1:
        raise ConfigError(
            f"actor_rollout_ref.rollout.n must be 1 with TRACE rollouts (TRACE decides each "
            f"prompt's rollouts), got {n}"
        )
    rows, size = trace.max_rows(), int(config.data.train_batch_size)
    if size < rows:
        raise ConfigError(
            f"data.train_batch_size={size} is below TRACE's most rows per step, "
            f"M + round(N * M) = {rows}: raise it or lower trace_gym.root_budget"
        )


class TraceRayPPOTrainer(RayPPOTrainer):
    """verl's ``RayPPOTrainer`` with TRACE's rollouts (module docstring); ``fit`` is verl's."""

    def __init__(
        self, config: Any, *args: Any, trace_config: VerlTraceConfig | None = None, **kwargs: Any
    ):
        self.trace_config = trace_config or VerlTraceConfig.from_verl(config)
        check_config(config, self.trace_config)  # before verl builds its dataloaders
        super().__init__(config, *args, **kwargs)

    def init_workers(self) -> None:
        """verl's workers, then its agent-loop manager wrapped in a `TraceRolloutManager`."""
        super().init_workers()
        self.use_trace_rollout(self.async_rollout_manager)

    def use_trace_rollout(self, manager: Any, *, predictor: Any = None) -> TraceRolloutManager:
        """Make `manager` (verl's ``AgentLoopManager``, or a worker) TRACE's rollout stage."""
        self.async_rollout_manager = TraceRolloutManager(
            manager, self.trace_config, predictor=predictor
        )
        return self.async_rollout_manager

    def _get_gen_batch(self, batch: DataProto) -> DataProto:
        gen_batch = super()._get_gen_batch(batch)
        if isinstance(self.async_rollout_manager, TraceRolloutManager):
            self.async_rollout_manager.fit_batch = batch
        return gen_batch


def task_rows(env_id: str, tasks: Sequence[str], data_source: str = "trace_gym") -> list[dict]:
    """verl dataset rows for `tasks` (``prompt`` is verl's required column; the env's own
    reset observation is the real prompt, and the reward is the env's)."""
    return [
        {
            "data_source": data_source,
            "prompt": [{"role": "user", "content": str(t)}],
            "reward_model": {"style": "env", "ground_truth": ""},
            "extra_info": {"task": str(t), "env_id": env_id, "index": i},
            "agent_name": AGENT_NAME,
        }
        for i, t in enumerate(tasks)
    ]


def write_task_parquet(env_id: str, path: str, tasks: Sequence[str] | None = None) -> int:
    """Write `tasks` (default: the env's task ids) as a verl parquet file; returns the row count."""
    import gymnasium as gym
    import pandas as pd

    import trace_gym  # noqa: F401 - registers the env ids

    if tasks is None:
        env = gym.make(env_id)
        tasks = list(env.unwrapped.task_ids)
        env.close()
    rows = task_rows(env_id, tasks)
    pd.DataFrame(rows).to_parquet(path)
    return len(rows)


def _task_runner() -> Any:
    """A Ray TaskRunner that runs verl's legacy ``TaskRunner.run`` with `TraceRayPPOTrainer`."""
    import ray
    from verl.trainer import main_ppo_v0

    @ray.remote(num_cpus=1)
    class TraceTaskRunner(main_ppo_v0.BaseTaskRunner):
        def run(self, config: Any) -> None:
            import trace_gym.trainers.verl_trainer as vt

            # verl's TaskRunner.run builds the trainer by this module-level name; this is
            # the Ray actor's own process, so only this run sees the swap
            main_ppo_v0.RayPPOTrainer = vt.TraceRayPPOTrainer
            main_ppo_v0.TaskRunner.__ray_actor_class__.run(self, config)

    return TraceTaskRunner


def compose_config(overrides: Sequence[str]) -> Any:
    """verl's ``ppo_trainer`` config with `overrides` (hydra syntax), for the legacy trainer."""
    import os

    import verl
    from hydra import compose, initialize_config_dir

    cdir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    defaults = [
        "trainer.use_v1=false",
        "algorithm.adv_estimator=grpo",  # groups by uid: a prompt's roots and replays together
        f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_NAME}",
    ]
    if AGENT_LOOP_YAML.is_file():  # registers the loop in verl's agent-loop worker processes
        defaults.append(f"actor_rollout_ref.rollout.agent.agent_loop_config_path={AGENT_LOOP_YAML}")
    with initialize_config_dir(config_dir=cdir, version_base=None):
        config = compose("ppo_trainer", overrides=[*defaults, *overrides])
    if config.trainer.use_v1:
        raise ConfigError("TraceRayPPOTrainer is verl's legacy trainer: leave trainer.use_v1=false")
    check_config(config, VerlTraceConfig.from_verl(config))  # before Ray starts anything
    return config


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trace_gym.trainers.verl_trainer [hydra overrides]``: verl's main_ppo
    (its device and config checks, then ``run_ppo``) with `TraceRayPPOTrainer`."""
    import sys

    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        config = compose_config(args)
        auto_set_device(config)  # what verl's own main does before run_ppo
        validate_config(
            config=config,
            use_reference_policy=need_reference_policy(config),
            use_critic=need_critic(config),
        )
    except (ConfigError, HydraException, OmegaConfBaseException, TypeError, ValueError) as e:
        print(f"trace-gym verl: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    run_ppo(config, task_runner_class=_task_runner())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
