"""The worked example of the self-attention tutorial qkv grew from (three inputs of width 4, keys,
queries and values of width 3), as the C++ compiler computed it when this qkv was built
(qkv/tutorial.hpp; the extension's static_asserts prove the numbers against the tutorial's).

    import qkv.tutorial as t
    t.inputs                 # 3 x 4
    t.plain.scores           # the tutorial's plain dot-product scores, 3 x 3
    t.scaled.output          # with "Attention Is All You Need" scaling, 1/sqrt(3)
    t.matrices()             # the 13 matrices of the walkthrough, in its order, with their names
    print(t.example())       # the walkthrough of `qkv example`, computed now and checked

Every matrix is a tuple of rows (tuples of floats): numpy.array(t.plain.keys) makes an array.
"""

from . import _qkv

__all__ = ["inputs", "w_key", "w_query", "w_value", "plain", "scaled", "matrices", "example"]

_values = _qkv._tutorial()

inputs = _values["inputs"]
w_key = _values["w_key"]
w_query = _values["w_query"]
w_value = _values["w_value"]


class Steps:
    """The tutorial's steps 3 to 7 for one scale: keys, queries, values (3 x 3), scores, weights
    (3 x 3), weighted_values (one 3 x 3 matrix per query: row j is weights[i][j] * values[j]) and
    output (3 x 3, the sum of each query's weighted values)."""

    def __init__(self, scale, values):
        self.scale = scale
        self.keys = values["keys"]
        self.queries = values["queries"]
        self.values = values["values"]
        self.scores = values["scores"]
        self.weights = values["weights"]
        self.weighted_values = values["weighted_values"]
        self.output = values["output"]

    def __repr__(self):
        return f"qkv.tutorial.Steps(scale={self.scale})"


plain = Steps("1", _values["plain"])
scaled = Steps("1/sqrt(3)", _values["scaled"])


def matrices(scaled_scores=False):
    """The 13 matrices `qkv example` compares, in its order, as (name, matrix) pairs: the inputs,
    the three weight matrices, keys, queries, values, scores, weights, the weighted values of each
    query, and the outputs."""
    s = scaled if scaled_scores else plain
    out = [("inputs", inputs), ("w_key", w_key), ("w_query", w_query), ("w_value", w_value), ("keys", s.keys),
           ("queries", s.queries), ("values", s.values), ("scores", s.scores), ("weights", s.weights)]
    out += [(f"weighted_values[{i}]", w) for i, w in enumerate(s.weighted_values)]
    out.append(("output", s.output))
    return out


def example(backend="vulkan", scaled_scores=False):
    """The walkthrough `qkv example` prints, computed now on `backend` ("vulkan": the default device or
    QKV_DEVICE; "cpu": the float64 reference) beside the compile-time values. Raises RuntimeError if a
    matrix disagrees (the text is in the error), qkv.Unavailable without Vulkan."""
    text, checks, disagreements = _qkv._example(backend, scaled_scores)
    if disagreements:
        raise RuntimeError(f"{text}\n{disagreements} of {checks} matrices differ from the compile-time values")
    return text
