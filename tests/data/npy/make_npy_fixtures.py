#!/usr/bin/python3
"""Regenerates the .npy fixtures for tests/npy_test.cpp (needs numpy; run with /usr/bin/python3).

The files are checked in; the build never runs this. The values are simple
formulas that tests/npy_test.cpp recomputes, so keep the two in sync.
"""
import io
import os

import numpy as np
from numpy.lib import format as npformat

HERE = os.path.dirname(os.path.abspath(__file__))


def save(name, arr, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, arr, allow_pickle=True)
    else:
        npformat.write_array(buf, arr, version=version, allow_pickle=True)
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(buf.getvalue())


def ramp(shape, dtype):
    # value of element i (C order): i / 4 - 0.5
    n = int(np.prod(shape))
    return (np.arange(n, dtype=np.float64) / 4 - 0.5).astype(dtype).reshape(shape)


# float32, as np.save writes it (tests also compare qkv::npy::serialize with these bytes)
save("f4_2x3.npy", ramp((2, 3), "<f4"))
save("f4_5.npy", ramp((5,), "<f4"))
save("f4_0d.npy", np.array(3.5, dtype="<f4"))
save("f4_0x3.npy", np.zeros((0, 3), dtype="<f4"))
save("f4_1x1x1x4.npy", ramp((1, 1, 1, 4), "<f4"))

# explicit format versions
save("f4_2x3_v2.npy", ramp((2, 3), "<f4"), version=(2, 0))
save("f4_2x3_v3.npy", ramp((2, 3), "<f4"), version=(3, 0))

# other dtypes and byte orders
save("f8_2x3.npy", ramp((2, 3), "<f8"))
save("f8_special.npy", np.array([1 / 3, -2.5, 1e300, -1e-300, np.inf, np.nan], dtype="<f8"))
save("f4_be_2x3.npy", ramp((2, 3), ">f4"))
save("f8_be_2x3.npy", ramp((2, 3), ">f8"))
save("b1_2x2.npy", np.array([[True, False], [False, True]]))

# refused
save("fortran_2x3.npy", np.asfortranarray(ramp((2, 3), "<f4")))
save("i4_3.npy", np.arange(3, dtype="<i4"))
save("f2_3.npy", np.arange(3, dtype="<f2"))
save("structured_2.npy", np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]))
save("unicode_2.npy", np.array(["ab", "c"], dtype="<U2"))
save("object_2.npy", np.array([1, "x"], dtype=object))
