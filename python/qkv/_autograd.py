"""Gradients through qkv's attention: the one place where it is decided whether a call records an
autograd graph. qkv.scaled_dot_product_attention and every qkv.flash_attn function describe their
call as an _sdpa.Attention (the inputs as the caller passed them, torch tensors with their
history) and run it here.

A call whose query, key or value would record a graph (a torch tensor that requires grad, with
grad mode on) runs through a torch.autograd.Function: its forward is call.run(return_lse=True),
saving the output and the lse (the inputs are the call's, detached when read); its backward is the
library's backward pass (context::sdpa_backward on the call's device, qkv::cpu::sdpa_backward with
device="cpu") with the call's options, dropout's seed and offset included, so the backward draws the
forward's mask. Gradients reach packed (qkvpacked, kvpacked) and permuted (FlashAttention's layout)
inputs through the views the call holds. The lse and the weights are returned as results without
a gradient. Masks, sinks and slopes are read by _arrays.host_view, which refuses them where they
require grad (no gradient flows to them through Python yet)."""

import sys

from . import _arrays, _qkv


def requiring_grad(call):
    """The name of the first of the call's query, key and value that would record a graph, or None."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.is_grad_enabled():
        return None
    for x, name in zip((call.query, call.key, call.value), call.names):
        if isinstance(x, torch.Tensor) and x.requires_grad:
            return name
    return None


def _inverse(perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def backward(call, grad_output, output, lse):
    """(dq, dk, dv) of the call's query, key and value (torch tensors of their views' shapes and
    dtype) from the gradient of its output, as the caller sees it (out_perm applied). A call with
    its own backward pass (a ragged batch: flash_attn._Ragged.gradients) computes them itself."""
    own = getattr(call, "gradients", None)
    if own is not None:
        return own(grad_output, output, lse)
    if call.out_perm:
        inv = _inverse(call.out_perm)
        grad_output, output = (x.permute(*inv) for x in (grad_output, output))
    dq, dk, dv, _ = _qkv._sdpa_backward(*(_arrays.detached(x) for x in (call.query, call.key, call.value)),
                                        grad_output.detach(), output.detach(), lse.detach(), mask=call.mask,
                                        mask_is_bool=call.mask_is_bool, sinks=call.sinks,
                                        alibi_slopes=call.alibi_slopes, options=call.options, context=call.context)
    return tuple(_arrays.wrap(g, _arrays.TORCH) for g in (dq, dk, dv))


_function = None


def _attention_function():
    """The torch.autograd.Function, made on first use (torch is imported only by callers that use it)."""
    global _function
    if _function is None:
        torch = sys.modules["torch"]

        class Attention(torch.autograd.Function):
            @staticmethod
            def forward(ctx, call, query, key, value):
                out, lse, weights = call.run(return_lse=True)
                ctx.call = call
                ctx.save_for_backward(out, lse)
                extras = [x for x in (lse if call.options.get("return_lse") else None, weights) if x is not None]
                ctx.mark_non_differentiable(*extras)
                return (out, *extras)

            @staticmethod
            def backward(ctx, grad_output, *_):
                out, lse = ctx.saved_tensors
                dq, dk, dv = backward(ctx.call, grad_output.contiguous(), out, lse)
                return None, dq, dk, dv

        _function = Attention
    return _function


def run(call):
    """(output, lse, weights) of an _sdpa.Attention, of the inputs' kind; None for what was not asked for."""
    if requiring_grad(call) is None:
        return call.run()
    results = list(_attention_function().apply(call, call.query, call.key, call.value))
    out = results.pop(0)
    lse = results.pop(0) if call.options.get("return_lse") else None
    weights = results.pop(0) if call.options.get("return_weights") else None
    return out, lse, weights
