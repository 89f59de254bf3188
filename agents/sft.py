"""Warm-start SFT for tiny models: scripted episodes, tokenised by the token contract.

`collect_episodes` plays scripted policies (`trace_gym.agents.scripted`) on real envs;
`sft_warm_start` trains a causal LM on them with the loss on assistant tokens only.
Each episode is tokenised exactly as `HFPolicy` would see it (`ChatTokens`): templated
prompt, then per turn the action's tokens (plus the end-of-turn token when the action
has no stop string, so the model learns to end plain-text turns) and the wrapped
observation's tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from trace_gym.agents.context import obs_role
from trace_gym.agents.formats import find_stop

from trace_gym.optional import require
from trace_gym.policy import Conversation
from trace_gym.tree import Turn

__all__ = [
    "Episode",
    "collect_episodes",
    "episode_texts",
    "play_episode",
    "sft_warm_start",
    "tokenize_episode",
]

logger = logging.getLogger(__name__)


@dataclass
class Episode:
    """One finished scripted episode."""

    env_id: str
    task_id: str
    prompt: str
    reset_info: dict[str, Any]
    turns: list[Turn]
    reward: float


def play_episode(env: Any, policy: Any, env_id: str, task: int | str, seed: int) -> Episode:
    """Run `policy` on `env` for one episode on `task` (one conversation, no branching)."""
    prompt, info = env.reset(seed=seed, options={"task": task})
    turns: list[Turn] = []
    reward = 0.0
    while True:
        conv = Conversation(
            env_id,
            str(info.get("task_id", task)),
            prompt,
            tuple(turns),
            seed=seed * 1000 + len(turns),
            reset_info=info,
        )
        out = policy.generate([conv])[0]
        obs, reward, terminated, truncated, step_info = env.step(out.text)
        turns.append(
            Turn(action=out.text, observation=obs, reward=float(reward), info=dict(step_info))
        )
        if terminated or truncated:
            break
    return Episode(env_id, str(info.get("task_id", task)), prompt, info, turns, float(reward))


def collect_episodes(
    env_ids: Sequence[str],
    per_env: int,
    *,
    skill: float = 0.9,
    seed: int = 0,
    env_kwargs: dict[str, dict[str, Any]] | None = None,
) -> list[Episode]:
    """`per_env` scripted episodes of each env (tasks in order, cycling)."""
    from trace_gym.agents.scripted import make_env, make_scripted

    episodes = []
    for env_id in env_ids:
        env = make_env(env_id, **(env_kwargs or {}).get(env_id, {}))
        policy = make_scripted(env_id, skill=skill, env=env)
        n_tasks = len(env.unwrapped.task_ids)
        for k in range(per_env):
            episodes.append(play_episode(env, policy, env_id, k % n_tasks, seed + k))
        env.close()
        wins = sum(e.reward >= 0.5 for e in episodes if e.env_id == env_id)
        logger.info("%s: %d scripted episodes, %d successes", env_id, per_env, wins)
    return episodes


def episode_texts(episodes: Sequence[Episode]) -> list[str]:
    """Every string of every episode, plus the format prompts (tokenizer training corpus)."""
    from trace_gym.agents.formats import FORMATS

    texts = [f.system for f in FORMATS.values()]
    for e in episodes:
        texts.append(e.prompt)
        for t in e.reset_info.get("tools") or []:
            texts.append(str(t))
        for t in e.turns:
            texts += [t.action, t.observation]
    return texts


def tokenize_episode(chat: Any, ep: Episode, max_len: int) -> tuple[list[int], list[int]]:
    """(ids, labels) of one episode; labels are -100 outside assistant tokens."""
    conv = Conversation(ep.env_id, ep.task_id, ep.prompt, (), seed=0, reset_info=ep.reset_info)
    fmt = chat.format(ep.env_id)
    eos = chat.tokenizer.eos_token_id
    ids = chat.prompt_ids(conv)
    labels = [-100] * len(ids)
    for k, t in enumerate(ep.turns):
        act = chat.action_ids(t.action)
        if find_stop(t.action, fmt.stop) is None:
            act = act + [eos]
        ids += act
        labels += act
        if k < len(ep.turns) - 1:
            obs = chat.obs_ids(t.observation, fmt, act, obs_role(t.info))
            ids += obs
            labels += [-100] * len(obs)
        if len(ids) >= max_len:
            break
    return ids[:max_len], labels[:max_len]


def sft_warm_start(
    model: Any,
    tokenizer: Any,
    episodes: Sequence[Episode],
    config: Any,
    formats: dict | None = None,
) -> dict[str, float]:
    """Train `model` in place on `episodes` for `config.sft_steps` steps; returns loss stats.

    `config` needs sft_steps, sft_lr, sft_batch, sft_max_len and seed (a `TinyConfig`).
    """
    from trace_gym.agents.context import ChatTokens

    torch = require("torch", "train")
    chat = ChatTokens(tokenizer, formats)
    data = [tokenize_episode(chat, e, config.sft_max_len) for e in episodes]
    data = [d for d in data if any(x != -100 for x in d[1])]
    if not data:
        return {}
    rng = np.random.default_rng(config.seed)
    torch.manual_seed(config.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=config.sft_lr, weight_decay=0.0)
    pad = tokenizer.pad_token_id
    model.train()
    losses = []
    for step in range(config.sft_steps):
        batch = [
            data[i]
            for i in rng.choice(len(data), size=min(config.sft_batch, len(data)), replace=False)
        ]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        lab = torch.full((len(batch), width), -100, dtype=torch.long)
        att = torch.zeros((len(batch), width), dtype=torch.long)
        for b, (x, y) in enumerate(batch):  # right-padded: positions start at 0 for every row
            ids[b, : len(x)] = torch.tensor(x)
            lab[b, : len(y)] = torch.tensor(y)
            att[b, : len(x)] = 1
        lr = (
            config.sft_lr * min(1.0, (step + 1) / 10) * (1 - step / max(1, config.sft_steps)) ** 0.5
        )
        for g in opt.param_groups:
            g["lr"] = lr
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if step % 20 == 0:
            logger.info("sft step %d/%d loss %.3f", step, config.sft_steps, losses[-1])
    model.eval()
    return {
        "first_loss": losses[0],
        "last_loss": float(np.mean(losses[-10:])),
        "steps": len(losses),
        "sequences": len(data),
    }
