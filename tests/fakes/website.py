"""A plain website: an HTML page, a text file, redirects, an error page and a binary file."""

from __future__ import annotations

from . import FakeServer, Request, Response, text_response

PAGE = """<!DOCTYPE html>
<html lang="en"><head>
<meta charset="utf-8"><title>Low-Rank   Adaptation &amp; friends</title>
<style>body { color: red; }</style>
<script>var secret = "do not show";</script>
</head><body>
<nav><a href="/">Home</a></nav>
<h1>LoRA explained</h1>
<p>LoRA freezes the weights &amp; trains <b>low-rank</b> updates.</p>
<noscript>enable javascript</noscript>
<ul><li>rank r</li><li>alpha</li></ul>
</body></html>
"""


class FakeWebsite(FakeServer):
    """``redirect_target`` lets a test send /away anywhere (e.g. to a private address)."""

    def __init__(self, redirect_target: str = "/page.html") -> None:
        super().__init__()
        self.redirect_target = redirect_target

    def route(self, request: Request) -> Response:
        if request.path == "/page.html":
            return text_response(PAGE, "text/html; charset=utf-8")
        if request.path == "/notes.txt":
            return text_response("plain notes\nsecond line\n", "text/plain; charset=utf-8")
        if request.path == "/moved":
            return Response(301, b"", {"Location": "/page.html"})
        if request.path == "/away":
            return Response(302, b"", {"Location": self.redirect_target})
        if request.path == "/loop":
            return Response(302, b"", {"Location": "/loop"})
        if request.path == "/file.bin":
            return Response(200, b"\x00\x01\x02", {"Content-Type": "application/octet-stream"})
        return text_response("<html><body>Not here</body></html>", "text/html", 404)
