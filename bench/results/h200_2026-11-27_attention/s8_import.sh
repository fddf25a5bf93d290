#!/usr/bin/env bash
# session 8: ONNX import matching attention: test_export on the GPU, then the BERT layer rows (onnx_import vs loaded)
export LD_LIBRARY_PATH=$PWD/.device-build/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_CACHE_DIR=/tmp/kc
nvidia-smi -L; date
for t in export cuda_ops nn; do timeout 200 build/dev/tests/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/t_$t.log 2>&1; echo "== $t rc=$? $(grep -E "test cases:" $OUT/t_$t.log | tr -s " ")"; grep -E "ERROR|logged|values" $OUT/t_$t.log | head -6; done
for r in 1 2; do
timeout 200 build/dev/bench/kiln_bench --no-cpu --filter bert_layer_f32,bert_layer_bf16 --json $OUT/bert_r$r.json > $OUT/bert_r$r.txt 2>&1; echo "== bench rc=$?"
grep -E "^bert_layer" $OUT/bert_r$r.txt | grep -E " (compiled|onnx_import|loaded) "; grep -i fail $OUT/bert_r$r.txt
done
date
