#!/usr/bin/env python3
"""Training with qkv's attention: a 2-layer transformer learns to copy a sequence, once with qkv's
attention (forward and backward on a Vulkan device such as Mesa's lavapipe) and once with a PyTorch
attention written here from PyTorch's documented scaled_dot_product_attention, from the same seed
on the same batches. Everything but the attention is the same PyTorch code.

    /usr/bin/python3 examples/train_tiny.py               # 300 steps, both models, then the checks
    /usr/bin/python3 examples/train_tiny.py --steps 30    # shorter (python/tests/test_train_tiny.py)

The model: token and learned position embeddings, d_model 64, 2 pre-norm blocks of 4 query heads
over 2 key/value heads (GQA, head size 16), causal; the first block's attention is a sliding window
(each query sees itself and the WINDOW keys before it, FlashAttention's window_size=(WINDOW, 0)),
the second sees every earlier key. The task: a row is n random tokens, a separator, and the same n
tokens again; the loss is the cross-entropy of predicting the copy (the second half), which needs
the full-causal layer to look back n + 1 positions. Adam (learning rate 3e-3 falling linearly to 0,
the gradient's norm clipped at 1), float32 throughout.

The checks (a run that fails one exits 1):
- the curves agree early: over the first EARLY_STEPS steps, |loss_qkv - loss_torch| <= EARLY_TOL at
  every step. The two attentions differ by float32 rounding (outputs and gradients agree to a
  normalised MSE near 1e-13), which ten optimizer steps carry to the loss at about 5e-7 here (as
  for the control below). Errors in the attention's gradients move it far more within those ten
  steps (measured with the reference attention broken on purpose): no gradient to q by 3e-3, a
  windowed key's gradient leaking through by 3e-3, dk 10 % too small by 5e-5. EARLY_TOL = 1e-5,
  20 times the rounding's effect, catches all three. (python/tests/test_train_tiny.py checks one
  step's parameter gradients directly, to a normalised MSE of 1e-9.)
- the curves agree throughout: the mean loss over every block of BLOCK steps differs by at most
  BLOCK_TOL of the reference's mean plus BLOCK_ABS. Training can amplify rounding differences (Adam
  at a near-zero loss without the schedule and clipping above set off loss spikes that differed
  between runs by 0.06 for the control as for qkv), so later steps are compared as block means,
  with a tolerance meant for devices whose rounding differs more; on lavapipe the curves agree far
  closer (README.md, "Training"). The run reports the same measures for a control: the reference
  attention computed in float64 and rounded to float32, a rounding-level change that has nothing
  to do with qkv.
- qkv's model learns the task: its final loss is below FINAL_LOSS and its accuracy on the copied
  tokens of a fresh batch at least FINAL_ACCURACY (a model that has not learnt to copy predicts
  1 token in vocab - 2: about 7%, loss about ln 14 = 2.64).

Each run prints its time; README.md ("Training") records those of the 2-core development machine.
"""

import argparse
import math
import sys
import time

import torch
import torch.nn as nn

import qkv

D_MODEL, HEADS, KV_HEADS, LAYERS = 64, 4, 2, 2
WINDOW = 3  # the sliding window of the first block: the query and the 3 keys before it
VOCAB, COPY_LEN = 16, 8  # tokens 0..13 are data, 14 the separator (15 unused); n = 8 copied tokens
SEPARATOR = 14
EARLY_STEPS, EARLY_TOL = 10, 1e-5
BLOCK, BLOCK_TOL, BLOCK_ABS = 25, 0.10, 0.02
FINAL_LOSS, FINAL_ACCURACY = 0.1, 0.95


