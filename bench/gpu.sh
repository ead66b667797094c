#!/usr/bin/env bash
# One GPU session's measurements, stage by stage, in one command (device minutes are few: ../shared/GPU.md).
#
#   bench/gpu.sh OUTDIR [STAGE ...]      stages: throughput population steady cold jaxmarl marl profile
#                                        (default: the first six, in this order)
#
# - throughput: bench/throughput.py's PPO CartPole rows at 8192, 16384 and 32768 environments (issue 47's >= 20M
#   env-steps/s on one GPU);
# - population: bench/population.py at N = 256 and 2048 (PureJaxRL's "2048 agents" figure, ~10M on an A100),
#   fragc's population beside `jax.jit(jax.vmap(...))` of PureJaxRL's train, alternating;
# - steady, cold: bench/ppo_single.py and bench/cold_start.py, fragc's PPO against PureJaxRL's (steady state; a
#   fresh process's compile and first iteration);
# - jaxmarl: bench/jaxmarl_ippo.py, one seed and ten, against JaxMARL's IPPO script style;
# - marl: bench/results.py's three JaxMARL rows, ten seeds each for their whole 1e7-step budget, a population of
#   ten vectorised (--vectorised), the three processes side by side (each row is latency-bound on a GPU);
# - profile: bench/experiments/ppo_profile_gpu.py, kernels and host time per iteration of `steady`'s sides (why
#   fragc's PPO at 4 environments was at 0.50 of PureJaxRL's on an H200, 2026-11-27).
#
# Each stage runs under a time limit of its own, the whole under BUDGET seconds (default 540), so a slow stage cannot
# take the rest with it; after every stage OUTDIR/gpu.tgz packs what the stages wrote (a call cut short brings back
# what was measured). Needs a JAX with CUDA in PYTHON (default .venv/bin/python) and refuses to run without a GPU, so
# a CPU table is never mistaken for a GPU one; DRY_RUN=1 runs every stage at toy sizes on any backend, to check this
# script before a device is spent on it. Record the tables in docs/benchmarks.md and docs/results.md, with the card.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
OUTDIR="${1:?usage: bench/gpu.sh OUTDIR [STAGE ...]}"
shift
STAGES="${*:-throughput population steady cold jaxmarl marl}"
BUDGET="${BUDGET:-540}"
DRY_RUN="${DRY_RUN:-0}"
WORK="$(mktemp -d)"
START=$SECONDS
for s in $STAGES; do
    case $s in throughput | population | steady | cold | jaxmarl | marl | profile) ;;
    *) echo "bench/gpu.sh: error: unknown stage $s (throughput population steady cold jaxmarl marl profile)"; exit 2 ;;
    esac
done
mkdir -p "$OUTDIR"

if [ "$DRY_RUN" = 1 ]; then
    echo "DRY RUN: toy sizes, any backend; no number from this run is a measurement"
else
    "$PYTHON" -P -c 'import jax, sys; sys.exit(0 if jax.default_backend() == "gpu" else "bench/gpu.sh: error: no GPU visible to JAX")' || exit 1
fi
"$PYTHON" -P -c 'import jax; d = jax.devices()[0]; print(f"device: {d.device_kind} ({jax.default_backend()}), jax {jax.__version__}")'
needs=fragc,gymnax
case " $STAGES " in *" jaxmarl "* | *" marl "*) needs=$needs,jaxmarl ;; esac  # the multi-agent stages: its wheel too
"$PYTHON" -P -c "import $needs, fragc; print('imports: $needs; fragc from', fragc.__file__)" || exit 1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

small() { [ "$DRY_RUN" = 1 ] && echo "$1" || echo "$2"; }  # small SMALL FULL: the dry run's value or the real one

stage() {  # stage NAME CAP_SECONDS COMMAND...: run COMMAND under min(CAP, what is left of BUDGET), then pack
    local name=$1 cap=$2 left
    shift 2
    left=$((BUDGET - (SECONDS - START) - 10))
    [ "$left" -lt "$cap" ] && cap=$left
    if [ "$cap" -le 20 ]; then echo "== $name: skipped, ${left}s of the budget left"; return; fi
    echo "== $name (at most ${cap}s; $((SECONDS - START))s into the run)"
    local t0=$SECONDS
    timeout --kill-after=5 "$cap" "$@"
    echo "== $name: exit $? after $((SECONDS - t0))s"
    tar czf "$OUTDIR/gpu.tgz" -C "$WORK" .
}

marl() {  # the three JaxMARL rows at once, each its own process and GPU memory grown as needed
    local steps pids=() row
    steps=$(small "--steps 40000" "")
    for row in ippo_mpe_simple_spread mappo_mpe_simple_spread mappo_smax_3m; do
        XLA_PYTHON_CLIENT_PREALLOCATE=false "$PYTHON" bench/results.py --only "$row" --seeds "$(small 0-1 0-9)" \
            --vectorised $steps --out "$WORK/marl_$row" > "$WORK/marl_$row.log" 2>&1 &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid"; done
    tail -n 30 "$WORK"/marl_*.log
}

for s in $STAGES; do
    case $s in
    throughput) stage throughput 150 "$PYTHON" bench/throughput.py \
        --rows "$(small ppo-cartpole-2048 ppo-cartpole-8192,ppo-cartpole-16384,ppo-cartpole-32768)" \
        --iterations "$(small 2 32)" --repeats "$(small 1 3)" --out "$WORK/throughput.json" ;;
    population) stage population 120 "$PYTHON" bench/population.py --sizes "$(small 4 256,2048)" \
        --iterations "$(small 2 8)" --repeats "$(small 1 5)" --out "$WORK" ;;
    steady) stage steady 90 "$PYTHON" bench/ppo_single.py --repeats "$(small 1 7)" --iterations "$(small 4 64)" \
        --compile-repeats 0 --sides fragc,purejaxrl,fragc_no_trunc --out "$WORK" ;;
    cold) stage cold 120 "$PYTHON" bench/cold_start.py --repeats "$(small 1 3)" --sides fragc,purejaxrl_train \
        --out "$WORK" ;;
    jaxmarl) stage jaxmarl 60 "$PYTHON" bench/jaxmarl_ippo.py --repeats "$(small 1 7)" --iterations "$(small 2 8)" \
        --out "$WORK"
        stage jaxmarl_seeds 60 "$PYTHON" bench/jaxmarl_ippo.py --seeds 10 --repeats "$(small 1 5)" \
        --iterations "$(small 2 4)" --out "$WORK" ;;
    marl) export -f marl small; export PYTHON WORK DRY_RUN
        stage marl 400 bash -c marl ;;
    profile) stage profile 120 "$PYTHON" bench/experiments/ppo_profile_gpu.py --iterations "$(small 2 32)" \
        --k "$(small 2 16)" --out "$WORK" ;;
    esac
done
echo "done in $((SECONDS - START))s; $OUTDIR/gpu.tgz holds: $(tar tzf "$OUTDIR/gpu.tgz" | tr '\n' ' ')"
