"""A small client of proxy-operator's discovery API for `requests`: lease a proxy, send requests
through it, report how it did, release it. Copy this file into your crawler.

    from proxy_leases import LeaseClient

    client = LeaseClient.from_env()   # DISCOVERY_URL, DISCOVERY_TOKEN or DISCOVERY_TOKEN_FILE
    with client.lease(pool="crawlers/egress", target="shop.example.com") as lease:
        page = lease.get("https://shop.example.com/")
        if blocked_reason(page):
            lease.report("blocked", target="shop.example.com")   # ends the lease
        else:
            lease.report("success")
    # released here (idempotent, also after "blocked")

The API is described in docs/discovery-api.md. Only `requests` is needed.
"""

from __future__ import annotations

import logging
import os
import time
from urllib.parse import urlsplit, urlunsplit

import requests

log = logging.getLogger("proxy_leases")

DEFAULT_API = "https://proxy-operator-discovery.proxy-operator:8090"
# What marks an answer as a block of the proxy by the site, rather than a bad page.
BLOCK_STATUSES = (403, 429)
CAPTCHA_MARKERS = ("captcha",)


class LeaseEnded(Exception):
    """The lease is over (blocked, expired, its proxy drained or gone): lease another proxy."""


class LeaseError(Exception):
    """The API refused a request in a way waiting does not fix (400, 401, 403, 404, 422...)."""

    def __init__(self, status: int, problem: dict):
        self.status = status
        self.type = problem.get("type", "")
        self.detail = problem.get("detail", "")
        super().__init__(f"{status} {self.type}: {self.detail}")


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


def blocked_reason(response: requests.Response) -> str | None:
    """Why the site's answer says it blocks this proxy (403, 429, a captcha page), or None."""
    if response.status_code in BLOCK_STATUSES:
        return str(response.status_code)
    content_type = response.headers.get("Content-Type", "")
    if content_type.startswith("text/"):
        text = response.text.lower()
        for marker in CAPTCHA_MARKERS:
            if marker in text:
                return marker
    return None


