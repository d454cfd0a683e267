#!/usr/bin/env bash
# Here, before and after the upload and job calls to a lent GPU machine: a call carries the
# checkout's tracked files (plus its carried paths) up to 64 MiB, and the stored tables, serving
# replays, traces and experiment figures are ~120 MiB that no GPU job reads. `park` moves them to
# ../servesim-parked/ (beside the checkout), `restore` moves them back; `git status` is clean after
# `restore`. Commit nothing while parked (the parked files read as deleted). `uploads [moe]` groups
# the vLLM parts (.vllm/p*, and with `moe` .vllm/m*, from profiles/vllm_parts.sh) into the upload
# folders .vllm/u1 .. (48 MiB each, under a call's 64 MiB with the parked tree): carry u1, u2, ...
# one call each (`mv .vllm/uN/* /root/vl/`), the last with the job (device_vllm.sh takes its parts).
# Usage: bash profiles/device_tree.sh park|restore|uploads [moe]
set -euo pipefail
cd "$(dirname "$0")/.."
PARKED=../servesim-parked
DIRS="validation/vllm-0.24 profiles/h100 profiles/h200 workloads/traces experiments"
case "${1:-}" in
  park)
    for d in $DIRS; do
      [ -e "$PARKED/$d" ] && { echo "$PARKED/$d exists: restore first" >&2; exit 1; }
      mkdir -p "$PARKED/$(dirname "$d")" && mv "$d" "$PARKED/$d"
    done
    echo "tracked bytes left here: $(git ls-files -z | du -cb --files0-from=- 2>/dev/null | tail -1 || true)" ;;
  restore)
    for d in $DIRS; do
      if [ -e "$PARKED/$d" ]; then
        [ -e "$d" ] && { echo "$d exists here and in $PARKED" >&2; exit 1; }
        mv "$PARKED/$d" "$d"
      fi
    done
    git status --short | head ;;
  uploads)
    parts=$(ls .vllm/p[0-9]* 2>/dev/null; [ "${2:-}" = moe ] && ls .vllm/m[0-9]* 2>/dev/null || true)
    [ -n "$parts" ] || { echo "no parts under .vllm/: run bash profiles/vllm_parts.sh" >&2; exit 1; }
    rm -rf .vllm/u[0-9]*
    n=1; used=0
    for f in $parts; do  # in name order; a folder holds at most 48 MiB
      size=$(stat -c %s "$f")
      if [ $((used + size)) -gt $((48 << 20)) ]; then n=$((n + 1)); used=0; fi
      mkdir -p .vllm/u$n && cp "$f" .vllm/u$n/ && used=$((used + size))
    done
    du -sh .vllm/u[0-9]* ;;
  *) echo "usage: $0 park|restore|uploads [moe]" >&2; exit 2 ;;
esac
