"""``data_ptr()``, ``untyped_storage()``, ``storage_offset()`` answer identities of server memory that
compare as torch's pointers do (views of one storage, offsets, clones, tied weights), never an address;
what only the server knows raises ``NotImplementedError``. And the small calls libraries make:
``torch.numel``, ``Module.to(tensor)``, ``Tensor.to(other)``. Each against the same code on CPU."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

# each: a tensor -> what torch code reads of its pointers (differences and equalities, never the numbers)
IDENTITIES = {
    "a view's storage is its base's": lambda x: x[1:].untyped_storage().data_ptr() == x.untyped_storage().data_ptr(),
    "a row view starts a row in": lambda x: x[1:].data_ptr() - x.data_ptr(),
    "a column view starts a column in": lambda x: x[:, 2].data_ptr() - x.data_ptr(),
    "a view of a view": lambda x: x[1:][1, 1:].data_ptr() - x.data_ptr(),
    "split": lambda x: [t.data_ptr() - x.data_ptr() for t in x.split(1)],
    "narrow then unsqueeze": lambda x: (x.narrow(1, 1, 2).unsqueeze(0).storage_offset(),
                                       x.narrow(1, 1, 2).unsqueeze(0).data_ptr() - x.data_ptr()),
    "transpose and reshape start where the base does": lambda x: (x.t().data_ptr() == x.data_ptr(),
                                                                   x.reshape(12).data_ptr() == x.data_ptr()),
    "a clone is other memory": lambda x: (x.clone().data_ptr() == x.data_ptr(),
                                          x.clone().untyped_storage().data_ptr() == x.untyped_storage().data_ptr()),
    "detach and .data alias": lambda x: (x.detach().data_ptr() == x.data_ptr(), x.data.data_ptr() == x.data_ptr(),
                                         x.data[1].data_ptr() - x.data_ptr(), x.detach()[2].storage_offset()),
    "an op's result is other memory": lambda x: (x + 1).untyped_storage().data_ptr() == x.untyped_storage().data_ptr(),
    "storage sizes": lambda x: (x[1:].untyped_storage().nbytes(), x.untyped_storage().size(),
                                len(x[2].untyped_storage())),
    "an empty tensor points nowhere": lambda x: x.new_zeros(0).data_ptr(),
}


@pytest.mark.parametrize("name", list(IDENTITIES))
def test_pointer_identities_compare_as_torchs(sess, name):
    local = torch.arange(12.0, dtype=torch.float64).reshape(3, 4)
    remote = local.to(sess.device)
    assert IDENTITIES[name](remote) == IDENTITIES[name](local)


def test_pointers_are_never_addresses(sess):
    x = torch.ones(3, device=sess.device)
    for ptr in (x.data_ptr(), x[1:].data_ptr(), x.untyped_storage().data_ptr()):
        assert 1 << 62 <= ptr < 1 << 63  # above every canonical user-space address, and an int64 as torch's


def _tied(device) -> nn.Module:
    torch.manual_seed(0)
    model = nn.ModuleDict({"embed": nn.Embedding(5, 3), "head": nn.Linear(3, 5, bias=False), "other": nn.Linear(3, 3)})
    model.head.weight = model.embed.weight
    return model.to(device)


def _tied_names(model: nn.Module) -> list[tuple[str, str]]:
    """peft's and Hugging Face's check: parameters whose pointers are equal are one tied weight."""
    params = list(model.named_parameters(remove_duplicate=False))
    return [(a, b) for i, (a, p) in enumerate(params) for b, q in params[i + 1:] if p.data_ptr() == q.data_ptr()]


def test_tied_weights_are_found_by_their_pointers(sess):
    assert _tied_names(_tied(sess.device)) == _tied_names(_tied("cpu")) == [("embed.weight", "head.weight")]
    copied = copy.deepcopy(_tied(sess.device))
    assert _tied_names(copied) == [("embed.weight", "head.weight")]
    assert copied.embed.weight.data_ptr() != _tied(sess.device).embed.weight.data_ptr()


def test_set_data_moves_a_tensor_to_the_other_memory_and_leaves_its_old_views(sess):
    def run(device):
        x = torch.arange(6.0, device=device)
        before = x[2:]
        x.data = torch.zeros(6, device=device)
        after = x[1:]
        return (before.data_ptr() == x.data_ptr() + 8, after.data_ptr() - x.data_ptr(),
                before.untyped_storage().data_ptr() == after.untyped_storage().data_ptr())

    assert run(sess.device) == run("cpu")
    model = nn.Linear(2, 2).to(sess.device)
    ptrs = [p.data_ptr() for p in model.parameters()]
    model.double()  # torch's Module._apply: param.data = the converted tensor
    assert len({p.data_ptr() for p in model.parameters()} | set(ptrs)) == 4


def test_what_only_the_server_knows_raises_not_implemented(sess):
    x = torch.arange(6.0, device=sess.device)
    picked = x[torch.tensor(2)]  # a view whose start depends on the index's value
    with pytest.raises(NotImplementedError, match="tensor index"):
        picked.data_ptr()
    with pytest.raises(NotImplementedError, match="tensor index"):
        picked.storage_offset()
    assert picked.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    reshaped = (x.view(2, 3).t() + 1).reshape(-1)  # a view or a copy: only the server knows
    with pytest.raises(NotImplementedError, match="a view or a copy"):
        reshaped.untyped_storage()
    with pytest.raises(NotImplementedError, match="bytes live on the server"):
        x.untyped_storage().tolist()


# -- the small calls -------------------------------------------------------------------------------


def test_torch_numel(sess):
    assert torch.numel(torch.ones(2, 3, device=sess.device)) == 6


def test_get_device_and_parameters_to_vector(sess):
    """``get_device()`` answers the device's index, as a cuda tensor's (``parameters_to_vector`` checks it)."""
    x = torch.ones(2, device=sess.device)
    assert x.get_device() == torch.get_device(x) == sess.device.index
    local = nn.Linear(3, 2)
    remote = copy.deepcopy(local).to(sess.device)
    for m in (local, remote):
        nn.utils.vector_to_parameters(nn.utils.parameters_to_vector(m.parameters()) * 2, m.parameters())
    for got, want in zip(remote.parameters(), local.parameters()):
        assert torch.equal(got.detach().cpu(), want.detach())


def test_module_to_another_tensor_takes_its_device_and_dtype(sess):
    """botorch's ``self.to(train_X)``: torch reads the tensor's device and dtype."""
    train_x = torch.randn(4, 2, dtype=torch.float64)
    local = nn.Linear(2, 1)
    remote = copy.deepcopy(local).to(train_x.to(sess.device))
    local.to(train_x)
    assert all(p.device == sess.device and p.dtype == torch.float64 for p in remote.parameters())
    torch.testing.assert_close(remote(train_x.to(sess.device)).cpu(), local(train_x))
    assert remote.to(train_x.to(sess.device)) is remote
    with pytest.raises(TypeError, match="floating point"):  # torch's own parsing and words
        remote.to(torch.ones(1, dtype=torch.int64, device=sess.device))


def test_tensor_to_another_tensor(sess):
    x = torch.arange(3.0)
    other = torch.zeros(1, dtype=torch.float64, device=sess.device)
    up = x.to(other)  # a local tensor to a remote one's device and dtype: an upload
    assert up.device == sess.device and up.dtype == torch.float64 and up.cpu().tolist() == [0.0, 1.0, 2.0]
    down = up.to(torch.zeros(1, dtype=torch.float32))  # and back: the local one's
    assert down.device.type == "cpu" and down.dtype == torch.float32
    assert up.to(other) is up
    with pytest.raises(RuntimeError, match="not differentiable"):
        x.requires_grad_().to(other)


def test_tensors_torch_load_builds_on_one_storage_share_its_memory(sess, tmp_path):
    base = torch.arange(6.0)
    torch.save({"a": base, "b": base[2:], "c": torch.ones(2)}, tmp_path / "state.pt")

    def identities(state):
        return (state["b"].data_ptr() - state["a"].data_ptr(),
                state["a"].untyped_storage().data_ptr() == state["b"].untyped_storage().data_ptr(),
                state["a"].untyped_storage().data_ptr() == state["c"].untyped_storage().data_ptr())

    assert identities(torch.load(tmp_path / "state.pt", map_location=sess.device)) == \
        identities(torch.load(tmp_path / "state.pt"))
