#!/usr/bin/env bash
# Usage: bench/cpu.sh PID COMMAND...  -- runs COMMAND and prints the CPU time PID used meanwhile
# (user+system, from /proc/PID/stat), so "µs of server CPU per request" can be computed.
set -euo pipefail
pid=$1; shift
tick=$(getconf CLK_TCK)
read_cpu() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
before=$(read_cpu)
"$@"
after=$(read_cpu)
echo "server cpu: $(( (after - before) * 1000 / tick )) ms"
