#!/usr/bin/python3
"""Regenerates the seed corpus for tests/fuzz/npy_fuzz.cpp (needs numpy; run with /usr/bin/python3).

The seeds are checked in under tests/fuzz/corpus/npy/; the build never runs this.
Valid seeds come from numpy itself, invalid ones are made by hand around them.
"""
import io
import os
import struct

import numpy as np
from numpy.lib import format as npformat

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "npy")


def npy(arr, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, arr, allow_pickle=False)
    else:
        npformat.write_array(buf, arr, version=version, allow_pickle=False)
    return buf.getvalue()


def handmade(header, data=b"", version=(1, 0)):
    """A .npy image with a literal header text (no padding added)."""
    h = header.encode("utf-8" if version == (3, 0) else "latin1")
    fmt = "<H" if version == (1, 0) else "<I"
    return b"\x93NUMPY" + bytes(version) + struct.pack(fmt, len(h)) + h + data


def main():
    os.makedirs(OUT, exist_ok=True)
    for old in os.listdir(OUT):
        os.remove(os.path.join(OUT, old))
    a23 = (np.arange(6) / 4 - 0.5).reshape(2, 3)
    seeds = {
        "v1_f4_2x3": npy(a23.astype("<f4")),
        "v2_f8_2x3": npy(a23.astype("<f8"), version=(2, 0)),
        "v3_f4_3": npy(np.array([1.0, -0.0, np.nan], dtype="<f4"), version=(3, 0)),
        "v1_b1_2x2": npy(np.array([[True, False], [False, True]])),
        "v1_be_f4_2x3": npy(a23.astype(">f4")),
        "v1_be_f8_3": npy(np.array([1e300, -np.inf, 2.5], dtype=">f8")),
        "v1_f4_0d": npy(np.array(7.25, dtype="<f4")),
        "v1_f4_0x3": npy(np.zeros((0, 3), dtype="<f4")),
        "v1_f4_3x0x2": npy(np.zeros((3, 0, 2), dtype="<f4")),
        "v1_fortran_2x3": npy(np.asfortranarray(a23.astype("<f4"))),
        "v1_i4_3": npy(np.arange(3, dtype="<i4")),
        "v1_structured": npy(np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")])),
        "v1_truncated": npy(a23.astype("<f4"))[:-5],
        "v1_trailing": npy(a23.astype("<f4")) + b"\0\0\0\0",
        "v1_b1_bad_byte": handmade("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }\n", b"\x01\x02\x00"),
        "v1_quotes_commas": handmade(
            '{ "shape" : ( 2 , ) ,\n\t"fortran_order":False,"descr":"<f8",}  \n', struct.pack("<2d", 1.5, -3.0)),
        "v1_native_f4_py2long": handmade("{'descr': '=f4', 'fortran_order': False, 'shape': (1L, 2L), }\n",
                                         struct.pack("<2f", 0.5, 2.0)),
        "v3_utf8_name": handmade("{'descr': [('\u00e9', '<f4')], 'fortran_order': False, 'shape': (1,), }\n",
                                 b"\0\0\0\0", version=(3, 0)),
        "bad_version_4": npy(a23.astype("<f4"))[:6] + b"\x04\x00" + npy(a23.astype("<f4"))[8:],
    }
    for name, data in seeds.items():
        with open(os.path.join(OUT, name + ".npy"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
