#!/usr/bin/env bash
# Profile several tables in one device call; results (tables + log) go to $OUT as one tarball.
# Usage: profiles/device_run.sh GPUKEY "model:tp:budget_min[:skip|:redo]" ...
# Resumes from the tables shipped under profiles/GPUKEY; "skip": op tables only; "redo": keep
# the op tables and re-time every whole step (e.g. after a change of the mixed-step mode).
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gpu=$1; shift
work=/tmp/tables
# start clean: a warm machine keeps /tmp from an earlier call, and a stale CSV there would be
# resumed into this run's tables
rm -rf "$work"
mkdir -p "$work"
# resume: unpack tables shipped with the working tree for this gpu
if [ -d "profiles/$gpu" ]; then cp -r "profiles/$gpu" "$work/"; fi
mkdir -p "$work/$gpu"
for job in "$@"; do
  IFS=: read -r model tp budget skip <<<"$job"
  out="$work/$gpu/${model}_tp${tp}"
  extra=""; [ "${skip:-}" = "skip" ] && extra="--skip-steps"
  [ "${skip:-}" = "redo" ] && extra="--redo-steps"
  echo "=== $model tp$tp budget ${budget}m $extra"
  timeout $(( ${budget%.*} * 60 + 150 )) python3 -m profiles.cli --model "$model" --tp "$tp" \
     --out "$out" --budget-minutes "$budget" --resume $extra 2>"$out.stderr" \
     || { echo "job failed rc=$?"; tail -c 3000 "$out.stderr"; }
  tail -c 600 "$out.stderr" | tr '\r' '\n' | tail -n 4
  (cd "$work" && tar czf "$OUT/tables_$gpu.tgz" "$gpu")
done
