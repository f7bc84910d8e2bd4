"""The crash states a recording implies, and how to lay one out on disk.

A crash after the first ``k`` operations leaves, in the bounded model ALICE and
CrashMonkey use (``kind`` of :class:`CrashState`):

* ``process``: every operation of the prefix (the process died, the machine did not);
* ``data-lost``: every entry operation, but the writes not yet made durable by a fsync
  of their file dropped (a file keeps the bytes it had at its last fsync);
* ``data-zeroed``: as ``data-lost``, but the unsynced writes leave zeros of their length
  (the file's size reached the disk, its blocks did not: delayed allocation);
* ``durable``: only what a fsync made durable: unsynced writes dropped, and entry
  operations (create, mkdir, rename, link, unlink, rmdir) lost unless a fsync of each
  directory they change came after them (POSIX's rule, stricter than ext4's journal);
* ``torn``: every operation before the last, which is a write, and that write cut at a
  4 KiB boundary of the file (the bytes after the cut never written).

Files and directories are inodes (see :mod:`crash_states.recorder`): an entry whose
directory's own entry is lost is unreachable, as on a real file system.
"""

from __future__ import annotations

import os
import random
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from crash_states.recorder import DATA_KINDS, ENTRY_KINDS, Op, Recording

BLOCK = 4096
KINDS = ("process", "data-lost", "data-zeroed", "durable", "torn")


@dataclass(frozen=True)
class CrashState:
    """A crash after ``prefix`` operations, of ``kind``; ``cut``: the torn write's
    bytes kept."""

    prefix: int
    kind: str
    cut: int = 0

    def describe(self, recording: Recording) -> str:
        last = recording.ops[self.prefix - 1].describe() if self.prefix else "nothing"
        torn = f", {self.cut} bytes of it kept" if self.kind == "torn" else ""
        return f"{self.kind} crash after op {self.prefix} ({last}{torn})"


class Tree:
    """The file system a crash state leaves: entries per directory inode, bytes per file
    inode (``None``: the file's bytes before the recording, unchanged)."""

    def __init__(self, recording: Recording, *, dry: bool = False) -> None:
        self.dry = dry
        self.entries: dict[int, dict[str, int]] = defaultdict(dict)
        self.dirs: set[int] = {0}
        self.content: dict[int, bytearray] = {}
        self.history: dict[int, list[tuple[int, int]]] = defaultdict(list)
        self.recording = recording
        for parent, name, node, is_dir in recording.initial:
            self.entries[parent][name] = node
            if is_dir:
                self.dirs.add(node)

    def apply_entry(self, op: Op) -> None:
        if op.kind in ("create", "mkdir"):
            self.entries[op.node][op.name] = op.new
            if op.kind == "mkdir":
                self.dirs.add(op.new)
            else:
                self.content[op.new] = bytearray()
        elif op.kind in ("rename", "link"):
            source = self.entries[op.node]
            if op.name in source:
                node = source[op.name] if op.kind == "link" else source.pop(op.name)
                self.entries[op.dest][op.dest_name] = node
        else:  # unlink, rmdir
            self.entries[op.node].pop(op.name, None)

    def _bytes(self, node: int, base: Path) -> bytearray:
        if node not in self.content:  # a file from before, or one whose entry is lost
            initial = self.recording.initial_files.get(node)
            self.content[node] = bytearray((base / initial).read_bytes() if initial else b"")
        return self.content[node]

    def apply_data(
        self, op: Op, index: int, base: Path, *, zero: bool = False, cut: int = -1
    ) -> None:
        self.history[op.node].append((index, -2 if zero else cut))
        if self.dry:  # only the signature is wanted
            return
        data = self._bytes(op.node, base)
        if op.kind == "truncate":
            del data[op.size :]
            data.extend(bytes(op.size - len(data)))
        else:
            payload = op.data if cut < 0 else op.data[:cut]
            if zero:
                payload = bytes(len(payload))
            end = op.offset + len(payload)
            if len(data) < op.offset:
                data.extend(bytes(op.offset - len(data)))
            data[op.offset : end] = payload

    def walk(self) -> list[tuple[str, int]]:
        """Every reachable path (``a/b``) with its inode, directories before their
        entries."""
        found: list[tuple[str, int]] = []

        def visit(directory: int, prefix: str, seen: frozenset[int]) -> None:
            for name in sorted(self.entries.get(directory, {})):
                node = self.entries[directory][name]
                found.append((prefix + name, node))
                if node in self.dirs and node not in seen:
                    visit(node, f"{prefix}{name}/", seen | {node})

        visit(0, "", frozenset({0}))
        return found

    def signature(self) -> tuple[object, ...]:
        """Equal for two trees with the same paths, inodes and applied writes."""
        return tuple((path, node, tuple(self.history.get(node, ()))) for path, node in self.walk())

    def write_to(self, target: Path, base: Path) -> None:
        """Lay the tree out in the new directory ``target``; files unchanged since the
        recording began are copied from ``base`` (the snapshot taken before it)."""
        target.mkdir(parents=True)
        for path, node in self.walk():
            where = target / path
            if node in self.dirs:
                where.mkdir()
            elif node in self.content:
                where.write_bytes(self.content[node])
            else:
                shutil.copyfile(base / self.recording.initial_files[node], where)


