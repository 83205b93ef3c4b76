"""One gpt-oss-20b expert matrix ([2880, 2880], MXFP4) on CPU: the native block kernel on ggml MXFP4 rows
(16-bit integer activations, --linear-backend native) against the torch backend's widening to float32 then
the float matmul, same inputs. Median milliseconds per call.

    python benchmarks/mxfp4_experts.py --batch-sizes 1 8 64
"""

import argparse
import os
import sys

import torch

from pagedserve.kernels.cpu.gguf_ops import MXFP4_GGML_TYPE, gguf_matmul
from pagedserve.quantization.base import linear
from pagedserve.quantization.mxfp4 import dequantize_mxfp4, ggml_mxfp4_rows, quantize_mxfp4

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # timing, however this file is run
from timing import median_seconds  # noqa: E402

SIZE = 2880  # gpt-oss-20b's hidden and intermediate sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--iterations", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(0)
    blocks, scales = quantize_mxfp4(torch.randn(SIZE, SIZE) * 0.02)
    rows = ggml_mxfp4_rows(blocks, scales)
    print(f"threads={torch.get_num_threads()}; median ms per call, [{SIZE}, {SIZE}] MXFP4")
    for batch in args.batch_sizes:
        x = torch.randn(batch, SIZE)
        native = median_seconds(lambda x=x: gguf_matmul(x, rows, MXFP4_GGML_TYPE, 16), args.iterations)
        widened = median_seconds(
            lambda x=x: linear(x, dequantize_mxfp4(blocks, scales, torch.float32)), args.iterations
        )
        print(f"batch {batch:4d}: native {native * 1e3:8.2f}  torch widening {widened * 1e3:8.2f}")


if __name__ == "__main__":
    main()
