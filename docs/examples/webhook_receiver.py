#!/usr/bin/env python3
"""A receiver for lull's replies (the http adapter's webhook), Python standard library only.

    export LULL_WEBHOOK_SECRET="whsec_$(openssl rand -base64 32)"   # lull signs with the same one
    python3 docs/examples/webhook_receiver.py                        # listens on 127.0.0.1:8000

It reads the secret from LULL_WEBHOOK_SECRET, the variable lull signs with, so both
processes started from one shell share it. It listens on RECEIVER_ADDR (HOST:PORT,
127.0.0.1:8000 by default) on any path, checks each POST's Standard Webhooks signature,
answers 401 to one that does not verify, and prints each verified reply once, as one
JSON line on standard output. A retry of a reply already printed (the same webhook-id:
lull delivers at least once) is acknowledged with 200 and not printed again.
"""

import base64
import hashlib
import hmac
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def verify(secret, headers, body, tolerance=300):
    """True if lull signed `body` with `secret` ("whsec_...") less than `tolerance` s ago."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    msg_id, timestamp = headers["webhook-id"], headers["webhook-timestamp"]
    if abs(time.time() - int(timestamp)) > tolerance:
        return False  # too old: a replayed request
    signed = f"{msg_id}.{timestamp}.".encode() + body
    expected = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    # The header may list several signatures (a secret being rotated).
    return any(hmac.compare_digest(expected, s) for s in headers.get("webhook-signature", "").split())


SECRET = os.environ.get("LULL_WEBHOOK_SECRET", "")
seen = set()  # in production: a table or cache that keeps ids for a few days


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        headers = {name.lower(): value for name, value in self.headers.items()}
        try:
            ok = verify(SECRET, headers, body)
        except (KeyError, ValueError):
            ok = False  # a header missing or malformed
        if not ok:
            self.send_response(401)
            self.end_headers()
            return
        if headers["webhook-id"] not in seen:
            seen.add(headers["webhook-id"])
            reply = json.loads(body)
            # Your app shows reply["text"] in reply["conversation"] here.
            print(json.dumps(reply, ensure_ascii=False), flush=True)
        self.send_response(200)
        self.end_headers()

    def log_message(self, format, *args):
        pass  # standard output carries the replies only


def main():
    if not SECRET.startswith("whsec_"):
        sys.exit("set LULL_WEBHOOK_SECRET to the whsec_... secret lull signs with")
    host, _, port = os.environ.get("RECEIVER_ADDR", "127.0.0.1:8000").rpartition(":")
    server = ThreadingHTTPServer((host, int(port)), Receiver)
    print(f"receiving lull's replies on http://{host}:{port}/", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
