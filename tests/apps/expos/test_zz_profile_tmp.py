import cProfile, pstats, io, time
from django.test import Client
from tests.apps.expos.test_request_path import appender, _append  # noqa: F401
import pytest
pytestmark = pytest.mark.django_db(transaction=True)

def test_profile(appender, settings):
    settings.RSI_TOKEN_RATE = ""
    run, experiment, plaintext, _ = appender
    client = Client()
    for i in range(50):
        _append(client, plaintext, experiment.handle, i)
    t = time.perf_counter()
    for i in range(50, 250):
        _append(client, plaintext, experiment.handle, i)
    print("\nper call ms", (time.perf_counter() - t) / 200 * 1000)
    pr = cProfile.Profile()
    pr.enable()
    for i in range(250, 650):
        _append(client, plaintext, experiment.handle, i)
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(60)
    print(s.getvalue()[:12000])
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue()[:6000])
    s = io.StringIO()
    pstats.Stats(pr, stream=s).print_callers("deepcopy")
    print(s.getvalue()[:3000])
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_callees("agent_token_authenticate")
    print(s.getvalue()[:3000])
