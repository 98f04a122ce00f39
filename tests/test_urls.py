"""The one check of a server URL and the one loopback test, shared by the CLI, the load sweep,
app.py's flags and the app's Serving engine tab."""
from __future__ import annotations

import pytest

from specviz.core.errors import SpecvizError
from specviz.serving.urls import base_url, check_url, is_loopback


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "https://example.org/api", "http://[::1]:8000/v1",
                                 "http://localhost", "http://10.0.0.5:9000/"])
def test_http_and_https_urls_with_a_host_pass_as_given(url):
    assert check_url(f"  {url} ") == url


@pytest.mark.parametrize("url", [
    "127.0.0.1:8000", "localhost:8000",  # no scheme (the second parses as scheme "localhost")
    "ftp://host", "file:///etc/passwd", "gopher://a:70/", "javascript:alert(1)",  # not http(s)
    "http://", "https://:8000/", "", "   ", None,  # no host
    "http://[::1", "http://host:99999", "http://host:port",  # no valid host or port
    "http://example.org/" + "a" * 3000,  # too long to be an address
])
def test_anything_else_gets_a_sentence_naming_the_flag_or_field(url):
    with pytest.raises(SpecvizError, match=r"^--baseline-server must be an http:// or https:// address with a host"):
        check_url(url, "--baseline-server")


def test_the_sentence_shows_what_was_given_but_not_all_of_a_long_one():
    with pytest.raises(SpecvizError, match="for example http://127.0.0.1:8000 \\(got 'ftp://x'\\)"):
        check_url("ftp://x")
    with pytest.raises(SpecvizError) as e:
        check_url("ftp://" + "x" * 5000)
    assert len(str(e.value)) < 250


def test_the_base_url_drops_a_trailing_slash_and_v1():
    assert base_url(" http://127.0.0.1:8000/v1/ ") == "http://127.0.0.1:8000"
    assert base_url("https://example.org/api/") == "https://example.org/api"
    with pytest.raises(SpecvizError, match="the server URL must be"):
        base_url("127.0.0.1:8000")


def test_loopback_is_localhost_127_slash_8_and_ipv6_one_without_dns():
    loopback = ("localhost", "LocalHost", "127.0.0.1", "127.3.2.1", "127.255.255.254", "::1", "[::1]", " ::1 ",
                "::ffff:127.0.0.1")
    remote = ("10.1.2.3", "192.168.1.20", "0.0.0.0", "::", "8.8.8.8", "example.com", "myhost.example",
              "localhost.example.com", "127.0.0.1.nip.io", "", None)
    assert all(is_loopback(h) for h in loopback)
    assert not any(is_loopback(h) for h in remote)
