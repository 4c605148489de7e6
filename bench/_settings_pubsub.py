"""Settings for bench/live_latency.py --layer pubsub: rsiweb's, on channels_redis's pub/sub layer.

channels_redis.core receives each message with several Redis round trips (a clean-up script,
BZPOPMIN, the in-flight backup and its removal); the pub/sub layer has Redis push messages to
subscribed connections. The benchmark runs both so the choice rests on figures.
"""

from rsiweb.settings.base import *  # noqa: F403
from rsiweb.settings.base import REDIS_URL

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL]},
    }
}
