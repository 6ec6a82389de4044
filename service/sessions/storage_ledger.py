"""``StorageLedger``: a session's bytes counted by storage, not by view.

A session holds memory through storages: a value, a grad, a view of a freed base, a
tensor the autograd graph saved (``engine.values.counting_saved``) all keep a storage alive, and two
views of one base keep it alive once. So the ledger keeps, per storage (keyed by its
``StorageImpl``, ``untyped_storage()._cdata``), its byte size and how many references
the session holds to it; a storage is charged when its first reference comes and
given back when its last goes. Counting by view (``value.nbytes``) let a client drive
the count down and negative: ``getitem`` one element, ``as_strided_`` that view to N
elements, free it (N elements given back for one charged); or ``x.data = y`` then free y.

Each ``CustomTensor`` records the keys it was counted under (``held``); a drop gives back
exactly those, so no op can make a drop give back more than was charged. Work is
O(tensors changed): a step calls ``hold`` for what it stores, ``drop`` for what it
frees and ``remeasure`` for what it changed in place (``resize_`` grows a storage,
``set_data`` and ``as_strided_`` point a tensor elsewhere); nothing rescans the session.

The entry keeps the storage object itself, so its address cannot be reused by another
storage while the entry is counted. Every call is made under the session's lock; the
one exception is ``unpin`` (an autograd node freed its saved tensors: that may happen
wherever the graph's last reference goes), which only queues the key for ``settle``.

The ledger is the one owner of the session's count (``held``: what its storages hold, and what
a running step reserved) and the only caller of its ``budgets`` (``Budget``: the server's and the
token's, shared with other sessions): each operation works out its net change and commits it once
(``_commit``), refused as a whole (413 naming the limit) or taken as a whole.
"""

from __future__ import annotations

from collections import deque
import threading
from typing import TYPE_CHECKING, Iterable

import torch

from remote_autograd.proto import ErrorCode, ProtocolError

if TYPE_CHECKING:  # the store holds the ledger: its tensors are only named here
    from .store import CustomTensor


class Budget:
    """Bytes held against ``limit``: by all sessions (``max_total_bytes``) or by one token's
    (``max_bytes_per_token``). Thread-safe. ``elsewhere`` counts bytes held outside this
    process that share the limit (the Ray backend sets it: a token's bytes on other workers)."""

    def __init__(self, limit: int, limit_name: str = "max_total_bytes", holder: str = "the server") -> None:
        self.limit = limit
        self.held = 0
        self.elsewhere = 0
        self.limit_name, self.holder = limit_name, holder
        self._lock = threading.Lock()

    def take(self, nbytes: int, anyway: bool = False) -> None:
        """Hold ``nbytes`` more, or 413 when that passes the limit (``anyway``: bytes that exist already)."""
        with self._lock:
            total = self.held + self.elsewhere + nbytes
            if total > self.limit and not anyway:
                raise ProtocolError(
                    ErrorCode.TOO_LARGE,
                    f"{self.holder} would hold {total} bytes across sessions: limit {self.limit_name}={self.limit}",
                )
            self.held += nbytes

    def give(self, nbytes: int) -> None:
        with self._lock:
            self.held -= nbytes


def storage_of(*tensors: torch.Tensor | None) -> list[tuple[object, object, int]]:
    """(key, what keeps the key unique while counted, bytes) of the memory each of ``tensors`` holds,
    ``None`` skipped (a tensor's pieces: ``storage_of(ct.value, ct.grad)``)."""
    pieces = []
    for t in tensors:
        if t is None:
            continue
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # no plain storage (sparse): counted as its dense size
            pieces.append((("tensor", id(t)), t, t.numel() * t.element_size()))
        else:
            pieces.append((storage._cdata, storage, storage.nbytes()))
    return pieces


