"""A real MCP client for the integration tests: the reference Python SDK
(`mcp`, pinned in tests/estate/mcp-client.txt) driving runwarden over stdio
or streamable HTTP, as an agent would.

    mcp_client.py [--name NAME] [--sessions N] stdio CMD ARGS...
    mcp_client.py [--name NAME] [--sessions N] http URL TOKEN_FILE

(`{n}` in URL is each session's number, 01 for the first.)

The script of each session is a JSON list on stdin; every session runs it
at once. One JSON line per event on stdout, each with its session's index:

    {"do": "list"}                             -> {"tools": [...]}
    {"do": "call", "tool": T, "args": {...}}   -> {"call": T, "is_error": .., "text": .., "structured": ..}
    {"do": "touch", "path": P}                 a file for the test to see (where the script is)
    {"do": "wait_file", "path": P}             until the test creates P (30 s at most)
    {"do": "abandon", "tool": T, "args": {..}, "after": S}
                                               send the call, wait S seconds, then
                                               leave without a word (the process exits)
"""

import argparse
import asyncio
import json
import os
import sys
import time

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import Implementation


def emit(session, **event):
    print(json.dumps({"session": session, **event}), flush=True)


def tool_view(t):
    a = t.annotations
    return {
        "name": t.name,
        "title": a.title if a else None,
        "read_only": a.read_only_hint if a else None,
        "destructive": a.destructive_hint if a else None,
        "schema": t.input_schema,
        "description": t.description,
    }


async def run_script(session, client, script):
    server = client.server_info
    emit(session, protocol=client.protocol_version, instructions=client.instructions,
         server=f"{server.name} {server.version}" if server else None)
    for step in script:
        do = step["do"]
        if do == "list":
            tools = await client.list_tools()
            emit(session, tools=[tool_view(t) for t in tools.tools])
        elif do == "call":
            r = await client.call_tool(step["tool"], step.get("args", {}))
            text = "".join(getattr(c, "text", "") for c in r.content)
            emit(session, call=step["tool"], is_error=bool(r.is_error), text=text,
                 structured=r.structured_content)
        elif do == "touch":
            open(step["path"], "w").close()
        elif do == "wait_file":
            deadline = time.monotonic() + 30
            while not os.path.exists(step["path"]):
                if time.monotonic() > deadline:
                    emit(session, error=f"{step['path']} never appeared")
                    return
                await asyncio.sleep(0.05)
        elif do == "abandon":
            task = asyncio.ensure_future(client.call_tool(step["tool"], step.get("args", {})))
            await asyncio.sleep(step.get("after", 1.0))
            emit(session, abandoned=step["tool"], answered=task.done())
            os._exit(0)
        else:
            raise SystemExit(f"unknown step {do!r}")


def connection(session, args):
    if args.transport == "stdio":
        return StdioServerParameters(command=args.target[0], args=args.target[1:]), None
    url, token_file = args.target
    # `{n}` in the URL: the session's number, 01 for the first.
    url = url.replace("{n}", f"{session + 1:02}")
    token = open(token_file).read().strip()
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"},
        timeout=httpx2.Timeout(30, read=300),
    )
    return streamable_http_client(url, http_client=http), http


def leaves(e):
    """The errors an exception group holds, however deep."""
    inner = getattr(e, "exceptions", None)
    if not inner:
        yield e
        return
    for x in inner:
        yield from leaves(x)


async def one(session, args, script):
    server, http = connection(session, args)
    info = Implementation(name=args.name, version="1.0")
    try:
        async with Client(server, mode="auto", client_info=info) as client:
            await run_script(session, client, script)
    except BaseException as e:  # noqa: BLE001 - the test reads what failed
        for inner in leaves(e):
            emit(session, error=f"{type(inner).__name__}: {inner}")
    finally:
        if http is not None:
            await http.aclose()
    emit(session, closed=True)


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--name", default="runwarden-tests")
    p.add_argument("--sessions", type=int, default=1)
    p.add_argument("transport", choices=["stdio", "http"])
    p.add_argument("target", nargs="+")
    args = p.parse_args()
    script = json.load(sys.stdin)
    await asyncio.gather(*(one(i, args, script) for i in range(args.sessions)))


asyncio.run(main())
