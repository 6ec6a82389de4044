"""Attention: ``F.scaled_dot_product_attention`` and ``F.multi_head_attention_forward``.

Both native: torch's own composition and derivative. ``nn.MultiheadAttention`` (and so
``nn.Transformer``, ``TransformerEncoderLayer``, ``TransformerDecoderLayer``) hands its
whole forward to ``F.multi_head_attention_forward`` through ``__torch_function__``, so
one step runs it on the server. Attention dropout draws from the session's generator;
the samples use ``dropout_p=0`` so gradcheck sees one function (tests/ops/test_op_families.py
checks the dropout draws against local torch). Not twice differentiable where torch picks
its fused CPU kernel (``_scaled_dot_product_flash_attention_for_cpu`` has no double backward),
so neither entry claims it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._native import native_op
from ._samples import S, T

_Q, _K, _V = T((2, 3, 4)), T((2, 5, 4)), T((2, 5, 3))
_MASK_BOOL = T((3, 5), dtype="bool", low=0, high=2, requires_grad=False)

native_op("scaled_dot_product_attention", F.scaled_dot_product_attention,
          torch_names=("torch.nn.functional.scaled_dot_product_attention",), random=True, exact=True,
          double_grad=False,  # torch's CPU flash kernel (4-d inputs) has no double backward
          samples=(S(_Q, _K, _V), S(T((2, 4, 3)), T((2, 4, 3)), T((2, 4, 3)), is_causal=True),
                   S(_Q, _K, _V, T((3, 5), low=-1, high=1), scale=0.3),
                   S(T((1, 2, 3, 4)), T((1, 2, 5, 4)), T((1, 2, 5, 4)), attn_mask=T((3, 5), dtype="bool", low=1,
                                                                                     high=2, requires_grad=False))))

_E, _HEADS, _S, _B = 4, 2, 3, 2  # embedding, heads, sequence, batch


def _mha(q_len: int = _S, kv_len: int = _S, **kwargs) -> S:
    """F.multi_head_attention_forward's arguments for a (seq, batch, embed) layout."""
    return S(T((q_len, _B, _E)), T((kv_len, _B, _E)), T((kv_len, _B, _E)), _E, _HEADS,
             T((3 * _E, _E), low=-0.7, high=0.7), T((3 * _E,), low=-0.3, high=0.3), None, None, False, 0.0,
             T((_E, _E), low=-0.7, high=0.7), T((_E,), low=-0.3, high=0.3), **kwargs)


native_op("multi_head_attention_forward", F.multi_head_attention_forward,
          torch_names=("torch.nn.functional.multi_head_attention_forward",), random=True, exact=True,
          double_grad=False,  # need_weights=False goes through scaled_dot_product_attention
          samples=(_mha(), _mha(need_weights=False), _mha(2, 3, attn_mask=T((2, 3), low=-1, high=0,
                                                                             requires_grad=False)),
                   _mha(key_padding_mask=T((_B, _S), dtype="bool", low=0, high=1, requires_grad=False),
                        need_weights=True, average_attn_weights=False),
                   _mha(need_weights=False, is_causal=True, attn_mask=T((_S, _S), dtype="bool", low=0, high=1,
                                                                        requires_grad=False))))
