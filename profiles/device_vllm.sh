#!/usr/bin/env bash
# On a lent GPU machine: install vLLM 0.24.0 from the parts carried in .vllm/ (see
# profiles/README.md, "Tables through vLLM"), then run engine jobs: device_vllm.sh JOB:NAME ...
# Each job's outputs (engine.json, steps, phases, log) are packed into $OUT/NAME.tgz.
# PARALLEL=1 runs job i on GPU i, all at once (TP1 jobs on a multi-GPU machine).
set -uo pipefail
VL=/root/vl
mkdir -p $VL
# parts carried loose or in the upload folders (.vllm/u1 ...), as profiles/README.md carries them
mv .vllm/p[0-9]* .vllm/m[0-9]* .vllm/u*/p[0-9]* .vllm/u*/m[0-9]* $VL/ 2>/dev/null || true
if [ ! -d $VL/site/vllm ]; then
  (cd $VL && cat $(ls p[0-9]* | sort) > all.tar && sha256sum all.tar && tar xf all.tar && mkdir -p site \
    && tar xJf vllm-trim.tar.xz -C site \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target site deps/*.whl \
    && rm -f all.tar vllm-trim.tar.xz) || { echo "vllm install failed"; exit 3; }
fi
# mixture-of-experts kernels, carried apart (parts m00..; profiles/README.md) when a job needs them.
# Unpacked aside and copied in only whole: a call that carried some of the parts once left a
# truncated .so in place, which the next call took as installed (a bus error at import)
if ls $VL/m[0-9]* >/dev/null 2>&1 && [ ! -f $VL/site/.moe_installed ]; then
  (cd $VL && rm -rf moe.tmp && mkdir moe.tmp && cat $(ls m[0-9]* | sort) | tar xJf - -C moe.tmp \
    && cp -a moe.tmp/. site/vllm/ && touch site/.moe_installed && rm -rf moe.tmp m[0-9]*) \
    || { echo "moe install failed (all of m00..m04 carried?)"; rm -rf $VL/moe.tmp; exit 3; }
fi
export PYTHONPATH=$VL/site:$PWD PYTHONUNBUFFERED=1
# NVLink multicast off on shared multi-GPU hosts (profiles/vllm_run.py forces the same)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" || exit 4
run_job() {  # run_job JOB:NAME: one engine job, its folder packed into $OUT/NAME.tgz
  local spec=$1 job=${1%%:*} name=${1##*:} dir=/tmp/runs/${1##*:}
  [ "${RESUME:-0}" = 1 ] || rm -rf $dir  # RESUME=1 keeps a cut-short run ("resume" in its job)
  mkdir -p $dir
  echo "=== $name ($job) $(date +%T)"
  # appended: a resumed run's log keeps the cut-short part before it. Exit status 75
  # (vllm_run.MORE_PASSES): a profile phase with passes_per_engine left passes to a fresh
  # engine process, so start the job again (it resumes) while JOB_TIMEOUT leaves as long as the
  # last process took: a pass cut at the timeout is finished by another process in the next
  # call (an H100 8B table of 2026-11-27 ran in five processes, not three), and the seconds
  # left idle are device time not held
  local end=$((SECONDS + ${JOB_TIMEOUT:-540})) rc=75 last=0 t0
  while [ $rc = 75 ] && [ $((end - SECONDS)) -gt $last ]; do
    t0=$SECONDS
    timeout $((end - SECONDS)) python3 -m profiles.vllm_run "$job" --out $dir >> $dir/log.txt 2>&1
    rc=$? last=$((SECONDS - t0))
  done
  [ $rc = 75 ] && echo "passes left; $((end - SECONDS)) s left of JOB_TIMEOUT, the last engine took ${last} s: call again with RESUME=1"
  echo "rc=$rc $name $(date +%T)"
  grep -E "^\[|^phase|Error|error|Traceback" $dir/log.txt | tail -n 25
  tar czf $OUT/$name.tgz -C /tmp/runs $name
}
if [ "${PARALLEL:-0}" = 1 ]; then
  # one TP1 job per GPU at once (job i on GPU i), outputs kept apart: a 70B's 20+ ms steps hide
  # the shared host's launches; an 8B's do not (profiles/README.md, "Re-recorded ...")
  i=0; rm -f /tmp/runs.*.txt
  for spec in "$@"; do
    (export CUDA_VISIBLE_DEVICES=$i; run_job "$spec" > /tmp/runs.$i.txt 2>&1) &
    i=$((i + 1)); sleep 15  # engines start one after the other (compile caches, ports)
  done
  wait
  cat /tmp/runs.*.txt
else
  for spec in "$@"; do run_job "$spec"; done
fi
