"""The ``remote`` device as torch sees it, and torch's rules about devices.

``_device`` (torch's PrivateUse1 backend renamed ``remote``: ``sess.device`` is
``torch.device("remote", k)``, its device module, which session an index names),
``_device_rule`` (a local tensor beside a remote one: torch's error, or the cases where torch
takes CPU tensors on purpose), ``_autocast`` (whether ``torch.autocast`` applies to remote ops,
and its dtype).
"""
