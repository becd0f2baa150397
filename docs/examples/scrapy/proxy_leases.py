"""A Scrapy downloader middleware that sends each request through a proxy leased from
proxy-operator's discovery API (docs/discovery-api.md). Copy this file into your project and
enable it before Scrapy's HttpProxyMiddleware (750), which turns the credentials of the proxy URL
into a Proxy-Authorization header:

    DOWNLOADER_MIDDLEWARES = {"proxy_leases.ProxyLeaseMiddleware": 600}
    PROXY_LEASES_POOL = "crawlers/egress"

- One lease per download slot (usually one per site), or per `request.meta["proxy_session"]`
  (the API's sticky `session`: one proxy for a cookie jar, a login, a cart).
- Each response is reported: `blocked` with `target` = the host for 403, 429 or a captcha page
  (the lease ends, the proxy cools down for that host only, and the request goes again through a
  new lease), `success` otherwise; a connection error is reported `failure`.
- A lease is renewed when a third of its lifetime is left, and replaced when it ended.
- Every lease is released when the spider closes.

Scrapy runs downloader middlewares before a request waits in its slot, so the requests already
waiting there when a block comes still go out through the old proxy; their blocked answers are
sent again through the new lease too, without counting against PROXY_LEASES_BLOCKED_RETRIES
(stats `proxy_leases/blocked_responses`). Keep
CONCURRENT_REQUESTS near CONCURRENT_REQUESTS_PER_DOMAIN times the sites crawled at once to keep
that queue short.

Settings (all optional but the token):

| setting | default | meaning |
|---|---|---|
| PROXY_LEASES_ENABLED | True | |
| PROXY_LEASES_API_URL | $DISCOVERY_URL, else the in-cluster Service | the discovery API |
| PROXY_LEASES_TOKEN | $DISCOVERY_TOKEN | the static bearer token |
| PROXY_LEASES_CA_FILE | $DISCOVERY_CA_FILE | the API's CA certificate (its TLS Secret's ca.crt); unset: the system's roots |
| PROXY_LEASES_TOKEN_FILE | $DISCOVERY_TOKEN_FILE | a token file (a projected ServiceAccount token), re-read every minute; wins over the token |
| PROXY_LEASES_POOL | none | `namespace/name` of a ProxyPool |
| PROXY_LEASES_FILTERS | {} | more fields of POST /v1/leases: `provider`, `zone`, `selector` |
| PROXY_LEASES_TTL | 300 | lease lifetime asked for, in seconds |
| PROXY_LEASES_BLOCK_CODES | [403, 429] | statuses that mean the site blocks the proxy |
| PROXY_LEASES_CAPTCHA_MARKERS | ["captcha"] | text (case-insensitive) in a text response that means the same |
| PROXY_LEASES_BLOCKED_RETRIES | 5 | times one request is sent again through a new lease after its block ended a lease |
| PROXY_LEASES_MAX_FAILURES | 3 | `failure` reports in a row after which the lease is given back |
| PROXY_LEASES_REPORT_SUCCESS | True | report `success` for each good response (it resets the proxy's failure count) |
| PROXY_LEASES_MAX_WAIT | 300 | seconds to wait for a free proxy before the request is dropped |
| PROXY_LEASES_MAX_RETRY_AFTER | 60 | wait at most this long between two tries for a lease |

Request meta: `proxy_session` (a session key), `proxy_lease_skip` (True: no proxy for this
request). The middleware sets `proxy` and `proxy_lease_id`. Stats: `proxy_leases/*`.

It needs Scrapy's asyncio reactor (the default since Scrapy 2.13) and nothing beyond Scrapy: the
API is called with urllib in a thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import time
import urllib.error
import urllib.request
from collections import defaultdict
from urllib.parse import urlsplit, urlunsplit

from scrapy import signals
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import TextResponse
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.reactor import is_asyncio_reactor_installed

logger = logging.getLogger(__name__)

DEFAULT_API = "https://proxy-operator-discovery.proxy-operator:8090"
TOKEN_FILE_REREAD = 60.0


def redact(proxy_url: str) -> str:
    """The proxy URL fit for a log: the password (if the proxy has credentials) masked."""
    parts = urlsplit(proxy_url)
    if parts.password is None:
        return proxy_url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class LeaseError(Exception):
    """The API refused in a way waiting does not fix (a bad filter, a wrong token, no such pool)."""


class _Lease:
    def __init__(self, body: dict, key: tuple, target: str | None):
        self.id: str = body["id"]
        self.proxy_url: str = body["proxyUrl"]
        self.proxy_name = f"{body['proxy']['namespace']}/{body['proxy']['name']}"
        self.key, self.target = key, target
        self.active = True
        self.failures = 0
        self.set_expiry(body)

    def set_expiry(self, body: dict) -> None:
        self.ttl: int = body["ttlSeconds"]
        # Our own clock: a clock difference with the operator does not matter.
        self.deadline = time.monotonic() + self.ttl

    def __str__(self) -> str:
        return f"{self.id} on {self.proxy_name} ({redact(self.proxy_url)})"


class ProxyLeaseMiddleware:
    def __init__(self, crawler):
        s = crawler.settings
        self.crawler = crawler
        self.stats = crawler.stats
        self.api_url = (s.get("PROXY_LEASES_API_URL") or os.environ.get("DISCOVERY_URL")
                        or DEFAULT_API).rstrip("/")
        self.token = s.get("PROXY_LEASES_TOKEN") or os.environ.get("DISCOVERY_TOKEN")
        self.token_file = s.get("PROXY_LEASES_TOKEN_FILE") or os.environ.get("DISCOVERY_TOKEN_FILE")
        if not self.token and not self.token_file:
            raise NotConfigured("set PROXY_LEASES_TOKEN(_FILE) or DISCOVERY_TOKEN(_FILE)")
        self.pool = s.get("PROXY_LEASES_POOL")
        self.filters = s.getdict("PROXY_LEASES_FILTERS")
        self.ttl = s.getint("PROXY_LEASES_TTL", 300)
        self.block_codes = {int(c) for c in s.getlist("PROXY_LEASES_BLOCK_CODES", [403, 429])}
        self.captcha_markers = [m.lower() for m in
                                s.getlist("PROXY_LEASES_CAPTCHA_MARKERS", ["captcha"])]
        self.blocked_retries = s.getint("PROXY_LEASES_BLOCKED_RETRIES", 5)
        self.max_failures = s.getint("PROXY_LEASES_MAX_FAILURES", 3)
        self.report_success = s.getbool("PROXY_LEASES_REPORT_SUCCESS", True)
        self.max_wait = s.getfloat("PROXY_LEASES_MAX_WAIT", 300)
        self.max_retry_after = s.getfloat("PROXY_LEASES_MAX_RETRY_AFTER", 60)
        # The API is reached directly, never through HTTP_PROXY from the environment, and its
        # certificate checked against its own CA when one is given (its TLS Secret's ca.crt).
        ca_file = s.get("PROXY_LEASES_CA_FILE") or os.environ.get("DISCOVERY_CA_FILE")
        tls = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                                  urllib.request.HTTPSHandler(context=tls))
        self._token_cache: tuple[float, str] | None = None
        self.current: dict[tuple, _Lease] = {}  # slot or session -> its lease
        self.by_id: dict[str, _Lease] = {}  # every lease not yet released
        self.locks: defaultdict[tuple, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.closing = False
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler):
        if not crawler.settings.getbool("PROXY_LEASES_ENABLED", True):
            raise NotConfigured
        if not is_asyncio_reactor_installed():
            raise NotConfigured("ProxyLeaseMiddleware needs the asyncio reactor (TWISTED_REACTOR)")
        return cls(crawler)

    # --- Scrapy's hooks ----------------------------------------------------------------------

    async def process_request(self, request, spider=None):
        if request.meta.get("proxy_lease_skip"):
            return None
        key, session = self._key(request)
        lease = await self._lease_for(key, session, urlparse_cached(request).hostname)
        request.meta["proxy"] = lease.proxy_url
        request.meta["proxy_lease_id"] = lease.id
        return None

    async def process_response(self, request, response, spider=None):
        lease_id = request.meta.get("proxy_lease_id")
        if lease_id is None:
            return response
        # None when the lease has ended meanwhile (another response reported it blocked).
        lease = self.by_id.get(lease_id)
        reason = self._blocked_reason(response)
        if reason is None:
            if lease is not None and lease.active:
                lease.failures = 0
                if self.report_success:
                    await self._report(lease, "success")
            return response
        host = urlparse_cached(request).hostname
        self.stats.inc_value("proxy_leases/blocked_responses")
        # Only the block that ends the lease counts against the request's retries: the others
        # went out through a proxy that was already blocked while they waited in the slot.
        ended_it = lease is not None and lease.active
        if ended_it:
            logger.info("%s blocked %s (%s): reporting lease %s", host, request.url, reason, lease)
            # Before the report's round trip: no request may go through it meanwhile.
            self._forget(lease)
            await self._report(lease, "blocked", target=host)  # ends the lease
        tries = request.meta.get("proxy_lease_blocked", 0) + ended_it
        if tries > self.blocked_retries:
            logger.warning("%s still blocked after %d new leases: giving up", request.url,
                           tries - 1)
            self.stats.inc_value("proxy_leases/blocked_gave_up")
            return response
        self.stats.inc_value("proxy_leases/blocked_retries")
        retry = request.replace(dont_filter=True)
        retry.meta["proxy_lease_blocked"] = tries
        retry.meta.pop("proxy_lease_id", None)
        return retry

    async def process_exception(self, request, exception, spider=None):
        lease = self.by_id.get(request.meta.get("proxy_lease_id"))
        if lease is None or isinstance(exception, IgnoreRequest) or not lease.active:
            return None
        # A connection error, a timeout, a failed CONNECT: the proxy did not work.
        lease.failures += 1
        logger.info("%s through lease %s failed: %s", request.url, lease, type(exception).__name__)
        await self._report(lease, "failure")
        if lease.failures >= self.max_failures:
            await self._release(lease)  # the operator probes it; the retry gets another proxy
        return None  # RetryMiddleware sends it again

    async def spider_closed(self, spider, reason):
        leases = list(self.by_id.values())
        await asyncio.gather(*(self._release(lease) for lease in leases))
        logger.info("released %d proxy leases", len(leases))

    # --- leases ------------------------------------------------------------------------------

    def _key(self, request) -> tuple[tuple, str | None]:
        session = request.meta.get("proxy_session")
        if session is not None:
            return ("session", str(session)), str(session)
        downloader = self.crawler.engine.downloader
        slot_key = getattr(downloader, "get_slot_key", None) or downloader._get_slot_key
        return ("slot", slot_key(request)), None

    async def _lease_for(self, key: tuple, session: str | None, target: str | None) -> _Lease:
        # One grant per slot or session at a time: concurrent requests wait for it and share it.
        async with self.locks[key]:
            lease = self.current.get(key)
            if lease is not None and lease.active:
                left = lease.deadline - time.monotonic()
                if left <= 0:
                    self._end(lease)  # expired
                elif left < lease.ttl / 3:
                    await self._renew(lease)
                if lease.active:
                    return lease
            lease = await self._grant(key, session, target)
            self.current[key] = lease
            self.by_id[lease.id] = lease
            return lease

    async def _grant(self, key: tuple, session: str | None, target: str | None) -> _Lease:
        body = dict(self.filters, pool=self.pool, session=session, target=target,
                    ttlSeconds=self.ttl)
        body = {k: v for k, v in body.items() if v is not None}
        give_up = time.monotonic() + self.max_wait
        while True:
            try:
                status, headers, doc = await self._call("POST", "/v1/leases", body)
            except OSError as e:
                status, headers, doc = 0, {"retry-after": "2"}, {"detail": str(e)}
            if status in (200, 201):  # 200: the session's lease, shared by its requests
                lease = _Lease(doc, key, target)
                self.stats.inc_value("proxy_leases/granted")
                logger.info("leased %s for %s %s", lease, *key)
                return lease
            retry_after = headers.get("retry-after")
            if status not in (0, 409, 503) or retry_after is None:
                await self._fatal(f"POST /v1/leases: {status} {doc.get('type', '')}: "
                                  f"{doc.get('detail', '')}")
            wait = min(float(retry_after), self.max_retry_after)
            if time.monotonic() + wait > give_up:
                self.stats.inc_value("proxy_leases/no_proxy")
                raise IgnoreRequest(f"no proxy leased in {self.max_wait:.0f} s: "
                                    f"{doc.get('detail', '')}")
            await asyncio.sleep(wait)

    async def _renew(self, lease: _Lease) -> None:
        try:
            status, _, doc = await self._call("POST", f"/v1/leases/{lease.id}/renew",
                                              {"ttlSeconds": self.ttl})
        except OSError as e:
            logger.warning("renewing %s failed (trying again next time): %s", lease.id, e)
            return
        if status == 200:
            lease.set_expiry(doc)
            self.stats.inc_value("proxy_leases/renewed")
        elif status in (404, 409, 410):
            # Ended, forgotten, or its proxy is draining: take a new lease.
            logger.info("lease %s cannot be renewed (%s): leasing another proxy", lease, status)
            self._forget(lease)

    async def _report(self, lease: _Lease, outcome: str, target: str | None = None) -> None:
        body = {"outcome": outcome}
        if target:
            body["target"] = target
        try:
            status, _, doc = await self._call("POST", f"/v1/leases/{lease.id}/report", body)
        except OSError as e:
            logger.warning("reporting %s on %s failed: %s", outcome, lease.id, e)
            return
        if status == 200:
            self.stats.inc_value(f"proxy_leases/reports/{outcome}")
        if status in (404, 410) or (status == 200 and not doc.get("active", True)):
            self._end(lease)  # the proxy is not ours any more: stop using it at once

    async def _release(self, lease: _Lease) -> None:
        self._end(lease)
        try:
            await self._call("DELETE", f"/v1/leases/{lease.id}")
            self.stats.inc_value("proxy_leases/released")
        except OSError as e:
            logger.warning("releasing %s failed (it expires anyway): %s", lease.id, e)

    def _forget(self, lease: _Lease) -> None:
        """No new request goes through the lease; it is still held (released on close)."""
        lease.active = False
        if self.current.get(lease.key) is lease:
            del self.current[lease.key]

    def _end(self, lease: _Lease) -> None:
        """The lease is over: forgotten, and nothing to release."""
        self._forget(lease)
        self.by_id.pop(lease.id, None)

    def _blocked_reason(self, response) -> str | None:
        if response.status in self.block_codes:
            return str(response.status)
        if isinstance(response, TextResponse) and self.captcha_markers:
            text = response.text.lower()
            for marker in self.captcha_markers:
                if marker in text:
                    return f"captcha marker {marker!r}"
        return None

    async def _fatal(self, message: str):
        if not self.closing:
            self.closing = True
            logger.error("proxy leases: %s; closing the spider", message)
            self.stats.set_value("proxy_leases/error", message)
            asyncio.ensure_future(self.crawler.engine.close_spider_async(reason="proxy_lease_error"))
        raise IgnoreRequest(message)

    # --- the API -----------------------------------------------------------------------------

    def _bearer(self) -> str:
        if not self.token_file:
            return self.token
        now = time.monotonic()
        if self._token_cache is None or now - self._token_cache[0] > TOKEN_FILE_REREAD:
            # Re-read: the kubelet rotates a projected ServiceAccount token.
            with open(self.token_file, encoding="utf-8") as f:
                self._token_cache = (now, f.read().strip())
        return self._token_cache[1]

    async def _call(self, method: str, path: str, body: dict | None = None):
        """(status, headers, JSON body) of one API call, made in a thread."""
        request = urllib.request.Request(self.api_url + path, method=method)
        request.add_header("Authorization", f"Bearer {self._bearer()}")
        if body is not None:
            request.data = json.dumps(body).encode()
            request.add_header("Content-Type", "application/json")
        return await asyncio.to_thread(self._send, request)

    def _send(self, request):
        try:
            with self.opener.open(request, timeout=10) as r:
                status, headers, text = r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            status, headers, text = e.code, e.headers, e.read()
        headers = {k.lower(): v for k, v in headers.items()}
        try:
            doc = json.loads(text) if text else {}
        except ValueError:
            doc = {"detail": text[:200].decode(errors="replace")}
        return status, headers, doc
