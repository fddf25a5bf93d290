#!/usr/bin/env bash
# session 12, call 4 (1 x H200): kiln_test_cuda_ops after the test fix (a row mean compared where it
# is not near 0), the CUDA differential fuzzer with 150 programs (call 3's 300 did not finish in 150 s).
cd "$(dirname "$0")" && rm -rf t old new && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s12
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
nvidia-smi -L; date; t0=$SECONDS
KILN_CACHE_DIR=/tmp/kct timeout 200 $P/t/kiln_test_cuda_ops --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/t.log 2>&1; echo "== cuda_ops rc=$? $(grep -E "test cases:" $OUT/t.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A8 $OUT/t.log | head -30; cat $OUT/t.log >> $OUT/tests.log
KILN_CACHE_DIR=/tmp/kct KILN_FUZZ_DEVICE=cuda KILN_FUZZ_GRAPHS=150 timeout 300 $P/t/kiln_test_fuzz -tc="fuzz: random programs*" > $OUT/t.log 2>&1; echo "== fuzz rc=$? $(grep -E "test cases:|programs" $OUT/t.log | tr -s " " | head -4) at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A8 $OUT/t.log | head -30; cat $OUT/t.log >> $OUT/tests.log
rm -f $OUT/t.log; gzip $OUT/tests.log
date
