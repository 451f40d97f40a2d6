"""examples/train_tiny.py, shortened: the same 2-layer model (GQA, causal, a sliding window on its
first layer) with qkv's attention on the Vulkan device and with the example's PyTorch reference
attention, from one seed. One step's parameter gradients agree (every weight that reaches the
attention gets its gradient through qkv's backward pass), the first steps' losses agree within the
example's tolerance, and a few more steps lower the loss. The full 300-step run and its learning
check are the example's own (README.md, "Training")."""

import importlib.util
import os

import pytest
import torch

from conftest import SOURCE_DIR, needs_vulkan


def example():
    spec = importlib.util.spec_from_file_location("train_tiny", os.path.join(SOURCE_DIR, "examples", "train_tiny.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)  # as the example: the model is too small to gain from more threads
    return example()


def test_reference_attention_is_pytorchs_documented_rule(tiny):
    """The example's reference against an explicit loop over rows: causal, the window, GQA."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, h, 7, 4, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    got = tiny.reference_attention(q, k, v, window_left=2)
    for h in range(4):
        for i in range(7):
            keys = [j for j in range(7) if i - 2 <= j <= i]
            w = torch.softmax(torch.stack([q[0, h, i] @ k[0, h // 2, j] for j in keys]) / 2.0, dim=0)
            want = sum(w[n] * v[0, h // 2, j] for n, j in enumerate(keys))
            assert torch.allclose(got[0, h, i], want, rtol=1e-12, atol=1e-12)


@needs_vulkan
def test_one_step_gradients_match(tiny):
    inputs, targets = tiny.batch(torch.Generator().manual_seed(1), 4)
    grads = []
    for attention in (tiny.reference_attention, tiny.qkv_attention):
        torch.manual_seed(3)
        model = tiny.Model(attention, 2 * tiny.COPY_LEN)
        loss, _ = tiny.loss_of(model, inputs, targets)
        loss.backward()
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
    for name, want in grads[0].items():
        got = grads[1][name]
        assert torch.isfinite(got).all(), name
        assert float((want ** 2).sum()) > 0, name  # every parameter is trained, the attention's included
        nmse = float(((got - want) ** 2).sum() / (want ** 2).sum())
        assert nmse <= 1e-9, f"{name}: normalised MSE {nmse:.2e}"


@needs_vulkan
def test_short_training_tracks_the_reference(tiny):
    steps = 24
    ref = tiny.train(tiny.reference_attention, steps, 16, 0, 3e-3)[0]
    got = tiny.train(tiny.qkv_attention, steps, 16, 0, 3e-3)[0]
    early = max(abs(a - b) for a, b in zip(got[: tiny.EARLY_STEPS], ref[: tiny.EARLY_STEPS]))
    assert early <= tiny.EARLY_TOL, f"the first {tiny.EARLY_STEPS} losses differ by {early:.2e}"
    excess, at = tiny.block_difference(got, ref)
    assert excess <= tiny.BLOCK_ABS, f"the mean losses from step {at} differ"
    assert sum(got[-4:]) / 4 < got[0] - 0.3, f"the loss did not fall: {got[0]:.3f} -> {got[-4:]}"
