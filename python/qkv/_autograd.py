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
a gradient.

scaled_dot_product_attention's floating attn_mask and its sinks may require grad too: the mask gets
the gradient PyTorch gives an attn_mask (each logit's gradient dS, summed over the dimensions the
mask broadcasts along; 0 where a key is masked), the sinks one per head (dσ_h = -Σ P_σ·D), both
computed by the library's backward pass with the others, in the mask's and the sinks' dtype; the
mask's only when it is asked for (it costs an L x S scratch per head). A bool mask has no
gradient; ALiBi's slopes none (a constant bias), and are read by _arrays.host_view, which refuses
them where they require grad, as it refuses every other argument no gradient flows to."""

import sys

from . import _arrays, _qkv


def _differentiable(call):
    """(array, name) of the call's inputs a gradient may reach: query, key, value, the mask, the sinks."""
    extras = (getattr(call, "mask", None), getattr(call, "sinks", None))
    return tuple(zip((call.query, call.key, call.value, *extras), (*call.names, "attn_mask", "sinks")))


def _first_recording(pairs):
    torch = sys.modules.get("torch")
    if torch is None or not torch.is_grad_enabled():
        return None
    for x, name in pairs:
        if isinstance(x, torch.Tensor) and x.requires_grad:
            return name
    return None


def requiring_grad(call):
    """The name of the first of the call's inputs that would record a graph, or None."""
    return _first_recording(_differentiable(call))


def records(*arrays):
    """Whether any of the arrays would record a graph (a torch tensor that requires grad, with grad
    enabled): a call without a backward pass must then take another route."""
    return _first_recording((x, "input") for x in arrays) is not None


def _inverse(perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def _mask_gradient(compact, mask, query, key):
    """The additive mask's gradient in the mask's shape, from the library's compact (b, h, l, s) one
    (the batch dimensions together, whole where the mask has any, Hq, L, S; each 1 where the mask
    broadcasts): summed over the batch dimensions the mask broadcasts along, as PyTorch's autograd
    sums a broadcast attn_mask's gradient."""
    qs = tuple(query.shape)
    batch = list(qs[:-3])
    target = batch + [qs[-3] if len(qs) >= 3 else 1, qs[-2], tuple(key.shape)[-2]]
    size = [1] * (len(target) - mask.dim()) + list(mask.shape)
    nb = len(batch)
    kept = any(d != 1 for d in size[:nb])
    shape = [t if kept else 1 for t in target[:nb]] + size[nb:]
    g = compact.reshape(shape)
    broadcast = [d for d in range(nb) if size[d] == 1 and shape[d] != 1]
    if broadcast:
        g = g.sum(dim=broadcast, keepdim=True)
    return g.reshape(mask.shape).to(mask.dtype)


def backward(call, grad_output, output, lse, want_mask=False):
    """(dq, dk, dv, d_mask, d_sinks) of the call's query, key and value (torch tensors of their
    views' shapes and dtype), its additive mask (with want_mask, else None) and its sinks (a torch
    tensor of theirs, else None) from the gradient of its output, as the caller sees it (out_perm
    applied). A call with its own backward pass (a ragged batch: flash_attn._Ragged.gradients)
    computes dq, dk and dv itself (it has no mask or sinks)."""
    own = getattr(call, "gradients", None)
    if own is not None:
        return (*own(grad_output, output, lse), None, None)
    if call.out_perm:
        inv = _inverse(call.out_perm)
        grad_output, output = (x.permute(*inv) for x in (grad_output, output))
    mask, sinks = _arrays.detached(call.mask), _arrays.detached(call.sinks)
    dq, dk, dv, ds, dm = _qkv._sdpa_backward(*(_arrays.detached(x) for x in (call.query, call.key, call.value)),
                                             grad_output.detach(), output.detach(), lse.detach(), mask=mask,
                                             mask_is_bool=call.mask_is_bool, sinks=sinks,
                                             alibi_slopes=call.alibi_slopes, options=call.options,
                                             context=call.context, return_d_mask=want_mask)
    dq, dk, dv, ds, dm = (_arrays.wrap(g, _arrays.TORCH) for g in (dq, dk, dv, ds, dm))
    torch = sys.modules["torch"]
    if dm is not None:
        dm = _mask_gradient(dm, mask, call.query, call.key)
    if ds is not None and isinstance(sinks, torch.Tensor):
        ds = ds.reshape(sinks.shape).to(sinks.dtype)
    else:
        ds = None
    return dq, dk, dv, dm, ds


_function = None


def _attention_function():
    """The torch.autograd.Function, made on first use (torch is imported only by callers that use it)."""
    global _function
    if _function is None:
        torch = sys.modules["torch"]

        class Attention(torch.autograd.Function):
            @staticmethod
            def forward(ctx, call, query, key, value, mask, sinks):
                out, lse, weights = call.run(return_lse=True)
                ctx.call = call
                ctx.save_for_backward(out, lse)
                extras = [x for x in (lse if call.options.get("return_lse") else None, weights) if x is not None]
                ctx.mark_non_differentiable(*extras)
                return (out, *extras)

            @staticmethod
            def backward(ctx, grad_output, *_):
                out, lse = ctx.saved_tensors
                want_mask = ctx.needs_input_grad[4]
                dq, dk, dv, dm, ds = backward(ctx.call, grad_output.contiguous(), out, lse, want_mask)
                return None, dq, dk, dv, dm, ds if ctx.needs_input_grad[5] else None

        _function = Attention
    return _function


def run(call):
    """(output, lse, weights) of an _sdpa.Attention, of the inputs' kind; None for what was not asked for."""
    if requiring_grad(call) is None:
        return call.run()
    torch = sys.modules["torch"]
    extras = (x if isinstance(x, torch.Tensor) else None for x, _ in _differentiable(call)[3:])
    results = list(_attention_function().apply(call, call.query, call.key, call.value, *extras))
    out = results.pop(0)
    lse = results.pop(0) if call.options.get("return_lse") else None
    weights = results.pop(0) if call.options.get("return_weights") else None
    return out, lse, weights
