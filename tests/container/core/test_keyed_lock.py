"""One lock per key: holders of one key run one at a time, other keys do not wait, and idle keys are dropped."""

from __future__ import annotations

import asyncio

from container.core.keyed_lock import KeyedLocks


def test_one_holder_per_key_and_no_lock_kept_when_idle() -> None:
    async def go() -> list[str]:
        locks = KeyedLocks()
        order: list[str] = []
        release = asyncio.Event()

        async def hold(key: str, name: str, wait: bool) -> None:
            async with locks.hold(key):
                order.append(f"{name} in")
                if wait:
                    await release.wait()
                order.append(f"{name} out")

        first = asyncio.create_task(hold("slot-0", "a", True))
        await asyncio.sleep(0)
        second = asyncio.create_task(hold("slot-0", "b", False))
        other = asyncio.create_task(hold("slot-1", "c", False))
        await other  # another key does not wait for slot-0
        await asyncio.sleep(0)
        assert "b in" not in order
        release.set()
        await asyncio.gather(first, second)
        assert len(locks) == 0
        return order

    order = asyncio.run(go())
    assert order.index("a out") < order.index("b in")
    assert order.index("c out") < order.index("a out")
