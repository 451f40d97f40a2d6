"""qkv.tutorial (the worked example as the compiler computed it), `python3 -m qkv example` (the
walkthrough `qkv example` prints, the same text), examples/tutorial.py, and every example of the
README's "From Python" section, run as written."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import qkv
import qkv.tutorial as t

from conftest import SOURCE_DIR, needs_vulkan

ENV = dict(os.environ)


def test_the_compile_time_matrices():
    # The tutorial's numbers (its text), and what they imply, recomputed here in float64.
    x = np.array(t.inputs)
    assert x.tolist() == [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]]
    keys, queries, values = (x @ np.array(w) for w in (t.w_key, t.w_query, t.w_value))
    assert np.array(t.plain.keys).tolist() == keys.tolist() == [[0, 1, 1], [4, 4, 0], [2, 3, 1]]
    assert np.array(t.plain.queries).tolist() == queries.tolist()
    assert np.array(t.plain.values).tolist() == values.tolist()
    for steps, scale in ((t.plain, 1.0), (t.scaled, 1 / np.sqrt(3))):
        scores = queries @ keys.T * scale
        weights = np.exp(scores - scores.max(1, keepdims=True))
        weights /= weights.sum(1, keepdims=True)
        np.testing.assert_allclose(steps.scores, scores, rtol=1e-6)
        np.testing.assert_allclose(steps.weights, weights, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(steps.output, weights @ values, rtol=1e-5)
        for i in range(3):
            np.testing.assert_allclose(steps.weighted_values[i], weights[i][:, None] * values, rtol=1e-5, atol=1e-7)
    assert len(t.matrices()) == 13 and [name for name, _ in t.matrices()][-1] == "output"


def cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "qkv", *args], capture_output=True, text=True, env=ENV, **kw)


@pytest.mark.parametrize("args", [["--backend", "cpu"], ["--backend", "cpu", "--scaled"],
                                  pytest.param([], marks=needs_vulkan)])
def test_python_m_qkv_example_prints_the_tools_walkthrough(args):
    r = cli("example", *args)
    assert r.returncode == 0, r.stderr
    assert "\u2713 All 13 matrices agree with the values computed at compile time." in r.stdout
    assert r.stdout.count("\u2713") >= 14
    tool = os.environ.get("QKV_TOOL")
    if tool:  # the qkv tool of the same build: the same text, byte for byte
        same = subprocess.run([tool, "example", *args], capture_output=True, text=True)
        assert same.returncode == 0 and same.stdout == r.stdout
    if args:  # the walkthrough of the float64 reference is the same text every time
        assert r.stdout == t.example("cpu", scaled_scores="--scaled" in args)


def test_python_m_qkv_usage():
    assert cli("example", "--backend", "gpu").returncode == 2
    assert cli().returncode == 2
    r = cli("devices")
    assert r.returncode == 0 and r.stdout


def test_examples_tutorial_py():
    r = subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "examples", "tutorial.py")], capture_output=True,
                       text=True, env=ENV, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "agrees" in r.stdout


def readme_python_blocks():
    text = open(os.path.join(SOURCE_DIR, "README.md"), encoding="utf-8").read()
    section = text.split("## From Python", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_readme_from_python_examples_run():
    blocks = readme_python_blocks()
    assert len(blocks) >= 3
    for block in blocks:
        if "mpi4py" in block:
            continue  # run under mpirun by mpi_check.py
        if not qkv.devices() and "device=\"cpu\"" not in block:
            continue
        exec(compile(block, "README.md (From Python)", "exec"), {})


def test_stubs_and_docstrings_cover_the_public_names():
    import ast

    import qkv.flash_attn
    import qkv.mpi

    for module in (qkv, qkv.flash_attn, qkv.mpi, qkv.tutorial):
        stub = module.__file__.rsplit(".", 1)[0] + ".pyi"
        tree = ast.parse(open(stub, encoding="utf-8").read())
        declared = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        declared |= {t.id for n in ast.walk(tree) if isinstance(n, ast.AnnAssign) for t in [n.target]}
        declared |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        for name in module.__all__:
            assert name in declared, f"{stub} lacks {name}"
            if callable(getattr(module, name)):
                assert getattr(module, name).__doc__, f"{module.__name__}.{name} has no docstring"
