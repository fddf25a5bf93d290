#!/usr/bin/env bash
# session 25, call 1 (2 x H200): does kiln_unit_tests_2 (without test_fuzz) hang at exit on the GPU
# machine? Time stamps for its summary line and its exit; a stack of every thread if it is still
# alive 40 s after the summary; then the same per test file.
cd "$(dirname "$0")" && rm -rf t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s25
mkdir -p /work && ln -sfn $PWD /work/main
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=/tmp/kc1
export KILN_RUN=$PWD/tools/kilnrun KILN_TEST_CUDA_ARCHS=80,90 KILN_TEST_CUDA_SASS=1
date; t0=$SECONDS; nvidia-smi -L
S=no_gpu,download,multi_gpu4
watch_run() {  # name, limit, args...
  local name=$1 limit=$2; shift 2
  local s=$SECONDS
  $P/t/kiln_unit_tests_2 --test-suite-exclude=$S --no-skip "$@" > $OUT/$name.log 2>&1 &
  local pid=$! ts=""
  while kill -0 $pid 2>/dev/null; do
    if [ -z "$ts" ] && grep -q "Status:" $OUT/$name.log; then ts=$((SECONDS - s)); fi
    if [ -n "$ts" ] && [ $((SECONDS - s - ts)) -gt 40 ]; then
      echo "== $name: alive 40 s after its summary; stacks:"
      gdb -p $pid -batch -ex "info threads" -ex "thread apply all bt 25" > $OUT/${name}_stacks.txt 2>&1
      grep -E "^Thread|^#" $OUT/${name}_stacks.txt | grep -vE "in (__GI_|syscall|futex)" | head -80
      kill -9 $pid; break
    fi
    if [ $((SECONDS - s)) -gt $limit ]; then echo "== $name: over $limit s, no summary=${ts:-none}"; gdb -p $pid -batch -ex "thread apply all bt 25" > $OUT/${name}_stacks.txt 2>&1; head -60 $OUT/${name}_stacks.txt; kill -9 $pid; break; fi
    sleep 1
  done
  wait $pid; local rc=$?
  echo "== $name rc=$rc summary at ${ts:-none} s, ended at $((SECONDS - s)) s: $(grep -E 'test cases:' $OUT/$name.log | tail -1 | tr -s ' ') | $(grep '\[kiln\]' $OUT/$name.log | tail -1)"
}
watch_run all 300 --source-file-exclude=*/test_fuzz.cpp
for f in test_dist test_autograd test_bert test_nn test_ops_sweep test_shape_ops; do
  left=$((540 - (SECONDS - t0))); [ $left -gt 30 ] || { echo "== $f: no time left"; continue; }
  watch_run $f $left --source-file=*/$f.cpp
done
gzip $OUT/*.log; date
