"""Linear algebra: matmul and friends, with broadcasting over batch dims."""

from __future__ import annotations

import string

import torch
from torch.autograd import Function

from ._grad import TensorLike, needs, sum_to
from ._registry import op
from ._samples import S, T


class MatMul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.matmul(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        # Treat vectors as matrices (a row on the left, a column on the right), do the
        # matrix rule, reduce broadcast batch dims, then drop the added dims again.
        a2 = a.unsqueeze(0) if a.dim() == 1 else a
        b2 = b.unsqueeze(-1) if b.dim() == 1 else b
        g2 = g
        if a.dim() == 1:
            g2 = g2.unsqueeze(-2 if b.dim() > 1 else 0)
        if b.dim() == 1:
            g2 = g2.unsqueeze(-1)
        ga = gb = None
        if needs(ctx, 0):
            ga = sum_to(g2 @ b2.mT, a2)
            ga = ga.squeeze(0) if a.dim() == 1 else ga
        if needs(ctx, 1):
            gb = sum_to(a2.mT @ g2, b2)
            gb = gb.squeeze(-1) if b.dim() == 1 else gb
        return ga, gb


@op("matmul", torch_names=("torch.matmul", "torch.Tensor.matmul", "torch.Tensor.__matmul__",
                           "torch.Tensor.__rmatmul__"),
    samples=(S(T((2, 3)), T((3, 4))), S(T((3,)), T((3,))), S(T((3,)), T((3, 2))), S(T((2, 3)), T((3,))),
             S(T((2, 2, 3)), T((3, 4))), S(T((4, 1, 2, 3)), T((5, 3, 2))), S(T((3, 2), noncontiguous=True), T((2, 4))),
             S(T((0, 3)), T((3, 2)))),
    reference=torch.matmul)
def matmul(input, other):
    """matrix product with torch's broadcasting and vector rules"""
    return MatMul.apply(input, other)


def _product(name: str, forward, grad_a, grad_b):
    """A Function for a product bilinear in (a, b): the grads are ``grad_a(g, b)`` and ``grad_b(a, g)``."""

    class Product(Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return forward(a, b)

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            return grad_a(g, b) if needs(ctx, 0) else None, grad_b(a, g) if needs(ctx, 1) else None

    Product.__name__ = Product.__qualname__ = name
    return Product


Mm = _product("Mm", torch.mm, lambda g, b: g @ b.mT, lambda a, g: a.mT @ g)
Bmm = _product("Bmm", torch.bmm, lambda g, b: g @ b.mT, lambda a, g: a.mT @ g)
Mv = _product("Mv", torch.mv, lambda g, v: torch.outer(g, v), lambda a, g: a.mT @ g)
Dot = _product("Dot", torch.dot, lambda g, b: g * b, lambda a, g: g * a)
Outer = _product("Outer", torch.outer, lambda g, b: g @ b, lambda a, g: g.mT @ a)


@op("mm", torch_names=("torch.spmm", "torch.Tensor.mm"), reference=torch.mm,
    samples=(S(T((2, 3)), T((3, 4))), S(T((3, 2), noncontiguous=True), T((2, 4), noncontiguous=True)),
             S(T((0, 3)), T((3, 2))), S(T((2, 3)), T((3, 4), requires_grad=False))))
def mm(input, mat2):
    """matrix product of two 2-D tensors (``torch.mm`` resolves to the name ``torch.spmm``)"""
    return Mm.apply(input, mat2)


@op("bmm", torch_names=("torch.bmm", "torch.Tensor.bmm"), reference=torch.bmm,
    samples=(S(T((2, 2, 3)), T((2, 3, 4))), S(T((2, 2, 3), noncontiguous=True), T((2, 3, 1))),
             S(T((0, 2, 3)), T((0, 3, 1)))))
def bmm(input, mat2):
    """batched matrix product of two 3-D tensors"""
    return Bmm.apply(input, mat2)


@op("mv", torch_names=("torch.mv", "torch.Tensor.mv"), reference=torch.mv,
    samples=(S(T((2, 3)), T((3,))), S(T((3, 2), noncontiguous=True), T((2,))), S(T((0, 3)), T((3,)))))
def mv(input, vec):
    """matrix-vector product"""
    return Mv.apply(input, vec)


@op("dot", torch_names=("torch.dot", "torch.Tensor.dot"), reference=torch.dot,
    samples=(S(T((3,)), T((3,))), S(T((0,)), T((0,))), S(T((4,)), T((4,), requires_grad=False))))
def dot(input, tensor):
    """inner product of two 1-D tensors"""
    return Dot.apply(input, tensor)


@op("outer", torch_names=("torch.outer", "torch.ger", "torch.Tensor.outer", "torch.Tensor.ger"), reference=torch.outer,
    samples=(S(T((2,)), T((3,))), S(T((1,)), T((4,))), S(T((0,)), T((2,)))))
def outer(input, vec2):
    """outer product of two 1-D tensors (``ger`` is the old name)"""
    return Outer.apply(input, vec2)


class AddMm(Function):
    @staticmethod
    def forward(ctx, c, a, b, beta, alpha):
        ctx.c, ctx.beta, ctx.alpha = TensorLike(c.shape, c.dtype), beta, alpha
        ctx.save_for_backward(a, b)
        return torch.addmm(c, a, b, beta=beta, alpha=alpha)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        gc = sum_to(g * ctx.beta, ctx.c) if needs(ctx, 0) else None
        ga = (g @ b.mT) * ctx.alpha if needs(ctx, 1) else None
        gb = (a.mT @ g) * ctx.alpha if needs(ctx, 2) else None
        return gc, ga, gb, None, None


@op("addmm", torch_names=("torch.addmm", "torch.Tensor.addmm", "torch.Tensor.addmm_"), reference=torch.addmm,
    samples=(S(T((2, 4)), T((2, 3)), T((3, 4))), S(T((4,)), T((2, 3)), T((3, 4)), beta=0.5, alpha=2.0),
             S(T((3, 1)), T((3, 2), noncontiguous=True), T((2, 4)), alpha=-1), S(T(()), T((2, 3)), T((3, 2)), beta=0)))
def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    """beta * input + alpha * (mat1 @ mat2), ``input`` broadcast to the product's shape"""
    return AddMm.apply(input, mat1, mat2, beta, alpha)


# -- einsum ----------------------------------------------------------------------------------

_LETTERS = string.ascii_uppercase + string.ascii_lowercase  # torch's sublist numbering: 0 -> 'A', 26 -> 'a'


def _einsum_args(args) -> tuple[str, tuple]:
    """torch.einsum's spellings -> (equation, operands): ``(eq, a, b)``, ``(eq, [a, b])`` or sublists."""
    if isinstance(args[0], str):
        ops = args[1:]
        return args[0], tuple(ops[0]) if len(ops) == 1 and isinstance(ops[0], (list, tuple)) else tuple(ops)
    ops, subs = args[0:len(args) - len(args) % 2:2], args[1::2][:len(args) // 2]
    return ",".join(map(_spell, subs)) + ("->" + _spell(args[-1]) if len(args) % 2 else ""), tuple(ops)


def _spell(sublist) -> str:
    """A sublist (``[0, 1, ...]``) as subscript letters."""
    return "".join("..." if s is Ellipsis else _LETTERS[s] for s in sublist)


def _explicit(eq: str, shapes) -> tuple[list[str], str, list[str]]:
    """``eq`` spelled out for these shapes: ellipses become letters, the output is explicit.

    Returns (input subscripts, output subscripts, unused letters).
    """
    lhs, arrow, out = eq.replace(" ", "").partition("->")
    ins = lhs.split(",")
    free = [c for c in _LETTERS if c not in lhs + out]
    ranks = [len(shape) - len(s) + 3 for s, shape in zip(ins, shapes) if "..." in s]
    n_ell = max(ranks, default=0)
    ell, free = "".join(free[:n_ell]), free[n_ell:]
    ins = [s.replace("...", ell[len(ell) - (len(shape) - len(s) + 3):]) for s, shape in zip(ins, shapes)]
    if arrow:
        return ins, out.replace("...", ell), free
    letters = "".join(ins)
    once = sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ell)
    return ins, ell + "".join(once), free


class Einsum(Function):
    @staticmethod
    def forward(ctx, eq, *ops):
        out = torch.einsum(eq, *ops)  # first, so a bad equation gets torch's own error
        ctx.ins, ctx.out, ctx.free = _explicit(eq, [o.shape for o in ops])
        ctx.save_for_backward(*ops)
        return out

    @staticmethod
    def backward(ctx, g):
        ops = ctx.saved_tensors
        return (None,) + tuple(_einsum_grad(g, ops, ctx.ins, ctx.out, k, list(ctx.free)) if needs(ctx, k + 1) else None
                               for k in range(len(ops)))


def _einsum_grad(g, ops, ins, out, k, free):
    """Operand ``k``'s gradient, itself an einsum: the output grad times the other operands.

    A letter repeated in operand ``k`` (a diagonal) gets a fresh letter tied to it by an identity; a
    letter summed inside operand ``k`` alone is broadcast back with a ones vector.
    """
    others = [i for i in range(len(ops)) if i != k]
    known = set(out).union(*(ins[i] for i in others))
    subs, extra, target = [out] + [ins[i] for i in others], [], ""
    for c, size in zip(ins[k], ops[k].shape):
        if c in target:
            target += free.pop()
            subs.append(c + target[-1])
            extra.append(torch.eye(size, dtype=g.dtype, device=g.device))
            continue
        target += c
        if c not in known:
            subs.append(c)
            extra.append(torch.ones(size, dtype=g.dtype, device=g.device))
    grad = Einsum.apply(",".join(subs) + "->" + target, g, *(ops[i] for i in others), *extra)
    return sum_to(grad, ops[k])


@op("einsum", torch_names=("torch.functional.einsum",), reference=torch.einsum,
    samples=(S("ij,jk->ik", T((2, 3)), T((3, 4))), S("ij,jk", [T((2, 3)), T((3, 2))]), S("ii->i", T((3, 3))),
             S("ii", T((3, 3))), S("bij,bjk->bik", T((2, 2, 3)), T((2, 3, 2))), S("i,j->ij", T((2,)), T((3,))),
             S("...ij,...jk->...ik", T((2, 1, 2, 3)), T((2, 3, 2))), S("ij->", T((3, 2), noncontiguous=True)),
             S("iij,jk->ik", T((2, 2, 3)), T((3, 2))), S("i...->...", T((2, 3, 1))),
             S("ij,ij->i", T((1, 3)), T((2, 3))), S(T((2, 3)), [0, 1], T((3, 2)), [1, 2], [0, 2]),
             S(" ij , j -> i ", T((2, 3)), T((3,), requires_grad=False))))
def einsum(*args):
    """Einstein summation: ``einsum("ij,jk->ik", a, b)``, ``einsum(eq, [a, b])`` or the sublist form"""
    eq, ops = _einsum_args(args)
    return Einsum.apply(eq, *ops)
