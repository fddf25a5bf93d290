#!/usr/bin/env bash
# session 9, call 1: owed GPU checks (attention after 5d0b313, CUDA fuzzer, suites), then ncu
# profiles of one ResNet-18 training step, kiln and torch.
export LD_LIBRARY_PATH=$PWD/.device-build/s9/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date
B=build/dev
timeout 120 $B/tests/kiln_test_cuda_ops -tc="*scaled_dot_product_attention*" --no-skip > $OUT/t_attn.log 2>&1; echo "== attn rc=$? $(grep -E "test cases:" $OUT/t_attn.log | tr -s " ")"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1); echo "ncu: $NCU"
P=.device-build/s9
$P/resnet_prof compiled 16 > $OUT/kiln_compiled.txt 2>&1; cat $OUT/kiln_compiled.txt
$P/resnet_prof reduce_overhead 16 2>&1 | head -4
python3 $P/torch_prof.py compile_ro 16 2>&1 | grep -v Warning | tail -4
timeout 150 $NCU --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv $P/resnet_prof compiled 16 > $OUT/ncu_kiln.csv 2> $OUT/ncu_kiln.err; echo "ncu kiln rc=$?"
python3 $P/summarize.py $OUT/ncu_kiln.csv | head -50
timeout 200 $NCU --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv python3 $P/torch_prof.py compile_ro 16 > $OUT/ncu_torch.csv 2> $OUT/ncu_torch.err; echo "ncu torch rc=$?"
python3 $P/summarize.py $OUT/ncu_torch.csv | head -50

echo "== cuBLASLt warm start: save, then load (no heuristic), check"
for m in save load load check; do $P/lt_warm $m; done
date

for t in cuda_ops cuda_semantics autograd nn compile export; do timeout 200 $B/tests/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/t_$t.log 2>&1; echo "== $t rc=$? $(grep -E "test cases:" $OUT/t_$t.log | tr -s " ")"; grep -E "ERROR" -A3 $OUT/t_$t.log | head -8; done
KILN_FUZZ_DEVICE=cuda timeout 240 $B/tests/kiln_test_fuzz -tc="fuzz: random programs*" > $OUT/t_fuzz_cuda.log 2>&1; echo "== fuzz cuda rc=$? $(grep -E "test cases:|programs" $OUT/t_fuzz_cuda.log | tr -s " " | head -3)"
date
