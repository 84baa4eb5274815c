#!/usr/bin/env python3
"""A stand-in streaming server for measuring the load client itself (bench_serving.py): every POST gets a
chunked text/event-stream of CHUNKS completion chunks, one every INTERVAL seconds, then a usage chunk and
[DONE]. No model, no tokens: how fast the client reads is all that is measured (docs/perf.md, session 45).

  python3 bench/sse_emitter.py PORT CHUNKS INTERVAL &
  python3 bench/bench_serving.py --base-url http://127.0.0.1:PORT --concurrency 1024 --prompt-tokens 4 \\
      --max-tokens CHUNKS --prompt-ids --requests-per-slot 1 --client-procs 1
"""
import asyncio
import sys

PORT, CHUNKS, INTERVAL = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
CHUNK = (b'data: {"id":"cmpl-0","object":"text_completion","created":0,"model":"emitter",'
         b'"choices":[{"index":0,"text":" word","logprobs":null,"finish_reason":null}]}\n\n')
USAGE = b'data: {"choices":[],"usage":{"completion_tokens":%d,"prompt_tokens":1,"total_tokens":%d}}\n\n' % (
    CHUNKS, CHUNKS + 1)
DONE = b"data: [DONE]\n\n"


def framed(b):
    return b"%x\r\n%s\r\n" % (len(b), b)


streams = {}  # writer -> chunks sent


async def handle(reader, writer):
    data = b""
    while b"\r\n\r\n" not in data:
        more = await reader.read(65536)
        if not more:
            return
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    length = [int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")]
    while length and len(body) < length[0]:
        body += await reader.read(65536)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    streams[writer] = 0


async def tick():
    # One chunk a stream every INTERVAL; a stream's end once it has CHUNKS.
    while True:
        await asyncio.sleep(INTERVAL)
        for w in list(streams):
            if streams[w] < CHUNKS:
                w.write(framed(CHUNK))
                streams[w] += 1
            else:
                w.write(framed(USAGE) + framed(DONE) + b"0\r\n\r\n")
                w.close()
                del streams[w]


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", PORT, backlog=8192)
    asyncio.create_task(tick())
    async with server:
        await server.serve_forever()


asyncio.run(main())
