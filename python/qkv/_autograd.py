"""Gradients through qkv's attention: the one place where it is decided whether a call records an
autograd graph. qkv.scaled_dot_product_attention and every qkv.flash_attn function describe their
call as an _sdpa.Attention (the inputs as the caller passed them, torch tensors with their
history) and run it here.

qkv has no backward pass yet: a call whose query, key or value would record a graph (a torch
tensor that requires grad, with grad mode on) raises NotImplementedError naming the argument,
never a silent no-op. The backward pass plugs in here, and only here: `run` hands such a call to
a torch.autograd.Function whose forward is call.run(return_lse=True) (saving the detached inputs,
the output and lse) and whose backward calls the library's backward pass with call.options;
gradients reach packed (qkvpacked, kvpacked) and permuted (FlashAttention's layout) inputs through
the views the call holds. Masks, sinks and slopes are read by _arrays.host_view, which refuses
them where they require grad."""

import sys


def requiring_grad(call):
    """The name of the first of the call's query, key and value that would record a graph, or None."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.is_grad_enabled():
        return None
    for x, name in zip((call.query, call.key, call.value), call.names):
        if isinstance(x, torch.Tensor) and x.requires_grad:
            return name
    return None


def run(call):
    """(output, lse, weights) of an _sdpa.Attention, of the inputs' kind; None for what was not asked for."""
    name = requiring_grad(call)
    if name is not None:
        raise NotImplementedError(
            f"{name}.requires_grad: qkv computes the forward pass only (no gradients yet); call it under "
            "torch.no_grad() or pass a detached tensor")
    return call.run()
