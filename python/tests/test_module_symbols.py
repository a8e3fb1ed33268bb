"""The extension module keeps its statically linked code private (python/CMakeLists.txt):
a library loaded earlier into the global scope (torch brings libstdc++.so and its own
cuDNN frontend) must not interpose on sdpa's copies."""

import shutil
import subprocess
import sys

import pytest

import sdpa
from sdpa import _C

# Exported names that would mean a static archive leaked into the dynamic symbol table.
PRIVATE_PREFIXES = ("_ZN4sdpa", "_ZNK4sdpa", "_ZN14cudnn_frontend", "_ZN3hwy", "__cxa_throw",
                    "__gxx_personality_v0", "cuda", "_ZNSt6locale", "_ZNSo")


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("nm") is None,
                    reason="needs Linux and binutils' nm")
def test_module_exports_only_its_init_and_header_templates():
    out = subprocess.run(["nm", "-D", "--defined-only", _C.__file__], capture_output=True,
                         text=True, check=True).stdout
    names = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert "PyInit__C" in names
    leaked = [n for n in names if n.startswith(PRIVATE_PREFIXES)]
    assert leaked == [], leaked[:10]


def test_errors_after_import_torch_are_sdpa_errors():
    torch = pytest.importorskip("torch")
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(sdpa.Error, match="query"):
        sdpa.scaled_dot_product_attention(q[0, 0, 0], q, q)
