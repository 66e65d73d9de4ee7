"""FrameLink (service/engine/frame_link.py), one front's connection to the engine: what one turn posts leaves
as one frame, in order, after what it gathered; the reader takes frames however the socket splits them, small
ones through its shared buffer, large ones (out-of-band arrays, or above its buffer) into memory their arrays
own; a gathered message that cannot be built or pickled fails its own items and nothing else."""

from __future__ import annotations

import asyncio
import socket

import numpy as np

from bertserve.service.engine import frame_link
from bertserve.service.engine.frame_link import FrameLink
from bertserve.service.engine.messages import IN_BAND_BYTES, unpack
from tests.helpers.links import linked, none_failed, until


def _frames(data: bytes) -> list[list]:
    """The frames in `data` as written by FrameLink, each as its list of messages."""
    out, at = [], 0
    while at < len(data):
        parts, at = frame_link.frame_parts(data, at)
        out.append(unpack(parts))
    return out


async def _posted(turns: list[list]) -> bytes:
    """What a FrameLink wrote when it posted turns[k]'s messages in turn k (read as it comes)."""
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    _, link = await loop.create_unix_connection(
        lambda: FrameLink(lambda _, m: None, lambda exc: None), sock=ours
    )
    data = bytearray()

    async def read() -> None:
        while chunk := await loop.sock_recv(theirs, 1 << 20):
            data.extend(chunk)

    reading = asyncio.ensure_future(read())
    for messages in turns:
        for message in messages:
            link.post(message)
        await asyncio.sleep(0.02)
    link.close()  # after what it holds is written: the reader then sees the end
    await asyncio.wait_for(reading, 10)
    theirs.close()
    return bytes(data)


def test_what_one_turn_posts_leaves_as_one_frame_in_order():
    turns = [[("m", n) for n in range(50)], [("m", 50)], [("m", n) for n in range(51, 54)]]
    frames = _frames(asyncio.run(_posted(turns)))
    assert [len(messages) for messages in frames] == [50, 1, 3]
    assert [message[1] for messages in frames for message in messages] == list(range(54))


async def _read(data: bytes, chunk: int, messages: int) -> list:
    """What a FrameLink handed over when `data` came `chunk` bytes at a time."""
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    got: list = []
    await loop.create_unix_connection(
        lambda: FrameLink(lambda _, m: got.append(m), lambda exc: None), sock=ours
    )
    for at in range(0, len(data), chunk):
        await loop.sock_sendall(theirs, data[at : at + chunk])
    for _ in range(200):  # bounded: 10 s
        if len(got) >= messages:
            break
        await asyncio.sleep(0.05)
    theirs.close()
    return got


def test_frames_arrive_whole_however_the_socket_splits_them():
    large = np.arange(IN_BAND_BYTES // 4 * 3, dtype=np.float32)  # out of band: memory of its own
    huge = b"x" * (frame_link.READ_BUFFER_BYTES + 10)  # in band, larger than the shared buffer
    turns = [[("a", 1), ("a", 2)], [("big", large)], [("huge", huge)]]
    data = asyncio.run(_posted(turns))
    for chunk in (len(data), 7_001, 65_537):
        got = asyncio.run(_read(data, chunk, 4))
        assert [m[0] for m in got] == ["a", "a", "big", "huge"]
        assert np.array_equal(got[2][1], large) and got[3][1] == huge
        assert got[2][1].base is not None  # a view of the frame's own memory, not of the shared buffer
    head = asyncio.run(_posted([[("a", 1), ("a", 2)]]))  # a few bytes at a time: the head split too
    assert asyncio.run(_read(head, 3, 2)) == [("a", 1), ("a", 2)]


def test_gathered_items_leave_as_one_message_before_the_posted_ones():
    async def scenario():
        link, received = await linked()
        link.gather(lambda items: ("many", tuple(items)), 1, none_failed)
        link.post(("one",))  # a cancel of a call gathered in this turn must come after it
        link.gather(lambda items: ("many", tuple(items)), 2, none_failed)  # another build: its own message
        await until(lambda: len(received) == 3)
        link.close()
        return received

    received = asyncio.run(scenario())
    assert received[2] == ("one",) and sorted(received[:2]) == [("many", (1,)), ("many", (2,))]


def test_a_message_that_cannot_be_built_fails_its_items_alone_and_the_link_goes_on():
    def broken(items):
        raise ValueError("cannot build")

    async def scenario():
        link, received = await linked()
        failed: list = []
        link.gather(broken, "a", lambda items, error: failed.append((items, str(error))))
        link.gather(lambda items: ("many", tuple(items)), "b", none_failed)
        link.post(("one",))
        await until(lambda: len(received) == 2)
        link.post(("two",))  # the next turn's frame is written as usual
        link.gather(lambda items: ("many", tuple(items)), "c", none_failed)
        await until(lambda: len(received) == 4)
        link.close()
        return received, failed

    received, failed = asyncio.run(scenario())
    assert failed == [(["a"], "cannot build")]
    assert received == [("many", ("b",)), ("one",), ("many", ("c",)), ("two",)]


def test_a_failed_callback_that_raises_or_a_message_that_does_not_pickle_loses_nothing_else():
    def raising(items, error):
        raise RuntimeError("a broken callback")

    async def scenario():
        link, received = await linked()
        failed: list = []
        link.post(("done", 1))
        link.gather(lambda items: 1 / 0, "a", raising)  # its build raises, then its callback
        link.gather(
            lambda items: ("odd", lambda: None), "b", lambda items, e: failed.append(items)
        )  # no pickle
        link.gather(lambda items: ("many", tuple(items)), "c", none_failed)
        await until(lambda: len(received) == 2)
        await asyncio.sleep(0.05)  # nothing more comes
        link.close()
        return received, failed

    received, failed = asyncio.run(scenario())
    assert received == [("many", ("c",)), ("done", 1)] and failed == [["b"]]
