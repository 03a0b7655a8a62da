#!/usr/bin/env bash
# Offline datasets recorded with `robotrl dataset collect` from committed PPO policies
# (benchmarks/policies/, data-only checkpoints of 0.3-1.7 MB each):
#   <task>_expert.pt  the zoo's PPO recipe at 1M steps, seed 0 (benchmarks/grids/zoo.yaml's cell);
#   <task>_medium.pt  the same recipe stopped early, at about a third (hopper, walker2d) or 45%
#                     (halfcheetah) of the expert's return, as D4RL's "medium" policies were.
# Recording from the committed files, not from runs trained here, keeps the behaviour policies
# the same on every machine: training a policy is not reproducible across CPUs (the walker2d
# expert ends at 4160.9 on an AMD EPYC and 2843.8 on an Intel Xeon, same config and seed).
# The rows still depend on the CPU: MKL multiplies the policy's float32 matrices with other
# kernels on AMD than on Intel, and the last-bit differences grow through the simulation. On an
# AMD CPU with AVX-512 this script preloads benchmarks/mkl_intel_path.c (built with $CC or cc),
# which makes MKL take its Intel kernels, and sets ROBOTRL_CPU_LINEAR=blas (robotrl.nn.linear
# would otherwise train hopper medium-replay's replayed PPO run with oneDNN's products on Zen 5):
# two Intel Xeons and a Zen 5 EPYC so record the same four digests. An AMD CPU without AVX-512
# records others (benchmarks/README.md).
#   MINARI_DATASETS_PATH=$PWD/datasets bash benchmarks/offline_datasets.sh         # 4 datasets
#   MINARI_DATASETS_PATH=$PWD/datasets bash benchmarks/offline_datasets.sh suite   # 12 datasets
#   bash benchmarks/offline_datasets.sh policies   # retrain the six policies into runs/ and
#                                                  # copy them over benchmarks/policies/
#   MINARI_DATASETS_PATH=$PWD/datasets bash benchmarks/offline_datasets.sh d4rl    # 15 datasets,
#       D4RL's recipe from SAC agents trained here (robotrl/<task>/<kind>-v1; see that branch)
# The default records benchmarks/grids/offline_vs_d3rlpy.yaml's four (about 25 minutes on one
# core); `suite` the twelve of benchmarks/grids/offline.yaml (D4RL's locomotion kinds: medium,
# medium-replay, medium-expert, expert x hopper, halfcheetah, walker2d; 1M transitions each,
# medium-expert half and half, medium-replay what the medium policy's run saw, repeated from
# the config and seed its checkpoint holds). Datasets already written are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
POLICIES=benchmarks/policies
one=(torch_threads=1 backend.num_threads=1 logger.progress=false eval_episodes=10)
declare -A SHORT=([hopper]=150000 [walker2d]=307200 [halfcheetah]=102400)  # env steps
if [ "${1:-}" = policies ]; then  # the zoo's recipe (its cells' overrides), seed 0
    mkdir -p "$POLICIES"
    for task in hopper walker2d halfcheetah; do
        for kind in medium expert; do
            steps=$([ "$kind" = medium ] && echo "${SHORT[$task]}" || echo 1000000)
            run="runs/datasets/${task}_$kind"
            [ -f "$run/checkpoints/last.pt" ] ||
                robotrl train algo=ppo env="$task" total_steps="$steps" run_dir="$run" "${one[@]}"
            cp "$run/checkpoints/last.pt" "$POLICIES/${task}_$kind.pt"
        done
    done
    exit 0
fi
: "${MINARI_DATASETS_PATH:?set MINARI_DATASETS_PATH to the datasets root}"
export ROBOTRL_CPU_LINEAR=blas  # MKL's products, as the committed recordings were made with
if grep -q AuthenticAMD /proc/cpuinfo 2>/dev/null; then
    if ! grep -qw avx512f /proc/cpuinfo; then
        echo "note: an AMD CPU without AVX-512 records other digests than the committed cells'" >&2
    elif shim=$(mktemp -d)/libmkl_intel_path.so &&
            "${CC:-cc}" -shared -fPIC -O2 -o "$shim" benchmarks/mkl_intel_path.c; then
        export LD_PRELOAD="$shim${LD_PRELOAD:+:$LD_PRELOAD}"
    else
        echo "note: no C compiler (set CC): MKL keeps its AMD kernels on this CPU, so the" \
             "datasets get other digests than the committed cells'" >&2
    fi
