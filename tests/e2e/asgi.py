"""The ASGI application the browser tests serve: rsiweb's, with static files served by Django.

Production serves static/ from a web server or CDN (collectstatic); a test server has neither,
so Django's static-files handler answers /static/ here, as channels' live-server test case does.
"""

from __future__ import annotations

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

from rsiweb.asgi import application as rsiweb_application

application = ASGIStaticFilesHandler(rsiweb_application)
