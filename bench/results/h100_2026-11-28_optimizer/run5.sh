#!/usr/bin/env bash
# session 10, call 5: the final build (4aae043): GPU suites touched by the last review mend, and the
# training rows once more.
cd "$(dirname "$0")" && rm -rf new old t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s10
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date; t0=$SECONDS
for t in cuda_ops autograd nn compile; do timeout 150 $P/t/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/t.log 2>&1; rc=$?; echo "== $t rc=$rc $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A6 $OUT/t.log | head -30; done
rm -f $OUT/t.log
timeout 120 $P/new/kiln_bench --no-cpu --filter _train --min-time 0.3 --json $OUT/kiln_final.json > $OUT/bench.txt 2>&1; echo "bench exit $?"
grep -E "_train|first step" $OUT/bench.txt | grep -v "^#"
date
