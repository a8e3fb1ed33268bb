#!/usr/bin/env python3
"""Checks bench/render_benchmarks.py on the tiny fixture in bench/testdata/results/, so the
renderer cannot rot while no host's results change. Standard library only: runs as
`python3 bench/test_render_benchmarks.py` (CTest does) or under pytest."""

import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import render_benchmarks  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "testdata/results"


class RenderBenchmarks(unittest.TestCase):
    def test_every_result_file_renders_with_its_command(self):
        page = render_benchmarks.render(FIXTURE)
        self.assertIn("## test-host", page)
        self.assertIn("Test CPU; sdpa kernels at the AVX512 level, avx512_bf16 yes, 2 threads",
                      page)
        for command in ("build/release/tools/sdpa bench --peak-only --json",
                        "build/release/tools/sdpa bench --seq-lens 8 --json",
                        "build/release/bench/sdpa_mask_ratios 1 --json x.json",
                        "build/release/bench/sdpa_block_mask_build 1024 --json x.json",
                        "build/release/bench/sdpa_decode_bandwidth 1 --json x.json",
                        "build/release/bench/sdpa_paged_decode 1 16 --json x.json",
                        "build/release/bench/sdpa_chunked_prefill 1 16 --json x.json",
                        "python3 bench/compare_torch.py --quick --json x.json",
                        "python3 bench/context_parallel.py --seq-lens 64 --json x.json"):
            self.assertIn(f"```sh\n{command}\n```", page)
        self.assertIn("| fp32 FMA (AVX-512) | 100.0 GFLOP/s |", page)
        self.assertIn("| FLASH_ATTENTION | 1.000 | 2.0 | 1.0 MiB | 4.0x |", page)
        self.assertIn("| causal / plain (L=4096) | is_causal | 0.500 | ≤ 0.6 | ✓ |", page)
        self.assertIn("| forward | 64 | 1.000 | 1.100 | 1.100 | ✓ | 1.0 | 1.0 |", page)
        self.assertIn("single and ring calls alternate, median of 1 round after a", page)
        self.assertIn("| 4096 | huge pages | 1.000 | 8.0 | 10.0 | 0.80 | ✓ |", page)
        self.assertIn("| 16 | 110.00 | 100.00 | 1.100 | ✓ | 8.0 | 10.0 | 0.80 | ✓ |", page)
        self.assertIn("| 16 | 120.00 | 100.00 | 250.0 | 300.0 | 1.200 | ✗ |", page)
        self.assertIn("| float32 | 64 | no | 2.000 | 1.000 | 2.00x | 50.0 | 50% of fp32 |", page)
        self.assertIn("1 case(s) disagreed with torch", page)

    def test_gpu_host_renders_from_its_device_description(self):
        page = render_benchmarks.render(FIXTURE)
        self.assertIn("## test-gpu\n\n### Against PyTorch on the GPU", page)
        self.assertIn("```sh\npython3 bench/compare_torch_cuda.py --json x.json\n```", page)
        self.assertIn("Test GPU (sm_90, 1 SMs, 1 MiB, driver 13.0); torch 2.0", page)
        self.assertIn("| 8 | 2 | 4 | 64 | no | fwd | CUDNN_ATTENTION | 1.000 | 500 | 400 | 250 "
                      "| 1.25 | 2.00 |", page)
        self.assertIn("µs: sdpa 10.0, torch-cudnn 20.0, torch-flash", page)

    def test_no_results_no_numbers(self):
        with tempfile.TemporaryDirectory() as empty:
            page = render_benchmarks.render(Path(empty))
        self.assertIn("No results yet", page)
        self.assertNotIn("\n## ", page)


if __name__ == "__main__":
    unittest.main()
