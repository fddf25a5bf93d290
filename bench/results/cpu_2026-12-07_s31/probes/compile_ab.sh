#!/usr/bin/env bash
# /tmp/ab.sh FILE [reps]: separate-mode compile of FILE with old (/tmp/inc_old) and new (/work/main) headers, alternating; min and median wall
f=$1; n=${2:-3}
F="-std=c++20 -O2 -I/usr/include/eigen3 -DKILN_WITH_CUDA=1 -isystem /usr/local/cuda/include -DKILN_SEPARATE_COMPILATION ${EXTRA:-}"
for i in $(seq $n); do
  for v in old new; do
    inc=/work/main/include; [ $v = old ] && inc=/tmp/inc_old/include
    /usr/bin/time -f "$v %e %M" g++ $F -I$inc -c $f -o /tmp/ab.o 2>&1 | tail -1
  done
done | awk '{t[$1]=t[$1]" "$2; m[$1]=$3} END {for (v in t) print v, t[v], "peakKB", m[v]}'
