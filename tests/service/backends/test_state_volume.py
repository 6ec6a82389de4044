"""Sessions across a graceful restart: tensors with their layouts and aliasing, grads, generators, program ids.

The layout tests rebuild tensors in this process (``service/sessions/tensor_snapshot.py``) and
compare them with the torch tensors they came from; the volume tests save a real
``LocalSessions`` and restore it into another (``service/backends/state_volume.py``); the
restart tests send a real server SIGTERM between training steps (tests/e2e/test_restart.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgpack
import pytest
import torch

from remote_autograd.proto import MSGPACK, decode_tensor
from remote_autograd.service.backends import state_volume
from remote_autograd.service.backends.local_sessions import LocalSessions
from remote_autograd.service.ops import load_configured_ops
from remote_autograd.service.settings import Settings
from remote_autograd.service.sessions.tensor_snapshot import rebuild, snapshot
from remote_autograd.service.sessions.store import CustomTensor

from ...servers import call, put, ref


def _round_trip(tensors: dict[str, CustomTensor]) -> dict[str, CustomTensor]:
    layout, storages = snapshot(tensors)
    layout = msgpack.unpackb(msgpack.packb(layout))  # as the volume stores it: plain values only
    return dict(rebuild(layout, [s.clone() for s in storages]))  # over bytes of their own, as read back


def _held() -> dict[str, CustomTensor]:
    w = torch.randn(4, 3, requires_grad=True)
    w.grad = torch.randn(4, 3)
    with torch.no_grad():
        quiet = w[0]  # a view made under no_grad
    f = torch.arange(6.0)
    z = torch.tensor([1 + 2j, 3 - 1j])
    return {"w": CustomTensor(w, w.grad), "row": CustomTensor(w[1]), "wt": CustomTensor(w.t()),
            "alias": CustomTensor(w.detach()), "quiet": CustomTensor(quiet),
            "bits": CustomTensor(f[2:].view(torch.int32)), "f": CustomTensor(f),
            "loss": CustomTensor((w * 2).sum()), "lone": CustomTensor(torch.randn(5)[1:4]), "conj": CustomTensor(z.conj()),
            "negated": CustomTensor(torch._neg_view(z))}


def test_values_layouts_and_flags_come_back_as_they_were():
    before = _held()
    after = _round_trip(before)
    for tid, ct in before.items():
        got = after[tid]
        assert torch.equal(got.value.detach(), ct.value.detach()), tid
        assert (got.value.stride(), got.value.storage_offset()) == (ct.value.stride(), ct.value.storage_offset()), tid
        assert (got.value.requires_grad, got.value.is_leaf) == (ct.value.requires_grad, ct.value.is_leaf), tid
        assert (got.grad is None) == (ct.grad is None) and (ct.grad is None or torch.equal(got.grad, ct.grad)), tid
    assert after["w"].value.is_leaf and not after["row"].value.is_leaf and after["alias"].value._base is None
    assert after["lone"].value.untyped_storage().nbytes() == 5 * 4  # the whole storage, not just the view


def test_ids_that_shared_memory_share_it_again_with_their_version_counters():
    after = _round_trip(_held())
    w, row, wt, alias, quiet = (after[k].value for k in ("w", "row", "wt", "alias", "quiet"))
    pointers = {t.untyped_storage().data_ptr() for t in (w, row, wt, alias, quiet)}
    assert len(pointers) == 1 and after["bits"].value.untyped_storage().data_ptr() == after["f"].value.data_ptr()
    versions = [t._version for t in (row, wt, alias, quiet)]
    with torch.no_grad():
        w.add_(1.0)  # written through the root: seen through every alias, and autograd knows
    assert torch.equal(row, w[1]) and torch.equal(alias, w.detach())
    assert [t._version for t in (row, wt, alias, quiet)] == [v + 1 for v in versions]
    after["f"].value[2] = 1.5
    assert after["bits"].value[0].item() == torch.tensor(1.5).view(torch.int32).item()


def test_gradients_flow_through_restored_views_and_a_lost_graph_fails_loudly():
    before, after = _held(), _round_trip(_held())
    local_w = before["w"].value
    local_w.grad = None
    (before["row"].value * 3).sum().backward()  # through a view, in torch
    w = after["w"].value
    w.grad = None
    (after["row"].value * 3).sum().backward()  # through the rebuilt view
    assert torch.equal(w.grad, local_w.grad)
    quiet = after["quiet"].value  # made under no_grad, as before: a leaf, and torch's error for in-place on it
    assert quiet.is_leaf and quiet.requires_grad == before["quiet"].value.requires_grad
    with pytest.raises(RuntimeError, match="created in no_grad mode"):
        quiet.mul_(2)
    with pytest.raises(RuntimeError, match="lost when the server restarted"):
        after["loss"].value.backward()


# -- the volume, with real sessions --------------------------------------------------------


def _program(local: LocalSessions, sid: str, owner, pid: str, steps: list) -> tuple[int, dict]:
    body = msgpack.packb({"id": pid, "steps": steps}, use_bin_type=True)

    async def run():
        async with local.answer_program(sid, owner, body, MSGPACK, MSGPACK) as answer:
            return answer.status, msgpack.unpackb(b"".join(bytes(p) for p in answer.parts))

    return asyncio.run(run())


TRAIN = [put("w", [1.0, 2.0, 3.0], requires_grad=True), call("mul", ref("w"), 2.0, out=["y"]),
         call("sum", ref("y"), out=["loss"]), {"kind": "backward", "tensors": ["loss"]},
         call("randn", 3, out=["r1"])]
DRAW = [call("randn", 3, out=["r2"]), {"kind": "fetch", "id": "r2"}, {"kind": "fetch", "id": "w"}]


def test_a_restored_session_goes_on_as_the_uninterrupted_one(tmp_path: Path):
    load_configured_ops((), test_ops=False)
    settings = Settings(tokens=("tok", "other"), tenant_processes="off", state_dir=str(tmp_path))
    first = LocalSessions(settings)
    sid = asyncio.run(first.create_session("tok"))["session_id"]
    assert _program(first, sid, "tok", "p1", TRAIN)[0] == 200
    state_volume.save_all(first, settings)
    assert [p.name for p in tmp_path.iterdir()] == [state_volume.tenant_dir(tmp_path, "tok").name]
    uninterrupted = _program(first, sid, "tok", "p2", DRAW)
    second = LocalSessions(settings)
    state_volume.restore_all(second, settings)
    assert not any(tmp_path.iterdir())  # restored once: a later crash cannot bring it back
    status, body = _program(second, sid, "tok", "p1", TRAIN)  # a retry of a program that ran: never twice
    assert status == 409 and "before the server restarted" in body["error"]["message"]
    assert _program(second, sid, "tok", "p2", DRAW) == uninterrupted  # the same draw, the same w and grad
    with pytest.raises(Exception, match="unknown session"):
        asyncio.run(second.describe_session(sid, "other"))  # still the token's own
    first.shutdown(), second.shutdown()


def test_templates_are_not_written_a_run_after_the_restart_asks_for_the_template_again(tmp_path: Path):
    load_configured_ops((), test_ops=False)
    settings = Settings(tenant_processes="off", state_dir=str(tmp_path))
    double = {"kind": "template", "id": "T", "inputs": [{"id": "x", "dtype": "float32", "shape": [3]}],
              "steps": [call("mul", ref("x"), 2.0, out=["y"])], "outputs": ["y"]}
    run = {"kind": "run_template", "template": "T", "inputs": [ref("w")], "out": ["y1"]}
    first = LocalSessions(settings)
    sid = asyncio.run(first.create_session(None))["session_id"]
    assert _program(first, sid, None, "p1", [put("w", [1.0, 2.0, 3.0]), double, run])[0] == 200
    state_volume.save_all(first, settings)
    second = LocalSessions(settings)
    state_volume.restore_all(second, settings)
    status, body = _program(second, sid, None, "p2", [{**run, "out": ["y2"]}])
    assert status == 404 and body["error"]["code"] == "unknown_template", body
    status, body = _program(second, sid, None, "p3", [double, {**run, "out": ["y2"]}, {"kind": "fetch", "id": "y2"}])
    assert status == 200 and decode_tensor(body["results"][2]["tensor"]["value"]).tolist() == [2.0, 4.0, 6.0]
    assert _program(second, sid, None, "p4", [{"kind": "fetch", "id": "y1"}])[0] == 200  # the first run's output stays
    first.shutdown(), second.shutdown()


def test_a_tenant_no_longer_configured_is_left_on_the_volume(tmp_path: Path):
    load_configured_ops((), test_ops=False)
    old = Settings(tokens=("gone",), state_dir=str(tmp_path))
    local = LocalSessions(old)
    sid = asyncio.run(local.create_session("gone"))["session_id"]
    assert _program(local, sid, "gone", "p", [put("x", [1.0])])[0] == 200
    state_volume.save_all(local, old)
    fresh = LocalSessions(Settings(tokens=("new",), state_dir=str(tmp_path)))
    state_volume.restore_all(fresh, fresh.settings)
    assert len(fresh.store) == 0 and state_volume.tenant_dir(tmp_path, "gone").is_dir()
    assert "gone" not in "".join(p.name for p in tmp_path.iterdir())  # named by a digest, never the token
    local.shutdown(), fresh.shutdown()


FORWARD = [put("w", [1.0, 2.0, 3.0], requires_grad=True), call("mul", ref("w"), 2.0, out=["y"]),
           call("sum", ref("y"), out=["loss"])]


@pytest.mark.parametrize("after", [
    [{"kind": "backward", "tensors": ["loss"]}],
    [{"kind": "backward", "tensors": ["loss"], "inputs": ["w"]}],
    [{"kind": "grad", "outputs": ["loss"], "inputs": ["w"], "out": ["g"]}],
    # a graph built after the restart on a lost one, whose restored tensor the client has freed since
    [call("mul", ref("loss"), 3.0, out=["z"]), {"kind": "free", "ids": ["loss", "y"]},
     {"kind": "backward", "tensors": ["z"]}],
], ids=["backward", "backward-inputs", "grad", "graph-on-a-lost-one"])
def test_a_backward_through_a_graph_lost_in_the_restart_is_a_422(tmp_path: Path, after: list):
    """SPEC §10: ``autograd.grad`` with explicit inputs (every backward step runs so) skipped the
    lost graph's node, and the backward answered 200 with no gradient for ``w``."""
    load_configured_ops((), test_ops=False)
    settings = Settings(tenant_processes="off", state_dir=str(tmp_path))
    first = LocalSessions(settings)
    sid = asyncio.run(first.create_session(None))["session_id"]
    assert _program(first, sid, None, "forward", FORWARD)[0] == 200
    state_volume.save_all(first, settings)
    second = LocalSessions(settings)
    state_volume.restore_all(second, settings)
    status, body = _program(second, sid, None, "after", [*after, {"kind": "fetch", "id": "w"}])
    assert status == 422, body
    assert body["error"]["step"] == len(after) - 1 and "lost when the server restarted" in body["error"]["message"]
    status, body = _program(second, sid, None, "again", [call("mul", ref("w"), 2.0, out=["y2"]),
                                                          call("sum", ref("y2"), out=["l2"]),
                                                          {"kind": "backward", "tensors": ["l2"]},
                                                          {"kind": "fetch", "id": "w"}])
    grad = body["results"][-1]["tensor"]["grad"]
    assert status == 200 and torch.frombuffer(bytearray(grad["data"]), dtype=torch.float32).tolist() == [2.0] * 3
    first.shutdown(), second.shutdown()
