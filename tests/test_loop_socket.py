"""LoopSocket (service/engine/loop_socket.py), the fronts' and the engine's ZeroMQ sockets on the event loop:
what one turn posts for a peer leaves as one ZeroMQ message, in order, and the reader hands every message
of every ZeroMQ message to its callback with the sender's routing id."""

from __future__ import annotations

import asyncio

import zmq

from bertserve.service.engine.loop_socket import LoopSocket
from bertserve.service.engine.messages import pack, unpack

TURN_S = 0.05  # a sleep that lets the loop flush what was posted


async def _posted(address: str, turns: list[int]) -> list[list]:
    """A LoopSocket DEALER posting `turns[k]` messages in turn k: each ZeroMQ message a plain ROUTER got,
    as its list of messages."""
    context = zmq.Context()
    router, dealer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    router.bind(address)
    dealer.connect(address)
    errors: list[BaseException] = []
    sending = LoopSocket(dealer, lambda peer, message: None, errors.append)
    sent = 0
    for count in turns:
        for _ in range(count):
            sending.post(("m", sent))
            sent += 1
        await asyncio.sleep(TURN_S)
    got = []
    while router.poll(1000 if not got else 100):
        got.append(unpack(router.recv_multipart(copy=False)[1:]))
    sending.close()
    context.destroy(linger=0)
    assert not errors
    return got


def test_what_one_turn_posts_leaves_as_one_message_in_order(tmp_path):
    got = asyncio.run(_posted(f"ipc://{tmp_path}/s", [50, 1, 3]))
    assert [len(messages) for messages in got] == [50, 1, 3]
    assert [message[1] for messages in got for message in messages] == list(range(54))


async def _read(address: str, batches: list[list]) -> list[tuple]:
    """A plain DEALER (routing id b"front-1") sending each of `batches` as one ZeroMQ message to a
    LoopSocket ROUTER: what its callback got, as (peer, message)."""
    context = zmq.Context()
    router, dealer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.ROUTING_ID, b"front-1")
    router.bind(address)
    dealer.connect(address)
    got: list[tuple] = []
    errors: list[BaseException] = []
    receiving = LoopSocket(
        router, lambda peer, message: got.append((peer, message)), errors.append, routed=True
    )
    for batch in batches:
        dealer.send_multipart(pack(batch))
    wanted = sum(len(batch) for batch in batches)
    for _ in range(100):  # bounded: 5 s
        if len(got) == wanted:
            break
        await asyncio.sleep(TURN_S)
    receiving.close()
    context.destroy(linger=0)
    assert not errors
    return got


def test_the_reader_hands_over_every_message_with_its_sender(tmp_path):
    got = asyncio.run(_read(f"ipc://{tmp_path}/r", [[("a", 1), ("a", 2), ("a", 3)], [("b", 4), ("b", 5)]]))
    assert got == [(b"front-1", (kind, n)) for kind, n in [("a", 1), ("a", 2), ("a", 3), ("b", 4), ("b", 5)]]
