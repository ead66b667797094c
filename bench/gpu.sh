#!/usr/bin/env bash
# Throughput rows on one GPU, written as a JSON table (bench/results/gpu.json by default):
# PPO CartPole at 2048 and 8192 environments, a population of 256 seeds, PPO on the four MinAtar games.
#
#   bench/gpu.sh [OUT.json]
#
# Needs a JAX with CUDA in the environment's python (PYTHON, default .venv/bin/python). Refuses to run on
# a machine without a GPU, so a CPU table is never mistaken for a GPU one. Record the table in
# docs/benchmarks.md next to PureJaxRL's ~10M aggregate env-steps/s for 2048 CartPole agents on an A100.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
OUT="${1:-bench/results/gpu.json}"
"$PYTHON" -c 'import jax, sys; sys.exit(0 if jax.default_backend() == "gpu" else "bench/gpu.sh: error: no GPU visible to JAX")'
"$PYTHON" -c 'import jax; d = jax.devices()[0]; print(f"device: {d.device_kind} ({jax.default_backend()}), jax {jax.__version__}")'
"$PYTHON" bench/throughput.py --iterations 64 --repeats 5 --out "$OUT"
echo "wrote $OUT"
