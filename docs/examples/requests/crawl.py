"""Crawls URLs through leased proxies with `requests`, the way a crawler team would:

    DISCOVERY_URL=https://proxy-operator-discovery.proxy-operator:8090 \
    DISCOVERY_CA_FILE=/etc/proxy-operator-ca/ca.crt \
    DISCOVERY_TOKEN_FILE=/var/run/secrets/proxy-operator/token \
    python crawl.py --pool crawlers/egress https://shop.example.com/a https://shop.example.com/b

One lease at a time per target host. A page the site blocks (403, 429, a captcha) is reported
`blocked` for that host, which ends the lease, and fetched again through a new lease; a
connection error is reported `failure`, and after three in a row the proxy is given back.
Every lease is released at the end, also on errors and Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter
from urllib.parse import urlsplit

import requests

from proxy_leases import LeaseClient, LeaseEnded, blocked_reason

MAX_FAILURES = 3


def crawl(client: LeaseClient, urls: list[str], pool: str | None, max_attempts: int) -> Counter:
    counts: Counter = Counter()
    leases: dict = {}  # target host -> its current Lease
    failures: Counter = Counter()  # lease id -> failures in a row
    try:
        for url in urls:
            host = urlsplit(url).hostname
            for _ in range(max_attempts):
                lease = leases.get(host)
                if lease is None or not lease.active:
                    lease = leases[host] = client.lease(pool=pool, target=host)
                    counts["leases"] += 1
                try:
                    page = lease.get(url)
                except LeaseEnded:
                    continue  # expired or drained meanwhile: the next attempt leases anew
                except requests.RequestException as e:
                    counts["failures"] += 1
                    failures[lease.id] += 1
                    print(f"error {url} via {lease!r}: {type(e).__name__}", flush=True)
                    if lease.report("failure") and failures[lease.id] >= MAX_FAILURES:
                        lease.release()  # the operator probes it; we move on
                    continue
                reason = blocked_reason(page)
                if reason:
                    counts["blocked"] += 1
                    print(f"blocked ({reason}) {url} via {lease!r}", flush=True)
                    lease.report("blocked", target=host)  # ends the lease; retry on another
                    continue
                failures[lease.id] = 0
                lease.report("success")
                counts["pages"] += 1
                print(f"{page.status_code} {url} via {lease!r}", flush=True)
                break
            else:
                counts["given_up"] += 1
                print(f"gave up on {url} after {max_attempts} attempts", flush=True)
    finally:
        for lease in leases.values():
            lease.release()
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("urls", nargs="+")
    parser.add_argument("--pool", help="namespace/name of a ProxyPool")
    parser.add_argument("--max-attempts", type=int, default=5, help="fetches of one URL at most")
    parser.add_argument("--max-retry-after", type=float, default=60,
                        help="wait at most this long between two tries for a lease")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    client = LeaseClient.from_env(max_retry_after=args.max_retry_after)
    counts = crawl(client, args.urls, args.pool, args.max_attempts)
    print("done:", json.dumps(dict(sorted(counts.items()))), flush=True)
    return 0 if counts["given_up"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