class _Bearer(requests.auth.AuthBase):
    """The token file is read for each call: the kubelet rotates a projected ServiceAccount token."""

    def __init__(self, token: str | None, token_file: str | None):
        if not token and not token_file:
            raise ValueError("set DISCOVERY_TOKEN or DISCOVERY_TOKEN_FILE (the API needs a bearer token)")
        self.token, self.token_file = token, token_file

    def __call__(self, r):
        token = self.token
        if self.token_file:
            with open(self.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        r.headers["Authorization"] = f"Bearer {token}"
        return r


class Lease:
    """One proxy, leased. Use it as a context manager so it is released whatever happens."""

    def __init__(self, client: LeaseClient, body: dict, target: str | None):
        self.client = client
        self.id: str = body["id"]
        # Always the proxy to use: it carries the proxy's credentials when it has some.
        self.proxy_url: str = body["proxyUrl"]
        self.proxy_name = f"{body['proxy']['namespace']}/{body['proxy']['name']}"
        self.target = target
        self.active = True
        self._set_expiry(body)

    def _set_expiry(self, body: dict) -> None:
        self.ttl_seconds: int = body["ttlSeconds"]
        # Our own clock, so a clock difference with the operator does not matter.
        self.deadline = time.monotonic() + self.ttl_seconds

    def __repr__(self) -> str:
        return f"Lease({self.id} on {self.proxy_name} at {redact(self.proxy_url)})"

    @property
    def proxies(self) -> dict:
        """The `proxies=` argument of requests."""
        return {"http": self.proxy_url, "https": self.proxy_url}

    def request(self, method: str, url: str, **kwargs) -> requests.Response:
        """A request through the leased proxy, renewing the lease first when it is about to end."""
        if self.active and self.deadline - time.monotonic() < self.ttl_seconds / 3:
            self.renew()
        if not self.active:
            raise LeaseEnded(f"{self!r} has ended: lease another proxy")
        kwargs.setdefault("timeout", 30)
        return self.client.web.request(method, url, proxies=self.proxies, **kwargs)

    def get(self, url: str, **kwargs) -> requests.Response:
        return self.request("GET", url, **kwargs)

    def renew(self, ttl_seconds: int | None = None) -> bool:
        """Extends the lease. False when it cannot be (ended, or its proxy is draining)."""
        body = {} if ttl_seconds is None else {"ttlSeconds": ttl_seconds}
        r = self.client.call("POST", f"/v1/leases/{self.id}/renew", body)
        if r.status_code == 200:
            self._set_expiry(r.json())
            return True
        if r.status_code in (404, 409, 410):
            # Ended, forgotten, or draining: move to a new lease before this one expires.
            log.info("lease %s cannot be renewed (%s): leasing another proxy", self.id, r.status_code)
            self.active = False
            return False
        if r.status_code == 503:  # a failover: the lease is still valid until its old expiry
            self.active = self.deadline > time.monotonic()
            return False
        self.client.raise_problem(r)

    def report(self, outcome: str, target: str | None = None) -> bool:
        """Reports `success`, `failure` or `blocked` (for `target` only, when given).

        Returns whether the lease is still ours: False after `blocked`, and when the operator
        answers that the lease has ended (then stop using the proxy at once)."""
        body = {"outcome": outcome}
        if outcome == "blocked" and target:
            body["target"] = target
        r = self.client.call("POST", f"/v1/leases/{self.id}/report", body)
        if r.status_code == 200:
            self.active = r.json()["active"]
        elif r.status_code in (404, 410):
            self.active = False
        elif r.status_code != 503:  # 503: a failover; the next call will tell
            self.client.raise_problem(r)
        return self.active

    def release(self) -> None:
        """Gives the proxy back now rather than at expiry. Idempotent; never raises."""
        self.active = False
        try:
            self.client.call("DELETE", f"/v1/leases/{self.id}")
        except requests.RequestException as e:
            log.warning("releasing %s failed (it expires anyway): %s", self.id, e)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class LeaseClient:
    """The discovery API: `lease()` waits for a proxy and returns a `Lease`."""

    def __init__(
        self,
        api_url: str = DEFAULT_API,
        token: str | None = None,
        token_file: str | None = None,
        ca_file: str | None = None,
        max_wait: float = 300,
        max_retry_after: float = 60,
    ):
        self.api_url = api_url.rstrip("/")
        self.max_wait = max_wait
        # A pool refilling after a recycle often has a proxy sooner than Retry-After says.
        self.max_retry_after = max_retry_after
        self.api = requests.Session()
        self.api.auth = _Bearer(token, token_file)
        # The API is reached directly, never through HTTP_PROXY from the environment.
        self.api.trust_env = False
        # The API's certificate is checked against its own CA (the ca.crt of its TLS Secret);
        # the sites crawled keep the system's roots.
        self.api.verify = ca_file or True
        self.web = requests.Session()

    @classmethod
    def from_env(cls, **kwargs) -> LeaseClient:
        """DISCOVERY_URL, DISCOVERY_TOKEN_FILE (a projected ServiceAccount token) or DISCOVERY_TOKEN,
        and DISCOVERY_CA_FILE (the API's CA, docs/discovery-api.md "TLS")."""
        return cls(
            api_url=os.environ.get("DISCOVERY_URL", DEFAULT_API),
            token=os.environ.get("DISCOVERY_TOKEN"),
            token_file=os.environ.get("DISCOVERY_TOKEN_FILE"),
            ca_file=os.environ.get("DISCOVERY_CA_FILE"),
            **kwargs,
        )

    def call(self, method: str, path: str, body: dict | None = None) -> requests.Response:
        return self.api.request(method, self.api_url + path, json=body, timeout=10)

    @staticmethod
    def raise_problem(r: requests.Response):
        try:
            problem = r.json()
        except ValueError:
            problem = {"detail": r.text[:200]}
        raise LeaseError(r.status_code, problem)

    def lease(
        self,
        pool: str | None = None,
        target: str | None = None,
        session: str | None = None,
        ttl_seconds: int | None = None,
        **filters,
    ) -> Lease:
        """Waits until a proxy is leased (up to max_wait seconds). `filters`: provider, zone,
        selector, proxy, as in POST /v1/leases."""
        body = {k: v for k, v in dict(filters, pool=pool, target=target, session=session,
                                      ttlSeconds=ttl_seconds).items() if v is not None}
        give_up = time.monotonic() + self.max_wait
        while True:
            try:
                r = self.call("POST", "/v1/leases", body)
            except requests.ConnectionError as e:
                r, wait = None, 2.0  # no Ready replica: a failover is under way
                log.info("discovery API unreachable (%s); retrying", e)
            else:
                if r.status_code in (200, 201):  # 200: the session's lease, shared
                    lease = Lease(self, r.json(), target)
                    log.info("leased %r", lease)
                    return lease
                if r.status_code not in (409, 503) or "Retry-After" not in r.headers:
                    self.raise_problem(r)  # waiting will not help
                wait = min(float(r.headers["Retry-After"]), self.max_retry_after)
            if time.monotonic() + wait > give_up:
                if r is None:
                    raise LeaseError(503, {"detail": "discovery API unreachable"})
                self.raise_problem(r)
            time.sleep(wait)
