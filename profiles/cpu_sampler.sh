#!/bin/bash
# The GPU machine's CPU counters every 0.5 s, to set beside a run's step stamps (the engine's
# clock is Python's time.monotonic, printed first on each line): the /proc/stat cpu line (user
# nice system idle iowait irq softirq steal guest guest_nice, in ticks), the mean MHz /proc/cpuinfo
# reports and the load average. Used on a replay: `bash profiles/cpu_sampler.sh > $OUT/cpu.txt &`
# (validation/vllm-0.24/README.md, "Qwen3-30B-A3B on a second H200").
while true; do
  echo "$(python3 -c 'import time; print(time.monotonic())') $(head -1 /proc/stat)" \
    "MHZ $(awk '/MHz/{s+=$4;n++} END{print s/n}' /proc/cpuinfo) LOAD $(cut -d' ' -f1-3 /proc/loadavg)"
  sleep 0.5
done
