#!/usr/bin/env bash
# session 10, call 4 (2 GPUs): test_dist (its multi_gpu suite included) and the CUDA fuzzer on the
# final build; the ResNet-18 step old / new / new KILN_CUDA_COMBO=0 with fresh kernel caches.
cd "$(dirname "$0")" && rm -rf new old t && tar xzf bins.tar.gz && cd - > /dev/null
P=.device-build/s10
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
nvidia-smi -L; date; t0=$SECONDS
KILN_CACHE_DIR=/tmp/kc timeout 200 $P/t/kiln_test_dist --test-suite-exclude=no_gpu,download --no-skip > $OUT/dist.log 2>&1; echo "== dist rc=$? $(grep -E "test cases:" $OUT/dist.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A6 $OUT/dist.log | head -30
KILN_CACHE_DIR=/tmp/kc KILN_FUZZ_DEVICE=cuda KILN_FUZZ_GRAPHS=150 timeout 150 $P/t/kiln_test_fuzz -tc="fuzz: random programs*" > $OUT/fuzz.log 2>&1; echo "== fuzz rc=$? $(grep -E "test cases:|programs" $OUT/fuzz.log | tr -s " " | head -3) at $((SECONDS - t0)) s"
for m in reduce_overhead compiled; do for v in old new combo0; do
  b=$v; e=""; [ $v = combo0 ] && { b=new; e="KILN_CUDA_COMBO=0"; }
  echo "-- $v $m 16"; rm -rf /tmp/kc_$v; env $e KILN_CACHE_DIR=/tmp/kc_$v timeout 60 $P/$b/resnet_prof $m 16 2>&1 | grep -E "us per|first|kernels|rror"
done; done
gzip $OUT/*.log; date
