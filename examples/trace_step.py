"""One TRACE step, top to bottom: the reference you can read in one sitting.

The library spreads a training step over several modules: `trace_gym.runner`
(`BranchingRunner.run_step` drives it), `trace_gym.plan` (what gets budget),
`trace_gym.alloc.solvers` (the two exact solvers), `trace_gym.scheduling` (batched
execution, checkpoints, the trees) and `trace_gym.trainers.advantages` (what the
optimiser trains). This file is the same step in one place, on the simulator
(``trace/Sim-v0``, ``math`` preset), with public API only; each part names the library
function it stands for. `tests/test_examples.py` checks that it gives the same root
allocation, the same trees (as JSON) and the same TreeRPO advantages as
`BranchingRunner` + `treerpo` on a fixed seed.

The step (docs/runner.md has the picture, docs/alloc.md the solvers):

1. describe and score the candidate prompts with a predictor;
2. the exact root solve: M root rollouts over the candidates (most get 0);
3. run the root rollouts in batched rounds, one checkpoint per turn boundary;
4. split the round(N * M) replays over the prompts, score each one's prefixes, solve;
5. replay from restored checkpoints;
6. bottom-up targets, one predictor update;
7. TreeRPO advantages.

What this file leaves out, because the simulator never needs it: failures as data
(a policy or env error ending a branch on a failed leaf), policy retries, streaming
engines, multi-env mixtures and cost-aware prefixes. The library expands each prompt the
moment its own roots are done; here every prompt is expanded after all roots, which
gives the same trees (``RunnerConfig.expansion = "global"`` is that schedule).

Run: ``python examples/trace_step.py --roots 32 --replays 2``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

import trace_gym  # noqa: F401 - registers trace/Sim-v0 with gymnasium
from trace_gym import Checkpoint, checkpoint, restore, unwrap
from trace_gym.alloc import prefix_candidates, solve_prefixes, solve_roots, split_budget
from trace_gym.budget import Budget
from trace_gym.policy import Conversation, Policy
from trace_gym.predict import FeaturePredictor, Predictor, State, make_predictor, training_batch
from trace_gym.seeding import branch_seed, stable_seed
from trace_gym.sim import SimPolicy
from trace_gym.tree import RolloutTree, Turn, batch_metrics, success_threshold_for


@dataclass(frozen=True)
class Args:
    """The step's settings (the library's `trace_gym.runner.RunnerConfig`)."""

    #: M: root rollouts per step, over all candidates
    roots: int = 32
    #: N: replays per root; the step's continuation budget is round(N * M) replays
    replays: float = 2.0
    #: cost of one replay in trajectory-equivalents (a root costs 1)
    replay_cost: float = 0.5
    #: most root rollouts one prompt gets (the allocator's ``m_max``)
    m_max: int = 16
    #: the run's seed, mixed into every branch seed
    seed: int = 0
    #: share of prefix samples in the predictor's update batch
    prefix_share: float = 0.06


@dataclass
class Branch:
    """One branch in flight: a root rollout (anchor 0) or a replay from a prefix node."""

    tree: RolloutTree
    #: the node it grows from (0: the prompt) and its index among that node's children
    anchor: int
    child: int
    kind: str  # "rollout" | "replay"
    #: the env seed of the branch (`branch_seed(..., turn=0)`)
    env_seed: int
    prompt: str = ""
    reset_info: dict = field(default_factory=dict)
    #: the turns above the anchor (a replay's prefix), then the branch's own turns
    prefix_turns: tuple[Turn, ...] = ()
    turns: list[Turn] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    true_values: list[float] = field(default_factory=list)
    #: a checkpoint after each non-final turn of a root rollout (None after the last)
    checkpoints: list[tuple[Checkpoint, gym.Env] | None] = field(default_factory=list)
    env: gym.Env | None = None
    done: bool = False
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False


@dataclass
class StepOutput:
    """What one step produced: the root allocation, the trees and the trained units."""

    #: candidate id -> root rollouts (0: skipped)
    root_counts: dict[str, int]
    trees: list[RolloutTree]
    #: TreeRPO units: (tree index, node ids, advantage, per-token weight)
    units: list[tuple[int, tuple[int, ...], float, float]]


class Pool:
    """Env instances; a checkpoint restores into any of them (`trace_gym.scheduling.EnvPool`)."""

    def __init__(self, make_env, step: int):
        self.make_env, self.step, self.free = make_env, step, []

    def acquire(self) -> gym.Env:
        if self.free:
            return self.free.pop()
        env = self.make_env()
        unwrap(env).set_step(self.step)  # the simulator's skill drifts with the step
        return env

    def give_back(self, env: gym.Env) -> None:
        self.free.append(env)


# ----------------------------------------------------------------------------- 1. score
def predict(predictor: Predictor, states: list[State]) -> np.ndarray:
    """Values in [0, 1] (`trace_gym.plan.predictor_fn`)."""
    if not states:
        return np.zeros(0)
    return np.clip(np.asarray(predictor.predict(states), dtype=float), 0.0, 1.0)


def describe(pool: Pool, task_id: str) -> tuple[str, dict, float]:
    """The task's prompt, reset info and exact value (`BranchingRunner.run_step`'s first stage).

    The simulator knows the exact success probability of every state (``true_value()``):
    the runner records it on the tree beside the prediction, for measuring predictors.
    """
    env = pool.acquire()
    prompt, info = env.reset(seed=stable_seed("describe", task_id), options={"task": task_id})
    true_value = float(unwrap(env).true_value())
    pool.give_back(env)
    return prompt, info, true_value


# ----------------------------------------------------------------------------- 2. roots
def plan_roots(step, ids, pool, predictor, budget, args) -> tuple[np.ndarray, list[RolloutTree]]:
    """Score the candidates, solve the root problem, open one tree per selected prompt.

    `trace_gym.plan.plan_roots`; the solve is `TraceAllocator.allocate_roots`, that is
    `trace_gym.alloc.solvers.solve_roots`: choose m_i in {0, 2..m_max} with sum m_i = M
    maximising the expected number of mixed groups sum 1 - v_i^m_i - (1 - v_i)^m_i.
    """
    described = [describe(pool, t) for t in ids]
    env_id = unwrap(pool.acquire()).id
    states = [
        State(t, prompt, (), env_id) for t, (prompt, _, _) in zip(ids, described, strict=True)
    ]
    values = predict(predictor, states)
    counts = solve_roots(values, budget.roots, args.m_max, exact_budget=True).counts
    trees = []
    for t, (prompt, info, tv), v, m in zip(ids, described, values, counts, strict=True):
        if m == 0:
            continue
        tree = RolloutTree(
            t, prompt, env_id=env_id, step=step, success_threshold=success_threshold_for(info)
        )
        tree.root.value, tree.root.true_value = float(v), tv
        tree.info.update(root_count=int(m), candidate_value=float(v))
        trees.append(tree)
    if trees:  # the candidates nobody rolls out, kept for the viewer (trace-gym view)
        skipped = [[t, float(v)] for t, v, m in zip(ids, values, counts, strict=True) if m == 0]
        trees[0].info["skipped_candidates"] = skipped
    return counts, trees


def root_branches(step: int, trees: list[RolloutTree], seed: int) -> list[Branch]:
    """m root rollouts per tree, each seeded by its place (`trace_gym.plan._root_work`)."""
    return [
        Branch(tree, 0, i, "rollout", branch_seed(step, tree.prompt_id, 0, i, turn=0, base=seed))
        for tree in trees
        for i in range(tree.info["root_count"])
    ]


# ----------------------------------------------------------------------------- 3. roll out
def start(branch: Branch, pool: Pool, checkpoints: dict) -> None:
    """Reset the env for a root; restore the prefix's checkpoint for a replay.

    `trace_gym.scheduling.StepScheduler._start`. A replay gets a fresh env RNG from its
    own branch seed (``RunnerConfig.reseed_replays``), so sibling replays are
    independent draws rather than repeats of the restored env randomness.
    """
    branch.env = env = pool.acquire()
    if branch.kind == "rollout":
        options = {"task": branch.tree.prompt_id}
        branch.prompt, branch.reset_info = env.reset(seed=branch.env_seed, options=options)
    else:
        restore(env, checkpoints[(branch.tree.prompt_id, branch.anchor)][0])
        unwrap(env).np_random = np.random.Generator(np.random.PCG64(branch.env_seed))


def conversation(branch: Branch, step: int, seed: int) -> Conversation:
    """What the policy sees; every turn has its own seed (`StepScheduler._conversation`)."""
    tree = branch.tree
    turn_seed = branch_seed(
        step, tree.prompt_id, branch.anchor, branch.child, turn=len(branch.turns) + 1, base=seed
    )
    branch.seeds.append(turn_seed)
    return Conversation(
        env_id=tree.env_id,
        task_id=tree.prompt_id,
        prompt=branch.prompt,
        turns=branch.prefix_turns + tuple(branch.turns),
        seed=turn_seed,
        reset_info=branch.reset_info,
    )


def run(branches: list[Branch], policy: Policy, pool: Pool, step: int, seed: int) -> None:
    """Batched rounds: one ``policy.generate`` over every live branch, then one env step each.

    `trace_gym.scheduling.StepScheduler._run_rounds` / `_take_turn`. Root rollouts take a
    checkpoint after every turn that does not end the episode: those are the prefixes a
    replay can restore.
    """
    live = list(branches)
    while live:
        convs = [conversation(b, step, seed) for b in live]
        outs = policy.generate(convs)
        for b, out in zip(live, outs, strict=True):
            obs, reward, terminated, truncated, info = b.env.step(out.text)
            b.done = bool(terminated or truncated)
            b.turns.append(
                Turn(out.text, obs, float(reward), _list(out.token_ids), _list(out.logprobs))
            )
            b.turns[-1].info = dict(info)
            b.true_values.append(float(unwrap(b.env).true_value()))
            take = b.kind == "rollout" and not b.done
            b.checkpoints.append((checkpoint(b.env), b.env) if take else None)
            if b.done:
                b.reward, b.terminated, b.truncated = float(reward), terminated, truncated
                pool.give_back(b.env)
        live = [b for b in live if not b.done]


def _list(x):
    return None if x is None else list(x)


def insert(branches: list[Branch], checkpoints: dict) -> None:
    """Append the branches' turns to their trees in a fixed order (`StepScheduler._insert`).

    Roots by index, replays by prefix then index: node ids (and with them every branch
    seed) do not depend on how the work was batched. Each checkpoint is filed under the
    node id of the boundary it was taken at.
    """
    for b in branches:
        node_id = b.anchor
        for k, turn in enumerate(b.turns):
            node = b.tree.add_child(
                node_id, turn, origin=b.kind, seed=b.seeds[k], true_value=b.true_values[k]
            )
            node_id = node.id
            if b.checkpoints[k] is not None:
                checkpoints[(b.tree.prompt_id, node_id)] = b.checkpoints[k]
        b.tree.finish(node_id, reward=b.reward, terminated=b.terminated, truncated=b.truncated)


# ----------------------------------------------------------------------------- 4. prefixes
def chain_leaf(tree: RolloutTree, node_id: int) -> int:
    """The leaf at the end of the single-child chain from `node_id` (one root rollout)."""
    while tree[node_id].children:
        node_id = tree[node_id].children[0]
    return node_id


def expand(tree, roots, replay_budget, predictor, step, args) -> list[Branch]:
    """Score one prompt's prefixes and allocate its replays (`trace_gym.plan.expand`).

    Prefixes are the turn boundaries strictly inside each finished root rollout. The
    split is `TraceAllocator.allocate_prefixes`, that is
    `trace_gym.alloc.solvers.solve_prefixes`: k_j replays per prefix maximising
    sum 1 - q_j^k_j, where q_j is the chance that one replay repeats the known outcome
    of the rollout the prefix lies on (`trace_gym.alloc.prefix_candidates` builds the
    records: rollout, node, depth, that outcome, the predicted value).
    """
    leaves = [chain_leaf(tree, first) for first in tree.root.children]
    prefixes = [n.id for leaf in leaves for n in tree.path(leaf)[:-1]]
    replays: list[Branch] = []
    if replay_budget > 0 and prefixes:
        states = [
            State(tree.prompt_id, tree.prompt, history(tree, n), tree.env_id) for n in prefixes
        ]
        for n, v in zip(prefixes, predict(predictor, states), strict=True):
            tree[n].value = float(v)
        cands = prefix_candidates(tree, leaves, cost=args.replay_cost)
        values, outcomes = [c.value for c in cands], [c.reward for c in cands]
        counts = solve_prefixes(values, outcomes, replay_budget).counts
        for cand, k in zip(cands, counts, strict=True):
            root, turns = roots[cand.rollout], tuple(tree.turns(cand.node))
            for j in range(int(k)):
                child = len(tree[cand.node].children) + j
                seed = branch_seed(step, tree.prompt_id, cand.node, child, turn=0, base=args.seed)
                replay = Branch(
                    tree, cand.node, child, "replay", seed, root.prompt, root.reset_info
                )
                replay.prefix_turns = turns
                replays.append(replay)
    tree.info.update(replay_budget=replay_budget, replays=len(replays))
    return replays


def history(tree: RolloutTree, node_id: int) -> tuple[tuple[str, str], ...]:
    """The (action, observation) turns from the prompt to `node_id`, as a `State` holds them."""
    return tuple((t.action, t.observation) for t in tree.turns(node_id))


# ----------------------------------------------------------------------------- 5. the step
def trace_step(step, ids, make_env, policy, predictor, args=Args()) -> StepOutput:
    """One step (`BranchingRunner.run_step`): score, solve, roll out, expand, replay, close."""
    pool = Pool(make_env, step)
    budget = Budget.per_root(args.roots, args.replays, args.replay_cost)
    policy.set_step(step)  # step-aware parts (`trace_gym.scheduling.tell_step`)
    counts, trees = plan_roots(step, ids, pool, predictor, budget, args)

    # the step's round(N * M) replays, shared over the prompts in proportion to their
    # root counts, largest remainder (`trace_gym.plan.split_replays`)
    shares = split_budget([t.info["root_count"] for t in trees], budget.replays) if trees else []

    roots = root_branches(step, trees, args.seed)
    checkpoints: dict = {}  # (prompt id, node id) -> (checkpoint, the env that took it)
    for b in roots:
        start(b, pool, checkpoints)
    run(roots, policy, pool, step, args.seed)
    insert(roots, checkpoints)

    replays: list[Branch] = []
    for tree, share in zip(trees, shares, strict=True):
        mine = [b for b in roots if b.tree is tree]
        replays += expand(tree, mine, int(share), predictor, step, args)
    for b in replays:
        start(b, pool, checkpoints)
    run(replays, policy, pool, step, args.seed)
    insert(replays, checkpoints)  # in prefix then index order, per tree

    # close the trees: checkpoints released, bottom-up targets (`StepScheduler._close`)
    for ckpt, env in checkpoints.values():
        unwrap(env).release(ckpt)
    for tree in trees:
        tree.compute_targets()  # a node's target: the success rate of the leaves below it
    update_predictor(predictor, trees, step, args)
    units = treerpo(trees)
    return StepOutput(dict(zip(ids, counts.tolist(), strict=True)), trees, units)


# ----------------------------------------------------------------------------- 6. predictor
def update_predictor(predictor: Predictor, trees, step: int, args: Args) -> None:
    """Every prompt's target plus a few prefixes' (`BranchingRunner._update_predictor`).

    `trace_gym.predict.training_batch` takes the roots and a random sample of inner
    nodes making up `prefix_share` of the batch, weighted by their leaf counts.
    """
    rng = np.random.default_rng(stable_seed("predictor", args.seed, step))
    states, targets, weights = training_batch(trees, prefix_share=args.prefix_share, rng=rng)
    if len(states):
        predictor.update(states, targets, weights)


# ----------------------------------------------------------------------------- 7. advantages
def treerpo(trees: list[RolloutTree], eps: float = 1e-6) -> list:
    """TreeRPO on chain-compressed segments (`trace_gym.trainers.advantages.treerpo`).

    Every maximal single-child chain is one segment hanging under an anchor (the root
    or a branch point); its value is the success rate of the leaves below it
    (`RolloutTree.segments`). The segments under one anchor form a group:
    A = (V - mean) / (std + eps), 0 for a group of one. Each unit trains only its own
    segment's turns; every unit of a tree weighs m / U (m root rollouts, U units), so a
    prompt weighs what its root allocation says, whatever its replay count.
    """
    out = []
    for i, tree in enumerate(trees):
        groups: dict[int, list] = {}
        for seg in tree.segments():
            if seg.value is not None:  # only failed branches below: nothing to train
                groups.setdefault(seg.anchor, []).append(seg)
        units = []
        for segs in groups.values():
            v = np.array([s.value for s in segs], dtype=np.float64)
            adv = (v - v.mean()) / (v.std(ddof=1) + eps) if v.size > 1 else np.zeros_like(v)
            units += [(i, s.nodes, float(a)) for s, a in zip(segs, adv, strict=True)]
        weight = len(tree.root.children) / len(units) if units else 1.0
        out += [(t, nodes, a, weight) for t, nodes, a in units]
    return out


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> StepOutput:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--roots", type=int, default=Args.roots, help="M, root rollouts")
    parser.add_argument("--replays", type=float, default=Args.replays, help="N, replays per root")
    parser.add_argument("--candidates", type=int, default=48, help="candidate prompts")
    parser.add_argument("--seed", type=int, default=Args.seed)
    parser.add_argument(
        "--predictor", default="noisy", help="'noisy' (exact values + noise) or 'features'"
    )
    a = parser.parse_args(argv)
    args = Args(roots=a.roots, replays=a.replays, seed=a.seed)
    make_env = lambda: gym.make("trace/Sim-v0", preset="math", num_tasks=a.candidates)  # noqa: E731
    ids = list(unwrap(make_env()).task_ids)
    predictor = make_predictor("noisy", rho=0.9) if a.predictor == "noisy" else FeaturePredictor()
    out = trace_step(0, ids, make_env, SimPolicy("math"), predictor, args)
    m = batch_metrics(out.trees)
    chosen = {t: m for t, m in out.root_counts.items() if m}
    print(f"{len(out.trees)} of {len(ids)} prompts selected, root rollouts: {chosen}")
    print(f"{sum(len(t) - 1 for t in out.trees)} turns, effective ratio {m['effective_ratio']:.2f}")
    for t, nodes, adv, w in out.units[:8]:
        print(f"tree {t} nodes {nodes}: advantage {adv:+.3f}, weight {w:.3f}")
    return out


if __name__ == "__main__":
    main()
