#!/usr/bin/env python3
"""Watch a cbf engine's sensors with aiokatcp's SensorWatcher, as katgpucbf's monitoring does.

Usage: katcp_watch.py HOST PORT SENSOR REQUEST_JSON [HEALTH_SENSOR...]
Connects, lets the watcher sync (it lists the sensors and subscribes to them all with bulk
`?sensor-sampling ... auto`), notes SENSOR's value, runs REQUEST_JSON (["name", arg, ...]),
waits for the watcher to see SENSOR change, then runs ?client-list, ?log-level debug,
?log-level and ?halt. Prints one JSON object.
"""
import asyncio
import json
import sys

import aiokatcp


def text(v):
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


async def main():
    host, port, name, request = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
    client = await asyncio.wait_for(aiokatcp.Client.connect(host, port), 10)
    watcher = aiokatcp.SensorWatcher(client)
    client.add_sensor_watcher(watcher)
    await asyncio.wait_for(watcher.synced.wait(), 20)
    sensor = watcher.sensors[name]
    out = {"sensors": len(watcher.sensors), "before": text(sensor.value)}
    # The health sensors as the watcher mirrors them: value and status.
    out["health"] = {
        n: [text(aiokatcp.encode(watcher.sensors[n].value)), watcher.sensors[n].status.name]
        for n in sys.argv[5:]
    }
    changed = asyncio.Event()
    sensor.attach(lambda s, reading: changed.set())
    await client.request(*request)
    await asyncio.wait_for(changed.wait(), 20)
    out["after"] = text(sensor.value)
    out["status"] = sensor.status.name
    _, informs = await client.request("client-list")
    out["clients"] = [text(i.arguments[0]) for i in informs]
    reply, _ = await client.request("log-level", "debug")
    out["log_level_set"] = text(reply[0])
    reply, _ = await client.request("log-level")
    out["log_level"] = text(reply[0])
    reply, _ = await client.request("halt")
    out["halt"] = "ok"
    print(json.dumps(out), flush=True)
    client.close()
    await client.wait_closed()


asyncio.run(main())
