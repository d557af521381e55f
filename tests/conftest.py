"""Fixtures shared by the test modules: real servers, started and stopped by the tests.

tests/ has no __init__.py, so pytest puts it on sys.path and these modules import.
"""

from reverb_fixtures import *  # noqa: F401,F403  (reverb_servers, reverb_child_server)
from redis_fixtures import *  # noqa: F401,F403  (redis_binary, redis_url, redis_namespace, redis_servers)
