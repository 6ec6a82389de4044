import torch

from remote_autograd import client


def test_end_to_end(sess):
    w = sess.tensor(torch.randn(4, 2), requires_grad=True)
    x = client.RemoteTensor.from_torch(torch.randn(3, 4), sess)
    loss = torch.nn.functional.relu(x @ w).sum()
    loss.backward()
    wl = w.to_torch().detach().requires_grad_()
    torch.relu(x.to_torch() @ wl).sum().backward()
    torch.testing.assert_close(w.grad.to_torch(), wl.grad)
