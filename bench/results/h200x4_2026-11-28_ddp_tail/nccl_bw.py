# all_reduce bandwidth through torch.distributed (NCCL), eager and inside a CUDA graph, f32 sizes 1-64 MB
import os, time, torch, torch.distributed as dist
dist.init_process_group("nccl")
r = dist.get_rank(); n = dist.get_world_size(); torch.cuda.set_device(r)
for mb in [1, 2.4, 4.7, 7, 9.4, 18.9, 28, 64]:
    x = torch.ones(int(mb * 2**20 / 4), device="cuda")
    for _ in range(5): dist.all_reduce(x)
    torch.cuda.synchronize()
    it = 50
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(it): dist.all_reduce(x)
    e1.record(); torch.cuda.synchronize()
    t_e = e0.elapsed_time(e1) / it * 1e3
    s = torch.cuda.Stream(); g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        dist.all_reduce(x); torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            for _ in range(10): dist.all_reduce(x)
    for _ in range(3): g.replay()
    torch.cuda.synchronize()
    e0.record()
    for _ in range(5): g.replay()
    e1.record(); torch.cuda.synchronize()
    t_g = e0.elapsed_time(e1) / 50 * 1e3
    b = mb * 2**20
    if r == 0: print(f"{mb:5} MB: eager {t_e:7.1f} us busbw {b / t_e / 1e3 * 2 * (n - 1) / n:6.1f} GB/s; graph {t_g:7.1f} us busbw {b / t_g / 1e3 * 2 * (n - 1) / n:6.1f} GB/s", flush=True)
dist.destroy_process_group()
