#!/usr/bin/env bash
# On a lent GPU machine: K fresh engine processes of MODEL_DIR (default the 8B's folder written by
# `run_all.py arrivals`), one after the other, each timing isolated prompts and sampling its
# engine core with py-spy beside 3 x N more 600-token prompts (`profiles.launch_trace`), while
# BUDGET seconds leave as long as the last process took. Carries: the vLLM upload folders
# (profiles/device_tree.sh), vjobs/ and .whl/ (the py-spy wheel). All runs come back as one
# $OUT/runs.tar (a call returns only a few files). Read back: launch_trace --summary p*/.
# Usage: K=8 N=15 BUDGET=500 bash profiles/device_launch_trace.sh
set -uo pipefail
K=${K:-7} N=${N:-15} END=$((SECONDS + ${BUDGET:-520})) MODEL_DIR=${MODEL_DIR:-vjobs/models/llama-3-8b}
bash profiles/device_vllm.sh > /tmp/install.log 2>&1 || { tail -5 /tmp/install.log; exit 3; }
mkdir -p /root/pyspy && python3 -m pip install -q --no-index --no-deps --target /root/pyspy .whl/py_spy*.whl
export PATH=/root/pyspy/bin:$PATH PYTHONPATH=/root/vl/site:$PWD PYTHONUNBUFFERED=1
which py-spy || exit 4
last=150
for i in $(seq 1 $K); do
  left=$((END - SECONDS)); [ $left -gt $last ] || { echo "stop before p$i: ${left}s left"; break; }
  t0=$SECONDS
  timeout $left python3 -m profiles.launch_trace $MODEL_DIR --out $OUT/p$i --n $N --traced 1 \
    --sampler "py-spy record --pid {pid} --rate 500 --nonblocking --format raw -o {out}/pyspy.txt" \
    > $OUT/p$i.log 2>&1
  echo "p$i rc=$? $((SECONDS - t0)) s"; last=$(( (SECONDS - t0) + 10 ))
  [ -f $OUT/p$i/pyspy.txt ] && gzip $OUT/p$i/pyspy.txt
  rm -rf $OUT/p$i/trace
  python3 -m profiles.launch_trace --summary $OUT/p$i | head -n 3  # its medians, in the log
done
# one file back: a call returns at most a few files
tar cf $OUT/runs.tar -C $OUT $(cd $OUT && ls -d p*) && (cd $OUT && rm -rf p[0-9]*)
