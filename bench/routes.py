"""The experts each engine routes every token to, and router replay (R3).

A *route* is the top-k expert set a router chose for one token position in one MoE layer:
routes of a sequence are an int tensor [positions, layers, k] (−1 where not known). Both
engines record theirs with forward hooks on the routers (bench/moe.py `routers`), which see
every router output `(logits, weights, experts)`:

- `DecodeRoutes`, the rollout engine (bench/engines/torch_engine.py): the prefill's routes at
  every prompt position, then one position per decode step for each live row, so a sample of P
  prompt and T response tokens carries the routes of positions 0 … P+T−2 (every input the
  engine ran; the last sampled token is never fed back).
- `TrainRoutes`, the training engine: for each forward over rows `rows` of a packed batch
  (prompt + response right-padded, position j of a row = position j of its rollout), the
  routes the trainer chooses, written into `chosen` [N, W, layers, k] while `recording`.
  With `replay` (R3, arXiv 2510.11370) the router's output is replaced: the experts are the
  rollout's at every position where they are known, and their weights the trainer's own
  softmax probabilities at those experts, renormalised as the router does (so the router
  still gets a gradient); `chosen` keeps what the trainer would have chosen.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from .moe import _renormalizes, routers

UNKNOWN = -1


class DecodeRoutes:
    """Record the rollout engine's routes over one batched decode of `rows` sequences of at most
    `max_len` positions (see the module docstring). Use as: `prefill(attn)` after the prompt's
    forward, `step(live)` after each decode forward, `sample(r)` for row r's routes, `close()`."""

    def __init__(self, model, rows: int, max_len: int):
        self.gates = routers(model)
        self.routes: torch.Tensor | None = None
        self.fill = torch.zeros(rows, dtype=torch.long)
        self.shape = (rows, max_len)
        self._last: list[torch.Tensor | None] = [None] * len(self.gates)
        self.handles = [g.register_forward_hook(self._hook(i)) for i, g in enumerate(self.gates)]

    def _hook(self, layer: int):
        def hook(module, args, output):
            self._last[layer] = output[2].detach().to("cpu", torch.int16)
        return hook

    def _taken(self) -> torch.Tensor:
        """The routes of the last forward, [tokens, layers, k]."""
        out = torch.stack(self._last, dim=1)
        self._last = [None] * len(self.gates)
        return out

    def prefill(self, attn: torch.Tensor, src: torch.Tensor | None = None) -> None:
        """The prompt forward over left-padded rows (`attn` [rows, W], 1 on real tokens); `src`:
        the forward ran over distinct prompts only, row r's being number src[r]."""
        got = self._taken()
        rows, width = attn.shape
        got = got.view(-1, width, *got.shape[1:])
        if src is not None:
            got = got[src.cpu()]
        if self.routes is None:
            self.routes = torch.full((*self.shape, *got.shape[2:]), UNKNOWN, dtype=torch.int16)
        a = attn.bool().cpu()
        for r in range(rows):
            n = int(a[r].sum())
            self.routes[r, :n] = got[r, a[r]]
            self.fill[r] = n

    def step(self, live: torch.Tensor) -> None:
        """One decode forward of one token for each row in `live` (original row indices)."""
        got = self._taken()
        live = live.cpu()
        self.routes[live, self.fill[live]] = got
        self.fill[live] += 1

    def sample(self, r: int) -> torch.Tensor | None:
        return None if self.routes is None else self.routes[r, :int(self.fill[r])].clone()

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def pad_routes(routes: list[torch.Tensor | None], width: int, layers: int, k: int) -> torch.Tensor:
    """The rollout's routes of N sequences as one tensor [N, width, layers, k], right-padded with
    UNKNOWN (as the training engine's packed batch is padded)."""
    out = torch.full((len(routes), width, layers, k), UNKNOWN, dtype=torch.long)
    for i, r in enumerate(routes):
        if r is not None:
            n = min(width, r.shape[0])
            out[i, :n] = r[:n].long()
    return out


def replayed(logits: torch.Tensor, own: torch.Tensor, replay: torch.Tensor, renormalize: bool,
             dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, experts) of router replay for tokens [N]: experts = `replay` [N, k] where it
    is known (no UNKNOWN in the row), else the router's `own` [N, k]; weights = p at those
    experts, p = softmax(logits) in fp32, divided by their sum when `renormalize`, in `dtype`."""
    known = (replay >= 0).all(-1, keepdim=True)
    experts = torch.where(known, replay.to(own.dtype), own)
    w = torch.softmax(logits.float(), dim=-1).gather(-1, experts)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return w.to(dtype), experts


class TrainRoutes:
    """The training engine's routes over one packed batch [N, W] (module docstring): `chosen`
    [N, W, layers, k] (UNKNOWN until a forward covers a position while `recording`), and the
    rollout's routes to `replay` there (same shape) or None."""

    def __init__(self, model, n: int, width: int, replay: torch.Tensor | None = None):
        self.gates = routers(model)
        self.k = self.gates[0].top_k if self.gates else 0
        self.chosen = torch.full((n, width, len(self.gates), self.k), UNKNOWN, dtype=torch.long)
        self.replay = replay
        self.recording = True
        self._rows: torch.Tensor | None = None
        self._width = width

    @contextmanager
    def forward(self, rows: torch.Tensor | list[int] | None, width: int | None = None):
        """Hooks for one forward over `rows` of the batch (None: all, in order), `width` positions."""
        self._rows = (torch.arange(self.chosen.shape[0]) if rows is None
                      else torch.as_tensor(rows, dtype=torch.long).cpu())
        self._width = self.chosen.shape[1] if width is None else width
        handles = [g.register_forward_hook(self._hook(i)) for i, g in enumerate(self.gates)]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def _hook(self, layer: int):
        def hook(module, args, output):
            logits, weights, own = output
            n, w = len(self._rows), self._width
            if own.shape[0] != n * w:        # not this batch's forward (e.g. a generation inside): leave it
                return None
            if self.recording:
                self.chosen[self._rows, :w, layer] = own.detach().view(n, w, -1).cpu().long()
            if self.replay is None:
                return None
            rep = self.replay[self._rows, :w, layer].reshape(n * w, -1).to(own.device)
            new_w, experts = replayed(logits, own, rep, _renormalizes(module), weights.dtype)
            return logits, new_w, experts
        return hook


@contextmanager
def routed(session: TrainRoutes | None, rows=None, width: int | None = None):
    """`session.forward(rows, width)`, or nothing when there is no session (a dense model)."""
    if session is None:
        yield None
        return
    with session.forward(rows, width) as s:
        yield s
