"""The `bench learn` command: run the arms over paired seeds, summarise, test, write the outputs."""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from trace_gym.bench.learn import (
    DEFAULT_PROTOCOL,
    TINY_LM_PROTOCOL,
    check_protocol,
    config_from_protocol,
    load_protocol,
    run_arm,
)
from trace_gym.bench.learn_stats import (
    auc,
    cost_to_target,
    holm,
    mean_ci95,
    paired_t,
    wilcoxon_signed_rank,
)

from trace_gym.cli import Parser
from trace_gym.errors import ConfigError

__all__ = ["compare", "main", "summarise"]


def curves(records: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, list[float]]]]:
    """arm -> seed -> {cost, turns, success} at the evaluation points (cumulative cost and turns)."""
    out: dict[str, dict[int, dict[str, list[float]]]] = {}
    for arm in dict.fromkeys(r["arm"] for r in records):
        out[arm] = {}
        for seed in dict.fromkeys(r["seed"] for r in records if r["arm"] == arm):
            rs = sorted(
                (r for r in records if r["arm"] == arm and r["seed"] == seed),
                key=lambda r: r["step"],
            )
            cost = np.cumsum([r["accounted_cost"] for r in rs])
            turns = np.cumsum([r["measured_turns"] for r in rs])
            keep = [i for i, r in enumerate(rs) if r["success"] is not None]
            out[arm][seed] = {
                "cost": [float(cost[i]) for i in keep],
                "turns": [float(turns[i]) for i in keep],
                "success": [float(rs[i]["success"]) for i in keep],
            }
    return out


def _mean_curve(
    per_seed: dict[int, dict[str, list[float]]], key: str = "cost"
) -> tuple[np.ndarray, np.ndarray]:
    x = np.mean([c[key] for c in per_seed.values()], axis=0)
    y = np.mean([c["success"] for c in per_seed.values()], axis=0)
    return x, y


def summarise(records: list[dict[str, Any]], target_arm: str = "grpo") -> dict[str, dict[str, Any]]:
    """Per arm: AUC (vs cost and vs turns) with 95% CIs, final success, cost per step, cost_to_target."""
    cur = curves(records)
    target = float(_mean_curve(cur[target_arm])[1][-1]) if target_arm in cur else None
    arms = {}
    for arm, per_seed in cur.items():
        a = [auc(c["cost"], c["success"]) for c in per_seed.values()]
        at = [auc(c["turns"], c["success"]) for c in per_seed.values()]
        fin = [c["success"][-1] for c in per_seed.values()]
        x, y = _mean_curve(per_seed)
        steps = [r for r in records if r["arm"] == arm and r["step"] >= 0]
        ctt = cost_to_target(x, y, target) if target is not None else None
        arms[arm] = {
            "auc": mean_ci95(a)[0],
            "auc_ci95": mean_ci95(a)[1],
            "auc_turns": mean_ci95(at)[0],
            "auc_turns_ci95": mean_ci95(at)[1],
            "initial_success": float(y[0]),
            "final_success": mean_ci95(fin)[0],
            "final_success_ci95": mean_ci95(fin)[1],
            "cost_to_target": ctt,
            "total_cost": float(x[-1]),
            "cost_to_target_share": None
            if ctt is None or target is None
            else ctt / float(_mean_curve(cur[target_arm])[0][-1]),
            "accounted_cost_per_step": float(np.mean([r["accounted_cost"] for r in steps])),
            "measured_turns_per_step": float(np.mean([r["measured_turns"] for r in steps])),
            "generated_tokens_per_step": float(np.mean([r["generated_tokens"] for r in steps])),
            "seeds": len(per_seed),
            "per_seed_auc": a,
            **_sampling_noise(records, arm),
        }
    return arms


