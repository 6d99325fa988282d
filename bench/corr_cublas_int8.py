# cuBLAS int8 GEMM (int32 out) through torch._int_mm, 8192^3: the library ceiling beside the
# correlator's figures (issue 12 asks for a measured cuBLAS int8 GEMM in the same run).
import torch
n = 8192
a = torch.randint(-128, 128, (n, n), dtype=torch.int8, device="cuda")
b = torch.randint(-128, 128, (n, n), dtype=torch.int8, device="cuda").t()
for _ in range(3):
    torch._int_mm(a, b)
ts = []
for _ in range(20):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record(); torch._int_mm(a, b); e1.record(); e1.synchronize()
    ts.append(e0.elapsed_time(e1) / 1e3)
ts.sort()
t = ts[len(ts) // 2]
print(f"cuBLAS int8 GEMM (torch._int_mm) {n}^3: {2 * n**3 / t / 1e12:.0f} TOPS ({t*1e3:.3f} ms)")
