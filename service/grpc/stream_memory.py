"""The most memory open EmbedStreams can hold, whatever their clients do (read or not, send or not).

Per stream (service/grpc/streaming.py, service/grpc/admission.py):
- its window: inputs admitted and not yet answered and sent, at most max_stream_inputs_in_flight, or one
  request's inputs when a request is larger (at most max_inputs_per_request). Each input is held as the
  request read (UTF-8) and as the text handed to the tokenizer, and its answer until it is sent;
- its answers: at most max_message_bytes in all, computed or being computed and not yet sent (each
  request's worst case is reserved before it runs: a token-level or sparse answer is far larger than a
  vector, service/grpc/stream_window.py);
- one request read ahead of the window, waiting for room: at most max_message_bytes, as read and parsed;
- what gRPC reads ahead of the server on the stream: HTTP/2's initial window (bandwidth-delay probing is
  off, `admission.server_options`).
Streams beyond max_concurrent_streams are refused before they hold anything. Besides: the answer being
serialized on each of the CPU pool's threads exists twice more (its pieces and the joined message).
"""

from __future__ import annotations

from bertserve.service.settings import Settings

GRPC_STREAM_WINDOW = 64 * 1024  # HTTP/2's initial stream window, which gRPC keeps with BDP probing off
UTF8_MAX_BYTES = 4  # per character
SERIALIZING_THREADS = 2  # the CPU pool (service/supervisor/server.py), where large answers are serialized


def stream_bytes(window_inputs: int, input_bytes: int, answer_bytes: int, request_bytes: int) -> int:
    """One stream's worst case: `window_inputs` inputs of `input_bytes` (held twice) with answers of
    `answer_bytes`, one request of `request_bytes` read ahead (held twice), and gRPC's stream window."""
    window = window_inputs * (2 * input_bytes + answer_bytes)
    return window + 2 * request_bytes + GRPC_STREAM_WINDOW


def streams_bound(settings: Settings, dimension: int) -> int:
    """All streams' worst case at `settings`. The window's texts are at most max_stream_inputs_in_flight
    inputs of max_input_chars, or one request larger than the window, which runs alone and whose texts fit
    in one message; its answers at most max_message_bytes (any embedding model answers token-level
    vectors; `dimension` no longer matters: dense answers are within that too)."""
    window_text = max(
        settings.max_stream_inputs_in_flight * UTF8_MAX_BYTES * settings.max_input_chars,
        settings.max_message_bytes,
    )
    answers = settings.max_message_bytes
    per_stream = 2 * window_text + answers + 2 * settings.max_message_bytes + GRPC_STREAM_WINDOW
    serializing = SERIALIZING_THREADS * 2 * settings.max_message_bytes
    return settings.max_concurrent_streams * per_stream + serializing