def _sampling_noise(records: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    """Sampled evaluation only: episodes per evaluation point and the binomial SE of the
    seed-mean final success (sqrt(sum SE_i^2) / seeds); nothing for exact evaluation."""
    last: dict[int, dict[str, Any]] = {}
    for r in records:
        if (
            r["arm"] == arm
            and r.get("success_se") is not None
            and r["step"] >= last.get(r["seed"], {}).get("step", -2)
        ):
            last[r["seed"]] = r
    if not last:
        return {}
    se = [r["success_se"] for r in last.values()]
    return {
        "eval_episodes": int(next(iter(last.values()))["eval_episodes"]),
        "final_success_binomial_se": float(np.sqrt(np.sum(np.square(se)))) / len(se),
    }


def comparisons(
    arms: dict[str, dict[str, Any]], primary: list[list[str]], test: str = "wilcoxon"
) -> dict[str, dict[str, Any]]:
    """Paired AUC differences per seed; p-values of the registered `test` ("wilcoxon" or
    "paired_t", both reported), Holm-corrected within each family."""
    if test not in ("wilcoxon", "paired_t"):
        raise ConfigError(f"the protocol's test must be 'wilcoxon' or 'paired_t', got {test!r}")
    fams: dict[str, list[tuple[str, str]]] = {
        "primary": [(a, b) for a, b in primary if a in arms and b in arms]
    }
    done = {x for pair in fams["primary"] for x in pair}
    fams["secondary"] = [
        (x, "trace") for x in arms if x not in done and "trace" in arms and x != "trace"
    ]
    out = {}
    for fam, pairs in fams.items():
        raw = []
        for a, b in pairs:
            n = min(arms[a]["seeds"], arms[b]["seeds"])
            d = np.subtract(arms[a]["per_seed_auc"][:n], arms[b]["per_seed_auc"][:n])
            m, h = mean_ci95(d)
            pw, pt = wilcoxon_signed_rank(d), paired_t(d)
            raw.append(pw if test == "wilcoxon" else pt)
            out[f"{a}_vs_{b}"] = {
                "family": fam,
                "effect": m,
                "effect_ci95": h,
                "seeds": int(n),
                "test": test,
                "p_value_raw": raw[-1],
                "p_wilcoxon_raw": pw,
                "p_t_raw": pt,
            }
        for (a, b), p in zip(pairs, holm(raw), strict=True):
            out[f"{a}_vs_{b}"]["p_value"] = p
    return out


def goals(
    arms: dict[str, Any], comps: dict[str, Any], proto: dict[str, Any]
) -> list[dict[str, Any]]:
    """The issue's goals on this run (measured, never asserted)."""
    if "staleness" in proto:
        return staleness_goals(arms, comps, proto)
    share = arms.get("trace", {}).get("cost_to_target_share")
    c = comps.get("trace_vs_treepo", {})
    limit = proto["comparisons"]["cost_goal"]
    target = arms.get(proto["comparisons"]["target_arm"], {})
    # a target at or below the starting success is reached at cost 0 by every arm: no evidence
    learned = bool(target) and target["final_success"] > target["initial_success"]
    return [
        {
            "goal": f"trace reaches grpo's final success with <= {limit:.0%} of grpo's accounted cost",
            "value": share,
            "met": learned and share is not None and share <= limit,
            **(
                {}
                if learned
                else {
                    "note": "grpo's final success is not above the initial success: nothing to reach"
                }
            ),
        },
        {
            "goal": "trace beats treepo on AUC (Holm p < 0.05)",
            "value": c.get("effect"),
            "p_value": c.get("p_value"),
            "met": bool(c) and c["effect"] > 0 and c["p_value"] < proto["comparisons"]["alpha"],
        },
    ]


def staleness_goals(
    arms: dict[str, Any], comps: dict[str, Any], proto: dict[str, Any]
) -> list[dict[str, Any]]:
    """An asynchronous-rollouts protocol's goal (issue 29): each asynchronous arm's mean AUC
    inside the synchronous target arm's 95% t interval; the paired difference beside it."""
    sync = proto["comparisons"]["target_arm"]
    out = []
    for arm, k in proto["staleness"].items():
        if not k or arm not in arms or sync not in arms:
            continue
        a, s = arms[arm], arms[sync]
        c = comps.get(f"{arm}_vs_{sync}", {})
        out.append(
            {
                "goal": f"{arm}'s AUC (cost) inside {sync}'s 95% CI ({s['auc']:.4f} +- {s['auc_ci95']:.4f})",
                "value": a["auc"],
                "met": abs(a["auc"] - s["auc"]) <= s["auc_ci95"],
                "note": f"paired difference {c.get('effect', float('nan')):+.4f} +- "
                f"{c.get('effect_ci95', float('nan')):.4f}, p {c.get('p_value', float('nan')):.3g}",
            }
        )
    return out


def _run_one(cfg: Any, arm: str, seed: int, tick: Any = None) -> list[dict[str, Any]]:
    if cfg.learner == "tiny-lm":
        if cfg.staleness.get(arm, 0):
            raise ConfigError(
                "asynchronous arms ([staleness]) are run by the softmax learner only; the "
                "tiny-LM trainer's own switch is rollout.max_staleness"
            )
        from trace_gym.bench.learn_lm import run_lm_arm

        return run_lm_arm(cfg, arm, seed, tick=tick)
    return run_arm(cfg, arm, seed, tick=tick)


def run_all(
    cfg: Any, arms: list[str], jobs: int = 1, sink: Path | None = None
) -> list[dict[str, Any]]:
    """Every (seed, arm)'s records, in seed-then-arm order; with `jobs` > 1 in that many
    spawned processes (each run is a function of (cfg, arm, seed) only: the same records).
    `sink`: a JSON-lines file that gets each finished run's records as it ends (a run
    stopped early keeps what finished)."""
    from tqdm.auto import tqdm

    pairs = [(seed, arm) for seed in cfg.seed_list for arm in arms]
    done: dict[tuple[int, str], list[dict[str, Any]]] = {}

    def finish(key: tuple[int, str], recs: list[dict[str, Any]]) -> None:
        done[key] = recs
        if sink is not None:
            with open(sink, "a") as f:
                f.write(json.dumps(recs) + "\n")

    bar = tqdm(total=len(pairs) * cfg.steps, disable=not cfg.progress, desc=f"learn {cfg.preset}")
    with bar:
        if jobs <= 1:
            for seed, arm in pairs:
                finish((seed, arm), _run_one(cfg, arm, seed, tick=bar.update))
            return [r for key in pairs for r in done[key]]
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            futs = {pool.submit(_run_one, cfg, arm, seed): (seed, arm) for seed, arm in pairs}
            for f in as_completed(futs):
                finish(futs[f], f.result())
                bar.update(cfg.steps)
    return [r for key in pairs for r in done[key]]


def compare(
    cfg: Any,
    arms: list[str],
    proto: dict[str, Any],
    protocol_info: dict[str, Any],
    jobs: int = 1,
    sink: Path | None = None,
) -> dict[str, Any]:
    """Run every (arm, seed) on the same per-seed task streams; the report dict."""
    unknown_arms = [a for a in arms if a not in cfg.arms]
    if unknown_arms:
        raise ConfigError(
            f"unknown arm(s) {', '.join(unknown_arms)}; choose from {', '.join(cfg.arms)}"
        )
    records = run_all(cfg, arms, jobs, sink)
    target = proto["comparisons"]["target_arm"]
    summary = summarise(records, target)
    comps = comparisons(
        summary, proto["comparisons"]["primary"], proto["comparisons"].get("test", "wilcoxon")
    )
    return {
        "preset": cfg.preset,
        "arms": summary,
        "comparisons": comps,
        "goals": goals(summary, comps, proto),
        "protocol": {
            **protocol_info,
            "seeds": cfg.seed_list,
            "steps": cfg.steps,
            "accounted_budget_per_step": cfg.accounted_budget,
            "heldout_tasks": cfg.heldout_tasks,
            "roots": cfg.root_budget,
            "replays": cfg.replays_per_root,
            "candidates": cfg.candidates,
            "learner": cfg.learner,
            "evaluation": proto["tasks"].get("evaluation", "exact"),
            "eval_samples": cfg.eval_samples if cfg.learner == "tiny-lm" else None,
        },
        "records": records,
    }


def table(rep: dict[str, Any]) -> str:
    head = f"{'arm':<30} {'AUC(cost)':>17} {'AUC(turns)':>17} {'final':>17} {'cost->target':>13} {'cost/step':>9} {'turns/step':>10}"
    lines = [head]
    for arm, r in rep["arms"].items():
        ctt = "never" if r["cost_to_target"] is None else f"{r['cost_to_target']:.0f}"
        lines.append(
            f"{arm:<30} {r['auc']:>8.4f} +- {r['auc_ci95']:<6.4f} {r['auc_turns']:>8.4f} +- {r['auc_turns_ci95']:<6.4f} "
            f"{r['final_success']:>8.4f} +- {r['final_success_ci95']:<6.4f} {ctt:>13} {r['accounted_cost_per_step']:>9.1f} "
            f"{r['measured_turns_per_step']:>10.1f}"
        )
    for arm, r in rep["arms"].items():
        if "eval_episodes" in r:
            lines.append(
                f"{arm}: sampled evaluation, {r['eval_episodes']} episodes per point per seed; binomial SE of "
                f"the seed-mean final success {r['final_success_binomial_se']:.4f}"
            )
    for name, c in rep["comparisons"].items():
        lines.append(
            f"{name:<40} {c['family']:<9} AUC diff {c['effect']:+.4f} +- {c['effect_ci95']:.4f}  "
            f"p(Holm) {c['p_value']:.4g}  (raw {c['p_value_raw']:.4g}, {c['seeds']} seeds)"
        )
    for g in rep["goals"]:
        note = f" ({g['note']})" if "note" in g else ""
        lines.append(f"goal: {g['goal']}: {g['value']} -> {'met' if g['met'] else 'not met'}{note}")
    return "\n".join(lines)


def _plot(rep: dict[str, Any], out: Path, key: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from trace_gym.bench.learn_stats import t95

    cur = curves(rep["records"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm, per_seed in cur.items():
        x = np.mean([c[key] for c in per_seed.values()], axis=0)
        ys = np.array([c["success"] for c in per_seed.values()])
        m = ys.mean(axis=0)
        h = (
            t95(len(ys) - 1) * ys.std(axis=0, ddof=1) / np.sqrt(len(ys))
            if len(ys) > 1
            else np.zeros_like(m)
        )
        ax.plot(x, m, label=arm)
        ax.fill_between(x, m - h, m + h, alpha=0.2)
    ax.set_xlabel("cumulative accounted cost" if key == "cost" else "cumulative measured turns")
    ax.set_ylabel(f"{rep['protocol'].get('evaluation', 'exact')} held-out success")
    ax.set_title(f"{rep['preset']}: mean and 95% CI over {len(rep['protocol']['seeds'])} seeds")
    ax.legend(fontsize=8)
    path = out / f"curve_{key}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_paired(rep: dict[str, Any], out: Path) -> Path | None:
    """Per comparison: the per-seed success difference (a - b) along cost, mean and 95% CI."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from trace_gym.bench.learn_stats import t95

    cur = curves(rep["records"])
    pairs = [name.split("_vs_") for name in rep["comparisons"]]
    pairs = [(a, b) for a, b in pairs if a in cur and b in cur]
    if not pairs:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for a, b in pairs:
        seeds = sorted(set(cur[a]) & set(cur[b]))
        d = np.array([np.subtract(cur[a][s]["success"], cur[b][s]["success"]) for s in seeds])
        x = np.mean([cur[a][s]["cost"] for s in seeds], axis=0)
        h = (
            t95(len(d) - 1) * d.std(axis=0, ddof=1) / np.sqrt(len(d))
            if len(d) > 1
            else np.zeros(d.shape[1])
        )
        ax.plot(x, d.mean(axis=0), label=f"{a} - {b}")
        ax.fill_between(x, d.mean(axis=0) - h, d.mean(axis=0) + h, alpha=0.2)
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xlabel("cumulative accounted cost")
    ax.set_ylabel("paired held-out success difference")
    ax.set_title(f"{rep['preset']}: paired differences, 95% CI over seeds")
    ax.legend(fontsize=8)
    path = out / "paired_differences.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(rep: dict[str, Any], out: Path, command: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cols = [
        "arm",
        "auc",
        "auc_ci95",
        "auc_turns",
        "auc_turns_ci95",
        "initial_success",
        "final_success",
        "final_success_ci95",
        "cost_to_target",
        "cost_to_target_share",
        "accounted_cost_per_step",
        "measured_turns_per_step",
        "generated_tokens_per_step",
        "seeds",
    ]
    with open(out / "summary.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for arm, r in rep["arms"].items():
            w.writerow([arm] + [r[c] for c in cols[1:]])
    keys = sorted({k for r in rep["records"] for k in r})
    with open(out / "steps.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rep["records"])
    (out / "table.txt").write_text(table(rep) + "\n")
    for key in ("cost", "turns"):
        _plot(rep, out, key)
    _plot_paired(rep, out)
    from trace_gym.bench import report_html

    if hasattr(report_html, "write_index"):
        report_html.write_index(
            out,
            f"bench learn: {rep['preset']}",
            ["trace-gym", "bench", "learn", *command],
            notes=[table(rep)],
        )


#: the arms a v1-style protocol runs when --arms is not given
DEFAULT_ARMS = "trace,treepo,trace_roots,grpo"


def default_arms(proto: dict[str, Any]) -> list[str]:
    """`DEFAULT_ARMS` where the protocol has them all, else every arm of the protocol (an
    asynchronous protocol's arms are named otherwise)."""
    names = DEFAULT_ARMS.split(",")
    have = list(proto.get("arms", {}))
    return names if all(a in have for a in names) else have


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="trace-gym bench learn", description=__doc__)
    p.add_argument(
        "--learner",
        choices=("softmax", "tiny-lm"),
        default="softmax",
        help="softmax: the simulator learner (exact evaluation); tiny-lm: the LLM trainer on the tiny Qwen3",
    )
    p.add_argument("--preset", default="math")
    p.add_argument(
        "--arms",
        default=None,
        help=f"comma-separated arm names of the protocol (default: {DEFAULT_ARMS} where the "
        "protocol has them all, else every arm of the protocol)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="paired seeds B..B+S-1, B the protocol's seed_base (v1: 0..19)",
    )
    p.add_argument("--steps", type=int, default=None, help="training steps per run (protocol: 60)")
    p.add_argument("--heldout", type=int, default=None, help="held-out tasks (protocol: 1024)")
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument(
        "--eval-samples",
        type=int,
        default=None,
        help="episodes per held-out task (tiny-lm; protocol: 4)",
    )
    p.add_argument("--roots", type=int, default=None, help="override M (a deviation, recorded)")
    p.add_argument(
        "--candidates",
        type=int,
        default=None,
        help="override candidates per step (a deviation, recorded)",
    )
    p.add_argument(
        "--protocol",
        type=Path,
        default=None,
        help=f"default: {DEFAULT_PROTOCOL.name} (softmax) or {TINY_LM_PROTOCOL.name} (tiny-lm)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="(arm, seed) runs in parallel processes (the same records as 1)",
    )
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--no-progress", action="store_true")
    return p


def _protocol_for(args: Any) -> tuple[Path, dict[str, Any]]:
    """The protocol file the run follows (--protocol, else the learner's registered one)."""
    path = args.protocol or (TINY_LM_PROTOCOL if args.learner == "tiny-lm" else DEFAULT_PROTOCOL)
    proto = load_protocol(path)
    if proto["protocol"].get("learner", "softmax") != args.learner:
        raise ConfigError(
            f"protocol {path} is for learner {proto['protocol'].get('learner', 'softmax')!r}, "
            f"not --learner {args.learner}"
        )
    return path, proto


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        from trace_gym.sim import PRESETS

        if args.preset not in PRESETS:
            raise ConfigError(f"--preset must be one of {', '.join(PRESETS)}, got {args.preset!r}")
        path, proto = _protocol_for(args)
        arms = default_arms(proto) if args.arms is None else [a for a in args.arms.split(",") if a]
        info: dict[str, Any] = {
            "file": str(path),
            "sha256": check_protocol(path) if len(arms) > 1 else None,
        }
        over = {
            "preset": args.preset,
            "seeds": args.seeds,
            "steps": args.steps,
            "heldout_tasks": args.heldout,
            "eval_every": args.eval_every,
            "eval_samples": args.eval_samples,
            "root_budget": args.roots,
            "candidates": args.candidates,
            "progress": not args.no_progress,
            "work_dir": str(args.out / "runs") if args.out else None,
        }
        cfg = config_from_protocol(proto, **over)
        if min(cfg.seeds, cfg.steps, cfg.heldout_tasks, cfg.eval_every, cfg.eval_samples) < 1:
            raise ConfigError(
                "need --seeds, --steps, --heldout, --eval-every and --eval-samples >= 1"
            )
        info["deviations"] = {  # under the flags' names (--roots)
            {"root_budget": "roots"}.get(k, k): v
            for k, v in over.items()
            if k in ("root_budget", "candidates", "eval_samples") and v is not None
        }
        if args.jobs < 1:
            raise ConfigError(f"--jobs must be >= 1, got {args.jobs}")
        sink = None
        if args.out:  # each finished (arm, seed) run, as it ends
            args.out.mkdir(parents=True, exist_ok=True)
            sink = args.out / "runs.jsonl"
            sink.write_text("")
        rep = compare(cfg, arms, proto, info, jobs=args.jobs, sink=sink)
    except ConfigError as e:
        print(f"trace-gym bench learn: {e}", file=sys.stderr)
        return 2
    print(table(rep))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rep, indent=1))
    if args.out:
        write_outputs(rep, args.out, argv)
    return 0
