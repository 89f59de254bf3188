#!/usr/bin/env bash
# GPU checks on one GPU, in under 5 minutes together (no vLLM, no downloads; needs torch,
# transformers, peft). Time limits per check (seconds; a check past its limit is killed and
# recorded with rc 124): step 100, fsdp 60, fsdp8b 70, async 60 = 290 s; GPU_CHECK_LIMITS
# overrides them ("step=200,async=120"):
#   1. step   scripts/gpu_check_step.py: one full TRACE training step (LoRA and full; empirical
#             predictor and the LM critic) with HF bf16 generation on a random-init
#             Qwen3-0.6B-shaped model: tokens/s, step time, peak memory;
#   2. fsdp   scripts/gpu_check_fsdp.py: FSDP2 sharded training at the 0.6B shape on every
#             visible GPU (`trace-gym bench train` code) and the docs' memory formula against
#             the measured peak per rank (docs/distributed.md "Memory estimate");
#   3. fsdp8b scripts/gpu_check_fsdp.py --shape 8b: the formula at Qwen3-8B's full shape (formula
#             only: a full fine-tune needs several GPUs), and measured against the formula on an
#             8B-wide model cut to a few layers, which fits one GPU;
#   4. async  scripts/gpu_check_async.py: asynchronous rollouts, staleness 1 vs 0 on the HF
#             policy path: steps/s of each and their ratio.
# Each check prints JSON lines; all of them are also collected into ONE JSON file,
# `--json PATH` (default out/gpu_check.json): {"checks": {name: [rows]}, "rc": {name: code}}.
# `scripts/gpu_check.sh --tiny --device cpu` is the CPU smoke run of all of them;
# GPU_CHECK=step,async (say) runs a subset. Exit code: the first failing check's (3: no CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
WHICH=${GPU_CHECK:-step,fsdp,fsdp8b,async}
OUT=out/gpu_check.json
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --json) OUT=$2; shift 2 ;;
    --json=*) OUT=${1#--json=}; shift ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
rc=0
declare -A LIMIT=([step]=100 [fsdp]=60 [fsdp8b]=70 [async]=60)
IFS=, read -ra OVERRIDES <<< "${GPU_CHECK_LIMITS:-}"
for kv in ${OVERRIDES[@]+"${OVERRIDES[@]}"}; do
  [[ $kv =~ ^(step|fsdp|fsdp8b|async)=[0-9]+$ ]] || { echo "gpu_check: bad GPU_CHECK_LIMITS entry '$kv' (want NAME=SECONDS)" >&2; exit 2; }
  LIMIT[${kv%%=*}]=${kv#*=}
done
START=$(date +%s)
run() {  # name, script, extra args: its JSON lines to stdout and to $TMP/name.jsonl
  local name=$1 script=$2 code=0
  shift 2
  [[ ,$WHICH, == *,$name,* ]] || return 0
  [ "$rc" -ne 3 ] || return 0  # no CUDA: the other checks would say so again
  set +e
  timeout "${LIMIT[$name]}" "$PY" "scripts/$script" ${ARGS[@]+"${ARGS[@]}"} "$@" | tee "$TMP/$name.jsonl"
  code=${PIPESTATUS[0]}
  set -e
  echo "$code" > "$TMP/$name.rc"
  if [ "$code" -ne 0 ] && [ "$rc" -eq 0 ]; then rc=$code; fi
}
run step gpu_check_step.py
run fsdp gpu_check_fsdp.py
run fsdp8b gpu_check_fsdp.py --shape 8b
run async gpu_check_async.py
mkdir -p "$(dirname "$OUT")"
WALL=$(( $(date +%s) - START ))
"$PY" - "$TMP" "$OUT" "$WHICH" "$WALL" ${ARGS[@]+"${ARGS[@]}"} <<'EOF'
import json, pathlib, sys

tmp, out, which, wall = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
args = sys.argv[5:]
checks, rcs = {}, {}
for name in which.split(","):
    lines = tmp / f"{name}.jsonl"
    if lines.exists():
        checks[name] = [json.loads(x) for x in lines.read_text().splitlines() if x.startswith("{")]
        rcs[name] = int((tmp / f"{name}.rc").read_text())
timed_out = sorted(n for n, c in rcs.items() if c == 124)
rep = {"args": args, "wall_s": wall, "checks": checks, "rc": rcs, "timed_out": timed_out}
pathlib.Path(out).write_text(json.dumps(rep, indent=1) + "\n")
print(f"gpu_check: {len(checks)} check(s) -> {out}", file=sys.stderr)
EOF
exit "$rc"
