#!/usr/bin/env python3
"""A retrying HTTP client from outside the project against the demo: how long does a
client that honours `Retry-After` take to get its replay?

urllib3's `Retry` with `respect_retry_after_header` (what requests, boto and many SDKs
use) sends `POST /orders` with an Idempotency-Key while the first request with that key
is still running: it is answered `409` with `Retry-After`, sleeps that long, retries,
and prints how long it took to get the stored response (`Idempotent-Replayed: true`).

    cargo run --example demo &   # WORK_MS to change the handler's time (default 5000)
    python3 scripts/retry_after_check.py [base URL, default http://127.0.0.1:3000]
"""
import json
import sys
import threading
import time
import uuid

import urllib3
from urllib3.util.retry import Retry

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:3000"
KEY = f'"{uuid.uuid4()}"'
HEADERS = {
    "Authorization": "Bearer alice",
    "Idempotency-Key": KEY,
    "Content-Type": "application/json",
}
BODY = json.dumps({"sku": 42})

http = urllib3.PoolManager()
first = threading.Thread(
    target=lambda: http.request("POST", f"{BASE}/orders", body=BODY, headers=HEADERS, retries=False)
)
first.start()
time.sleep(0.2)  # the first request now holds the key

retry = Retry(
    total=10,
    status_forcelist=[409],
    allowed_methods=None,  # retry POST too: the Idempotency-Key makes it safe
    respect_retry_after_header=True,
    backoff_factor=0,
    raise_on_status=False,
)
started = time.monotonic()
reply = http.request("POST", f"{BASE}/orders", body=BODY, headers=HEADERS, retries=retry)
took = time.monotonic() - started
first.join()
print(f"status {reply.status}, idempotent-replayed: {reply.headers.get('idempotent-replayed')}")
print(f"retries: {[(h.status, h.error) for h in reply.retries.history]}")
print(f"the retrying client got its answer after {took:.2f} s")
