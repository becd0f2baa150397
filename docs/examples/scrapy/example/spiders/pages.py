"""Fetches the URLs it is given through leased proxies and yields what each page said.

    scrapy crawl pages -a urls=https://shop.example.com/a,https://shop.example.com/b
    scrapy crawl pages -a urls=... -a sessions=2    # sticky sessions: two cookie jars, a proxy each
"""

import scrapy


class PagesSpider(scrapy.Spider):
    name = "pages"

    def __init__(self, urls="", sessions="0", **kwargs):
        super().__init__(**kwargs)
        self.urls = [u for u in urls.split(",") if u]
        self.sessions = int(sessions)

    async def start(self):
        for i, url in enumerate(self.urls):
            meta = {}
            if self.sessions:
                # One lease per session key: a session keeps its proxy while it is not blocked.
                meta["proxy_session"] = f"{self.name}-{i % self.sessions}"
                meta["cookiejar"] = i % self.sessions
            yield scrapy.Request(url, meta=meta)

    def parse(self, response):
        yield {
            "url": response.url,
            "status": response.status,
            "lease": response.meta.get("proxy_lease_id"),
            "session": response.meta.get("proxy_session"),
            "body": response.text[:200],
        }