def _synced_after(ops: list[Op], prefix: int) -> dict[int, list[int]]:
    """For each inode, the indices (below ``prefix``) of its fsyncs."""
    synced: dict[int, list[int]] = defaultdict(list)
    for index, op in enumerate(ops[:prefix]):
        if op.kind == "fsync":
            synced[op.node].append(index)
    return synced


def build(recording: Recording, state: CrashState, base: Path, *, dry: bool = False) -> Tree:
    """The tree ``state`` leaves (``base``: the snapshot of the tree before; ``dry``:
    only its signature, no bytes)."""
    ops = recording.ops
    tree = Tree(recording, dry=dry)
    if state.kind == "torn":
        for index, op in enumerate(ops[: state.prefix - 1]):
            _apply(tree, op, index, base)
        last = state.prefix - 1
        tree.apply_data(ops[last], last, base, cut=state.cut)
        return tree
    synced = _synced_after(ops, state.prefix)

    def durable(index: int, nodes: tuple[int, ...]) -> bool:
        return all(any(s > index for s in synced.get(n, ())) for n in nodes)

    for index, op in enumerate(ops[: state.prefix]):
        if state.kind == "process":
            _apply(tree, op, index, base)
        elif op.kind in ENTRY_KINDS:
            if state.kind != "durable" or durable(index, op.parents()):
                tree.apply_entry(op)
        elif op.kind in DATA_KINDS:
            if durable(index, (op.node,)):
                tree.apply_data(op, index, base)
            elif state.kind == "data-zeroed" and op.kind == "write":
                tree.apply_data(op, index, base, zero=True)
    return tree


def _apply(tree: Tree, op: Op, index: int, base: Path) -> None:
    if op.kind in ENTRY_KINDS:
        tree.apply_entry(op)
    elif op.kind in DATA_KINDS:
        tree.apply_data(op, index, base)


TEARS_LONG = 16
"""Tear points per write in the long run (a 1 MiB write has 255 boundaries)."""


def tear_points(op: Op, *, every: bool) -> list[int]:
    """The lengths a torn ``op`` keeps: 4 KiB boundaries of the file strictly inside
    the write, evenly spaced, the first and last among them: up to
    :data:`TEARS_LONG` (``every``) or 3."""
    start = op.offset
    end = op.offset + len(op.data)
    first = (start // BLOCK + 1) * BLOCK
    boundaries = list(range(first, end, BLOCK))
    most = TEARS_LONG if every else 3
    if len(boundaries) > most:
        last = len(boundaries) - 1
        boundaries = [boundaries[round(i * last / (most - 1))] for i in range(most)]
    return [b - start for b in boundaries]


def enumerate_states(recording: Recording, *, every_tear: bool) -> list[CrashState]:
    """Every crash state of the model, in order of prefix (duplicates included)."""
    states: list[CrashState] = []
    for prefix in range(len(recording.ops) + 1):
        for kind in ("process", "data-lost", "data-zeroed", "durable"):
            states.append(CrashState(prefix, kind))
        if prefix and recording.ops[prefix - 1].kind == "write":
            for cut in tear_points(recording.ops[prefix - 1], every=every_tear):
                states.append(CrashState(prefix, "torn", cut))
    return states


def distinct_states(recording: Recording, base: Path, *, every_tear: bool) -> list[CrashState]:
    """The states leaving different trees (the first state of each), in prefix order."""
    seen: set[tuple[object, ...]] = set()
    distinct: list[CrashState] = []
    for state in enumerate_states(recording, every_tear=every_tear):
        key = build(recording, state, base, dry=True).signature()
        if key not in seen:
            seen.add(key)
            distinct.append(state)
    return distinct


def sample(states: list[CrashState], budget: int | None, seed: int) -> list[CrashState]:
    """``budget`` of ``states`` chosen with ``seed`` (all when ``budget`` is None or
    larger), always with those after the last operation (the save completed) among them."""
    if budget is None or budget >= len(states):
        return states
    last = max(state.prefix for state in states)
    final = [s for s in states if s.prefix == last]
    rest = [s for s in states if s.prefix != last]
    chosen = random.Random(seed).sample(rest, max(0, budget - len(final)))
    return sorted(final + chosen, key=lambda s: (s.prefix, KINDS.index(s.kind), s.cut))


def snapshot(root: Path, target: Path) -> None:
    """A copy of ``root`` (regular files and directories) at ``target``."""
    shutil.copytree(root, target, symlinks=True)
    os.sync()
