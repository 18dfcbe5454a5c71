#!/usr/bin/env python3
"""A small stdio MCP server for lull's tests (no dependencies).

MCP's stdio transport: newline-delimited JSON-RPC 2.0 on stdin/stdout. It answers
`initialize` (echoing a supported protocol version), `ping`, `tools/list` (in pages of
MCP_PAGE_SIZE tools, default 3, so the client must follow `nextCursor`) and
`tools/call`; `notifications/*` are taken silently. Calls run on threads, so a slow or
hanging call does not hold the others up.

Every execution is appended as one JSON line {"tool", "arguments", "meta", "at",
"parent"} (parent: the pid of the process that started the server) to
the file named by MCP_COUNT_FILE (when set); `at` is "start" or "end" for the slow
tools (a call killed in between leaves only its start), "run" for the others.

Tools (MCP_TOOLS, comma-separated, selects some; default all):
  lookup             read-only; a fixed fact about its `query`
  append             appends its `text` to MCP_NOTES_FILE; "appended"
  slow_append        sleeps MCP_SLOW_MS (default 3000), then appends and answers
  idempotent_append  the same, annotated idempotentHint
  delete             destructiveHint; "deleted <what>"
  fail               isError: true
  die                the process exits at once
  hang               never answers
  huge               about 5 MB of text
  env_dump           writes this process's environment as JSON to its `path`
  plain              no annotations at all; "plain"
"""

import json
import os
import sys
import threading
import time

SUPPORTED = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"]
write_lock = threading.Lock()
log_lock = threading.Lock()


def send(message):
    line = json.dumps(message) + "\n"
    with write_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def log(tool, arguments, meta, at):
    path = os.environ.get("MCP_COUNT_FILE")
    if not path:
        return
    # The parent: the lull process that started this server (a stress run kills the
    # one whose call is running).
    entry = {"tool": tool, "arguments": arguments, "meta": meta, "at": at,
             "parent": os.getppid()}
    with log_lock, open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


def append_note(text):
    with log_lock, open(os.environ["MCP_NOTES_FILE"], "a") as f:
        f.write(text + "\n")


def text(result, is_error=False):
    return {"content": [{"type": "text", "text": result}], "isError": is_error}


OBJECT = {"type": "object"}


def schema(**props):
    return {
        "type": "object",
        "properties": {name: {"type": kind} for name, kind in props.items()},
        "required": list(props),
    }


TOOLS = [
    {
        "name": "lookup",
        "description": "Look a fact up.",
        "inputSchema": schema(query="string"),
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "append",
        "description": "Append a note.",
        "inputSchema": schema(text="string"),
        "annotations": {"readOnlyHint": False, "destructiveHint": False},
    },
    {
        "name": "slow_append",
        "description": "Append a note, slowly.",
        "inputSchema": schema(text="string"),
        "annotations": {"destructiveHint": False},
    },
    {
        "name": "idempotent_append",
        "description": "Append a note, slowly; doing it twice is doing it once.",
        "inputSchema": schema(text="string"),
        "annotations": {"destructiveHint": False, "idempotentHint": True},
    },
    {
        "name": "delete",
        "description": "Delete something.",
        "inputSchema": schema(what="string"),
        "annotations": {"destructiveHint": True},
    },
    {"name": "fail", "description": "Always fails.", "inputSchema": OBJECT,
     "annotations": {"readOnlyHint": True}},
    {"name": "die", "description": "Exits the server.", "inputSchema": OBJECT},
    {"name": "hang", "description": "Never answers.", "inputSchema": OBJECT,
     "annotations": {"readOnlyHint": True}},
    {"name": "huge", "description": "Answers about 5 MB.", "inputSchema": OBJECT,
     "annotations": {"readOnlyHint": True}},
    {
        "name": "env_dump",
        "description": "Write the environment to a file.",
        "inputSchema": schema(path="string"),
    },
    {"name": "plain", "description": "No annotations.", "inputSchema": OBJECT},
]


def selected_tools():
    wanted = os.environ.get("MCP_TOOLS")
    if not wanted:
        return TOOLS
    names = set(wanted.split(","))
    return [t for t in TOOLS if t["name"] in names]


def run_tool(name, arguments, meta):
    slow = int(os.environ.get("MCP_SLOW_MS", "3000")) / 1000.0
    if name in ("slow_append", "idempotent_append"):
        log(name, arguments, meta, "start")
        time.sleep(slow)
        append_note(arguments.get("text", ""))
        log(name, arguments, meta, "end")
        return text("appended")
    log(name, arguments, meta, "run")
    if name == "lookup":
        return text(f"{arguments.get('query', '')}: the answer is 42")
    if name == "append":
        append_note(arguments.get("text", ""))
        return text("appended")
    if name == "delete":
        return text(f"deleted {arguments.get('what', '')}")
    if name == "fail":
        return text("it failed, as it always does", is_error=True)
    if name == "die":
        os._exit(3)
    if name == "hang":
        return None
    if name == "huge":
        return text("y" * (5 * 1024 * 1024))
    if name == "env_dump":
        with open(arguments["path"], "w") as f:
            json.dump(dict(os.environ), f)
        return text("dumped")
    if name == "plain":
        return text("plain")
    return text(f"unknown tool {name}", is_error=True)


def call(request_id, params):
    name = params.get("name")
    if name not in {t["name"] for t in selected_tools()}:
        send({"jsonrpc": "2.0", "id": request_id,
              "error": {"code": -32602, "message": f"unknown tool {name}"}})
        return
    result = run_tool(name, params.get("arguments") or {}, params.get("_meta") or {})
    if result is not None:
        send({"jsonrpc": "2.0", "id": request_id, "result": result})


def handle(message):
    method = message.get("method")
    request_id = message.get("id")
    params = message.get("params") or {}
    if request_id is None:
        return  # notifications/initialized, notifications/cancelled, ...
    if method == "initialize":
        asked = params.get("protocolVersion")
        version = asked if asked in SUPPORTED else SUPPORTED[0]
        result = {
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "lull-test-server", "version": "1.0.0"},
        }
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        tools = selected_tools()
        page = int(os.environ.get("MCP_PAGE_SIZE", "3"))
        start = int(params.get("cursor") or 0)
        result = {"tools": tools[start:start + page]}
        if start + page < len(tools):
            result["nextCursor"] = str(start + page)
    elif method == "tools/call":
        threading.Thread(target=call, args=(request_id, params), daemon=True).start()
        return
    else:
        send({"jsonrpc": "2.0", "id": request_id,
              "error": {"code": -32601, "message": f"no method {method}"}})
        return
    send({"jsonrpc": "2.0", "id": request_id, "result": result})


def main():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            message = json.loads(line)
        except ValueError:
            send({"jsonrpc": "2.0", "id": None,
                  "error": {"code": -32700, "message": "parse error"}})
            continue
        handle(message)


if __name__ == "__main__":
    main()
