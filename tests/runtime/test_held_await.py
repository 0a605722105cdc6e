"""A parked read is awaited as :class:`~kuikproxy.runtime.heldread.HeldRead`, in no frame of its
own: however its wait ends, its waiter is unparked once, as the read's coroutine did it (P11)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from kuikproxy.core.images import Image
from kuikproxy.runtime.heldread import HeldRead
from kuikproxy.runtime.messages import Answer, Reply
from kuikproxy.runtime.proofs import Proofs


class Parking:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.unparked: list[bool] = []

    def unpark(self, waiter: object, *, cancelled: bool) -> None:
        self.unparked.append(cancelled)


def held() -> tuple[HeldRead, Any, Parking, list[tuple[str, str, float]]]:
    loop = asyncio.get_running_loop()
    parking, waits = Parking(loop), []
    request = SimpleNamespace(
        host="reg.test",
        operation="check",
        image=Image("reg.test", "app", "v1"),
        auth=None,
        signer=None,
    )
    waiter = SimpleNamespace(
        future=loop.create_future(), parking=parking, request=request, since=loop.time()
    )
    services = SimpleNamespace(
        waits=SimpleNamespace(observe=lambda host, op, s: waits.append((host, op, s))),
        flights=SimpleNamespace(proofs=Proofs(lambda host: 0)),
    )
    read = SimpleNamespace(services=services)
    return HeldRead(read, waiter), waiter, parking, waits  # type: ignore[arg-type]


async def test_an_answer_ends_the_wait_and_the_wait_is_counted() -> None:
    awaitable, waiter, parking, waits = held()
    answer = Answer(200, (), b"", "HEAD", 0.0, None)
    asyncio.get_running_loop().call_soon(waiter.future.set_result, answer)
    reply = await awaitable
    assert reply == Reply(answer=answer)
    assert parking.unparked == [False]
    assert [(h, op) for h, op, _ in waits] == [("reg.test", "check")]


async def test_a_cancelled_handler_unparks_as_cancelled_once() -> None:
    awaitable, _, parking, waits = held()

    async def handler() -> Reply:
        return await awaitable

    task = asyncio.ensure_future(handler())
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
    assert parking.unparked == [True] and waits == []


async def test_a_refusal_meanwhile_is_raised_after_unparking() -> None:
    awaitable, waiter, parking, _ = held()
    asyncio.get_running_loop().call_soon(waiter.future.set_exception, LookupError("refused"))
    with pytest.raises(LookupError):
        await awaitable
    assert parking.unparked == [False]


async def test_closed_while_it_waits_it_unparks_once() -> None:
    awaitable, waiter, parking, _ = held()
    iterator = awaitable.__await__()
    assert iterator.send(None) is waiter.future
    iterator.close()
    iterator.close()
    assert parking.unparked == [False]
