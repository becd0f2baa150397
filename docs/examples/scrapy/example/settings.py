"""Settings of the example crawler: Scrapy's, plus the lease middleware's (proxy_leases.py says
what each PROXY_LEASES_* setting does)."""

import os

BOT_NAME = "example"
SPIDER_MODULES = ["example.spiders"]

# Before HttpProxyMiddleware (750), which turns the credentials of the leased proxyUrl into a
# Proxy-Authorization header; before RetryMiddleware's (550) handling of 429.
DOWNLOADER_MIDDLEWARES = {"proxy_leases.ProxyLeaseMiddleware": 600}

# The API address and token come from DISCOVERY_URL and DISCOVERY_TOKEN or DISCOVERY_TOKEN_FILE.
PROXY_LEASES_POOL = os.environ.get("PROXY_POOL")  # namespace/name of a ProxyPool
PROXY_LEASES_TTL = 300
PROXY_LEASES_BLOCK_CODES = [403, 429]
PROXY_LEASES_CAPTCHA_MARKERS = ["captcha"]
PROXY_LEASES_MAX_RETRY_AFTER = float(os.environ.get("PROXY_LEASES_MAX_RETRY_AFTER", "60"))

# Requests to one site share its slot's lease, so its concurrency is what one proxy carries.
CONCURRENT_REQUESTS_PER_DOMAIN = 2
ROBOTSTXT_OBEY = False
# No listening consoles in a crawler that only needs to crawl.
TELNETCONSOLE_ENABLED = False
REMOTE_CONTROL_ENABLED = False
LOG_LEVEL = "INFO"
