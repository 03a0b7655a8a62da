"""benchmarks/mkl_intel_path.c, which benchmarks/offline_datasets.sh preloads on AMD CPUs with
AVX-512 so that they record the offline datasets' committed digests: it must change MKL's
products there (torch still links MKL and exports the symbol it answers) and nothing on Intel;
and with it preloaded, ``robotrl.nn.linear`` leaves float32 products to MKL."""
import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from robotrl.nn.linear import cpu_fields

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = """
import hashlib, torch
from robotrl.experiment.run import machine
from robotrl.nn.linear import mkl_intel_path, onednn_enabled
torch.manual_seed(0); torch.set_num_threads(1)
a, b = torch.randn(512, 256), torch.randn(256, 256)
print(hashlib.sha1((a @ b).numpy().tobytes()).hexdigest(), mkl_intel_path(), onednn_enabled(),
      machine().endswith("MKL's Intel kernels"))
"""


def _exports_symbol() -> bool:
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        return hasattr(ctypes.CDLL(str(lib)), "mkl_serv_intel_cpu_true")
    except OSError:
        return False


def _product(preload: str | None) -> list[str]:
    """[digest of an MKL product, mkl_intel_path(), onednn_enabled(), whether ``machine()``
    names MKL's Intel kernels] in a new process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ROBOTRL_CPU_LINEAR": "auto"}
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = preload
    out = subprocess.run([sys.executable, "-c", PRODUCT], env=env, capture_output=True,
                         text=True, check=True)
    return out.stdout.split()


@pytest.mark.skipif(sys.platform != "linux" or shutil.which("cc") is None,
                    reason="needs Linux and a C compiler")
@pytest.mark.skipif(not _exports_symbol(), reason="this torch does not export MKL's CPU check")
def test_the_preloaded_shim_moves_an_amd_cpu_onto_mkls_intel_kernels(tmp_path):
    cpu = cpu_fields()
    amd = cpu.get("vendor_id") == "AuthenticAMD"
    avx512 = "avx512f" in cpu.get("flags", "").split()
    if not (cpu.get("vendor_id") == "GenuineIntel" or (amd and avx512)):
        pytest.skip("MKL's Intel AVX-512 kernels do not run on this CPU")
    shim = tmp_path / "libmkl_intel_path.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(shim),
                    str(ROOT / "benchmarks" / "mkl_intel_path.c")], check=True)
    plain, spoofed = _product(None), _product(str(shim))
    if amd:
        assert spoofed[0] != plain[0], "MKL kept its AMD kernels with the shim preloaded"
        assert plain[1] == plain[3] == "False"
        assert spoofed[3] == "True", "the tables must say which kernels an AMD run used"
    else:
        assert spoofed[0] == plain[0], "the shim changed MKL's products on an Intel CPU"
        assert spoofed[3] == "False", "an Intel CPU's MKL is on its own kernels anyway"
    assert spoofed[1:3] == ["True", "False"], "with MKL on its Intel kernels, products stay on MKL"
