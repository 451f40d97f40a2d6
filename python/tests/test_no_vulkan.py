"""An interpreter on a machine without Vulkan: qkv imports, lists no devices, computes on the float64
reference (device="cpu"), and says what to do when asked for a device. Also: importing qkv needs
neither numpy nor torch. Each case runs in a fresh interpreter, without the Vulkan loader (qkv loads
it at run time, from QKV_VULKAN_LIBRARY when that is set: here a file that does not exist)."""

import os
import subprocess
import sys


def run(code, **env):
    e = dict(os.environ, QKV_VULKAN_LIBRARY="/nonexistent/libvulkan.so.1", **env)
    e.pop("QKV_DEVICE", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=300)


def test_imports_lists_nothing_and_computes_on_the_reference():
    r = run("""
import numpy as np, qkv
assert qkv.devices() == [], qkv.devices()
q = np.random.default_rng(0).standard_normal((1, 2, 3, 8)).astype(np.float32)
out = qkv.scaled_dot_product_attention(q, q, q, is_causal=True, device="cpu")
assert out.shape == (1, 2, 3, 8) and np.isfinite(out).all()
try:
    qkv.scaled_dot_product_attention(q, q, q)
except qkv.Unavailable as e:
    assert 'device="cpu"' in str(e), str(e)
    print("unavailable:", str(e).splitlines()[0])
else:
    raise SystemExit("no error without Vulkan")
from qkv.flash_attn import flash_attn_func
flash_attn_func(q.transpose(0, 2, 1, 3), q.transpose(0, 2, 1, 3), q.transpose(0, 2, 1, 3), causal=True, device="cpu")
print("ok")
""")
    assert r.returncode == 0 and r.stdout.endswith("ok\n"), r.stdout + r.stderr


def test_python_m_qkv_example_without_vulkan():
    e = dict(os.environ, QKV_VULKAN_LIBRARY="/nonexistent/libvulkan.so.1")
    ok = subprocess.run([sys.executable, "-m", "qkv", "example", "--backend", "cpu"], capture_output=True, text=True,
                        env=e)
    assert ok.returncode == 0 and "All 13 matrices agree" in ok.stdout
    failed = subprocess.run([sys.executable, "-m", "qkv", "example"], capture_output=True, text=True, env=e)
    assert failed.returncode == 1 and "--backend cpu" in failed.stderr, failed.stderr


def test_import_needs_neither_numpy_nor_torch():
    # None in sys.modules makes an import of that module fail, as if it were not installed.
    r = run("""
import sys
sys.modules["numpy"] = None
sys.modules["torch"] = None
import qkv  # its submodules with it: qkv.flash_attn, qkv.mpi, qkv.tutorial
assert callable(qkv.flash_attn.flash_attn_func) and isinstance(qkv.mpi.available, bool)
print(qkv.devices(), len(qkv.tutorial.matrices()))
import array
q = array.array("f", [0.5] * 16)
out = qkv.scaled_dot_product_attention(memoryview(q).cast("B").cast("f", (2, 8)), memoryview(q).cast("B").cast("f", (2, 8)),
                                       memoryview(q).cast("B").cast("f", (2, 8)), device="cpu")
print(type(out).__name__, out.shape, out.dtype)
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "[] 13\n_Array (2, 8) float32\n", r.stdout