def reference_attention(q, k, v, window_left=None):
    """PyTorch's documented scaled_dot_product_attention (torch 1.13 has none) for is_causal=True
    and enable_gqa=True: scores q kᵀ / sqrt(E), key j allowed for query i when j <= i (and, with a
    window, i - window_left <= j, FlashAttention's window_size=(window_left, 0)), softmax over the
    allowed keys, times v; K and V heads repeated along dimension -3 for the query heads."""
    group = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    L, S = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    i, j = torch.arange(L)[:, None], torch.arange(S)[None, :]
    allowed = j <= i
    if window_left is not None:
        allowed &= j >= i - window_left
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def float64_reference_attention(q, k, v, window_left=None):
    """The control: the same attention computed in float64 and rounded to float32."""
    return reference_attention(q.double(), k.double(), v.double(), window_left).float()


def qkv_attention(q, k, v, window_left=None):
    """qkv's attention on the default device: autograd runs qkv's backward pass."""
    window = None if window_left is None else (window_left, 0)
    return qkv.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, window=window)


class Block(nn.Module):
    def __init__(self, attention, window_left):
        super().__init__()
        self.attention, self.window_left = attention, window_left
        self.head = D_MODEL // HEADS
        self.norm1, self.norm2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
        self.wq = nn.Linear(D_MODEL, D_MODEL, bias=False)
        self.wk = nn.Linear(D_MODEL, KV_HEADS * self.head, bias=False)
        self.wv = nn.Linear(D_MODEL, KV_HEADS * self.head, bias=False)
        self.wo = nn.Linear(D_MODEL, D_MODEL, bias=False)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(), nn.Linear(4 * D_MODEL, D_MODEL))

    def forward(self, x):
        B, T, _ = x.shape
        h = self.norm1(x)
        q = self.wq(h).view(B, T, HEADS, self.head).transpose(1, 2)
        k = self.wk(h).view(B, T, KV_HEADS, self.head).transpose(1, 2)
        v = self.wv(h).view(B, T, KV_HEADS, self.head).transpose(1, 2)
        a = self.attention(q.contiguous(), k.contiguous(), v.contiguous(), self.window_left)  # (B, Hq, T, head)
        x = x + self.wo(a.transpose(1, 2).reshape(B, T, D_MODEL))
        return x + self.mlp(self.norm2(x))


class Model(nn.Module):
    def __init__(self, attention, length):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, D_MODEL)
        self.positions = nn.Parameter(0.02 * torch.randn(length, D_MODEL))
        self.blocks = nn.ModuleList([Block(attention, WINDOW), Block(attention, None)])
        self.norm = nn.LayerNorm(D_MODEL)
        self.out = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens):
        x = self.tokens(tokens) + self.positions[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.out(self.norm(x))


def batch(generator, size):
    """(inputs, targets) of `size` rows: data, separator, data again; targets are the next tokens,
    -100 (ignored) outside the copy."""
    data = torch.randint(0, SEPARATOR, (size, COPY_LEN), generator=generator)
    row = torch.cat([data, torch.full((size, 1), SEPARATOR), data], dim=1)
    inputs, targets = row[:, :-1], row[:, 1:].clone()
    targets[:, :COPY_LEN] = -100
    return inputs, targets


def loss_of(model, inputs, targets):
    logits = model(inputs)
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=-100), logits


def train(attention, steps, batch_size, seed, lr):
    """(per-step losses, final accuracy on a fresh batch, final loss on it, seconds) of a model with
    this attention: the same initial weights and batches for every attention with the same seed."""
    torch.manual_seed(seed)
    model = Model(attention, 2 * COPY_LEN)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    # The learning rate falls linearly to 0 and the gradient's norm is clipped at 1: without them
    # Adam's steps at a near-zero loss set off loss spikes late in the run, which differ between
    # runs that differ only in rounding (the control as much as qkv) and hide the comparison.
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    data = torch.Generator().manual_seed(seed + 1)
    losses, start = [], time.perf_counter()
    for _ in range(steps):
        inputs, targets = batch(data, batch_size)
        loss, _ = loss_of(model, inputs, targets)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if not math.isfinite(loss.item()):
            raise RuntimeError(f"the loss is {loss.item()} at step {len(losses)}")
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    with torch.no_grad():
        inputs, targets = batch(torch.Generator().manual_seed(seed + 2), 256)
        loss, logits = loss_of(model, inputs, targets)
        copied = targets != -100
        accuracy = (logits.argmax(-1)[copied] == targets[copied]).float().mean().item()
    return losses, accuracy, loss.item(), seconds


