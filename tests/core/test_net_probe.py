"""trm.core.net_probe: the one reachability check behind the Hub downloads
and W&B's online mode (their wording is tested in tests/data/test_offline.py
and tests/core/test_wandb_writer.py)."""
import socket
import time

from trm.core import net_probe


def _closed_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_kinds_of_unreachable(monkeypatch):
  for name in net_probe.PROXY_VARIABLES:
    monkeypatch.delenv(name, raising=False)
  assert net_probe.probe("no-scheme-or-host", 1).kind == "no_host"
  # urlsplit's own ValueError was a traceback (HF_ENDPOINT, WANDB_BASE_URL).
  assert net_probe.probe("http://[::1", 1) == net_probe.Unreachable(
      "bad_url", detail="Invalid IPv6 URL")
  assert net_probe.probe("http://127.0.0.1:99999/x", 1).kind == "bad_port"
  refused = net_probe.probe(f"http://127.0.0.1:{_closed_port()}/", 1)
  assert refused.kind == "connect" and refused.host == "127.0.0.1"
  assert "ConnectionRefusedError" in refused.detail
  with socket.socket() as server:
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    assert net_probe.probe(f"http://127.0.0.1:{server.getsockname()[1]}",
                           1) is None


def test_behind_a_proxy_the_proxy_is_checked(monkeypatch):
  """The proxy resolves and connects to the host; a proxy that was down
  went unchecked, and huggingface_hub failed after 27 s of retries with a
  ProxyError's text."""
  for name in net_probe.PROXY_VARIABLES + ("NO_PROXY", "no_proxy"):
    monkeypatch.delenv(name, raising=False)
  with socket.socket() as proxy:
    proxy.bind(("127.0.0.1", 0))
    proxy.listen(1)
    monkeypatch.setenv("https_proxy",
                       f"127.0.0.1:{proxy.getsockname()[1]}")  # no scheme
    assert net_probe.probe("https://hub.invalid/", 1) is None
  monkeypatch.setenv("https_proxy", "http://proxy.invalid:3128")
  problem = net_probe.probe("https://hub.invalid/", 1)
  assert (problem.kind, problem.host, problem.port, problem.proxy) == (
      "resolve", "proxy.invalid", 3128, "http://proxy.invalid:3128")
  monkeypatch.setenv("https_proxy", "socks5h://proxy.invalid")
  assert net_probe.probe("https://hub.invalid/", 1).port == 1080
  # A URL of another scheme, or a host NO_PROXY names, goes direct.
  port = _closed_port()
  assert net_probe.probe(f"http://127.0.0.1:{port}/", 1).proxy == ""
  monkeypatch.setenv("ALL_PROXY", "http://proxy.invalid:3128")
  assert net_probe.probe(f"http://127.0.0.1:{port}/", 1).proxy
  monkeypatch.setenv("no_proxy", "localhost,127.0.0.1")
  direct = net_probe.probe(f"http://127.0.0.1:{port}/", 1)
  assert (direct.kind, direct.proxy) == ("connect", "")
  from trm.core import hub  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("https_proxy", "http://[::1")
  assert hub.unreachable("https://hub.invalid/") == (
      "the proxy URL http://[::1 (from the environment's *_PROXY) is no URL"
      " (Invalid IPv6 URL)")


def test_a_hanging_look_up_is_bounded(monkeypatch):
  for name in net_probe.PROXY_VARIABLES:
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: time.sleep(30))
  start = time.monotonic()
  problem = net_probe.probe("https://example.invalid/", 0.5, shared=True)
  assert time.monotonic() - start < 2
  assert problem.kind == "resolve"
  assert problem.detail == "no answer within 0.5 s"


def test_a_malformed_endpoint_is_one_line_naming_it(monkeypatch):
  """HF_ENDPOINT or WANDB_BASE_URL="http://[::1" (a bracket left open)
  stopped a download, or W&B's online check, with urlsplit's "Invalid IPv6
  URL", naming neither the variable's value nor what it is."""
  from trm.core import hub  # pylint: disable=g-import-not-at-top
  from trm.core import wandb_writer  # pylint: disable=g-import-not-at-top
  assert hub.unreachable("http://[::1") == (
      "http://[::1 is no URL (Invalid IPv6 URL)")
  monkeypatch.setenv("WANDB_BASE_URL", "http://[::1")
  assert wandb_writer.online_problem(1) == (
      "the W&B host URL 'http://[::1' is no URL (Invalid IPv6 URL)")


def test_every_address_of_a_host_is_tried(monkeypatch):
  """Only getaddrinfo's first address was tried: a host whose IPv6 address
  comes first but has no route (its IPv4 one answers) counted as
  unreachable, and its download was not even tried."""
  for name in net_probe.PROXY_VARIABLES:
    monkeypatch.delenv(name, raising=False)
  real = socket.getaddrinfo
  with socket.socket() as server:
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    closed = _closed_port()

    def two_addresses(host, port_, *args, **kwargs):
      # The closed port stands for the address without a route.
      return (real("127.0.0.1", closed, *args, **kwargs)
              + real("127.0.0.1", port, *args, **kwargs))

    monkeypatch.setattr(socket, "getaddrinfo", two_addresses)
    assert net_probe.probe(f"http://dual.example:{port}/", 1) is None
