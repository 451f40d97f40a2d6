#!/usr/bin/python3
"""Expected values for tests/compile/*.cpp, computed by PyTorch in float64.

Run: /usr/bin/python3 tests/reference/expected_values.py
The numbers it prints are pasted into the static_assert tests, so the compile-time core is
checked against PyTorch, never against itself.
"""
import torch

torch.set_printoptions(precision=8)
f64 = torch.float64
x = torch.tensor([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]], dtype=f64)
wk = torch.tensor([[0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 0]], dtype=f64)
wq = torch.tensor([[1, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 1]], dtype=f64)
wv = torch.tensor([[0, 2, 0], [0, 3, 0], [1, 0, 3], [1, 1, 0]], dtype=f64)

def sdpa(x, wq, wk, wv, scale, causal=False):
    q, k, v = x @ wq, x @ wk, x @ wv
    s = (q @ k.T) * scale
    if causal:
        n = s.shape[0]
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    w = torch.softmax(s, dim=-1)
    return w, w @ v

print("# tutorial, scale 1")
w, o = sdpa(x, wq, wk, wv, 1.0)
print("weights", w); print("output", o)
print("# tutorial, scale 1/sqrt(3)")
w, o = sdpa(x, wq, wk, wv, 3 ** -0.5)
print("weights", w); print("output", o)
print("# tutorial, causal, scale 1")
w, o = sdpa(x, wq, wk, wv, 1.0, causal=True)
print("weights", w); print("output", o)

print("# multi-head: torch.nn.MultiheadAttention, 2 heads, biases, output projection")
# Inputs of width 4, d_k = d_v = 4 (torch's MHA needs d_k = d_v = embed_dim).
wq4 = torch.tensor([[1, 0, 1, 0], [1, 0, 0, 1], [0, 0, 1, 1], [0, 1, 1, 0]], dtype=f64) * 0.5
wk4 = torch.tensor([[0, 0, 1, 1], [1, 1, 0, 0], [0, 1, 0, 1], [1, 1, 0, 0]], dtype=f64) * 0.5
wv4 = torch.tensor([[0, 2, 0, 1], [0, 3, 0, 0], [1, 0, 3, 1], [1, 1, 0, 2]], dtype=f64) * 0.5
wo4 = torch.tensor([[1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 1, 0], [1, 0, 0, -1]], dtype=f64)
bq = torch.tensor([0.1, -0.2, 0.3, 0.0], dtype=f64)
bk = torch.tensor([0.0, 0.5, -0.5, 0.25], dtype=f64)
bv = torch.tensor([1.0, 0.0, -1.0, 0.5], dtype=f64)
bo = torch.tensor([0.5, 0.25, 0.0, -0.5], dtype=f64)
mha = torch.nn.MultiheadAttention(4, 2, bias=True, dtype=f64)
with torch.no_grad():
    # torch computes x @ W.T, qkv's convention is x @ W: pass the transposes.
    mha.in_proj_weight.copy_(torch.cat([wq4.T, wk4.T, wv4.T]))
    mha.in_proj_bias.copy_(torch.cat([bq, bk, bv]))
    mha.out_proj.weight.copy_(wo4.T)
    mha.out_proj.bias.copy_(bo)
out, attn = mha(x, x, x, need_weights=True, average_attn_weights=False)
print("output", out)
print("weights", attn)
causal = torch.ones(3, 3, dtype=torch.bool).triu(1)  # torch: True = may NOT attend
out, attn = mha(x, x, x, attn_mask=causal, need_weights=True, average_attn_weights=False)
print("causal output", out)
