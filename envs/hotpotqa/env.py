"""`trace/HotpotQA-v0`: multi-hop QA with a search tool over a local Wikipedia index.

The agent sees Search-R1's prompt with the question, issues ``<search>query</search>``
turns (answered with the top-k passages in ``<information>``) and ends with
``<answer>...</answer>``. Reward: exact match after the official HotpotQA answer
normalisation (1/0); the terminal info carries F1 and the retrieval trace. Malformed
turns get a hint and the episode goes on, until the env's own turn limit.

Defaults (``gym.make("trace/HotpotQA-v0")``): the bundled HotpotQA-format set about
fictional entities (380 questions, 3,100 passages) and a BM25 index built on first use
and cached under ``~/.cache/trace-gym`` ($TRACE_GYM_CACHE). Real HotpotQA: pass
``dataset="path/to/hotpot_dev_distractor_v1.json"`` (its context paragraphs become the
corpus) and optionally ``corpus="wiki-18.jsonl"`` or ``retriever="<index dir or URL>"``.

``env.unwrapped.current_task`` is the current `QATask` (question, gold answer,
supporting facts): privileged information for scripted policies and analysis.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from trace_gym.envs.hotpotqa import protocol
from trace_gym.envs.hotpotqa.data import (
    Passage,
    QATask,
    context_passages,
    load_bundled,
    load_hotpotqa,
    load_wiki18,
)
from trace_gym.envs.hotpotqa.metrics import score_answer
from trace_gym.envs.hotpotqa.retrievers import KINDS, Retriever, open_retriever

from trace_gym.core import TraceEnv, Transition
from trace_gym.errors import ConfigError
from trace_gym.plugins import check_kwargs

__all__ = ["HotpotQAConfig", "HotpotQAEnv"]

SPLITS = ("all", "train", "dev")


@dataclass
class HotpotQAConfig:
    """Everything that selects the questions, the corpus and the retriever."""

    #: "bundled" (fictional HotpotQA-format set) or a path to HotpotQA JSON / JSONL
    dataset: str = "bundled"
    #: "all", "train" or "dev" (dev = every 10th question, by position in the file)
    split: str = "all"
    #: wiki-18-style JSONL corpus; default: the bundled corpus, or the dataset's context paragraphs
    corpus: str | None = None
    #: retriever kind (bm25, dense-flat, dense-hnsw, pyserini), an index directory, a server URL,
    #: or a `Retriever` instance
    retriever: str | Retriever = "bm25"
    #: passages returned per search
    topk: int = 3
    #: turns before truncation (searches, answers and invalid turns all count)
    max_turns: int = 6
    #: longer queries are refused with a hint
    max_query_chars: int = 512
    #: the core's action cap (`TraceEnv.max_action_chars`, 100,000 by default): `TraceEnv.step`
    #: answers a longer turn unparsed, as an invalid turn behind the core's "Error: ..." line
    max_action_chars: int = TraceEnv.max_action_chars
    #: use only the first N questions (after the split)
    limit: int | None = None
    #: where lazily built indexes are cached (default: $TRACE_GYM_CACHE or ~/.cache/trace-gym)
    cache_dir: str | None = None
    #: extra options for the retriever builder (e.g. {"encoder": {"model": "e5", "model_path": ...}})
    retriever_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.split not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {self.split!r}")
        if self.topk < 1:
            raise ConfigError(f"topk must be >= 1, got {self.topk}")
        if self.max_turns < 1:
            raise ConfigError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_query_chars < 1:
            raise ConfigError(f"max_query_chars must be >= 1, got {self.max_query_chars}")
        if self.max_action_chars < 1:
            raise ConfigError(f"max_action_chars must be >= 1, got {self.max_action_chars}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit must be >= 1 or None, got {self.limit}")


# Questions, corpora and indexes are shared by every env of a process (a runner makes
# many envs); they are read-only after construction.
_SHARED: dict[tuple, Any] = {}
_SHARED_LOCK = threading.Lock()


def _shared(key: tuple, make):
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = make()
        return _SHARED[key]


def _load_dataset(cfg: HotpotQAConfig) -> tuple[list[QATask], list[Passage] | None]:
    if cfg.dataset == "bundled":
        tasks, passages = _shared(("bundled",), load_bundled)
    else:
        path = str(Path(cfg.dataset).expanduser().resolve())
        tasks = _shared(("hotpotqa", path), lambda: load_hotpotqa(path))
        passages = None
    if cfg.corpus is not None:
        cpath = str(Path(cfg.corpus).expanduser().resolve())
        passages = _shared(("wiki18", cpath), lambda: load_wiki18(cpath))
    elif passages is None and isinstance(cfg.retriever, str) and cfg.retriever in KINDS:
        # only a retriever built here needs the corpus (an index directory or a server has its own)
        if not any(t.context for t in tasks):
            raise ConfigError(
                f"{cfg.dataset} has no context paragraphs (FlashRAG / Search-R1 files carry only question and "
                "golden_answers); pass corpus=<wiki-18 JSONL> or retriever=<index directory or server URL>"
            )
        passages = _shared(("ctx", cfg.dataset), lambda: context_passages(tasks))
    return tasks, passages


def _split(tasks: list[QATask], split: str) -> list[QATask]:
    if split == "all":
        return tasks
    dev = split == "dev"
    return [t for i, t in enumerate(tasks) if (i % 10 == 0) == dev]


class HotpotQAEnv(TraceEnv):
    """Search-R1-style multi-hop QA over a local retriever (see the module docstring)."""

    env_id = "trace/HotpotQA-v0"
    volatile_info_keys = frozenset({"elapsed_s", "timings"})

    #: the dataclass that reads the constructor's ``**options`` (what `check_env_kwargs` checks)
    options_class: ClassVar[type] = HotpotQAConfig

    def __init__(self, render_mode: str | None = None, **options: Any):
        check_kwargs(self.env_id, HotpotQAEnv, options)  # a typo: one line, not a TypeError
        cfg = HotpotQAConfig(**options)
        super().__init__(max_turns=cfg.max_turns, render_mode=render_mode)
        self.config = cfg
        self.max_action_chars = int(cfg.max_action_chars)  # the one cap, enforced by TraceEnv.step
        tasks, passages = _load_dataset(cfg)
        tasks = _split(tasks, cfg.split)
        if cfg.limit is not None:
            tasks = tasks[: cfg.limit]
        if not tasks:
            raise ConfigError(
                f"no questions left in {cfg.dataset} after split={cfg.split!r}, limit={cfg.limit}"
            )
        self.tasks = tasks
        self._ids = [t.id for t in tasks]
        opts = dict(cfg.retriever_options)
        if isinstance(cfg.retriever, Retriever):
            self.retriever: Retriever = cfg.retriever
        else:
            key = (
                "retriever",
                cfg.retriever,
                cfg.dataset,
                cfg.corpus,
                cfg.cache_dir,
                repr(sorted(opts.items())),
            )
            self.retriever = _shared(
                key,
                lambda: open_retriever(cfg.retriever, passages, cache_dir=cfg.cache_dir, **opts),
            )
        digest = hashlib.sha1("\n".join(self._ids).encode()).hexdigest()[:10]
        name = "bundled" if cfg.dataset == "bundled" else Path(cfg.dataset).name
        if passages is not None and cfg.corpus is not None:
            name += f"+{Path(cfg.corpus).name}"
        self._task_set = f"hotpotqa:{name}:{cfg.split}:{len(tasks)}:{digest}"
        self._history: list[dict[str, Any]] = []
        self._invalid = 0

    # ----------------------------------------------------------------- TraceEnv hooks
    @property
    def task_ids(self) -> Sequence[str]:
        return self._ids

    @property
    def task_set(self) -> str:
        return self._task_set

    @property
    def current_task(self) -> QATask | None:
        """The current question with its gold answer and supporting facts (privileged)."""
        return None if self._task_index is None else self.tasks[self._task_index]

    @property
    def history(self) -> list[dict[str, Any]]:
        """The searches of this episode so far: query, retrieved ids and titles."""
        return [dict(h) for h in self._history]

    def _reset_task(self, task_index: int) -> tuple[str, dict[str, Any]]:
        self._history = []
        self._invalid = 0
        task = self.tasks[task_index]
        info = {
            "question": task.question,
            "type": task.type,
            "topk": self.config.topk,
            "retriever": self.retriever.describe(),
        }
        return protocol.make_prompt(task.question), info

    def _step(self, action: str) -> Transition:
        parsed = protocol.parse_action(action, self.config.max_query_chars)
        last_turn = self._turn + 1 >= self.max_turns
        if parsed.kind == "search":
            obs, info = self._search(parsed.content)
        elif parsed.kind == "answer":
            return self._answer(parsed.content)
        else:
            self._invalid += 1
            obs = protocol.invalid_observation(parsed)
            info = {"action": "invalid", "error": parsed.error, "detail": parsed.detail}
        info["num_searches"] = len(self._history)
        if last_turn:  # the base truncates after this turn: report the episode now
            info.update(self._episode_report())
        return Transition(obs, 0.0, False, info)

    def _search(self, query: str) -> tuple[str, dict[str, Any]]:
        try:
            hits = self.retriever.search([query], self.config.topk)[0]
        except Exception as e:  # a failing backend (server down) is an observation, not a crash
            msg = f"{type(e).__name__}: {e}"
            return (
                f"<information>Search failed: {msg[:300]}</information>",
                {
                    "action": "search",
                    "query": query,
                    "error": "retrieval_failed",
                    "detail": msg[:500],
                },
            )
        self._history.append(
            {
                "query": query,
                "ids": [h.passage.id for h in hits],
                "titles": [h.passage.title for h in hits],
            }
        )
        info = {
            "action": "search",
            "query": query,
            "retrieved": [
                {"id": h.passage.id, "title": h.passage.title, "score": h.score} for h in hits
            ],
        }
        return protocol.format_information(hits), info

    def _answer(self, answer: str) -> Transition:
        task = self.tasks[self._task_index]  # type: ignore[index]
        # several gold answers (FlashRAG's golden_answers): the best-scoring one counts
        scores = max(
            (score_answer(answer, g) for g in task.answers), key=lambda s: (s["em"], s["f1"])
        )
        info = {
            "action": "answer",
            "answer": answer,
            "gold_answer": task.answer,
            **scores,
            "num_searches": len(self._history),
            **self._episode_report(),
        }
        obs = f"\nYour answer: {answer}\n"
        return Transition(obs, scores["em"], True, info)

    def _episode_report(self) -> dict[str, Any]:
        task = self.tasks[self._task_index]  # type: ignore[index]
        gold = task.supporting_titles
        seen = {t for h in self._history for t in h["titles"]}
        return {
            "retrieval_trace": self.history,
            "supporting_titles": list(gold),
            "supporting_recall": (sum(t in seen for t in gold) / len(gold)) if gold else None,
            "invalid_turns": self._invalid,
        }

    def _get_state(self) -> Any:
        hist = tuple((h["query"], tuple(h["ids"]), tuple(h["titles"])) for h in self._history)
        return {"history": hist, "invalid": self._invalid}

    def _set_state(self, payload: Any) -> None:
        self._history = [
            {"query": q, "ids": list(ids), "titles": list(titles)}
            for q, ids, titles in payload["history"]
        ]
        self._invalid = int(payload["invalid"])

    # ----------------------------------------------------------------- demo / checker
    def example_action(self, rng: np.random.Generator) -> str:
        """A plausible turn: mostly the scripted two-hop policy, sometimes a sloppy search or a bad turn."""
        from trace_gym.envs.hotpotqa import scripted

        task = self.current_task
        if task is None:
            return "<search>example</search>"
        u = rng.random()
        if u < 0.1:
            return "<think>I am not sure which tag to use.</think> search for it"
        if u < 0.25:
            words = task.question.rstrip("?").split()
            pick = rng.choice(len(words), size=min(4, len(words)), replace=False)
            return f"<think>Let me look this up.</think>\n<search>{' '.join(words[int(i)] for i in sorted(pick))}</search>"
        observations = [seg for seg in self._transcript[2::2]]
        return scripted.next_action(
            task.question, [o.removeprefix("[env]\n") for o in observations]
        )
