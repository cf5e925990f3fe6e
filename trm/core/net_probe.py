"""Is a URL's host reachable from here, within a few seconds?

Checked before a network call whose own failure is slow: the Hub downloads
(`trm.core.hub`, where huggingface_hub retries with back-off for about 25 s)
and W&B's online mode (`trm.core.wandb_writer`, where wandb.init waits 90 s).
Each caller words the answer for its own error or warning.

A host-name look-up ignores socket timeouts, so it runs in a daemon thread
that is abandoned if it takes too long; the TCP connect has the socket's
timeout. With a proxy configured (HTTPS_PROXY and friends) the proxy
resolves and connects, not this host, so `probe` does not check.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
import urllib.parse
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


def proxied() -> bool:
  return any(os.environ.get(name) for name in PROXY_VARIABLES)


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


def probe(url: str, timeout_s: float, *, shared: bool = False
          ) -> Optional[Unreachable]:
  """None when `url`'s host resolves and accepts a TCP connection (or a
  proxy is configured); else why not. The look-up and the connect each get
  `timeout_s` seconds, or, with `shared`, `timeout_s` in all."""
  start = time.monotonic()
  try:
    parsed = urllib.parse.urlsplit(url)
    host = parsed.hostname
  except ValueError as e:  # "http://[::1": "Invalid IPv6 URL" (a traceback)
    return Unreachable("bad_url", detail=str(e))
  if not host:
    return Unreachable("no_host")
  try:
    port = parsed.port or (80 if parsed.scheme == "http" else 443)
  except ValueError:
    return Unreachable("bad_port", host)
  if proxied():
    return None
  addresses, why = _resolve(host, port, timeout_s)
  if not addresses:
    return Unreachable("resolve", host, port, why or "no address")
  connect_s = timeout_s - (time.monotonic() - start) if shared else timeout_s
  family, kind, proto, _, address = addresses[0]
  try:
    with socket.socket(family, kind, proto) as connection:
      connection.settimeout(max(connect_s, 0.05))
      connection.connect(address)
  except OSError as e:
    return Unreachable("connect", host, port, f"{type(e).__name__}: {e}")
  return None
