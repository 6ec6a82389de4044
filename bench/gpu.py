"""``gpu``: the GPT step with the server on the GPU, beside local torch on the same GPU, with CUDA-graph
replay off and on. Runs only where ``torch.cuda.is_available()``; says so and skips elsewhere.

Two servers, started with ``REMOTE_AUTOGRAD_DEVICE=cuda`` and ``REMOTE_AUTOGRAD_CUDA_GRAPHS`` off and
on, each measured through the SDK on loopback. The GPT step (AdamW and a cosine schedule: new floats
every step; clipping, whose coefficient is read on the host) is never
captured (``service/engine/graph_steps.py`` says which programs are); the MLP step with SGD at a
fixed learning rate is, so its rows show what a replay saves. Whether replay is really there is read from the
server's own answers (``/healthz`` and the session-creation answer): where neither names it, the
row says "replay not reported" and is labelled by the setting alone. The server's part of a step
(its worker's time, from ``Server-Timing``) is the figure to hold against local torch.

Then the same two steps as templates (``bench/server_compile.py``): the server's time for one run
the plain way, compiled by inductor, and compiled with CUDA graphs (inductor's cudagraph trees), with
each compile's time cold and warm.
"""

from __future__ import annotations

import copy

import httpx
import torch

from remote_autograd import client
from remote_autograd.proto import PROTOCOL_HEADER, PROTOCOL_VERSION

from . import _hot, server_compile
from ._util import measure, requests_per_step, row, serve
from .real_model import HEADER, build_gpt, gpt_data, gpt_step
from .step_parts import print_breakdown, print_client_cost, step_parts
from .training import _mlp, _step_fn

GRAPHS_SETTING = "REMOTE_AUTOGRAD_CUDA_GRAPHS"
_OFF = {False, 0, "0", "off", "false", "disabled", None}


def replay_reported(answers: list[dict]) -> bool | None:
    """What the server's answers say of CUDA-graph replay: the value of the first field (at any depth)
    whose name mentions graphs, as on or off; None where no field does."""
    for answer in answers:
        for key, value in answer.items():
            if isinstance(value, dict):
                nested = replay_reported([value])
                if nested is not None:
                    return nested
            elif "graph" in key.lower():
                return (value.lower() if isinstance(value, str) else value) not in _OFF
    return None


def server_answers(url: str) -> list[dict]:
    """``/healthz`` and the answer to a new session (deleted again): what a server says of itself."""
    with httpx.Client(base_url=url, headers={PROTOCOL_HEADER: PROTOCOL_VERSION}, timeout=30) as http:
        created = http.post("/v1/sessions", json={}).json()
        http.delete(f"/v1/sessions/{created['session_id']}")
        return [http.get("/healthz").json(), created]


def _replay_label(setting: str, reported: bool | None) -> str:
    if reported is None:
        return f"{GRAPHS_SETTING}={setting}, replay not reported by the server"
    return f"{GRAPHS_SETTING}={setting}, replay {'on' if reported else 'off'}"


def _gpu_servers():
    """A server on the GPU with graphs off, then one with graphs on: (label, session, tap) of each."""
    for setting in ("off", "on"):
        env = {"REMOTE_AUTOGRAD_DEVICE": "cuda", GRAPHS_SETTING: setting}
        with serve(["-m", "remote_autograd.service"], env) as gpu_url:
            label = _replay_label(setting, replay_reported(server_answers(gpu_url)))
            tap = _hot.Tap()
            with client.connect(gpu_url, transport=tap) as sess:
                yield label, sess, tap


def run(url: str | None = None, repeat: int = 30) -> None:
    print(f"\n[gpu] {HEADER}; the server on the GPU against local torch on the same GPU")
    if not torch.cuda.is_available():
        print("  skipped: torch.cuda.is_available() is False (no CUDA device here)")
        return
    print(f"  {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    base, data = build_gpt(), gpt_data()
    local = row("local torch on cuda", measure(gpt_step(copy.deepcopy(base), "cuda", data), repeat=repeat, warmup=5))
    for label, sess, tap in _gpu_servers():
        step = gpt_step(copy.deepcopy(base), sess.device, data)
        times = measure(step, repeat=repeat, warmup=5)
        print(f"  {label}")
        row("  remote on cuda, the same loop", times, local,
            f"{requests_per_step(sess, step):.1f} requests/step")
        parts = step_parts(sess, tap, step)
        print_breakdown(parts)
        print_client_cost(parts)
        print(f"  {'  server time (worker) / local torch':<48} {parts.worker * 1e6 / local:9.2f}x"
              "   (target <= 1.2x)")
    _mlp_sgd_rows(repeat)
    _template_rows(repeat)


def _mlp_sgd_rows(repeat: int) -> None:
    """The MLP step with SGD at a fixed learning rate: a program the server captures."""
    print("\n[gpu] MLP 784-128-10, SGD lr=0.1, batch 64: graphs off and on")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g)
    base = _mlp()
    local_model = copy.deepcopy(base).cuda()
    local_step = _step_fn(local_model, torch.optim.SGD(local_model.parameters(), lr=0.1), x.cuda(), y.cuda())
    local = row("local torch on cuda", measure(local_step, repeat=repeat, warmup=5))
    for label, sess, tap in _gpu_servers():
        model = sess.module(copy.deepcopy(base))
        step = _step_fn(model, torch.optim.SGD(model.parameters(), lr=0.1), sess.tensor(x), sess.tensor(y))
        times = measure(step, repeat=repeat, warmup=5)
        print(f"  {label}")
        row("  remote on cuda", times, local)
        parts = step_parts(sess, tap, step)
        print(f"  {'  server time (worker) / local torch':<48} {parts.worker * 1e6 / local:9.2f}x")


def _template_rows(repeat: int) -> None:
    """The MLP and GPT steps as templates on the GPU: plain, compiled, compiled with CUDA graphs."""
    print("\n[gpu] the MLP and GPT steps as templates: a run's server time, plain against compiled (in process)")
    missing = server_compile.compiler_missing()
    if missing:
        print(f"  skipped: {missing}")
        return
    cuda = torch.device("cuda")
    for label, loop in (("MLP step", server_compile.mlp_loop()), ("GPT step", server_compile.gpt_loop())):
        case = server_compile.program_case(label, loop)
        server_compile.print_server_times(label, case, repeat, device=cuda)
        server_compile.print_server_times(f"{label}, CUDA graphs", case, repeat, device=cuda, cuda_graphs=True)
