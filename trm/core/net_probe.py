"""Is a URL's host reachable from here, within a few seconds?

Checked before a network call whose own failure is slow: the Hub downloads
(`trm.core.hub`, where huggingface_hub retries with back-off for about 25 s)
and W&B's online mode (`trm.core.wandb_writer`, where wandb.init waits 90 s).
Each caller words the answer for its own error or warning.

A host-name look-up ignores socket timeouts, so it runs in a daemon thread
that is abandoned if it takes too long; the TCP connect has the socket's
timeout. With a proxy configured for the URL (HTTPS_PROXY and friends, as
requests reads them: NO_PROXY's hosts go direct) the proxy resolves and
connects to the host, so `probe` checks the proxy instead: a proxy that is
down cost huggingface_hub's 27 s of retries and a ProxyError's traceback
text.
"""
from __future__ import annotations

import dataclasses
import socket
import threading
import time
import urllib.parse
import urllib.request
from typing import Optional

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
                   "ALL_PROXY", "all_proxy")


@dataclasses.dataclass(frozen=True)
class Unreachable:
  """Why a URL's host cannot be reached.

  kind: 'bad_url' | 'no_host' | 'bad_port' (the URL itself), 'resolve'
  (the name does not resolve in time), 'connect' (no TCP connection in
  time); detail: the socket error, the URL's ("Invalid IPv6 URL"), or "no
  answer within N s".
  """
  kind: str
  host: str = ""
  port: int = 0
  detail: str = ""
  proxy: str = ""  # the proxy's URL when it is the proxy that is unreachable


def proxy_for(url: str) -> Optional[str]:
  """The proxy that requests (under huggingface_hub) sends `url` through,
  from the environment (`<scheme>_proxy`, then ALL_PROXY; none for a host
  NO_PROXY names), or None."""
  parsed = urllib.parse.urlsplit(url)
  proxies = urllib.request.getproxies_environment()
  proxy = proxies.get(parsed.scheme) or proxies.get("all")
  if not proxy or urllib.request.proxy_bypass_environment(
      parsed.hostname or "", proxies):
    return None
  return proxy if "://" in proxy else f"http://{proxy}"  # as requests reads it


def _resolve(host: str, port: int, timeout_s: float):
  """(socket.getaddrinfo(host, port), None), or (None, why not) when it
  fails or takes longer than `timeout_s`."""
  result: list = []

  def look_up():
    try:
      result.append((socket.getaddrinfo(host, port,
                                        type=socket.SOCK_STREAM), None))
    except (OSError, UnicodeError) as e:
      result.append((None, f"{type(e).__name__}: {e}"))

  thread = threading.Thread(target=look_up, daemon=True,
                            name="trm-network-check")
  thread.start()
  thread.join(timeout_s)
  return result[0] if result else (None, f"no answer within {timeout_s:g} s")


def _connect(host: str, port: int, addresses, deadline: float
             ) -> Optional[Unreachable]:
  """None once a TCP connection to one of `addresses` (getaddrinfo's)
  opens before `deadline`, tried in turn as requests' urllib3 tries them:
  only the first was, and a host whose IPv6 address came first but had no
  route counted as unreachable, its IPv4 one untried."""
  error = None
  for family, kind, proto, _, socket_address in addresses:
    try:
      with socket.socket(family, kind, proto) as connection:
        connection.settimeout(max(deadline - time.monotonic(), 0.05))
        connection.connect(socket_address)
      return None
    except OSError as e:
      error = error or e  # the first address's, as its error is worded
      if time.monotonic() >= deadline:
        break
  return Unreachable("connect", host, port,
                     f"{type(error).__name__}: {error}")


def _host_and_port(url: str):
  """(host, port) of `url`, or the Unreachable that says what is wrong
  with it."""
  try:
    parsed = urllib.parse.urlsplit(url)
    host = parsed.hostname
  except ValueError as e:  # "http://[::1": "Invalid IPv6 URL" (a traceback)
    return Unreachable("bad_url", detail=str(e))
  if not host:
    return Unreachable("no_host")
  try:
    if parsed.port:
      return host, parsed.port
  except ValueError:
    return Unreachable("bad_port", host)
  if parsed.scheme.startswith("socks"):  # a SOCKS proxy's
    return host, 1080
  return host, 80 if parsed.scheme == "http" else 443


def probe(url: str, timeout_s: float, *, shared: bool = False
          ) -> Optional[Unreachable]:
  """None when `url`'s host (or the proxy it goes through) resolves and
  accepts a TCP connection; else why not (its `proxy` set when the proxy
  does not). The look-up and the connect each get `timeout_s` seconds, or,
  with `shared`, `timeout_s` in all."""
  start = time.monotonic()
  address = _host_and_port(url)
  if isinstance(address, Unreachable):
    return address
  proxy = proxy_for(url)
  if proxy:
    address = _host_and_port(proxy)
    if isinstance(address, Unreachable):
      return dataclasses.replace(address, proxy=proxy)
  host, port = address
  problem = None
  addresses, why = _resolve(host, port, timeout_s)
  if not addresses:
    problem = Unreachable("resolve", host, port, why or "no address")
  else:
    problem = _connect(host, port, addresses, time.monotonic() + (
        timeout_s - (time.monotonic() - start) if shared else timeout_s))
  if problem and proxy:
    problem = dataclasses.replace(problem, proxy=proxy)
  return problem
