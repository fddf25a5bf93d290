#!/usr/bin/env bash
# /tmp/ab.sh FILE [reps]: separate-mode compile of FILE with old (/tmp/inc_old) and new (/work/main) headers, alternating; user seconds
f=$1; n=${2:-3}
F="-std=c++20 -O2 -I/usr/include/eigen3 -DKILN_WITH_CUDA=1 -isystem /usr/local/cuda/include ${MODE:--DKILN_SEPARATE_COMPILATION} ${EXTRA:-}"
for i in $(seq $n); do
  for v in old new; do
    inc=/work/main/include; [ $v = old ] && inc=/tmp/inc_old/include
    /usr/bin/time -f "$v %U %e %M" g++ $F -I$inc -c $f -o /tmp/ab_$v.o 2>&1 | tail -1
  done
done | awk '{u[$1]=u[$1]" "$2; w[$1]=w[$1]" "$3; m[$1]=$4} END {for (v in u) print v, "user" u[v], "| wall" w[v], "| peakKB", m[v]}' | sort
size /tmp/ab_old.o /tmp/ab_new.o | awk 'NR>1{print $6, $1}'
