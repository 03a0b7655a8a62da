#!/usr/bin/env bash
# Offline datasets recorded with `robotrl dataset collect` from PPO policies: the experts are the
# zoo's seed-0 PPO runs at 1M steps (`robotrl bench run benchmarks/grids/zoo.yaml seeds=[0]
# algos=[ppo]` writes them), the "medium" policies the same recipes stopped early, at about a
# third (hopper, walker2d) or 45% (halfcheetah) of the expert's return, as D4RL's were.
#   MINARI_DATASETS_PATH=$PWD/datasets bash benchmarks/offline_datasets.sh         # 4 datasets
#   MINARI_DATASETS_PATH=$PWD/datasets bash benchmarks/offline_datasets.sh suite   # 12 datasets
# The default records benchmarks/grids/offline_vs_d3rlpy.yaml's four (about 25 minutes on one
# EPYC core); `suite` the twelve of benchmarks/grids/offline.yaml (D4RL's locomotion kinds:
# medium, medium-replay, medium-expert, expert x hopper, halfcheetah, walker2d; 1M transitions
# each, medium-expert half and half, medium-replay what the short run saw). Datasets and short
# runs already written are kept.
set -euo pipefail
: "${MINARI_DATASETS_PATH:?set MINARI_DATASETS_PATH to the datasets root}"
export OMP_WAIT_POLICY=PASSIVE
one=(torch_threads=1 backend.num_threads=1 logger.progress=false eval_episodes=10)
declare -A SHORT=([hopper]=150000 [walker2d]=307200 [halfcheetah]=102400)  # env steps
short() {  # the task's short run: the zoo's recipe stopped early
    [ -f "runs/datasets/$1_short/checkpoints/last.pt" ] ||
        robotrl train algo=ppo env="$1" total_steps="${SHORT[$1]}" \
            run_dir="runs/datasets/$1_short" "${one[@]}"
}
collect() {  # id task kind [arguments]: skip a dataset already written
    local id=$1 task=$2 kind=$3 expert medium
    shift 3
    expert="runs/bench/zoo/robotrl/ppo/$task/1000000/s0/checkpoints/last.pt"
    medium="runs/datasets/${task}_short/checkpoints/last.pt"
    [ "$kind" = expert ] && medium=$expert
    [ -d "$MINARI_DATASETS_PATH/$id" ] || robotrl dataset collect id="$id" kind="$kind" \
        progress=false checkpoint="$medium" expert="$expert" "$@"
}
if [ "${1:-}" = suite ]; then
    for task in hopper halfcheetah walker2d; do
        short "$task"
        collect "robotrl/$task/medium-v0" "$task" medium steps=1000000
        collect "robotrl/$task/medium-replay-v0" "$task" medium-replay
        collect "robotrl/$task/medium-expert-v0" "$task" medium-expert steps=1000000
        collect "robotrl/$task/expert-v0" "$task" expert steps=1000000
    done
    exit 0
fi
for task in hopper walker2d halfcheetah; do short "$task"; done
collect robotrl/hopper/medium-replay-v0 hopper medium-replay
collect robotrl/walker2d/medium-v0 walker2d medium steps=1000000
collect robotrl/halfcheetah/medium-expert-v0 halfcheetah medium-expert steps=1000000
# mixed quality, simulated by Gymnasium's own Hopper-v5 (not robotrl's simulator)
collect gymnasium/hopper/medium-expert-v0 hopper medium-expert steps=1000000 backend=gymnasium
for id in robotrl/hopper/medium-replay-v0 robotrl/walker2d/medium-v0 \
          robotrl/halfcheetah/medium-expert-v0 gymnasium/hopper/medium-expert-v0; do
    robotrl dataset info "$id"
done
