"""Per-message cost of the JSON-RPC layer: streamd's msgspec envelope vs sansio-jsonrpc.

trio-jsonrpc (0.4.0) carries its messages through sansio-jsonrpc; this measures
decoding one request frame and encoding its response with each, in-process.
Run: python bench/rpc_overhead.py
"""

from __future__ import annotations

import json
import time

import msgspec
from sansio_jsonrpc import JsonRpcPeer

from streamd.recall.wire import HealthParams
from streamd.rpc.protocol import Envelope, encode_result

FRAME = (
    b'{"jsonrpc":"2.0","id":7,"method":"recall/health",'
    b'"params":{"deadline":"2099-01-01T00:00:00Z"}}'
)
N = 50_000


def ours() -> float:
    dec = msgspec.json.Decoder(Envelope)
    start = time.perf_counter()
    for _ in range(N):
        env = dec.decode(FRAME)
        msgspec.json.decode(env.params, type=HealthParams)
        encode_result(env.id, {"status": "healthy"})
    return (time.perf_counter() - start) / N


def theirs() -> float:
    peer = JsonRpcPeer()
    start = time.perf_counter()
    for _ in range(N):
        for msg in peer.parse(FRAME):
            peer.respond_with_result(msg, {"status": "healthy"})
    return (time.perf_counter() - start) / N


if __name__ == "__main__":
    a, b = ours(), theirs()
    print(json.dumps({"streamd_us_per_message": round(a * 1e6, 2),
                      "sansio_jsonrpc_us_per_message": round(b * 1e6, 2)}))