def largest_difference(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


def block_difference(a, b):
    """The largest |mean(a) - mean(b)| - BLOCK_TOL * |mean(b)| over blocks of BLOCK steps, and that block."""
    worst = (-math.inf, 0)
    for s in range(0, len(a), BLOCK):
        ma, mb = sum(a[s:s + BLOCK]) / len(a[s:s + BLOCK]), sum(b[s:s + BLOCK]) / len(b[s:s + BLOCK])
        worst = max(worst, (abs(ma - mb) - BLOCK_TOL * abs(mb), s))
    return worst


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--no-control", action="store_true", help="skip the control run (float64 reference attention)")
    parser.add_argument("--no-learn-check", action="store_true",
                        help="skip the final loss and accuracy check (for runs too short to learn the task)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch's CPU threads (default 1: this model is too small to gain from more)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not qkv.devices():
        print("train_tiny: no Vulkan device (qkv's attention trains on one; lavapipe will do)", file=sys.stderr)
        return 1
    print(f"qkv on {qkv.default_context().device.name}; {args.steps} steps of batch {args.batch}, seed {args.seed}")
    runs = {}
    attentions = [("torch", reference_attention), ("qkv", qkv_attention)]
    if not args.no_control:
        attentions.append(("control", float64_reference_attention))
    for name, attention in attentions:
        runs[name] = train(attention, args.steps, args.batch, args.seed, args.lr)
        losses, accuracy, final, seconds = runs[name]
        print(f"{name:8s} {seconds:7.1f} s  loss {losses[0]:.4f} -> {losses[-1]:.4f}  fresh batch: loss {final:.4f}, "
              f"accuracy {accuracy:.3f}")
    ref, got = runs["torch"][0], runs["qkv"][0]
    control = runs["control"][0] if "control" in runs else None
    for s in range(0, args.steps, max(1, args.steps // 10)):
        print(f"step {s:4d}  torch {ref[s]:.5f}  qkv {got[s]:.5f}" + (f"  control {control[s]:.5f}" if control else ""))
    failures = []
    early = largest_difference(got[:EARLY_STEPS], ref[:EARLY_STEPS])
    excess, at = block_difference(got, ref)
    print(f"first {EARLY_STEPS} steps, largest |loss difference|: qkv {early:.2e} (tolerance {EARLY_TOL:g})")
    print(f"blocks of {BLOCK} steps, largest |mean difference| - {BLOCK_TOL:g} x mean: qkv {excess:+.4f} (steps "
          f"{at}.., tolerance {BLOCK_ABS:g})")
    print(f"every step, largest |loss difference|: qkv {largest_difference(got, ref):.2e}")
    if control:
        first = largest_difference(control[:EARLY_STEPS], ref[:EARLY_STEPS])
        print(f"control: first {EARLY_STEPS} steps {first:.2e}, blocks {block_difference(control, ref)[0]:+.4f}, "
              f"every step {largest_difference(control, ref):.2e}")
    if early > EARLY_TOL:
        failures.append(f"the first {EARLY_STEPS} losses differ by {early:.2e} > {EARLY_TOL:g}")
    if excess > BLOCK_ABS:
        failures.append(f"the mean losses of steps {at}.. differ beyond {BLOCK_TOL:g} relative + {BLOCK_ABS:g}")
    _, accuracy, final, _ = runs["qkv"]
    if not args.no_learn_check and (final > FINAL_LOSS or accuracy < FINAL_ACCURACY):
        failures.append(f"qkv's model did not learn to copy: loss {final:.4f} (at most {FINAL_LOSS}), accuracy "
                        f"{accuracy:.3f} (at least {FINAL_ACCURACY})")
    for f in failures:
        print("FAILED:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
