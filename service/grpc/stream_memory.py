"""The most memory open EmbedStreams can hold, whatever their clients do (read or not, send or not).

Per stream (service/grpc/streaming.py, service/grpc/admission.py):
- its window: inputs admitted and not yet answered and sent, at most max_stream_inputs_in_flight, or one
  request's inputs when a request is larger (at most max_inputs_per_request). Each input is held as the
  request read (UTF-8) and as the text handed to the tokenizer, and its answer until it is sent;
- one request read ahead of the window, waiting for room: at most max_message_bytes, as read and parsed;
- what gRPC reads ahead of the server on the stream: HTTP/2's initial window (bandwidth-delay probing is
  off, `admission.server_options`).
Streams beyond max_concurrent_streams are refused before they hold anything.
"""

from __future__ import annotations

from bertserve.service.settings import Settings

GRPC_STREAM_WINDOW = 64 * 1024  # HTTP/2's initial stream window, which gRPC keeps with BDP probing off
UTF8_MAX_BYTES = 4  # per character
ANSWER_OVERHEAD = 16  # protobuf framing per input's vector


def stream_bytes(window_inputs: int, input_bytes: int, answer_bytes: int, request_bytes: int) -> int:
    """One stream's worst case: `window_inputs` inputs of `input_bytes` (held twice) with answers of
    `answer_bytes`, one request of `request_bytes` read ahead (held twice), and gRPC's stream window."""
    window = window_inputs * (2 * input_bytes + answer_bytes)
    return window + 2 * request_bytes + GRPC_STREAM_WINDOW


def streams_bound(settings: Settings, dimension: int) -> int:
    """All streams' worst case at `settings`, for answers of `dimension` float32 values per input. The window's
    texts are at most max_stream_inputs_in_flight inputs of max_input_chars, or one request larger than the
    window, which runs alone and whose texts fit in one message."""
    window_inputs = max(settings.max_stream_inputs_in_flight, settings.max_inputs_per_request)
    window_text = max(
        settings.max_stream_inputs_in_flight * UTF8_MAX_BYTES * settings.max_input_chars,
        settings.max_message_bytes,
    )
    answers = window_inputs * (4 * dimension + ANSWER_OVERHEAD)
    per_stream = 2 * window_text + answers + 2 * settings.max_message_bytes + GRPC_STREAM_WINDOW
    return settings.max_concurrent_streams * per_stream
