"""The ``redis+sentinel://`` URL (issue #30): how it parses, how a malformed one is refused,
and what each control-plane library is given for it (a plain URL passes through unchanged)."""

from __future__ import annotations

import pytest

from config import redis_sentinel
from runtime.redis_conn import SentinelTarget, sentinel_target

pytestmark = pytest.mark.unit

URL = "redis+sentinel://:s%40cret@10.0.0.1:26379,10.0.0.2:26380/primary/3"


def test_parses_sentinels_master_db_and_password() -> None:
    assert sentinel_target(URL) == SentinelTarget(
        sentinels=(("10.0.0.1", 26379), ("10.0.0.2", 26380)),
        master="primary",
        db=3,
        password="s@cret",
    )
    assert sentinel_target("redis+sentinel://h:1/m") == SentinelTarget((("h", 1),), "m")


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "rediss://h:6380/1", "unix:///r.sock"])
def test_other_urls_are_not_sentinel_and_pass_through(url: str) -> None:
    assert sentinel_target(url) is None
    assert redis_sentinel.celery_url(url) == url
    assert redis_sentinel.celery_transport_options(url) == {}
    assert redis_sentinel.channels_host(url) == url
    assert redis_sentinel.cache_location(url) == {"LOCATION": url}


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("redis+sentinel://h:1", "needs /<master>"),
        ("redis+sentinel://h:1/m/zero", "needs /<master>"),
        ("redis+sentinel://h:1/m/0/x", "needs /<master>"),
        ("redis+sentinel://h/m", "bad Sentinel address 'h'"),
        ("redis+sentinel://h:1,:2/m", "bad Sentinel address ':2'"),
    ],
)
def test_a_malformed_sentinel_url_is_refused_clearly(url: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint) as info:
        sentinel_target(url)
    assert "redis+sentinel://[[user]:password@]host:port" in str(info.value)  # the form wanted


def test_each_library_gets_its_own_form() -> None:
    assert redis_sentinel.celery_url(URL) == (
        "sentinel://:s%40cret@10.0.0.1:26379/3;sentinel://:s%40cret@10.0.0.2:26380/3"
    )
    assert redis_sentinel.celery_transport_options(URL) == {"master_name": "primary"}
    assert redis_sentinel.channels_host(URL) == {
        "sentinels": [["10.0.0.1", 26379], ["10.0.0.2", 26380]],
        "master_name": "primary",
        "db": 3,
        "username": None,
        "password": "s@cret",
    }
    assert redis_sentinel.cache_location(URL) == {
        "LOCATION": [URL],  # one server: Django would split a string at its commas
        "OPTIONS": {"pool_class": "config.redis_sentinel.SentinelAwarePool"},
    }
