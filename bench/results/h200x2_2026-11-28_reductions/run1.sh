#!/usr/bin/env bash
# session 12, call 1 (2 x H200): GPU suites on GPU 1 while GPU 0 measures: the ResNet-18 step old
# (HEAD e8e5d53) / new (column reductions with 16 loads in flight, max-pool geometry baked in,
# channels-last conv weights), ncu of one step each, kiln_bench's training rows and torch's.
cd "$(dirname "$0")" && rm -rf t old new && tar xzf bins.tar.gz && ln -s t new && cd - > /dev/null
P=.device-build/s12
export LD_LIBRARY_PATH=$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-} KILN_BENCH_DATA=/tmp/kbd NCCL_NVLS_ENABLE=0
nvidia-smi -L; date; t0=$SECONDS
( for t in cuda_ops autograd nn compile; do CUDA_VISIBLE_DEVICES=1 KILN_CACHE_DIR=/tmp/kct timeout 200 $P/t/kiln_test_$t --test-suite-exclude=no_gpu,download,multi_gpu --no-skip > $OUT/t_$t.log 2>&1; echo "== $t rc=$? $(grep -E "test cases:" $OUT/t_$t.log | tr -s " ") at $((SECONDS - t0)) s"; grep -E "ERROR|FATAL" -A8 $OUT/t_$t.log | head -40; done > $OUT/tests_summary.txt ) &
export CUDA_VISIBLE_DEVICES=0
for b in 16 64; do for v in old new old new; do
  echo "-- $v reduce_overhead $b"; KILN_CACHE_DIR=/tmp/kc_$v timeout 60 $P/$v/resnet_prof reduce_overhead $b 2>&1 | grep -E "us per|first|kernels|rror" | tail -2
done; done 2>&1 | sed 's/^/  /'
echo "at $((SECONDS - t0)) s"
for v in old new; do
  KILN_CACHE_DIR=/tmp/kc_$v timeout 120 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv $P/$v/resnet_prof reduce_overhead 16 > $OUT/ncu_$v.csv 2>&1; echo "ncu $v rc=$?"
done
python3 $P/classify.py $OUT/ncu_old.csv $OUT/ncu_new.csv
python3 - $OUT/ncu_old.csv $OUT/ncu_new.csv <<'PY'
import csv, sys, collections
for p in sys.argv[1:]:
    d = collections.defaultdict(float); c = collections.Counter()
    for r in csv.DictReader(l for l in open(p) if l.startswith('"')):
        if r.get("Metric Name") != "gpu__time_duration.sum": continue
        n = r["Kernel Name"]; us = float(r["Metric Value"].replace(",", "")) / 1000
        k = "red" if n.startswith("kiln_red") else "max_pool" if "max_pool" in n else "ew" if n.startswith("kiln_ew") else None
        if k: d[k] += us; c[k] += 1
    print(p.split("/")[-1], {k: f"{v:.1f} us / {c[k]}" for k, v in d.items()})
PY
gzip $OUT/ncu_*.csv
echo "at $((SECONDS - t0)) s"
KILN_CACHE_DIR=/tmp/kc_new timeout 150 $P/t/kiln_bench --no-cpu --filter _train --min-time 0.3 --json $OUT/kiln_train.json > $OUT/kiln_train.txt 2>&1; echo "kiln train rc=$? at $((SECONDS - t0)) s"
grep -E "_train" $OUT/kiln_train.txt | grep -vE "^  " | grep -E "eager|compiled|reduce_overhead"
timeout 200 python3 bench/anchors/torch_train_anchor.py --min-time 0.3 --json $OUT/torch_train.json > $OUT/torch_train.txt 2>&1; echo "torch train rc=$? at $((SECONDS - t0)) s"
grep -vE "^\s*$" $OUT/torch_train.txt | tail -12
wait; cat $OUT/tests_summary.txt
date
