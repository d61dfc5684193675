#!/usr/bin/env bash
# Multi-task MiniVLA on a CUDA device, at a scale a CPU cannot reach: demonstrations (into a
# resumable cache), SFT of a wider, deeper MiniVLA with action chunks, GRPO from it through the
# three stacks (same seeds, same budget), and held-out evaluation with Wilson intervals.
#
#   bash scripts/gpu_vla.sh [OUT]            # OUT default runs/vla-gpu; resumable: rerun to continue
#   DEVICE=cpu SCALE=toy bash scripts/gpu_vla.sh /tmp/vla-toy   # the same pipeline in ~2 CPU minutes
#
# Environment: DEVICE (cuda | cpu, default cuda), SCALE (full | toy, default full), PYTHON
# (default .venv/bin/python when present), GRPO_TASK (default 7), CHUNK (actions per decision,
# default 4). Demonstrations and rollouts run the MuJoCo simulator on the CPU (EGL rendering);
# the policy's passes (SFT, acting, GRPO updates) run on DEVICE.
set -euo pipefail
OUT=${1:-runs/vla-gpu}
DEVICE=${DEVICE:-cuda}
SCALE=${SCALE:-full}
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}
GRPO_TASK=${GRPO_TASK:-7}
CHUNK=${CHUNK:-4}
export MUJOCO_GL=${MUJOCO_GL:-egl}

if [ "$SCALE" = toy ]; then
  TASKS="7"; INITS="0"; PER_INIT=1; DEMO_STEPS=600
  MODEL="--width 32 --llm-width 48 --vision-layers 1 --llm-layers 1 --image-size 32 --patch-size 16"
  SFT="--steps 4 --batch-size 4 --log-every 2 --checkpoint-every 4"
  GRPO="--total-steps 1 --groups-per-step 1 --group-size 2 --init-states 0 --max-episode-steps 9 --image-size 32"
  EVAL="--init-states 16 --trials 1 --max-episode-steps 9 --image-size 32"
  IMAGE=32
else
  TASKS="0 1 4 5 6 7"; INITS="$(seq -s ' ' 0 15)"; PER_INIT=4; DEMO_STEPS=600
  MODEL="--width 384 --llm-width 512 --vision-layers 8 --llm-layers 8 --fuse-dino true"
  SFT="--steps 30000 --batch-size 128 --learning-rate 3e-4 --warmup-steps 500 --checkpoint-every 1000"
  GRPO="--total-steps 200 --groups-per-step 4 --group-size 8 --rows-per-episode 32 --learning-rate 1e-5"
  EVAL="--init-states $(seq -s ' ' 16 49) --trials 4"
  IMAGE=64
fi

echo "== demonstrations: tasks $TASKS, init states $INITS, $PER_INIT per init (cache: $OUT/demos)"
"$PYTHON" -m agents.vla demos --tasks $TASKS --init-states $INITS --per-init "$PER_INIT" \
  --max-episode-steps "$DEMO_STEPS" --image-size "$IMAGE" --cache-dir "$OUT/demos"

echo "== SFT on $DEVICE (action chunk $CHUNK)"
"$PYTHON" -m agents.vla sft --demo-cache "$OUT/demos" $MODEL $SFT --action-chunk "$CHUNK" \
  --device "$DEVICE" --output-dir "$OUT/sft" --tensorboard false

for STACK in real wm wmrl; do
  echo "== GRPO ($STACK) on task $GRPO_TASK, $DEVICE"
  "$PYTHON" -m agents.vla train --checkpoint "$OUT/sft/checkpoint" --stack "$STACK" --task "$GRPO_TASK" \
    $GRPO --device "$DEVICE" --seed 0 --output-dir "$OUT/grpo-$STACK" --tensorboard false
done

for POLICY in sft grpo-real grpo-wm grpo-wmrl; do
  echo "== held-out evaluation: $POLICY"
  "$PYTHON" -m agents.vla evaluate --policy "$OUT/$POLICY/checkpoint" --tasks $TASKS $EVAL \
    --temperature 0 --output "$OUT/eval-$POLICY.json"
done
echo "== done: $OUT"