class StorageLedger:
    """Per storage key: ``[storage, nbytes, references]``; ``held``, the session's bytes, charged to ``budgets``."""

    def __init__(self, budgets: tuple[Budget, ...] = ()) -> None:
        self.budgets = budgets
        self.held = 0  # the session's bytes: its storages' and a running step's reservation
        self._entries: dict[object, list] = {}
        self.dead: deque = deque()  # keys whose saved-tensor pin went away (appended from anywhere)
        self.closed = False
        self.pool = 0  # bytes the running step reserved for its outputs, not yet taken by a pin (``reserve``)

    def __len__(self) -> int:
        return len(self._entries)

    def counted(self) -> int:
        """The bytes of every storage counted (``held`` less reservations in flight)."""
        return sum(entry[1] for entry in self._entries.values())

    # -- a session's tensors ---------------------------------------------------------------

    def hold(self, cts: list[CustomTensor], limit: int) -> None:
        """Count ``cts`` (new tensors of the session), all or none: 413 when the storages
        they bring that the session does not hold yet would pass ``limit``."""
        if self.dead:
            self.settle()
        per_ct = [storage_of(ct.value, ct.grad) for ct in cts]
        self._count([piece for pieces in per_ct for piece in pieces], limit)
        for ct, pieces in zip(cts, per_ct):
            ct.held = tuple(key for key, _, _ in pieces)

    def drop(self, cts: Iterable[CustomTensor]) -> None:
        """``cts`` left the session: each reference they were counted under goes."""
        cts = list(cts)
        freed = self._settled() if self.dead else 0
        freed += self._forget([key for ct in cts for key in ct.held])
        for ct in cts:
            ct.held = ()
        if freed:
            self._commit(-freed)

    def remeasure(self, cts: Iterable[CustomTensor], give_back: int = 0) -> None:
        """Count ``cts`` again after a step changed them in place or gave them a new grad, and give
        back ``give_back`` bytes ``charge`` held for the change (a backward's room for its grads), in one
        commit.

        Never refuses: the bytes exist already (the step's meta check charged a growth before
        the kernel ran, ``meta_check``), and an honest count is what later charges compare with.
        """
        delta = (-self._settled() if self.dead else 0) - give_back
        for ct in cts:
            pieces = storage_of(ct.value, ct.grad)
            for key, keep, nbytes in pieces:  # new references first: a storage kept stays counted
                entry = self._entries.get(key)
                if entry is None:
                    delta += nbytes
                    self._entries[key] = [keep, nbytes, 1]
                    continue
                if entry[1] != nbytes:  # resize_ grew it
                    delta += nbytes - entry[1]
                    entry[1] = nbytes
                entry[2] += 1
            delta -= self._forget(ct.held)
            ct.held = tuple(key for key, _, _ in pieces)
        if delta:
            self._commit(delta)

    # -- what the autograd graph saved (``engine.values.counting_saved``) -----------------

    def pin(self, t: torch.Tensor, limit: int) -> object:
        """Count one more reference to ``t``'s storage (a graph node saved it); its key, for ``unpin``.
        413 when the storage is new to the session and would pass ``limit``. (No ``settle`` first:
        this runs for every tensor a graph saves, and the runner settles after every step; a storage
        counted already takes one more reference at once.)"""
        piece, = storage_of(t)
        entry = self._entries.get(piece[0])
        if entry is None:  # an op that saves its own output (exp) pins what its step reserved
            self._count([piece], limit)
        else:
            entry[2] += 1
        return piece[0]

    def reserve(self, nbytes: int, limit: int) -> None:
        """Charge what a step's kernel will allocate for its outputs (``meta_check``) before it runs;
        ``unreserve`` after its outputs are held. What the graph pins meanwhile, then the outputs'
        new storages (``hold``), come out of it first: a step's bytes are charged once."""
        self._commit(nbytes, limit)
        self.pool = nbytes

    def unreserve(self) -> None:
        """Give back what the step reserved and neither a pin nor its outputs took (``pool``; nothing to do
        when it is 0, as the runner knows)."""
        left, self.pool = self.pool, 0
        if left:
            self._commit(-left)

    def charge(self, nbytes: int, limit: int) -> None:
        """Hold ``nbytes`` that no storage brings yet (a backward's room for its grads, a load's file
        before it is read), or 413 naming the limit it would pass; ``release`` gives them back."""
        self._commit(nbytes, limit)

    def release(self, nbytes: int) -> None:
        self._commit(-nbytes)

    def unpin(self, key: object) -> None:
        """The node that saved it is gone; counted off at the next ``settle`` (this may run on any thread)."""
        if not self.closed:
            self.dead.append(key)

    def settle(self) -> None:
        """Give back what the pins that went away held."""
        freed = self._settled()
        if freed:
            self._commit(-freed)

    def close(self) -> None:
        """The session is gone: every byte goes back at once."""
        self.closed = True
        self._entries.clear()
        self.dead.clear()
        self._commit(-self.held)

    # -- the counts -------------------------------------------------------------------------

    def _count(self, pieces: list[tuple[object, object, int]], limit: int) -> None:
        """One more reference to each piece's storage (``storage_of``), all or none: the storages new to
        the session are charged, out of the running step's reservation first (``reserve``: already
        charged and checked), the rest against ``limit`` (413 past it, nothing counted)."""
        entries = self._entries
        new = {key: nbytes for key, _, nbytes in pieces if key not in entries}
        if new:
            nbytes = sum(new.values())
            from_pool = min(self.pool, nbytes)
            if nbytes > from_pool:
                self._commit(nbytes - from_pool, limit)
            self.pool -= from_pool
        for key, keep, nbytes in pieces:
            entry = entries.get(key)
            if entry is None:
                entries[key] = [keep, nbytes, 1]
            else:
                entry[2] += 1

    def _commit(self, delta: int, limit: int | None = None) -> None:
        """``held`` and every budget moved by ``delta``, at once. A growth with a ``limit`` is refused
        whole (413 naming the session's limit, or a budget's), leaving no trace; one without (bytes
        that exist already: a kernel grew a storage its meta check reserved) never is."""
        if not delta:
            return
        if delta > 0 and limit is not None:
            if self.held + delta > limit:
                raise ProtocolError(ErrorCode.TOO_LARGE,
                                    f"session would hold {self.held + delta} bytes: limit max_session_bytes={limit}")
            taken: list[Budget] = []
            try:
                for budget in self.budgets:
                    budget.take(delta)
                    taken.append(budget)
            except ProtocolError:
                for budget in taken:  # all or nothing: a refused charge leaves no trace
                    budget.give(delta)
                raise
        elif delta > 0:
            for budget in self.budgets:
                budget.take(delta, anyway=True)
        else:
            for budget in self.budgets:
                budget.give(-delta)
        self.held += delta

    def _settled(self) -> int:
        dead = self.dead  # appended from any thread: taken one by one
        return self._forget([dead.popleft() for _ in range(len(dead))])

    def _forget(self, keys: Iterable[object]) -> int:
        """One reference fewer to each key's storage; the bytes of the storages that lost their last."""
        if self.closed:
            return 0
        entries, freed = self._entries, 0
        for key in keys:
            entry = entries[key]
            entry[2] -= 1
            if not entry[2]:
                del entries[key]
                freed += entry[1]
        return freed
