#!/usr/bin/env bash
# Here, before and after the upload and job calls to a lent GPU machine: a call carries the
# checkout's tracked files (plus its carried paths) up to 64 MiB, and the stored tables, serving
# replays, traces and experiment figures are ~120 MiB that no GPU job reads. `park` moves them to
# ../servesim-parked/ (beside the checkout), `restore` moves them back; `git status` is clean after
# `restore`. Commit nothing while parked (the parked files read as deleted). Usage: bash profiles/device_tree.sh park|restore
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
  *) echo "usage: $0 park|restore" >&2; exit 2 ;;
esac
