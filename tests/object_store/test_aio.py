"""Requests run together stand or fall together: the first failure cancels the rest."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest

from ckptstore.object_store._aio import gather_all


def test_results_come_back_in_order() -> None:
    async def double(value: int) -> int:
        return value * 2

    assert asyncio.run(gather_all([partial(double, i) for i in range(5)])) == [0, 2, 4, 6, 8]


def test_the_first_failure_cancels_the_others_and_is_raised() -> None:
    cancelled: list[str] = []

    async def waits_forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append("waiter")
            raise

    async def fails() -> None:
        raise ConnectionResetError("gone")

    with pytest.raises(ConnectionResetError, match="gone"):
        asyncio.run(gather_all([waits_forever, fails]))
    assert cancelled == ["waiter"]
