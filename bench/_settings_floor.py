"""Settings for bench/api_vs_mlflow.py: rsiweb's, plus the floor endpoint (bench/_floor_urls.py).

The floor is what any append must pay on this stack: the same server, middleware and WSGI
handler, a JSON body, one INSERT and its COMMIT. Nothing else differs from rsiweb.settings.base.
"""

from rsiweb.settings.base import *  # noqa: F403

ROOT_URLCONF = "bench._floor_urls"
