#!/usr/bin/env python3
"""The self-attention tutorial that started qkv, step by step in PyTorch, with qkv computing the
same attention beside it (on the default Vulkan device, or the float64 reference without one) and
the values the C++ compiler computed when qkv was built (qkv.tutorial) alongside.

    python3 examples/tutorial.py            # needs torch and numpy (Debian: python3-torch)

Run as the test python.tutorial (python/tests/test_tutorial.py).
"""

import sys

import numpy as np
import torch

import qkv
import qkv.tutorial

device = None if qkv.devices() else "cpu"
where = "the Vulkan device " + qkv.default_context().device.name if device is None else "the float64 reference"
disagreements = 0


def show(title, torch_value, qkv_value=None, compiled=None, tolerance=1e-5):
    """Prints one step: torch's value, and whether qkv and the compiler agree with it."""
    global disagreements
    print(f"\n{title}\n{np.array2string(torch_value.numpy(), precision=4, suppress_small=True)}")
    for name, value in (("qkv on " + where, qkv_value), ("qkv.tutorial (compile time)", compiled)):
        if value is None:
            continue
        error = float(np.abs(np.asarray(value, dtype=np.float64) - torch_value.double().numpy()).max())
        ok = error <= tolerance
        disagreements += not ok
        print(f"  {name}: {'agrees' if ok else 'DISAGREES'} (largest difference {error:.1e})")


# Step 1: the inputs, three of them, each of width 4.
x = torch.tensor([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]], dtype=torch.float32)
show("Step 1: inputs", x, compiled=qkv.tutorial.inputs)

# Step 2: the weights for keys, queries and values (4 x 3 each).
w_key = torch.tensor([[0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 0]], dtype=torch.float32)
w_query = torch.tensor([[1, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 1]], dtype=torch.float32)
w_value = torch.tensor([[0, 2, 0], [0, 3, 0], [1, 0, 3], [1, 1, 0]], dtype=torch.float32)
show("Step 2: weights for key", w_key, compiled=qkv.tutorial.w_key)
show("        weights for query", w_query, compiled=qkv.tutorial.w_query)
show("        weights for value", w_value, compiled=qkv.tutorial.w_value)

# Step 3: keys, queries and values: the inputs times each weight matrix.
keys, queries, values = x @ w_key, x @ w_query, x @ w_value
show("Step 3: keys", keys, compiled=qkv.tutorial.plain.keys)
show("        queries", queries, compiled=qkv.tutorial.plain.queries)
show("        values", values, compiled=qkv.tutorial.plain.values)

# Step 4: the attention scores, every query against every key (the tutorial's plain dot product).
scores = queries @ keys.T
show("Step 4: scores", scores, compiled=qkv.tutorial.plain.scores)

# Step 5: softmax over each row: the attention weights. qkv computes them from the queries, keys
# and values with scale 1 (the tutorial's), and returns them on request.
weights = torch.softmax(scores, dim=-1)
output, qkv_weights = qkv.scaled_dot_product_attention(queries, keys, values, scale=1.0, return_weights=True,
                                                       device=device)
show("Step 5: attention weights", weights, qkv_weights, qkv.tutorial.plain.weights)

# Step 6: each value times the weight the query gives it: the weighted values, per query.
for i in range(3):
    weighted = weights[i][:, None] * values
    show(f"Step 6: weighted values of query {i + 1}", weighted, qkv_weights[i][:, None] * values,
         qkv.tutorial.plain.weighted_values[i])

# Step 7: the outputs: each query's weighted values summed.
torch_output = weights @ values
show("Step 7: outputs", torch_output, output, qkv.tutorial.plain.output, tolerance=1e-4)

# The same attention as PyTorch's multi-head module would compute it for one head of width 3,
# "Attention Is All You Need" scaling: qkv's default scale, 1/sqrt(3).
scaled = torch.softmax(scores / 3 ** 0.5, dim=-1) @ values
show("Scaled by 1/sqrt(3)", scaled, qkv.scaled_dot_product_attention(queries, keys, values, device=device),
     qkv.tutorial.scaled.output, tolerance=1e-4)

print(f"\n{'qkv agrees with torch at every step' if not disagreements else f'{disagreements} disagreements'}")
sys.exit(1 if disagreements else 0)
