#!/usr/bin/env bash
# session 22, call 7 (nvidia-h200-x2): session 20's NCCL symmetric-memory probe
# (bench/results/h200_2026-11-29_ci_ptx/nccl_sym_probe.cu): NCCL all-reduce on 2 GPUs, cudaMalloc
# buffers against ncclMemAlloc buffers in a symmetric window, f32/bf16, sum/avg, 1-28 MB
nvidia-smi -L; date
nvcc -O2 -o /tmp/nccl_sym_probe bench/results/h200_2026-11-29_ci_ptx/nccl_sym_probe.cu -ldl || exit 1
libs=$( (ldconfig -p | awk '/libnccl.so.2/ {print $NF}'; find /usr/local /usr/lib /opt $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) -name 'libnccl.so.2*' 2>/dev/null) | sort -u)
echo "libnccl found: $libs"
for l in $libs; do echo "== $l"; NCCL_LIB=$l timeout 90 /tmp/nccl_sym_probe 2>&1 | tail -40; done
date
