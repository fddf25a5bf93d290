# Probe (session 9): one ResNet-18 training step of torch_train_anchor's workload between
# cudaProfilerStart/Stop for ncu; method eager | compile | compile_ro.
import sys, time, torch
sys.path.insert(0, "bench/anchors")
import torch_train_anchor as A
method = sys.argv[1] if len(sys.argv) > 1 else "compile_ro"
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 16
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = True
dev = torch.device("cuda")
model, opt, loss_fn, x, y, *_ = A.make("resnet18_train", dev, fused=method != "eager", batch=batch)
if method != "eager":
    loss_fn = torch.compile(loss_fn, mode="reduce-overhead" if method == "compile_ro" else None)
def step():
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(x, y); loss.backward(); opt.step(); return loss.detach()
for _ in range(5): step()
torch.cuda.synchronize()
for r in range(3):
    t0 = time.perf_counter()
    for _ in range(20): step()
    torch.cuda.synchronize()
    print(f"torch {method} batch {batch}: {(time.perf_counter()-t0)/20*1e6:.1f} us per step", flush=True)
torch.cuda.profiler.start(); step(); torch.cuda.synchronize(); torch.cuda.profiler.stop()