fi
behaviour_expert='' behaviour_medium=''  # checkpoints in place of the committed policies
collect() {  # id task kind [arguments]: skip a dataset already written
    local id=$1 kind=$3 expert=${behaviour_expert:-$POLICIES/${2}_expert.pt}
    local acting=${behaviour_medium:-$POLICIES/${2}_medium.pt}
    shift 3
    [ "$kind" = expert ] && acting=$expert
    [ "$kind" = random ] && acting=$expert  # its architecture (recipe=d4rl: untrained)
    [ -d "$MINARI_DATASETS_PATH/$id" ] || robotrl dataset collect id="$id" kind="$kind" \
        progress=false checkpoint="$acting" expert="$expert" "$@"
}
if [ "${1:-}" = d4rl ]; then
    # D4RL's and Minari's recipe (issue 95; `dataset collect recipe=d4rl`), as robotrl/<task>/
    # <kind>-v1: per task a SAC agent from seed 0 trained for 1M steps is the expert; medium is
    # the same run stopped at its first evaluation at or above a third of the expert's final
    # evaluation return (a run is deterministic for its seed on one machine, so the short run is
    # the long one's prefix), medium-replay what that short run saw, random the agent untrained;
    # 1M transitions a kind (medium-expert 1M of each). The SAC runs resume where they stopped.
    # D4RL_STEPS, D4RL_TRANSITIONS and D4RL_TASKS shrink it (a smoke run).
    train_steps=${D4RL_STEPS:-1000000} transitions=${D4RL_TRANSITIONS:-1000000}
    done_at() {  # run_dir: the step its result.json says it finished at, 0 without one
        python -c "import json,sys; print(json.load(open(sys.argv[1]))['step'])" \
            "$1/result.json" 2>/dev/null || echo 0
    }
    train_sac() {  # task run_dir steps: train, or resume an interrupted run
        local resume=()
        [ -f "$2/checkpoints/last.pt" ] && resume=("resume=$2/checkpoints/last.pt")
        [ "$(done_at "$2")" -ge "$3" ] ||
            robotrl train algo=sac env="$1" seed=0 total_steps="$3" run_dir="$2" \
                "${one[@]}" "${resume[@]}"
    }
    for task in ${D4RL_TASKS:-hopper halfcheetah walker2d}; do
        expert_run=runs/datasets/${task}_sac medium_run=runs/datasets/${task}_sac_medium
        train_sac "$task" "$expert_run" "$train_steps"
        medium_steps=$(python - "$expert_run/result.json" <<'PY'
import json, sys
evaluations = json.load(open(sys.argv[1]))["evaluations"]
target = evaluations[-1]["return_mean"] / 3
print(next(e["step"] for e in evaluations if e["return_mean"] >= target))
PY
)
        train_sac "$task" "$medium_run" "$medium_steps"
        behaviour_expert=$expert_run/checkpoints/last.pt
        behaviour_medium=$medium_run/checkpoints/last.pt
        for kind in random medium medium-replay medium-expert expert; do
            steps=("steps=$transitions"); [ "$kind" = medium-replay ] && steps=()
            collect "robotrl/$task/$kind-v1" "$task" "$kind" recipe=d4rl "${steps[@]}"
        done
    done
    exit 0
fi
if [ "${1:-}" = suite ]; then
    for task in hopper halfcheetah walker2d; do
        collect "robotrl/$task/medium-v0" "$task" medium steps=1000000
        collect "robotrl/$task/medium-replay-v0" "$task" medium-replay
        collect "robotrl/$task/medium-expert-v0" "$task" medium-expert steps=1000000
        collect "robotrl/$task/expert-v0" "$task" expert steps=1000000
    done
    exit 0
fi
collect robotrl/hopper/medium-replay-v0 hopper medium-replay
collect robotrl/walker2d/medium-v0 walker2d medium steps=1000000
collect robotrl/halfcheetah/medium-expert-v0 halfcheetah medium-expert steps=1000000
# mixed quality, simulated by Gymnasium's own Hopper-v5 (not robotrl's simulator)
collect gymnasium/hopper/medium-expert-v0 hopper medium-expert steps=1000000 backend=gymnasium
for id in robotrl/hopper/medium-replay-v0 robotrl/walker2d/medium-v0 \
          robotrl/halfcheetah/medium-expert-v0 gymnasium/hopper/medium-expert-v0; do
    robotrl dataset info "$id"
done
