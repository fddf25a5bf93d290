# Session 11 probe: per-kernel CUDA time of transformers' BertModel (bert-base, random weights) in bf16,
# eager and torch.compile, one forward under torch.profiler; prints the kernels grouped by name.
import sys, torch, collections
from transformers import BertConfig, BertModel
shape = sys.argv[1] if len(sys.argv) > 1 else "b1"
torch.manual_seed(0)
m = BertModel(BertConfig(), add_pooling_layer=False).cuda().to(torch.bfloat16).eval()
ids = torch.randint(1000, 29000, (1, 8) if shape == "b1" else (8, 128), device="cuda")
mask = torch.ones_like(ids)
for mode in ["eager", "compile"]:
    f = m if mode == "eager" else torch.compile(m)
    with torch.no_grad():
        for _ in range(5): f(input_ids=ids, attention_mask=mask)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
            f(input_ids=ids, attention_mask=mask); torch.cuda.synchronize()
    tot = collections.defaultdict(float); cnt = collections.Counter()
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            tot[e.name[:100]] += e.device_time; cnt[e.name[:100]] += 1
    print(f"== torch {mode} {shape}: {sum(tot.values()):.1f} us over {sum(cnt.values())} kernels")
    for n, v in sorted(tot.items(), key=lambda kv: -kv[1])[:22]: print(f"{v:9.1f} us {cnt[n]:4d}x  {n}")
