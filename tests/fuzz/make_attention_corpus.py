#!/usr/bin/python3
"""Regenerates the seed corpora of tests/fuzz/attention_inputs_fuzz.cpp and cli_args_fuzz.cpp
(plain Python, no numpy). The seeds are checked in under tests/fuzz/corpus/; the build never runs this.

attention_inputs seeds: 3 bytes (which optional inputs, heads, options), then .npy images of x, wq,
wk, wv, bq, bk, bv, wo, bo and the mask, separated by "\\nNPY|".
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def npy(shape, values, descr="<f4"):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, "".join("%d, " % d for d in shape) if len(shape) != 1 else "%d," % shape[0])
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    fmt = {"<f4": "<%df", "<f8": "<%dd", "|b1": "%dB"}[descr] % len(values)
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + struct.pack(fmt, *values)


def ramp(n, scale=0.25):
    return [((i * 7) % 11 - 5) * scale for i in range(n)]


def inputs_seed(b, n, d_in, d_k, d_v, heads, d_out=0, biases=False, mask=None, flags=0, dtype="<f4"):
    x_shape = (b, n, d_in) if b > 1 else (n, d_in)
    images = [npy(x_shape, ramp(b * n * d_in), dtype), npy((d_in, d_k), ramp(d_in * d_k), dtype),
              npy((d_in, d_k), ramp(d_in * d_k, 0.5), dtype), npy((d_in, d_v), ramp(d_in * d_v), dtype)]
    given = 0
    optional = [npy((d_k,), ramp(d_k), dtype), npy((d_k,), ramp(d_k), dtype), npy((d_v,), ramp(d_v), dtype)]
    optional += [npy((d_v, d_out), ramp(d_v * d_out), dtype) if d_out else b"",
                 npy((d_out,), ramp(d_out), dtype) if d_out else b""]
    if mask == "bool":
        optional.append(npy((n, n), [(i + j) % 3 != 0 for i in range(n) for j in range(n)], "|b1"))
    elif mask == "float":
        optional.append(npy((b, n, n), [-1e300 if j == 0 else 0.0 for _ in range(b * n) for j in range(n)], "<f8"))
    else:
        optional.append(b"")
    for i, image in enumerate(optional):
        if image and (biases or i >= 3):
            given |= 1 << i
    return bytes([given, heads, flags]) + b"\nNPY|".join(images + optional)


def main():
    out = os.path.join(HERE, "corpus", "attention_inputs")
    os.makedirs(out, exist_ok=True)
    seeds = {
        "tutorial": inputs_seed(1, 3, 4, 3, 3, 1),
        "mha_biases_wo": inputs_seed(1, 5, 4, 4, 6, 2, d_out=3, biases=True, flags=2),
        "batch_bool_mask": inputs_seed(2, 4, 3, 2, 2, 2, mask="bool", flags=3),
        "float64_mask": inputs_seed(2, 3, 2, 2, 4, 1, mask="float", flags=6),
        "float64_all": inputs_seed(1, 3, 2, 2, 2, 1, biases=True, dtype="<f8"),
        "heads_not_dividing": inputs_seed(1, 3, 4, 3, 3, 2),
    }
    for name, data in seeds.items():
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(data)

    out = os.path.join(HERE, "corpus", "cli_args")
    os.makedirs(out, exist_ok=True)
    lines = {
        "full": "--x\nx.npy\n--wq\nwq.npy\n--wk\nwk.npy\n--wv\nwv.npy\n--out\nout.npy\n--weights\nw.npy\n--heads\n2"
                "\n--scale\n0.5\n--causal\n--backend\ncpu\n--impl\nstaged\n--precision\nfp16",
        "empty_out": "--x\nx\n--wq\nq\n--wk\nk\n--wv\nv\n--out\n",
        "scale_big": "--x\nx\n--wq\nq\n--wk\nk\n--wv\nv\n--out\no\n--scale\n1e39",
        "scale_hex": "--x\nx\n--wq\nq\n--wk\nk\n--wv\nv\n--out\no\n--scale\n0x1p-3",
        "heads_huge": "--x\nx\n--wq\nq\n--wk\nk\n--wv\nv\n--out\no\n--heads\n99999999999999999999999",
        "fused_weights": "--x=x\n--wq=q\n--wk=k\n--wv=v\n--out=o\n--weights=w\n--impl=fused\n--mask=m\n--bo=b",
    }
    for name, text in lines.items():
        with open(os.path.join(out, name + ".txt"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
