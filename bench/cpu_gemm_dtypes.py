"""What one CPU core does per second in a GEMM of SmolLM2-135M's shape (1,024 tokens x 576 -> 1,536, its MLP's
up-projection) in float32, bfloat16 and float16, with the torch of vLLM's CPU environment, and whether oneDNN has
native bf16 here. vLLM's CPU path serves the demo in bfloat16: on a CPU without bf16 instructions (AVX-512 BF16 or
AMX) that arithmetic is emulated and prefill runs at the bf16 rate printed here.

    $ARTIFACT_VLLM_VENV/bin/python bench/cpu_gemm_dtypes.py   # default .venv-vllm
"""

import resource
import time

import torch

torch.set_num_threads(1)
print(f"torch {torch.__version__}; oneDNN native bf16: {torch.ops.mkldnn._is_mkldnn_bf16_supported()}")
x32, w32 = torch.randn(1024, 576), torch.randn(1536, 576)
for dt in (torch.float32, torch.bfloat16, torch.float16):
    x, w = x32.to(dt), w32.to(dt)
    torch.nn.functional.linear(x, w)
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.time()
    for _ in range(5):
        torch.nn.functional.linear(x, w)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / 5
    print(
        f"{str(dt):15} {cpu * 1e3:7.1f} CPU ms per GEMM = {2 * 1024 * 576 * 1536 / cpu / 1e9:5.1f} GFLOP/s per core "
        f"(wall {(time.time() - t0) / 5 * 1e3:.1f} ms)"
    )
