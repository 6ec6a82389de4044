"""``client/session/_steps.op_where`` (the user's line of an op torch's code called, remembered per calling frame)
against the walk it stands in for (``_steps.where``): optimizer steps, clipping, a generator resumed
from two lines, and a tensor held only by the remembered frame, freed in the program that follows."""

from __future__ import annotations

import sys

import torch

from bench import _hot
from remote_autograd import client
from remote_autograd.client.session import _steps

TORCH_FILE = torch.__file__  # code compiled under torch's name: what the walk skips as torch's


def _torch_code(source: str) -> dict:
    names: dict = {}
    exec(compile(source, TORCH_FILE, "exec"), names)
    return names


def _wheres(sess) -> list:
    return [o.where for o in sess._origins]


def test_ops_of_an_optimizer_and_of_clipping_name_the_users_lines():
    with client.connect(transport=client.InProcessTransport()) as sess, _steps.verifying():
        w = torch.nn.Parameter(torch.randn(4, 3, device=sess.device))
        opt = torch.optim.Adam([w], lr=0.1)
        for _ in range(2):
            (w * 2).sum().backward()
            sess.sync()
            clip_line = sys._getframe().f_lineno + 1
            torch.nn.utils.clip_grad_norm_([w], 1.0)
            step_line = clip_line + 2
            opt.step()
            lines = {where.rsplit(":", 1)[1] for where in _wheres(sess) if where}
            assert lines == {str(clip_line), str(step_line)}, lines
            sess.sync()


def test_a_generator_resumed_from_two_lines_names_each():
    gen = _torch_code("def doubling(t):\n    while True:\n        yield t * 2\n")["doubling"]
    with client.connect(transport=client.InProcessTransport()) as sess, _steps.verifying():
        steps = gen(sess.tensor(torch.ones(2)))
        first = sys._getframe().f_lineno + 1
        next(steps)
        next(steps)
        assert _wheres(sess)[-2:] == [f"{__file__}:{first}", f"{__file__}:{first + 1}"]


def test_a_tensor_the_remembered_frame_holds_is_freed_in_the_next_program():
    call = _torch_code("def call(t):\n    return t * 2\n")["call"]
    tap = _hot.Tap(client.InProcessTransport())
    with client.connect(transport=tap) as sess:
        x = sess.tensor(torch.ones(2))
        tid = x._id
        y = call(x)  # the frame of `call` is remembered, and with it its `t`
        del x
        with _hot.recording(tap) as programs:
            sess.sync()
        freed = [i for body in programs() for s in body["steps"] if s["kind"] == "free" for i in s["ids"]]
        assert tid in freed and y.tolist() == [2.0, 2.0]
