# Type stubs of qkv.tutorial (the implementation: tutorial.py).
from typing import Literal, Tuple

Matrix = Tuple[Tuple[float, ...], ...]

inputs: Matrix
w_key: Matrix
w_query: Matrix
w_value: Matrix

class Steps:
    scale: str
    keys: Matrix
    queries: Matrix
    values: Matrix
    scores: Matrix
    weights: Matrix
    weighted_values: Tuple[Matrix, Matrix, Matrix]
    output: Matrix

plain: Steps
scaled: Steps

def matrices(scaled_scores: bool = False) -> list[Tuple[str, Matrix]]: ...
def example(backend: Literal["vulkan", "cpu"] = "vulkan", scaled_scores: bool = False) -> str: ...
