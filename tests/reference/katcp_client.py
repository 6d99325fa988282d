#!/usr/bin/env python3
"""A real katcp client (aiokatcp) for cbf's katcp tests.

Usage: katcp_client.py HOST PORT REQUEST_JSON...
Each REQUEST_JSON is a list ["name", arg, ...]. Requests run in order; one JSON line is printed
per request: {"request": name, "status": "ok"|"fail"|"invalid", "args": [...], "informs": [[...]]}.
"""
import asyncio
import json
import sys

import aiokatcp


def text(v):
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


async def main():
    host, port = sys.argv[1], int(sys.argv[2])
    client = await asyncio.wait_for(aiokatcp.Client.connect(host, port), 10)
    try:
        for raw in sys.argv[3:]:
            name, *args = json.loads(raw)
            out = {"request": name}
            try:
                reply, informs = await asyncio.wait_for(client.request(name, *args), 60)
                out.update(status="ok", args=[text(a) for a in reply], informs=[[text(a) for a in i.arguments] for i in informs])
            except aiokatcp.FailReply as e:
                out.update(status="fail", args=[str(e)])
            except aiokatcp.InvalidReply as e:
                out.update(status="invalid", args=[str(e)])
            print(json.dumps(out), flush=True)
    finally:
        client.close()
        await client.wait_closed()


asyncio.run(main())
