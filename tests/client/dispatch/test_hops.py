"""The SDK's path for one op stays short: ``bench/client_hops.py``'s count for one ``a + b``.

8 calls into the client package across 3 files, pipelined (18 across 7 before issue 32's walk, 35
across 10 before the SDK's rooms). The bound leaves room for a small change; a new layer of calls
per op would cross it. The whole walk, client, wire and server, is ``bench/op_hops.py``'s (``tests/bench``).
"""

from __future__ import annotations

from bench.client_hops import figures, trace_one_add


def test_one_add_on_two_remote_tensors_makes_few_calls_inside_the_sdk():
    for requires_grad in (False, True):
        calls = trace_one_add(requires_grad)
        n, distinct, files = figures(calls)
        assert n <= 10 and files <= 4, calls
        names = [name for _, name in calls]
        assert names[0] == "RemoteTensor.__torch_function__" and "call_op" in names, names
        assert names.count("call_op") == 1, "one verb, called once: no second builder on the way"
